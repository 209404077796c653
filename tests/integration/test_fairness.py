"""Fair consumption through the running router: one agent's flood does not hold another's intents
behind it (workers/transport/consuming.py; the figures of record are bench/fairness.py's, BENCHMARKS.md)."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from datetime import datetime
from typing import Any
from urllib.parse import unquote, urlsplit

import amqp
import pytest

from examples.ticket_system import TicketSystem
from tests.fleet import BROKER_URL, Fleet, queue_depth
from workers.transport.topology import INTENTS_QUEUE

RUN = uuid.uuid4().hex[:6]
FLOODER = f"flood_{RUN}"
CALM = f"calm_{RUN}"
FLOOD = 1500
CATALOG = f"""
connector:
  name: fairdesk
  endpoint: {{url}}
  pool: {{{{ concurrency: 8 }}}}
  actions:
    - action: create_ticket
      path: POST /tickets
      input:
        title: {{{{ type: string, required: true }}}}
        description: {{{{ type: string, required: true }}}}
      permission: write
---
agent_app:
  name: {FLOODER}
  connector_bindings:
    - connector: fairdesk
      allowed_actions: ["*"]
      rate_limit: 10/sec
---
agent_app:
  name: {CALM}
  connector_bindings:
    - connector: fairdesk
      allowed_actions: ["*"]
"""


@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    system = TicketSystem().start()
    try:
        with Fleet(CATALOG.format(url=system.url), ["fairdesk"]) as running:
            yield running
    finally:
        system.stop()


def _connect() -> amqp.Connection:
    parts = urlsplit(BROKER_URL)
    conn = amqp.Connection(
        host=f"{parts.hostname or '127.0.0.1'}:{parts.port or 5672}",
        userid=unquote(parts.username or "guest"),
        password=unquote(parts.password or "guest"),
        virtual_host=unquote(parts.path[1:]) if parts.path not in ("", "/") else "/",
        connect_timeout=10,
    )
    conn.connect()
    return conn


def _flood(kind: str) -> None:
    """A's intents, published as fast as the broker takes them (one connection, no confirms)."""
    conn = _connect()
    try:
        ch = conn.channel()
        for i in range(FLOOD):
            intent_id = f"flood-{RUN}-{kind}-{i}"
            if kind == "valid":
                body = json.dumps(
                    {
                        "intent_id": intent_id,
                        "agent_id": FLOODER,
                        "action": "create_ticket",
                        "params": {"title": f"f{i}", "description": "d"},
                    }
                ).encode()
                headers: dict[str, Any] = {}
            else:
                body, headers = b'{"action": "create_ticket", "params": {"title": ', {"agent_id": FLOODER}
            ch.basic_publish(
                amqp.Message(
                    body,
                    content_type="application/json",
                    delivery_mode=2,
                    message_id=intent_id,
                    application_headers=headers,
                ),
                exchange="reach.intents",
                routing_key="intent",
            )
        ch.close()
    finally:
        conn.close()


def _calm_overtaken(seconds: float, during: Any) -> list[int]:
    """B: one intent every 50 ms for ``seconds`` (``during`` runs once B is going). For each of B's
    intents: how many flood intents the router finished between B's publish and B's own receipt
    (by the receipts' finished_at; same machine, same clock). Behind a FIFO that is the whole
    backlog; with fair lanes, a few. Counts, not milliseconds: the machine's speed does not change
    them much. A receipt that never comes counts as the whole flood."""
    conn = _connect()
    ch = conn.channel()
    queue, _, _ = ch.queue_declare("", exclusive=True, auto_delete=True)
    ch.queue_bind(queue, exchange="reach.receipts", routing_key=CALM)
    ch.queue_bind(queue, exchange="reach.receipts", routing_key=FLOODER)
    published: dict[str, float] = {}
    finished: dict[str, float] = {}
    flood_finished: list[float] = []
    statuses: list[str] = []

    def on_receipt(message: amqp.Message) -> None:
        receipt = json.loads(message.body)
        at = datetime.fromisoformat(receipt["execution"]["finished_at"].replace("Z", "+00:00")).timestamp()
        if message.delivery_info.get("routing_key") == FLOODER:
            flood_finished.append(at)
            return
        intent_id = message.properties.get("correlation_id")
        if intent_id in published and intent_id not in finished:
            finished[intent_id] = at
            statuses.append(receipt["status"])

    ch.basic_consume(queue, callback=on_receipt, no_ack=True)

    def drain(timeout: float) -> None:
        try:
            conn.drain_events(timeout=max(timeout, 0.001))
        except TimeoutError:
            pass

    try:
        t0 = time.perf_counter()
        i = 0
        while time.perf_counter() - t0 < seconds:
            if i == 4:
                during()  # B has been going for 200 ms; the flood is published while B goes on
            while (left := t0 + i * 0.05 - time.perf_counter()) > 0:
                drain(left)
            intent_id = f"calm-{RUN}-{uuid.uuid4().hex[:6]}"
            published[intent_id] = time.time()
            ch.basic_publish(
                amqp.Message(
                    json.dumps(
                        {
                            "intent_id": intent_id,
                            "agent_id": CALM,
                            "action": "create_ticket",
                            "params": {"title": f"c{i}", "description": "d"},
                        }
                    ).encode(),
                    content_type="application/json",
                    message_id=intent_id,
                ),
                exchange="reach.intents",
                routing_key="intent",
            )
            i += 1
        deadline = time.time() + 60
        while (len(finished) < len(published) or len(flood_finished) < FLOOD) and time.time() < deadline:
            drain(0.2)
    finally:
        conn.close()
    assert statuses and set(statuses) == {"succeeded"}, statuses
    return sorted(
        sum(1 for f in flood_finished if published[k] <= f <= finished[k]) if k in finished else FLOOD
        for k in published
    )


def _wait_drained(timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while queue_depth(INTENTS_QUEUE.name)[0] > 0 and time.time() < deadline:
        time.sleep(0.2)


@pytest.mark.parametrize("kind", ["valid", "invalid"])
def test_a_flood_from_one_agent_does_not_hold_back_another(fleet: Fleet, kind: str) -> None:
    _wait_drained()
    overtaken = _calm_overtaken(4.0, lambda: _flood(kind))
    p95 = overtaken[max(0, int(round(0.95 * len(overtaken) + 0.5)) - 1)]
    # the time it takes is bench/fairness.py's to measure (BENCHMARKS.md "Fairness under a flood")
    median = overtaken[len(overtaken) // 2]
    # in arrival order B waits behind the whole backlog (median ~half the flood, p95 nearly all of
    # it); with fair lanes only the read-ahead of the flood's first moment holds it back
    assert median <= FLOOD // 10 and p95 <= FLOOD // 2, f"B waited behind {overtaken} flood intents ({kind})"
    _wait_drained()
    fleet.check_alive()
