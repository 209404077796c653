"""Redis keys are namespaced by agent: one agent's intent ids can never answer, overwrite or
reveal another agent's intent (docs/contract.md section 4, limits against hostile input; workers/state/keys.py)."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from examples.ticket_system import TicketSystem
from producers.wire import Receipt
from tests.fleet import REDIS_URL, Fleet, agent
from workers.state import keys

RUN = uuid.uuid4().hex[:8]
CONNECTOR = "keyspace_tickets"
CREATE = f"{CONNECTOR}.create_ticket"
DESK, DESK_EU = "desk", "desk_eu"

CATALOG = f"""
connector:
  name: {CONNECTOR}
  endpoint: {{url}}
  actions:
    - action: create_ticket
      path: POST /tickets
      input:
        title: {{{{ type: string, required: true }}}}
        description: {{{{ type: string, required: true }}}}
      permission: write
      idempotent: false
""" + "".join(
    f"""
---
agent_app:
  name: {name}
  connector_bindings:
    - connector: {CONNECTOR}
      allowed_actions: ["*"]
"""
    for name in (DESK, DESK_EU)
)


@pytest.fixture(scope="module")
def system() -> Iterator[TicketSystem]:
    downstream = TicketSystem().start()
    yield downstream
    downstream.stop()


@pytest.fixture(scope="module")
def fleet(system: TicketSystem) -> Iterator[Fleet]:
    with Fleet(CATALOG.format(url=system.url), [CONNECTOR]) as running:
        yield running


def send(agent_id: str, intent_id: str, title: str) -> Receipt:
    with agent(agent_id) as client:
        client.publish(CREATE, {"title": title, "description": agent_id}, intent_id=intent_id)
        return client.wait(intent_id, timeout=20)


def stored(agent_id: str, intent_id: str) -> dict[str, Any]:
    raw = redis.Redis.from_url(REDIS_URL).get(keys.receipt(agent_id, intent_id))
    assert raw is not None, f"no stored receipt for {agent_id}'s {intent_id}"
    return json.loads(raw)


def trace_agents(agent_id: str, intent_id: str, stages: int) -> set[str]:
    """The ``agent`` of every audit line kept for this agent's intent, once ``stages`` are there."""
    client = redis.Redis.from_url(REDIS_URL)
    deadline = time.time() + 10
    while True:
        lines = [json.loads(raw) for raw in client.lrange(keys.trace(agent_id, intent_id), 0, -1)]
        if len(lines) >= stages or time.time() > deadline:
            return {line["agent"] for line in lines}
        time.sleep(0.1)


def titles(system: TicketSystem) -> list[str]:
    return [request["body"]["title"] for request in system.requests("POST")]


def test_one_agents_intent_id_never_answers_or_overwrites_another_agents_intent(
    fleet: Fleet, system: TicketSystem
) -> None:
    system.state.reset()
    # the pair that once shared "desk:eu:ORDER-…": agent desk's "eu:ORDER-…" and desk_eu's "ORDER-…"
    a = send(DESK, f"eu:ORDER-{RUN}", "desk's eu order")
    b = send(DESK_EU, f"ORDER-{RUN}", "desk_eu's order")
    assert a.success and b.success, (a, b)
    assert not b.execution.deduplicated and a.data["ticket_id"] != b.data["ticket_id"]
    assert titles(system) == ["desk's eu order", "desk_eu's order"]  # B's intent was not "already answered"

    # desk now reuses desk_eu's intent id: its own receipt and call, and desk_eu's record stays desk_eu's
    c = send(DESK, f"ORDER-{RUN}", "desk reusing the id")
    assert c.success and c.agent_id == DESK and not c.execution.deduplicated
    assert c.data["ticket_id"] not in (a.data["ticket_id"], b.data["ticket_id"])
    assert titles(system) == ["desk's eu order", "desk_eu's order", "desk reusing the id"]

    kept_b, kept_c = stored(DESK_EU, f"ORDER-{RUN}"), stored(DESK, f"ORDER-{RUN}")
    assert kept_b != kept_c
    assert (kept_b["agent_id"], kept_b["data"]["ticket_id"]) == (DESK_EU, b.data["ticket_id"])
    assert (kept_c["agent_id"], kept_c["data"]["ticket_id"]) == (DESK, c.data["ticket_id"])
    assert stored(DESK, f"eu:ORDER-{RUN}")["data"]["ticket_id"] == a.data["ticket_id"]
    # received, dispatched, attempt, receipt: each trace holds its own agent's stages only
    assert trace_agents(DESK_EU, f"ORDER-{RUN}", 4) == {DESK_EU}
    assert trace_agents(DESK, f"ORDER-{RUN}", 4) == {DESK}


def test_an_intent_answered_for_one_agent_is_not_answered_for_another(fleet: Fleet, system: TicketSystem) -> None:
    """Exactly one receipt per intent, per agent: desk resending its own id gets nothing more,
    while desk_eu sending that same id afterwards is a new intent of its own."""
    system.state.reset()
    intent_id = f"RESEND-{RUN}"
    first = send(DESK, intent_id, "first")
    with agent(DESK) as client:
        client.publish(CREATE, {"title": "first", "description": DESK}, intent_id=intent_id)
        assert list(client.receipts(timeout=2.0)) == []  # already answered: acked without a receipt
    other = send(DESK_EU, intent_id, "other")
    assert first.success and other.success and not other.execution.deduplicated
    assert other.agent_id == DESK_EU and other.data != first.data
    assert titles(system) == ["first", "other"]
