"""An intent that waits for a person cannot lose its receipt to another message with its id, and a
repeat of its request (a new intent id, the same idempotency key) never asks a person twice.

Before: a resend of a waiting intent id with other params or a mistyped action was answered
(UNKNOWN_ACTION, INVALID_INTENT...) and so marked the id answered; the approved job was then acked
by its pool as "already has its receipt": never run, no receipt. A repeat of the key parked a
second approval of the same request.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import redis

from producers.client import ReachClient, ReceiptTimeout
from producers.wire import ApprovalNotice, ErrorCode
from tests.fleet import BROKER_URL, REDIS_URL, Fleet
from tests.integration.counting_system import CountingSystem
from tests.waiting import wait_for
from workers.ops import approval_decisions as approvals

AGENT = "resend_bot"
CONNECTOR = "resend_shop"


def catalog(url: str) -> str:
    return f"""
connector:
  name: {CONNECTOR}
  endpoint: {url}
  idempotency_header: Idempotency-Key
  actions:
    - action: refund
      description: Refund an order
      path: POST /items
      permission: write
      input:
        title: {{ type: string, required: true }}
        amount: {{ type: number, required: true }}
      approval:
        when: "amount > 500"
        approvers: [finance]
---
approvers:
  finance: [alice]
---
agent_app:
  name: {AGENT}
  connector_bindings:
    - connector: {CONNECTOR}
      allowed_actions: ["*"]
"""


@pytest.fixture(scope="module")
def system() -> Iterator[CountingSystem]:
    running = CountingSystem().start()
    yield running
    running.stop()


@pytest.fixture(scope="module")
def fleet(system: CountingSystem) -> Iterator[Fleet]:
    with Fleet(catalog(system.url), [CONNECTOR]) as running:
        yield running


@pytest.fixture(scope="module")
def store() -> redis.Redis:
    return redis.Redis.from_url(REDIS_URL)


@pytest.fixture
def client(fleet: Fleet) -> Iterator[ReachClient]:
    notices: list[ApprovalNotice] = []
    with ReachClient(
        AGENT, BROKER_URL, reply_to=f"{AGENT}.{uuid.uuid4().hex[:8]}", drop_duplicates=False, on_notice=notices.append
    ) as reach:
        reach.seen_notices = notices  # type: ignore[attr-defined]
        yield reach


def notices_of(client: ReachClient, intent_id: str) -> list[ApprovalNotice]:
    return [n for n in client.seen_notices if n.intent_id == intent_id]  # type: ignore[attr-defined]


def wait_notices(client: ReachClient, intent_id: str, count: int, timeout: float = 20) -> list[ApprovalNotice]:
    """Wait until ``count`` notices came for the intent; a receipt meanwhile fails the test."""

    def seen() -> int:
        try:
            receipt = client.wait(intent_id, timeout=0.2)
        except ReceiptTimeout:
            return len(notices_of(client, intent_id))
        raise AssertionError(f"a receipt came while the intent waits: {receipt}")

    wait_for(seen, timeout, f"not {count} notices for {intent_id}", until=lambda n: n >= count)
    return notices_of(client, intent_id)


def no_receipt(client: ReachClient, intent_id: str, seconds: float = 1.5) -> None:
    with pytest.raises(ReceiptTimeout):
        client.wait(intent_id, timeout=seconds)


def pending_of(store: redis.Redis, *intent_ids: str) -> list[approvals.PendingApproval]:
    return [p for p in approvals.list_pending(store, 10_000) if p.intent_id in intent_ids]


def test_a_resend_of_a_waiting_intent_id_gets_the_notice_again_and_the_approval_its_receipt(
    client: ReachClient, system: CountingSystem, store: redis.Redis
) -> None:
    intent = f"wait-{uuid.uuid4().hex[:8]}"
    client.publish("refund", {"title": "resend-1", "amount": 900}, intent_id=intent)
    [first] = wait_notices(client, intent, 1)

    # the same id: a typo in the action, params the schema refuses, and params that would need no
    # approval at all (and so would be dispatched at once)
    client.publish("refnud", {"title": "resend-1", "amount": 900}, intent_id=intent)
    client.publish("refund", {"title": "resend-1", "amount": "lots"}, intent_id=intent)
    client.publish("refund", {"title": "resend-1-small", "amount": 5}, intent_id=intent)
    seen = wait_notices(client, intent, 4)
    assert {n.approval_id for n in seen} == {first.approval_id}  # a duplicate of the waiting one
    no_receipt(client, intent)
    assert system.requests(title="resend-1") == [] and system.requests(title="resend-1-small") == []
    assert [p.approval_id for p in pending_of(store, intent)] == [first.approval_id]

    decision = approvals.approve(store, BROKER_URL, first.approval_id, "alice")
    assert (decision.ok, decision.code) == (True, "approved"), decision
    receipt = client.wait(intent, timeout=20)
    assert receipt.success and receipt.intent_id == intent, receipt
    assert [c["body"] for c in system.requests(title="resend-1")] == [{"title": "resend-1", "amount": 900}]
    assert system.requests(title="resend-1-small") == []
    no_receipt(client, intent)  # exactly one


def test_a_resend_while_the_approved_job_runs_is_not_answered_in_its_place(
    client: ReachClient, system: CountingSystem, store: redis.Redis
) -> None:
    intent = f"run-{uuid.uuid4().hex[:8]}"
    client.publish("refund", {"title": "resend-2", "amount": 900}, intent_id=intent)
    [notice] = wait_notices(client, intent, 1)
    system.state.delay = 2.0  # the approved call is in flight when the resend comes
    try:
        assert approvals.approve(store, BROKER_URL, notice.approval_id, "alice").ok
        wait_for(lambda: system.requests(title="resend-2"), 20, "the approved job never reached the system")
        client.publish("refnud", {"title": "resend-2"}, intent_id=intent)
        receipt = client.wait(intent, timeout=20)
    finally:
        system.state.delay = 0.0
    assert receipt.success, receipt
    no_receipt(client, intent)
    assert len(system.requests(title="resend-2")) == 1


def test_a_repeat_of_the_key_joins_the_waiting_approval_and_runs_once(
    client: ReachClient, system: CountingSystem, store: redis.Redis
) -> None:
    key = f"key-{uuid.uuid4().hex[:8]}"
    params = {"title": "repeat-1", "amount": 750}
    first = client.publish("refund", params, idempotency_key=key)
    [asked] = wait_notices(client, first, 1)
    second = client.publish("refund", params, idempotency_key=key)  # a new intent id, the same request
    [joined] = wait_notices(client, second, 1)
    assert joined.approval_id == asked.approval_id
    assert [p.approval_id for p in pending_of(store, first, second)] == [asked.approval_id]  # asked once

    other = client.publish("refund", {"title": "repeat-1", "amount": 999}, idempotency_key=key)
    refused = client.wait(other, timeout=20)  # the key with other params: never parked, never run
    assert refused.error is not None and refused.error.code == ErrorCode.IDEMPOTENCY_KEY_REUSED, refused
    assert refused.error.details[0]["approval_id"] == asked.approval_id

    decision = approvals.approve(store, BROKER_URL, asked.approval_id, "alice")
    assert decision.ok and "1 repeat" in decision.message, decision
    one, two = client.wait(first, timeout=20), client.wait(second, timeout=20)
    assert one.success and two.success and one.data == two.data
    assert sorted([one.execution.deduplicated, two.execution.deduplicated]) == [False, True]

    later = client.publish("refund", params, idempotency_key=key)  # after the decision: its outcome at once
    again = client.wait(later, timeout=20)
    assert again.success and again.execution.deduplicated and again.data == one.data
    assert notices_of(client, later) == [] and pending_of(store, later) == []
    assert len(system.requests(title="repeat-1")) == 1
    for intent in (first, second, later):
        no_receipt(client, intent, seconds=0.5)


def test_a_denial_answers_every_intent_that_joined(
    client: ReachClient, system: CountingSystem, store: redis.Redis
) -> None:
    key = f"deny-{uuid.uuid4().hex[:8]}"
    params = {"title": "repeat-denied", "amount": 650}
    first = client.publish("refund", params, idempotency_key=key)
    [asked] = wait_notices(client, first, 1)
    second = client.publish("refund", params, idempotency_key=key)
    wait_notices(client, second, 1)
    assert approvals.deny(store, BROKER_URL, asked.approval_id, "alice", "not eligible").ok
    for intent in (first, second):
        receipt = client.wait(intent, timeout=20)
        assert receipt.error is not None and receipt.error.code == ErrorCode.APPROVAL_DENIED
        assert "not eligible" in receipt.error.message
    assert system.requests(title="repeat-denied") == []


def test_the_mcp_facades_retry_advice_joins_the_waiting_approval_and_runs_the_grant_once(
    fleet: Fleet, system: CountingSystem, store: redis.Redis
) -> None:
    """`reach mcp --stdio`: a call that waits for a person ends with "call again with this key";
    doing so (twice, and once more after the approval) never parks a second approval, and the
    approved refund reaches the system once."""
    import re
    import sys
    from pathlib import Path

    import anyio
    import mcp_types as types
    from mcp.client.session import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    tool, title = f"{CONNECTOR}__refund", f"mcp-{uuid.uuid4().hex[:8]}"
    decided: list[approvals.Decision] = []

    def text(result: types.CallToolResult) -> str:
        return "\n".join(b.text for b in result.content if isinstance(b, types.TextContent))

    async def calls() -> list[types.CallToolResult]:
        server = StdioServerParameters(
            command=sys.executable,
            args=["-m", "workers.cli", "mcp", "--stdio", "--agent", AGENT],
            env={**fleet.env, "REACH_MCP_WAIT": "3s"},
            cwd=Path(__file__).resolve().parents[2],
        )
        with open(fleet.log_dir / "mcp-stdio-resend.log", "a") as errlog:
            async with stdio_client(server, errlog=errlog) as (read, write), ClientSession(read, write) as session:
                await session.initialize()
                args = {"title": title, "amount": 900}
                first = await session.call_tool(tool, args)
                key = re.search(r'"idempotency_key": "([^"]+)"', text(first))
                assert first.is_error and key is not None, text(first)
                meta = {"idempotency_key": key.group(1)}
                again = [await session.call_tool(tool, args, meta=meta) for _ in range(2)]
                [waiting] = await anyio.to_thread.run_sync(lambda: [p for p in pending_of_title(store, title)])
                decided.append(await anyio.to_thread.run_sync(approvals.approve, store, BROKER_URL, waiting, "alice"))
                answered = await session.call_tool(tool, args, meta=meta)
                for _ in range(40):  # CONNECTOR_UNAVAILABLE while the approved call still runs: ask again
                    if not answered.is_error:
                        break
                    await anyio.sleep(0.5)
                    answered = await session.call_tool(tool, args, meta=meta)
                return [first, *again, answered]

    first, second, third, answered = anyio.run(calls)
    for waited in (first, second, third):
        assert waited.is_error and "waits for a person's approval" in text(waited), text(waited)
        assert "joins the same approval" in text(waited)
    assert decided[0].ok, decided
    assert not answered.is_error, text(answered)
    receipt = (answered.meta or {})["agent-reach/receipt"]
    assert receipt["status"] == "succeeded" and receipt["execution"]["deduplicated"] is True
    assert len(system.requests(title=title)) == 1  # the grant ran once
    assert pending_of_title(store, title) == []


def pending_of_title(store: redis.Redis, title: str) -> list[str]:
    """The approvals (ids) that wait for a refund of this title: asked of a person once, or more."""
    return [p.approval_id for p in approvals.list_pending(store, 10_000) if p.params.get("title") == title]
