"""`reach dlq list` and `reach dlq replay` against a running fleet: redacted previews, no second execution, identities kept."""

from __future__ import annotations

import json
import time
import uuid
from datetime import datetime
from typing import Any

import pytest
from kombu import Connection

from examples.ticket_system import TicketSystem
from producers.client import ReachClient
from tests.fleet import BROKER_URL, Fleet, purge, queue_depth
from tests.integration.operations.support import (
    CREATE,
    PLAIN,
    RUN,
    SECRET,
    TRACED,
    dlq_depth,
    reach,
    ticket_params,
)
from tests.waiting import wait_for
from workers.observability.redaction import REDACTED, REDACTED_HEADER
from workers.ops.fleet import list_dead_letters
from workers.transport.topology import DEFAULT_EXCHANGE, DLQ, INTENTS_EXCHANGE, connector_queue

# --------------------------------------------------------------------------- dead letters


def publish_dead_letter(body: bytes, message_id: str, headers: dict[str, Any]) -> None:
    with Connection(BROKER_URL, transport_options={"confirm_publish": True}) as conn:
        conn.Producer().publish(
            body,
            exchange=DEFAULT_EXCHANGE,
            routing_key=DLQ.name,
            content_type="application/json",
            content_encoding="utf-8",
            delivery_mode=2,
            message_id=message_id,
            headers=headers,
        )


def publish_intent(body: bytes, message_id: str | None, headers: dict[str, Any]) -> None:
    with Connection(BROKER_URL, transport_options={"confirm_publish": True}) as conn:
        conn.Producer().publish(
            body,
            exchange=INTENTS_EXCHANGE,
            routing_key="intent",
            content_type="application/json",
            content_encoding="binary",
            delivery_mode=2,
            message_id=message_id,
            headers=headers,
        )


def test_dlq_list_shows_reason_agent_time_and_a_redacted_preview_without_removing(
    fleet: Fleet, tickets: TicketSystem, client: ReachClient
) -> None:
    purge(DLQ.name)
    not_json, wrong_shape, anonymous = (f"junk-{n}-{uuid.uuid4().hex[:8]}" for n in ("a", "b", "c"))
    publish_intent(b"{not json", not_json, {"agent_id": "ops_agent"})
    shaped = {"action": CREATE, "params": {"title": "t", "description": "d", "phone": SECRET}, "bogus": 1}
    publish_intent(json.dumps(shaped).encode(), wrong_shape, {"agent_id": "ops_agent"})
    publish_intent(b"garbage", anonymous, {})
    for intent_id in (not_json, wrong_shape):
        assert client.wait(intent_id, timeout=20).error.code == "INVALID_INTENT"
    wait_for(lambda: dlq_depth() == 3, 10, "the junk did not reach reach.dlq")

    listed = reach(fleet, "dlq", "list")
    assert listed.returncode == 0, listed.stderr
    # listing removes nothing (a quorum queue takes the returned letters back a moment after the CLI exits)
    wait_for(lambda: dlq_depth() == 3, 10, "`reach dlq list` removed dead letters")
    header, _, *rows = listed.stdout.splitlines()
    assert header.split() == ["message", "id", "received", "agent", "connector", "reason", "preview"]
    by_id = {row.split()[0]: row for row in rows}
    assert set(by_id) == {not_json, wrong_shape, anonymous}
    year = str(datetime.now().year)
    for message_id in (not_json, wrong_shape):
        assert "ops_agent" in by_id[message_id] and year in by_id[message_id]
    # unparsable bodies are kept without their content: the preview says so, with the size
    assert "JSON" in by_id[not_json] and "{not json" not in by_id[not_json] and "not kept: 9 bytes" in by_id[not_json]
    assert "bogus" in by_id[wrong_shape] and "garbage" not in by_id[anonymous] and "not kept: 7" in by_id[anonymous]
    assert SECRET not in listed.stdout
    # the table cuts the preview to its column; the full preview the CLI prints from is redacted too
    previews = {letter.message_id: letter.preview for letter in list_dead_letters(BROKER_URL)}
    assert f'"phone":"{REDACTED}"' in previews[wrong_shape] and SECRET not in "".join(previews.values())
    # a quorum queue takes returned messages back a moment after the channel has closed
    wait_for(lambda: dlq_depth() == 3, 10, "listing in-process removed dead letters")
    assert reach(fleet, "dlq", "list").stdout == listed.stdout  # and again: same letters, same order
    assert tickets.requests() == []
    wait_for(lambda: dlq_depth() == 3, 10, "the listed letters did not return before the next test purges")


@pytest.mark.parametrize("shape", ["router", "pool"])
def test_dlq_replay_of_an_executed_intent_does_not_execute_it_twice(
    fleet: Fleet, tickets: TicketSystem, client: ReachClient, shape: str
) -> None:
    purge(DLQ.name)
    intent_id = f"replay-{shape}-{uuid.uuid4().hex[:8]}"
    intent = {"intent_id": intent_id, "agent_id": "ops_agent", "action": CREATE, "params": ticket_params()}
    body = json.dumps(intent).encode()
    publish_intent(body, intent_id, {"agent_id": "ops_agent"})
    first = client.wait(intent_id, timeout=20)
    assert first.success and len(tickets.requests("POST")) == 1

    # as the router dead-letters an intent / as a pool dead-letters a job
    headers = {
        "x-reach-reason": "simulated",
        "x-reach-intent-id": intent_id,
        "x-reach-agent-id": "ops_agent",
        "x-reach-received-at": datetime.now().astimezone().isoformat(),
    }
    if shape == "pool":
        now = time.time()
        body = json.dumps(
            {
                "v": 1,
                **intent,
                "connector": TRACED,
                "action": "create_ticket",
                "idempotency_key": intent_id,
                "reply_to": "ops_agent",
                "deadline": None,
                "trace_id": first.execution.trace_id,
                "traceparent": None,
                "format": "native",
                "received_at": now,
                "dispatched_at": now,
            }
        ).encode()
        headers["x-reach-connector"] = TRACED
    publish_dead_letter(body, intent_id, headers)
    bystander = f"junk-{uuid.uuid4().hex[:8]}"
    publish_dead_letter(b"{junk", bystander, {"x-reach-reason": "not JSON", "x-reach-agent-id": "ops_agent"})
    wait_for(lambda: dlq_depth() == 2, 10, "the dead letters are not there")

    missing = reach(fleet, "dlq", "replay", "--id", f"nothing-{RUN}")
    assert missing.returncode == 1 and "not found" in missing.stdout
    # it took both and returned them unacked: a quorum queue has them back a moment later
    wait_for(lambda: dlq_depth() == 2, 10, "a replay that found nothing removed dead letters")

    replayed = reach(fleet, "dlq", "replay", "--id", intent_id)
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    assert "replayed 1 dead letter" in replayed.stdout
    wait_for(lambda: dlq_depth() == 1, 10, "the bystander did not return to reach.dlq")  # only that one left the queue
    again = client.wait(intent_id, timeout=20)
    assert again.success and again.execution.deduplicated is True
    assert again.data == first.data
    time.sleep(0.5)
    assert len(tickets.requests("POST")) == 1  # the idempotency key was kept: no second ticket
    assert dlq_depth() == 1
    assert [line.split()[0] for line in reach(fleet, "dlq", "list").stdout.splitlines()[2:]] == [bystander]
    wait_for(lambda: dlq_depth() == 1, 10, "the listed letter did not return before the next test purges")


def pool_letter(intent_id: str, connector: str, params: dict[str, Any]) -> tuple[bytes, dict[str, Any]]:
    """(body, headers) of a job dead-lettered by ``connector``'s pool, as ``PoolRuntime._dead_letter``
    writes it (the params as given: already redacted or not)."""
    now = time.time()
    job = {
        "v": 1,
        "intent_id": intent_id,
        "agent_id": "ops_agent",
        "connector": connector,
        "action": "create_ticket",
        "params": params,
        "idempotency_key": intent_id,
        "reply_to": "ops_agent",
        "deadline": None,
        "trace_id": uuid.uuid4().hex,
        "traceparent": None,
        "format": "native",
        "received_at": now,
        "dispatched_at": now,
    }
    headers = {
        "x-reach-reason": "delivered 6 times without finishing (a worker died each time)",
        "x-reach-intent-id": intent_id,
        "x-reach-agent-id": "ops_agent",
        "x-reach-connector": connector,
    }
    return json.dumps(job).encode(), headers


@pytest.mark.parametrize("written", ["with_header", "before_the_header"])
def test_dlq_replay_keeps_a_letter_whose_sensitive_params_were_redacted(
    fleet: Fleet, tickets: TicketSystem, client: ReachClient, written: str
) -> None:
    purge(DLQ.name)
    redacted_id, clean_id = (f"replay-{n}-{uuid.uuid4().hex[:8]}" for n in ("redacted", "clean"))
    body, headers = pool_letter(redacted_id, TRACED, ticket_params(phone=REDACTED))
    if written == "with_header":
        headers[REDACTED_HEADER] = "true"  # as pools mark it now; older letters only have the marker
    publish_dead_letter(body, redacted_id, headers)
    clean_body, clean_headers = pool_letter(clean_id, TRACED, ticket_params())
    publish_dead_letter(clean_body, clean_id, clean_headers)
    wait_for(lambda: dlq_depth() == 2, 10, "the dead letters are not there")

    done = reach(fleet, "dlq", "replay")
    assert done.returncode == 1, done.stdout + done.stderr
    assert (
        f"not replayed {redacted_id}: its sensitive params were redacted when it was dead-lettered; "
        "ask the agent to send the intent again"
    ) in done.stdout
    assert "replayed 1 dead letter(s); 1 kept in reach.dlq" in done.stdout and "not found" not in done.stdout
    # the other letter was replayed as before
    assert client.wait(clean_id, timeout=20).success
    # the redacted one stays (returned unacked: a quorum queue has it back a moment later), and asking
    # for it by id says the same, not "not found"
    wait_for(lambda: dlq_depth() == 1, 10, "the kept letter did not return to reach.dlq")
    assert [letter.message_id for letter in list_dead_letters(BROKER_URL)] == [redacted_id]
    wait_for(lambda: dlq_depth() == 1, 10, "listing in-process removed the kept letter")
    by_id = reach(fleet, "dlq", "replay", "--id", redacted_id)
    assert by_id.returncode == 1 and f"not replayed {redacted_id}:" in by_id.stdout
    assert "replayed 0 dead letter(s); 1 kept in reach.dlq" in by_id.stdout and "not found" not in by_id.stdout
    wait_for(lambda: dlq_depth() == 1, 10, "the replay by id did not return the kept letter")
    assert [letter.message_id for letter in list_dead_letters(BROKER_URL)] == [redacted_id]
    assert [r for r in client.receipts(timeout=1.0) if r.intent_id == redacted_id] == []
    assert len(tickets.requests("POST")) == 1  # only the clean letter's ticket
    assert all(REDACTED not in json.dumps(r, default=str) for r in tickets.requests())


def test_dlq_replay_sends_a_pool_job_as_the_router_does_and_it_runs_once(
    fleet: Fleet, plain: TicketSystem, client: ReachClient
) -> None:
    purge(DLQ.name)
    queue = connector_queue(PLAIN).name
    intent_id, raw_id = f"replay-wire-{uuid.uuid4().hex[:8]}", f"raw-{uuid.uuid4().hex[:8]}"
    params = ticket_params()
    body, headers = pool_letter(intent_id, PLAIN, params)
    publish_dead_letter(body, intent_id, headers)
    # a message that is not a job, as a pool dead-letters it (x-reach-queue, no x-reach-connector)
    raw = json.dumps([[json.loads(body)], {}, {}]).encode()
    publish_dead_letter(raw, raw_id, {"x-reach-reason": "not a reach.execute message", "x-reach-queue": queue})
    wait_for(lambda: dlq_depth() == 2, 10, "the dead letters are not there")
    try:
        assert reach(fleet, "pause", PLAIN).returncode == 0
        wait_for(lambda: queue_depth(queue)[1] == 0, 5, "the pool kept consuming after `reach pause`")
        done = reach(fleet, "dlq", "replay", "--id", intent_id, "--id", raw_id)
        assert done.returncode == 1, done.stdout + done.stderr
        # each once: the copy the router dead-letters again while the replay runs is left alone,
        # and the replay says the router refused it again instead of counting it as replayed
        assert "replayed 1 dead letter(s); 1 refused again by the router" in done.stdout
        assert f"not replayed {raw_id}: sent back, and refused again: INVALID_INTENT" in done.stdout
        # the job waits in the paused queue; the other went to the router, which dead-letters it again
        wait_for(lambda: queue_depth(queue) == (1, 0), 10, "the replayed job is not in the connector queue")
        wait_for(dlq_depth, 20, "the router did not dead-letter the replayed non-job again", until=lambda n: n == 1)
        assert [letter.message_id for letter in list_dead_letters(BROKER_URL)] == [raw_id]
        time.sleep(0.5)
        assert queue_depth(queue) == (1, 0)  # the non-job was never sent to the pool
        with Connection(BROKER_URL) as conn:
            channel = conn.channel()
            channel.auto_decode = False
            message = channel.basic_get(queue, no_ack=False)
            assert message is not None
            props, wire_headers = message.properties, message.properties["application_headers"]
            assert message.delivery_info["exchange"] == "reach.dispatch"
            assert props["delivery_mode"] == 2 and props["content_type"] == "application/json"
            assert wire_headers["task"] == "reach.execute" and wire_headers["id"].startswith(f"{intent_id}:")
            # protocol 2 as the router builds it: the params are in the body only
            assert wire_headers["argsrepr"] == "(job)" and wire_headers["kwargsrepr"] == "{}"
            assert params["title"] not in json.dumps(wire_headers, default=str)
            (job,), kwargs, _ = json.loads(message.body)
            assert job == json.loads(body) and kwargs == {}
            channel.close()  # unacked: back to the queue for the pool (a quorum queue: a moment later)
        wait_for(lambda: queue_depth(queue) == (1, 0), 10, "the job taken unacked did not return to the paused queue")
    finally:
        assert reach(fleet, "resume", PLAIN).returncode == 0
    receipt = client.wait(intent_id, timeout=30)
    assert receipt.success and not receipt.execution.deduplicated
    posts = plain.requests("POST")
    assert len(posts) == 1 and params["title"] in json.dumps(posts[0], default=str)
    assert [r for r in client.receipts(timeout=1.0) if r.intent_id == intent_id] == []  # exactly one receipt
    assert len(plain.requests("POST")) == 1
