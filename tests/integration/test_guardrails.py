"""Guardrails through the running fleet: rate limits, time windows, deadlines, redaction."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator

import pytest
from kombu import Connection

from examples.ticket_system import TicketSystem
from tests.fleet import BROKER_URL, Fleet, agent
from workers.transport.topology import DLQ, INTENTS_EXCHANGE, DeadLetterBounds, dead_letter_queue

CATALOG = """
connector:
  name: guarded
  endpoint: {url}
  actions:
    - action: create_ticket
      path: POST /tickets
      input:
        title: {{ type: string, required: true }}
        description: {{ type: string, required: true }}
        secret_note: {{ type: string, sensitive: true }}
      permission: write
    - action: query_ticket
      path: GET /tickets/{{tid}}
      input:
        tid: {{ type: string, required: true }}
    - action: closed_now
      path: GET /tickets/{{tid}}
      allowed_hours: "{closed}"
      input:
        tid: {{ type: string, required: true }}
---
agent_app:
  name: limited_{run}
  connector_bindings:
    - connector: guarded
      allowed_actions: ["*"]
      rate_limit: 5/min
"""


def closed_window() -> str:
    """A one-minute window two hours from now (UTC): closed for the whole test."""
    hour = (time.gmtime().tm_hour + 2) % 24
    return f"{hour:02d}:00-{hour:02d}:01 UTC"


RUN = uuid.uuid4().hex[:6]
AGENT = f"limited_{RUN}"


@pytest.fixture(scope="module")
def system() -> Iterator[TicketSystem]:
    downstream = TicketSystem().start()
    yield downstream
    downstream.stop()


@pytest.fixture(scope="module")
def fleet(system: TicketSystem) -> Iterator[Fleet]:
    with Fleet(CATALOG.format(url=system.url, closed=closed_window(), run=RUN), ["guarded"]) as running:
        yield running


def test_burst_of_twelve_against_five_per_minute_executes_exactly_five(fleet: Fleet, system: TicketSystem) -> None:
    system.state.reset()
    with agent(AGENT) as client:
        ids = [client.publish("create_ticket", {"title": f"t{i}", "description": "d"}) for i in range(12)]
        receipts = [client.wait(i, timeout=20) for i in ids]
    assert sum(r.success for r in receipts) == 5
    limited = [r for r in receipts if not r.success]
    assert len(limited) == 7 and {r.error.code for r in limited} == {"RATE_LIMITED"}
    assert all(r.error.retryable and r.error.retry_after_ms and r.error.retry_after_ms > 0 for r in limited)
    assert len(system.requests("POST")) == 5


def test_outside_time_window_never_reaches_the_system(fleet: Fleet, system: TicketSystem) -> None:
    system.state.reset()
    # the rate limit (5/min) is spent by the test above; a fresh agent would need a catalog
    # entry, so check the order instead: the window is checked before the rate limit
    with agent(AGENT) as client:
        receipt = client.call("closed_now", {"tid": "TK-1"}, timeout=20)
    assert receipt.error is not None and receipt.error.code == "OUTSIDE_TIME_WINDOW"
    assert receipt.error.retry_after_ms and receipt.error.retry_after_ms > 3600 * 1000
    assert system.requests() == []


def test_dead_letters_never_hold_sensitive_values(fleet: Fleet, system: TicketSystem) -> None:
    with Connection(BROKER_URL) as conn:
        dlq = dead_letter_queue(DeadLetterBounds())  # declared as the fleet declares it
        dlq(conn.default_channel).declare()
        conn.default_channel.queue_purge(DLQ.name)
        message_id = f"sens-{uuid.uuid4().hex[:8]}"
        # a duplicate key makes the intent unreadable as a contract, but its params are known
        body = json.dumps(
            {
                "agent_id": AGENT,
                "action": "create_ticket",
                "intent_id": 5,
                "params": {"title": "x", "description": "d", "secret_note": "the-vault-code-1234"},
            }
        )
        with Connection(BROKER_URL, transport_options={"confirm_publish": True}) as pub:
            pub.Producer().publish(
                body.encode(),
                exchange=INTENTS_EXCHANGE,
                routing_key="intent",
                message_id=message_id,
                content_type="application/json",
                delivery_mode=2,
            )
        got = []
        deadline = time.time() + 15
        while time.time() < deadline and not got:
            message = conn.default_channel.basic_get(DLQ.name, no_ack=True)
            if message is not None and message.properties.get("message_id") == message_id:
                got.append(message)
            elif message is None:
                time.sleep(0.1)
    assert got, "the invalid intent was not dead-lettered"
    raw = got[0].body if isinstance(got[0].body, bytes) else got[0].body.encode()
    assert b"the-vault-code-1234" not in raw and b"[redacted]" in raw
    assert "intent_id" in got[0].headers["x-reach-reason"]
