"""Confirmed, persistent publishing of raw JSON bytes, safe to call from any thread.

Each publishing thread keeps one producer on a connection of its own (py-amqp connections are
not thread-safe): taking a producer from a shared pool, wrapping the call in kombu's retry loop
and re-declaring the exchange cost more CPU than the publish itself. When that fast path fails
(broker restarted, exchange deleted) the thread drops its connection and the message goes the
careful way — pooled producer, exchange declared, bounded retries — and the next publish opens a
fresh connection.
"""
from __future__ import annotations

import logging
import queue
import threading
from typing import Any

from kombu import Connection, Exchange, Producer
from kombu.pools import ProducerPool

log = logging.getLogger("reach.publisher")

# bounded: a broker that stays away makes the caller fail (and not ack) instead of hanging forever
RETRY_POLICY = {"max_retries": 5, "interval_start": 0.2, "interval_step": 0.5, "interval_max": 2.0}


class Publisher:
    def __init__(self, producer_pool: ProducerPool) -> None:
        self._pool = producer_pool
        self._local = threading.local()
        self._spare: queue.SimpleQueue[tuple[Connection, Producer]] = queue.SimpleQueue()

    def prewarm(self, count: int) -> int:
        """Open ``count`` connections now, for the first publishing threads to take. A thread's first
        publish would otherwise open one — an AMQP handshake of several round trips and tens of ms
        of CPU — in the middle of an intent, and a pool's threads all start at once. Returns how
        many were opened (fewer if the broker cannot be reached: threads then connect themselves)."""
        for opened in range(count):
            pair = self._connect()
            if pair is None:
                return opened
            self._spare.put(pair)
        return count

    @classmethod
    def for_connection(cls, connection: Connection, limit: int = 8) -> Publisher:
        return cls(ProducerPool(connection.clone(transport_options={"confirm_publish": True}).Pool(limit), limit=limit))

    def publish(self, body: bytes, *, exchange: Exchange, routing_key: str, headers: dict[str, Any] | None = None,
                **properties: Any) -> None:
        """Returns once the broker confirmed the message; raises if it could not be published."""
        producer: Producer | None = getattr(self._local, "producer", None)
        if producer is None:
            producer = self._open()
        if producer is not None:
            try:
                producer.publish(body, exchange=exchange.name, routing_key=routing_key, content_type="application/json",
                                 content_encoding="utf-8", delivery_mode=2, headers=headers or {}, **properties)
                return
            except Exception as exc:  # connection or channel trouble: the careful path decides
                log.info("publisher connection of %s failed (%s); publishing with retries",
                         threading.current_thread().name, exc)
                self._close()
        with self._pool.acquire(block=True, timeout=30) as pooled:
            pooled.publish(body, exchange=exchange, routing_key=routing_key, content_type="application/json",
                           content_encoding="utf-8", delivery_mode=2, headers=headers or {},
                           declare=[exchange] if exchange.name else [], retry=True, retry_policy=RETRY_POLICY,
                           **properties)

    def _open(self) -> Producer | None:
        """This thread's own producer, or None when the broker cannot be reached right now."""
        try:
            pair: tuple[Connection, Producer] | None = self._spare.get_nowait()
        except queue.Empty:
            pair = self._connect()
        if pair is None:
            return None
        self._local.connection, self._local.producer = pair
        return pair[1]

    def _connect(self) -> tuple[Connection, Producer] | None:
        connection = self._pool.connections.connection.clone()
        try:
            connection.connect()
            return connection, Producer(connection.channel())
        except Exception as exc:
            log.info("could not open a publisher connection (%s); publishing with retries", exc)
            connection.collect()
            return None

    def _close(self) -> None:
        connection = getattr(self._local, "connection", None)
        self._local.connection = self._local.producer = None
        if connection is not None:
            try:
                connection.collect()  # drop sockets and channels without talking to a dead broker
            except Exception:
                pass
