"""What operators ask of a running fleet: status per connector, one intent's stages, dead letters."""
from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis
from kombu import Connection

from connectors.catalog import Catalog
from workers.breaker import RedisBreakerStorage
from workers.control import is_paused, last_error_key, live_workers
from workers.health import HealthBoard
from workers.idempotency import _text
from workers.pool import deliveries_key
from workers.receipts import sent_key
from workers.topology import DLQ, INTENTS_EXCHANGE, connector_queue



@dataclass(frozen=True)
class ConnectorStatus:
    connector: str
    queue_depth: int | None
    consumers: int | None
    in_flight: int
    workers: int
    breaker: str
    health: str
    paused: bool
    last_error: str

    def to_dict(self) -> dict[str, Any]:
        return self.__dict__.copy()


def fleet_status(catalog: Catalog, broker_url: str, client: redis.Redis) -> list[ConnectorStatus]:
    """Raises the broker's or Redis's connection error when either cannot be reached."""
    client.ping()
    board = HealthBoard(client)
    rows = []
    with Connection(broker_url, connect_timeout=5) as conn:
        conn.ensure_connection(max_retries=1)
        channel = conn.channel()
        for name in sorted(catalog.connectors):
            try:
                declared = channel.queue_declare(connector_queue(name).name, passive=True)
                depth, consumers = int(declared.message_count), int(declared.consumer_count)
            except conn.channel_errors:
                depth = consumers = None  # never declared: no pool has started yet
                channel = conn.channel()
            workers = live_workers(client, name)
            raw_error = client.get(last_error_key(name))
            last_error = ""
            if raw_error:
                err = json.loads(raw_error)
                ago = int(time.time() - err["at"])
                last_error = f"{err['code']} {ago}s ago: {err['message']}"
            rows.append(ConnectorStatus(
                connector=name, queue_depth=depth, consumers=consumers,
                in_flight=sum(int(w.get("in_flight", 0)) for w in workers), workers=len(workers),
                breaker=RedisBreakerStorage(client, name).state, health=board.status(name),
                paused=is_paused(client, name), last_error=last_error))
    return rows


@dataclass(frozen=True)
class DeadLetter:
    message_id: str
    reason: str
    agent: str
    connector: str
    received_at: str
    preview: str
    body: bytes
    headers: dict[str, Any]


def _dead_letter(message: Any) -> DeadLetter:
    headers = dict(message.properties.get("application_headers") or {})
    body = message.body if isinstance(message.body, bytes) else str(message.body).encode()
    preview = body[:160].decode("utf-8", "replace").replace("\n", " ")
    return DeadLetter(
        message_id=_text(message.properties.get("message_id")),
        reason=_text(headers.get("x-reach-reason")),
        agent=_text(headers.get("x-reach-agent-id")),
        connector=_text(headers.get("x-reach-connector")),
        received_at=_text(headers.get("x-reach-received-at")),
        preview=preview + ("…" if len(body) > 160 else ""),
        body=body,
        headers=headers,
    )


def list_dead_letters(broker_url: str, limit: int = 100) -> list[DeadLetter]:
    """Read without removing: everything taken is returned to the queue when the channel closes."""
    found = []
    with Connection(broker_url, connect_timeout=5) as conn:
        channel = conn.channel()
        channel.auto_decode = False
        DLQ(channel).declare()
        while len(found) < limit:
            message = channel.basic_get(DLQ.name, no_ack=False)
            if message is None:
                break
            found.append(_dead_letter(message))
        channel.close()  # unacked messages go back, in order
    return found


def replay_dead_letters(broker_url: str, client: redis.Redis, ids: set[str] | None,
                        send_job: Callable[[dict[str, Any], str], None]) -> list[str]:
    """Send dead letters (all, or those whose message id is in ``ids``) back through the fleet.

    A router dead letter (an intent it could not read) goes back to reach.intents; a pool dead
    letter (a job that kept killing workers) goes back to its connector queue. Message ids and
    idempotency keys are kept, so the ledger still prevents a second execution; the intent's
    receipt marker is cleared so the replay is answered.
    """
    replayed: list[str] = []
    with Connection(broker_url, connect_timeout=5, transport_options={"confirm_publish": True}) as conn:
        channel = conn.channel()
        channel.auto_decode = False
        DLQ(channel).declare()
        producer = conn.Producer(channel=conn.channel())
        while True:
            message = channel.basic_get(DLQ.name, no_ack=False)
            if message is None:
                break
            letter = _dead_letter(message)
            if ids is not None and letter.message_id not in ids:
                continue  # stays unacked: returned to the queue when the channel closes
            if letter.message_id:
                client.delete(sent_key(letter.agent or None, letter.message_id),
                              deliveries_key(letter.agent, letter.message_id))
            if letter.connector:
                send_job(json.loads(letter.body), letter.connector)
            else:
                agent = letter.agent
                producer.publish(letter.body, exchange=INTENTS_EXCHANGE, routing_key="intent",
                                 content_type="application/json", content_encoding="utf-8", delivery_mode=2,
                                 message_id=letter.message_id or None,
                                 headers={"agent_id": agent} if agent else {})
            channel.basic_ack(message.delivery_info["delivery_tag"])
            replayed.append(letter.message_id)
        channel.close()
    return replayed
