"""W3C trace context through a running fleet: continued in receipts, audit lines and every downstream attempt, with spans."""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

import pytest

from examples.ticket_system import TicketSystem
from producers.client import ReachClient
from tests.fleet import Fleet
from tests.integration.operations.support import (
    CREATE,
    PLAIN,
    POOLS,
    QUERY,
    TRACED,
    audit_events,
    downstream_traceparents,
    new_traceparent,
    spans,
    ticket_params,
)
from tests.waiting import wait_for

# --------------------------------------------------------------------------- tracing


@pytest.mark.parametrize("connector", POOLS)
def test_traceparent_is_continued_in_receipt_audit_and_every_downstream_attempt(
    fleet: Fleet, systems: dict[str, TicketSystem], client: ReachClient, connector: str
) -> None:
    system = systems[connector]
    system.state.reset()
    system.state.fail_status, system.state.fail_count = 503, 2
    traceparent, trace_id, _ = new_traceparent()
    receipt = client.call(f"{connector}.query_ticket", {"tid": "TK-0777"}, traceparent=traceparent, timeout=20)
    assert receipt.execution.trace_id == trace_id
    assert receipt.execution.attempts == 3 and receipt.error.code == "DOWNSTREAM_NOT_FOUND"
    sent = downstream_traceparents(system, "/tickets/TK-0777")
    assert [t for t, _ in sent] == [trace_id] * 3
    events = wait_for(
        lambda: audit_events(fleet, receipt.intent_id), 10, "audit lines missing", until=lambda found: len(found) >= 6
    )
    assert [e["stage"] for e in events] == ["received", "dispatched", "attempt", "attempt", "attempt", "receipt"]
    assert {e["trace_id"] for e in events} == {trace_id}


@pytest.mark.parametrize(
    "connector",
    [
        TRACED,
        PLAIN,
    ],
)
def test_each_downstream_attempt_is_a_new_span_of_the_same_trace(
    fleet: Fleet, systems: dict[str, TicketSystem], client: ReachClient, connector: str
) -> None:
    system = systems[connector]
    system.state.reset()
    system.state.fail_status, system.state.fail_count = 503, 2
    traceparent, trace_id, agent_span = new_traceparent()
    receipt = client.call(f"{connector}.query_ticket", {"tid": "TK-0778"}, traceparent=traceparent, timeout=20)
    assert receipt.execution.attempts == 3
    sent = downstream_traceparents(system, "/tickets/TK-0778")
    span_ids = [s for _, s in sent]
    assert len(sent) == 3 and len(set(span_ids)) == 3, sent
    assert agent_span not in span_ids  # each attempt is a child span, not the agent's own


@pytest.mark.parametrize("connector", POOLS)
def test_intent_without_traceparent_gets_a_fresh_trace_also_sent_downstream(
    fleet: Fleet, systems: dict[str, TicketSystem], client: ReachClient, connector: str
) -> None:
    system = systems[connector]
    system.state.reset()
    receipt = client.call(f"{connector}.query_ticket", {"tid": "TK-0779"}, timeout=20)
    trace_id = receipt.execution.trace_id
    assert re.fullmatch(r"[0-9a-f]{32}", trace_id) and trace_id != "0" * 32
    assert [t for t, _ in downstream_traceparents(system, "/tickets/TK-0779")] == [trace_id]
    events = wait_for(
        lambda: audit_events(fleet, receipt.intent_id), 10, "audit lines missing", until=lambda found: len(found) >= 4
    )
    assert {e["trace_id"] for e in events} == {trace_id}
    other = client.call(f"{connector}.query_ticket", {"tid": "TK-0779"}, timeout=20)
    assert other.execution.trace_id != trace_id  # a new trace per intent


def test_traceparent_amqp_header_is_continued(fleet: Fleet, tickets: TicketSystem, client: ReachClient) -> None:
    traceparent, trace_id, _ = new_traceparent()
    intent_id = f"hdr-{uuid.uuid4().hex[:10]}"
    body = {"intent_id": intent_id, "agent_id": "ops_agent", "action": QUERY, "params": {"tid": "TK-0780"}}
    client.publish_raw(
        json.dumps(body).encode(), headers={"agent_id": "ops_agent", "traceparent": traceparent}, message_id=intent_id
    )
    receipt = client.wait(intent_id, timeout=20)
    assert receipt.execution.trace_id == trace_id
    assert [t for t, _ in downstream_traceparents(tickets, "/tickets/TK-0780")] == [trace_id]


def test_console_exporter_emits_route_queue_wait_and_downstream_spans_on_the_trace(
    fleet: Fleet, tickets: TicketSystem, plain: TicketSystem, client: ReachClient
) -> None:
    traceparent, trace_id, _ = new_traceparent()
    receipt = client.call(CREATE, ticket_params(), traceparent=traceparent, timeout=20)
    assert receipt.success

    def on_trace(name: str) -> list[dict[str, Any]]:
        return [s for s in spans(fleet, name) if s["context"]["trace_id"] == f"0x{trace_id}"]

    pool_spans = wait_for(lambda: on_trace(TRACED), 10, "no pool spans", until=lambda found: len(found) >= 2)
    router_spans = wait_for(lambda: on_trace("router"), 10, "no router span")
    assert sorted(s["name"] for s in pool_spans) == ["reach.downstream_call", "reach.queue_wait"]
    assert [s["name"] for s in router_spans] == ["reach.route"]
    assert router_spans[0]["attributes"]["reach.connector"] == TRACED
    # the downstream's parent is the downstream_call span
    (call,) = [s for s in pool_spans if s["name"] == "reach.downstream_call"]
    ((_, sent_span),) = downstream_traceparents(tickets, "/tickets")
    assert call["context"]["span_id"] == f"0x{sent_span}"
    # without an SDK nothing is recorded: the plain pool prints no spans at all
    assert client.call(f"{PLAIN}.query_ticket", {"tid": "TK-1"}, traceparent=traceparent, timeout=20).error
    assert spans(fleet, PLAIN) == []
