"""Confirmed, persistent publishing of raw JSON bytes, safe to call from any thread."""
from __future__ import annotations

from typing import Any

from kombu import Connection, Exchange
from kombu.pools import ProducerPool

# bounded: a broker that stays away makes the caller fail (and not ack) instead of hanging forever
RETRY_POLICY = {"max_retries": 5, "interval_start": 0.2, "interval_step": 0.5, "interval_max": 2.0}


class Publisher:
    def __init__(self, producer_pool: ProducerPool) -> None:
        self._pool = producer_pool

    @classmethod
    def for_connection(cls, connection: Connection, limit: int = 8) -> Publisher:
        return cls(ProducerPool(connection.clone(transport_options={"confirm_publish": True}).Pool(limit), limit=limit))

    def publish(self, body: bytes, *, exchange: Exchange, routing_key: str, headers: dict[str, Any] | None = None,
                **properties: Any) -> None:
        with self._pool.acquire(block=True, timeout=30) as producer:
            producer.publish(
                body,
                exchange=exchange,
                routing_key=routing_key,
                content_type="application/json",
                content_encoding="utf-8",
                delivery_mode=2,
                headers=headers or {},
                declare=[exchange] if exchange.name else [],
                retry=True,
                retry_policy=RETRY_POLICY,
                **properties,
            )
