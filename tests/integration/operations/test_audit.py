"""The audit trail through a running fleet: one line per stage, redacted digests, `reach trace` and audit levels."""

from __future__ import annotations

import json
import re
import time
from typing import Any

import redis

from examples.ticket_system import TicketSystem
from producers.client import ReachClient
from tests.fleet import REDIS_URL, Fleet, agent
from tests.integration.operations.support import (
    CREATE,
    POOLS,
    QUERY,
    RUN,
    SECRET,
    TRACED,
    all_redis_text,
    audit_events,
    log_lines,
    new_traceparent,
    reach,
    ticket_params,
)
from tests.waiting import wait_for
from workers.observability.audit import params_digest
from workers.observability.redaction import REDACTED
from workers.state import keys

# --------------------------------------------------------------------------- audit


def test_one_audit_line_per_stage_with_a_redacted_params_digest(
    fleet: Fleet, tickets: TicketSystem, client: ReachClient
) -> None:
    traceparent, trace_id, _ = new_traceparent()
    params = ticket_params(phone=SECRET)
    receipt = client.call(CREATE, params, traceparent=traceparent, timeout=20)
    assert receipt.success
    assert tickets.requests("POST")[0]["body"]["phone"] == SECRET  # the value was real, and went downstream
    events = wait_for(
        lambda: audit_events(fleet, receipt.intent_id), 10, "audit lines missing", until=lambda found: len(found) >= 4
    )
    assert [e["stage"] for e in events] == ["received", "dispatched", "attempt", "receipt"]
    for event in events:
        assert (event["agent"], event["action"], event["connector"], event["trace_id"]) == (
            "ops_agent",
            "create_ticket",
            TRACED,
            trace_id,
        ), event
    received, dispatched, attempt, final = events
    assert received["process"] == dispatched["process"] == "router" and received["format"] == "native"
    assert attempt["process"] == final["process"] == f"pool:{TRACED}"
    assert dispatched["param_keys"] == ["description", "phone", "title"]
    assert dispatched["params_digest"] == params_digest(dict(params, phone=REDACTED))
    assert attempt["outcome"] == "ok" and attempt["http_status"] == 201 and attempt["downstream_ms"] > 0
    assert final["status"] == "succeeded" and final["latency_ms"] > 0 and final["attempts"] == 1
    # the digest is taken after redaction: another phone number gives the same digest
    again = client.call(CREATE, dict(params, phone="+1-555-0100"), timeout=20)
    other = wait_for(
        lambda: [e for e in audit_events(fleet, again.intent_id) if e["stage"] == "dispatched"],
        10,
        "no dispatched line",
    )
    assert other[0]["params_digest"] == dispatched["params_digest"]

    assert SECRET not in "\n".join(log_lines(fleet, "router", *POOLS, "beat"))
    assert SECRET not in all_redis_text()


def test_an_answered_intent_leaves_its_receipt_and_sent_mark_but_no_delivery_count(
    fleet: Fleet, tickets: TicketSystem, client: ReachClient
) -> None:
    """The delivery counter only matters until the receipt is out: kept for 24 h it was a fifth
    of the keys the fleet stores per intent."""
    receipt = client.call(CREATE, ticket_params(), timeout=20)
    assert receipt.success
    store = redis.Redis.from_url(REDIS_URL)
    agent = receipt.agent_id
    # the sent mark is written once the broker confirmed the receipt, just after the agent has it
    wait_for(lambda: store.exists(keys.sent(agent, receipt.intent_id)), 10, "no sent mark")
    assert store.exists(keys.receipt(agent, receipt.intent_id)) == 1
    assert store.exists(keys.deliveries(agent, receipt.intent_id)) == 0, "the delivery count outlived the receipt"


def test_rejected_intent_audit_lines_received_rejected_receipt(
    fleet: Fleet, tickets: TicketSystem, client: ReachClient
) -> None:
    traceparent, trace_id, _ = new_traceparent()
    receipt = client.call(CREATE, {"description": "no title", "phone": SECRET}, traceparent=traceparent, timeout=20)
    assert receipt.error.code == "VALIDATION_FAILED"
    events = wait_for(
        lambda: audit_events(fleet, receipt.intent_id), 10, "audit lines missing", until=lambda found: len(found) >= 3
    )
    assert [e["stage"] for e in events] == ["received", "rejected", "receipt"]
    assert all(
        e["process"] == "router"
        and e["trace_id"] == trace_id
        and e["agent"] == "ops_agent"
        and e["action"] == "create_ticket"
        and e["connector"] == TRACED
        for e in events
    ), events
    assert events[1]["code"] == "VALIDATION_FAILED"
    assert events[2]["status"] == "rejected" and events[2]["code"] == "VALIDATION_FAILED" and "latency_ms" in events[2]
    assert tickets.requests() == []
    assert SECRET not in "\n".join(log_lines(fleet, "router", *POOLS, "beat"))
    assert SECRET not in all_redis_text()


def test_rejected_intent_audit_line_has_a_redacted_params_digest(
    fleet: Fleet, tickets: TicketSystem, client: ReachClient
) -> None:
    params = {"description": "no title", "phone": SECRET}
    receipt = client.call(CREATE, params, timeout=20)
    events = wait_for(
        lambda: audit_events(fleet, receipt.intent_id), 10, "audit lines missing", until=lambda found: len(found) >= 3
    )
    (rejected,) = [e for e in events if e["stage"] == "rejected"]
    assert rejected["params_digest"] == params_digest(dict(params, phone=REDACTED))


def test_reach_trace_prints_the_stages_in_order_with_timings(
    fleet: Fleet, tickets: TicketSystem, client: ReachClient
) -> None:
    tickets.state.fail_status, tickets.state.fail_count = 503, 1
    receipt = client.call(QUERY, {"tid": "TK-0404"}, timeout=20)
    assert receipt.execution.attempts == 2
    done = wait_for(
        lambda: reach(fleet, "trace", receipt.intent_id),
        10,
        "reach trace never showed five stages",
        until=lambda run: run.stdout.count("\n") >= 5,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    parsed = parse_trace(done.stdout)
    stages = [stage for _, stage, _ in parsed]
    offsets = [offset for offset, _, _ in parsed]
    assert stages == ["received", "dispatched", "attempt", "attempt", "receipt"]
    assert offsets[0] == 0.0 and offsets == sorted(offsets), offsets
    assert f"trace_id={receipt.execution.trace_id}" in lines[0]
    assert "outcome=DOWNSTREAM_ERROR" in lines[2] and "attempt=2" in lines[3]
    assert "status=failed" in lines[4] and "code=DOWNSTREAM_NOT_FOUND" in lines[4]

    assert "agent ops_agent" in done.stderr  # found without --agent, and named
    chosen = reach(fleet, "trace", receipt.intent_id, "--agent", "ops_agent")
    assert chosen.returncode == 0 and chosen.stdout == done.stdout, chosen.stderr
    elsewhere = reach(fleet, "trace", receipt.intent_id, "--agent", "ops_reader")
    assert elsewhere.returncode == 1 and "no stages recorded" in elsewhere.stderr

    unknown = reach(fleet, "trace", f"never-{RUN}")
    assert unknown.returncode == 1 and "no stages recorded" in unknown.stderr


def test_reach_trace_of_an_intent_id_two_agents_used_names_both_and_each_has_its_own(
    fleet: Fleet, tickets: TicketSystem
) -> None:
    intent_id = f"shared-{RUN}"
    for agent_id, tid in (("ops_agent", "TK-0201"), ("ops_reader", "TK-0202")):
        with agent(agent_id) as reach_client:
            reach_client.publish(QUERY, {"tid": tid}, intent_id=intent_id)
            assert reach_client.wait(intent_id, timeout=20).agent_id == agent_id
    both = wait_for(
        lambda: reach(fleet, "trace", intent_id),
        10,
        "reach trace never saw both agents",
        until=lambda run: "ops_reader" in run.stderr,
    )
    assert both.returncode == 1 and "ops_agent, ops_reader" in both.stderr and "--agent" in both.stderr
    for agent_id, _tid in (("ops_agent", "TK-0201"), ("ops_reader", "TK-0202")):
        mine = wait_for(
            lambda: reach(fleet, "trace", intent_id, "--agent", agent_id),
            10,
            "no receipt stage",
            until=lambda run: "receipt" in run.stdout,
        )
        assert mine.returncode == 0, mine.stderr
        assert {f"agent={agent_id}"} == {
            word for line in mine.stdout.splitlines() for word in line.split() if word.startswith("agent=")
        }


def test_audit_level_summary_writes_only_the_receipt_and_none_writes_nothing(
    fleet: Fleet, tickets: TicketSystem
) -> None:
    seen: dict[str, list[str]] = {}
    for agent_id in ("ops_summary", "ops_silent"):
        with agent(agent_id) as reach_client:
            ok = reach_client.call(CREATE, ticket_params(), timeout=20)
            rejected = reach_client.call(CREATE, {"description": "no title"}, timeout=20)
        assert ok.success and rejected.error.code == "VALIDATION_FAILED"
        seen[agent_id] = [ok.intent_id, rejected.intent_id]
    time.sleep(1.0)  # any stray line would be written by now
    for intent_id in seen["ops_summary"]:
        events = wait_for(lambda: audit_events(fleet, intent_id), 10, "no receipt line under audit_level summary")
        assert [e["stage"] for e in events] == ["receipt"]
        assert [e["stage"] for e in json_trace("ops_summary", intent_id)] == ["receipt"]
    for intent_id in seen["ops_silent"]:
        assert audit_events(fleet, intent_id) == []
        assert json_trace("ops_silent", intent_id) == []
        assert reach(fleet, "trace", intent_id).returncode == 1
    summary = reach(fleet, "trace", seen["ops_summary"][0])
    assert summary.returncode == 0 and [stage for _, stage, _ in parse_trace(summary.stdout)] == ["receipt"]


def parse_trace(output: str) -> list[tuple[float, str, str]]:
    """`reach trace` lines: ``+<ms since the first stage> ms  <stage> <key=value ...>``."""
    parsed = []
    for line in output.splitlines():
        match = re.match(r"^\+\s*(-?[0-9.]+) ms\s+(\w+)\s*(.*)$", line)
        assert match, f"not a trace line: {line!r}"
        parsed.append((float(match.group(1)), match.group(2), match.group(3)))
    return parsed


def json_trace(agent_id: str, intent_id: str) -> list[dict[str, Any]]:
    return [json.loads(raw) for raw in redis.Redis.from_url(REDIS_URL).lrange(keys.trace(agent_id, intent_id), 0, -1)]
