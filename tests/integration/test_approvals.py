"""Approvals through the real fleet: an intent that needs a person waits (a notice, no receipt, no
downstream call) until it is approved — then the parked payload runs exactly once — denied, or
expired; each ends in exactly one receipt. The decisions go through workers/ops/approval_decisions.py, as
`reach approvals` and the console make them.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from producers.client import ApprovalPending, ReachClient, ReceiptTimeout
from producers.wire import ApprovalNotice, ErrorCode, Receipt
from tests.fleet import BROKER_URL, REDIS_URL, Fleet
from tests.integration.counting_system import CountingSystem
from tests.waiting import wait_for
from workers.observability.audit import read_trace
from workers.ops import approval_decisions as approvals
from workers.state import keys
from workers.state.approval_store import ApprovalStore

AGENT = "approval_bot"
CONNECTOR = "approval_shop"


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
        card: {{ type: string, sensitive: true }}
      approval:
        when: "amount > 500"
        approvers: [finance]
    - action: wipe
      description: Something nobody may do unseen, and that nobody has long to approve
      path: POST /items
      permission: write
      input:
        title: {{ type: string, required: true }}
      approval: {{ required: true, approvers: [finance], expires: 2s }}
---
approvers:
  finance: [alice, bob]
---
agent_app:
  name: {AGENT}
  owners: [bob]
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


def parked(client: ReachClient, intent_id: str, timeout: float = 20) -> ApprovalNotice:
    """Wait for the intent's notice; a receipt before it fails the test."""

    def notice() -> ApprovalNotice | None:
        try:
            receipt = client.wait(intent_id, timeout=0.2)
        except ReceiptTimeout:
            return client.notice(intent_id)
        raise AssertionError(f"a receipt came while the intent should wait: {receipt}")

    return wait_for(notice, timeout, f"no approval notice for {intent_id}")  # type: ignore[no-any-return]


def no_receipt(client: ReachClient, intent_id: str, seconds: float = 1.5) -> None:
    with pytest.raises(ReceiptTimeout):
        client.wait(intent_id, timeout=seconds)


def refund(client: ReachClient, title: str, amount: float, **extra: Any) -> str:
    return client.publish("refund", {"title": title, "amount": amount, **extra})


def stages(store: redis.Redis, intent_id: str) -> list[dict[str, Any]]:
    return read_trace(store, AGENT, intent_id)


def test_below_the_threshold_the_intent_runs_without_waiting(client: ReachClient, system: CountingSystem) -> None:
    intent = refund(client, "small-1", 500)
    receipt = client.wait(intent, timeout=20)
    assert receipt.success and client.notice(intent) is None
    assert system.executions()["small-1"] == 1


def test_an_approved_intent_runs_exactly_the_parked_payload_once(
    client: ReachClient, system: CountingSystem, store: redis.Redis, fleet: Fleet
) -> None:
    intent = refund(client, "big-1", 900, card="4111-1111")
    notice = parked(client, intent)
    assert client.seen_notices == [notice]  # type: ignore[attr-defined]
    assert notice.intent_id == intent and "approval_bot asks for approval_shop.refund" in notice.summary
    assert "4111" not in notice.summary and "[redacted]" in notice.summary
    no_receipt(client, intent)
    assert system.requests(title="big-1") == []  # nothing reached the system while it waits

    pending = {p.approval_id: p for p in approvals.list_pending(store)}
    shown = pending[notice.approval_id]
    assert shown.params == {"title": "big-1", "amount": 900, "card": "[redacted]"}
    assert (shown.intent_id, shown.agent_id, shown.approvers, shown.state) == (intent, AGENT, ["finance"], "pending")

    decision = approvals.approve(
        store, BROKER_URL, notice.approval_id, "alice", "checked the order", payload_hash=shown.payload_hash
    )
    assert (decision.ok, decision.code) == (True, "approved"), decision
    receipt = client.wait(intent, timeout=20)
    assert receipt.success and receipt.intent_id == intent
    calls = system.requests(title="big-1")
    assert [c["body"] for c in calls] == [{"title": "big-1", "amount": 900, "card": "4111-1111"}]
    assert calls[0]["key"] == intent  # the intent's own idempotency key, from the parked job

    # the approval id is used: approving (or denying) it again does nothing
    again = approvals.approve(store, BROKER_URL, notice.approval_id, "alice")
    assert (again.ok, again.code) == (False, "already_decided")
    assert approvals.deny(store, BROKER_URL, notice.approval_id, "alice").code == "already_decided"
    no_receipt(client, intent)
    assert system.executions()["big-1"] == 1

    trail = stages(store, intent)
    by_stage = {e["stage"]: e for e in trail}
    assert ["approval_pending", "approval_approved", "dispatched"] == [
        e["stage"] for e in trail if e["stage"] in ("approval_pending", "approval_approved", "dispatched")
    ]
    assert by_stage["approval_approved"]["decided_by"] == "alice"
    assert by_stage["approval_approved"]["reason"] == "checked the order"
    assert (
        by_stage["approval_approved"]["payload_hash"]
        == shown.payload_hash
        == by_stage["approval_pending"]["payload_hash"]
    )
    assert "4111" not in json.dumps(trail)
    assert approvals.get_approval(store, notice.approval_id).state == "approved"  # type: ignore[union-attr]
    assert not store.hexists(keys.approval(notice.approval_id), "job")  # finished: only hash and redacted params

    # what an operator sees of it: `reach trace INTENT_ID` names the decision, who made it and the hash
    from click.testing import CliRunner

    from workers.cli import main

    traced = CliRunner().invoke(
        main, ["trace", intent], env={"REACH_REDIS_URL": REDIS_URL, "REACH_BROKER_URL": BROKER_URL}
    )
    assert traced.exit_code == 0, traced.output
    decided = [line for line in traced.stdout.splitlines() if " approval_approved " in line]
    assert len(decided) == 1, traced.stdout
    assert "decided_by=alice" in decided[0] and "reason=checked the order" in decided[0]
    assert f"payload_hash={shown.payload_hash}" in decided[0] and f"approval_id={notice.approval_id}" in decided[0]
    assert "4111" not in traced.output


def test_a_denied_intent_never_reaches_the_system(
    client: ReachClient, system: CountingSystem, store: redis.Redis
) -> None:
    intent = refund(client, "big-denied", 5000)
    notice = parked(client, intent)
    decision = approvals.deny(
        store, BROKER_URL, notice.approval_id, "alice", "customer is not eligible", receipt_ttl_seconds=600
    )
    assert (decision.ok, decision.code) == (True, "denied"), decision
    receipt = client.wait(intent, timeout=20)
    assert 0 < store.ttl(keys.receipt(AGENT, intent)) <= 600  # kept for REACH_RECEIPT_TTL, as the fleet's
    assert receipt.status == "rejected" and receipt.error is not None
    assert receipt.error.code == ErrorCode.APPROVAL_DENIED and receipt.error.retryable is False
    assert "customer is not eligible" in receipt.error.message
    assert receipt.error.details[0]["reason"] == "customer is not eligible"
    assert approvals.approve(store, BROKER_URL, notice.approval_id, "alice").code == "already_decided"
    no_receipt(client, intent)
    assert system.requests(title="big-denied") == []
    denied = [e for e in stages(store, intent) if e["stage"] == "approval_denied"]
    assert len(denied) == 1 and denied[0]["decided_by"] == "alice" and denied[0]["reason"] == "customer is not eligible"
    assert not store.hexists(keys.approval(notice.approval_id), "job")  # finished: only hash and redacted params


def test_owners_and_non_members_cannot_approve(client: ReachClient, system: CountingSystem, store: redis.Redis) -> None:
    intent = refund(client, "big-self", 700)
    notice = parked(client, intent)
    own = approvals.approve(store, BROKER_URL, notice.approval_id, "bob")  # in finance, but owns the agent
    assert (own.ok, own.code) == (False, "self_approval")
    shouted = approvals.approve(store, BROKER_URL, notice.approval_id, "BOB")  # names compare case-folded
    assert (shouted.ok, shouted.code) == (False, "self_approval")
    stranger = approvals.approve(store, BROKER_URL, notice.approval_id, "mallory")
    assert (stranger.ok, stranger.code) == (False, "not_an_approver")
    assert approvals.approve(store, BROKER_URL, "0" * 32, "alice").code == "not_found"
    assert approvals.approve(store, BROKER_URL, "../../etc", "alice").code == "not_found"
    no_receipt(client, intent)
    assert system.requests(title="big-self") == []
    assert approvals.get_approval(store, notice.approval_id).state == "pending"  # type: ignore[union-attr]
    assert approvals.deny(store, BROKER_URL, notice.approval_id, "Alice", "cleanup").ok  # alice, case-folded
    assert client.wait(intent, timeout=20).error.code == ErrorCode.APPROVAL_DENIED  # type: ignore[union-attr]
    wait_for(lambda: not store.hexists(keys.approval(notice.approval_id), "job"), 10, "the denied record kept its job")


def test_an_intent_id_that_had_its_receipt_is_not_parked_again(
    client: ReachClient, system: CountingSystem, store: redis.Redis
) -> None:
    intent = f"reused-{uuid.uuid4().hex[:8]}"
    client.publish("refund", {"title": "big-reused", "amount": "lots"}, intent_id=intent)
    first = client.wait(intent, timeout=20)
    assert first.error is not None and first.error.code == ErrorCode.VALIDATION_FAILED
    # sent again under the same id, now valid and over the threshold: one receipt per intent id
    client.publish("refund", {"title": "big-reused", "amount": 900}, intent_id=intent)
    again = client.wait(intent, timeout=20)  # the stored receipt, sent again
    assert again.error is not None and again.error.code == ErrorCode.VALIDATION_FAILED
    assert client.notice(intent) is None
    assert [p for p in approvals.list_pending(store) if p.intent_id == intent] == []
    assert system.requests(title="big-reused") == []


def test_call_says_when_its_intent_waits_for_a_person_and_wait_takes_it_up_later(
    client: ReachClient, store: redis.Redis
) -> None:
    with pytest.raises(ApprovalPending) as pending:
        client.call("refund", {"title": "big-call", "amount": 950}, timeout=3)
    notice = pending.value.notice
    assert notice.approval_id in str(pending.value) and notice.expires_at
    assert approvals.deny(store, BROKER_URL, notice.approval_id, "alice", "not now").ok
    receipt = client.wait(notice.intent_id, timeout=20)  # the same intent, not a second approval
    assert receipt.error is not None and receipt.error.code == ErrorCode.APPROVAL_DENIED
    with pytest.raises(ReceiptTimeout) as plain:  # an intent without a notice: a plain timeout
        client.wait("no-such-intent", timeout=0.3)
    assert not isinstance(plain.value, ApprovalPending)


def test_a_changed_parked_payload_cannot_be_approved(
    client: ReachClient, system: CountingSystem, store: redis.Redis
) -> None:
    intent = refund(client, "big-tampered", 800)
    notice = parked(client, intent)
    record = keys.approval(notice.approval_id)
    job = json.loads(store.hget(record, "job"))  # type: ignore[arg-type]
    job["params"]["amount"] = 80_000
    store.hset(record, "job", json.dumps(job))
    decision = approvals.approve(store, BROKER_URL, notice.approval_id, "alice")
    assert (decision.ok, decision.code) == (False, "hash_mismatch"), decision
    # and a hash other than the one shown is refused before anything else
    shown = approvals.approve(store, BROKER_URL, notice.approval_id, "alice", payload_hash="f" * 64)
    assert shown.code == "hash_mismatch"
    no_receipt(client, intent)
    assert system.requests(title="big-tampered") == []
    assert approvals.deny(store, BROKER_URL, notice.approval_id, "alice", "tampered").ok
    assert client.wait(intent, timeout=20).error.code == ErrorCode.APPROVAL_DENIED  # type: ignore[union-attr]


def test_an_unapproved_intent_expires_with_one_retryable_receipt(
    client: ReachClient, system: CountingSystem, store: redis.Redis
) -> None:
    intent = client.publish("wipe", {"title": "wipe-1"})
    notice = parked(client, intent)
    receipt: Receipt = client.wait(intent, timeout=20)  # nobody looks: the routers' sweep answers
    assert receipt.status == "rejected" and receipt.error is not None
    assert receipt.error.code == ErrorCode.APPROVAL_EXPIRED and receipt.error.retryable is True
    late = approvals.approve(store, BROKER_URL, notice.approval_id, "alice")
    assert (late.ok, late.code) == (False, "expired")
    no_receipt(client, intent, seconds=2.5)
    assert system.requests(title="wipe-1") == []
    assert [e["stage"] for e in stages(store, intent)].count("approval_expired") == 1


def test_a_redelivered_intent_is_parked_once(client: ReachClient, store: redis.Redis) -> None:
    intent = f"same-{uuid.uuid4().hex[:8]}"
    client.publish("refund", {"title": "big-twice", "amount": 600}, intent_id=intent)
    first = parked(client, intent)
    client.publish("refund", {"title": "big-twice", "amount": 600}, intent_id=intent)

    def notices() -> int:
        no_receipt(client, intent, seconds=0.2)  # (takes in what arrives)
        return len([n for n in client.seen_notices if n.intent_id == intent])  # type: ignore[attr-defined]

    wait_for(notices, 10, "the redelivered intent was not noticed again", until=lambda n: n >= 2)
    assert {n.approval_id for n in client.seen_notices if n.intent_id == intent} == {first.approval_id}  # type: ignore[attr-defined]
    assert [p.approval_id for p in approvals.list_pending(store) if p.intent_id == intent] == [first.approval_id]
    assert approvals.deny(store, BROKER_URL, first.approval_id, "alice").ok
    client.wait(intent, timeout=20)
    no_receipt(client, intent)


def test_a_parked_intent_survives_a_router_restart(
    client: ReachClient, system: CountingSystem, store: redis.Redis, fleet: Fleet
) -> None:
    intent = refund(client, "big-restart", 1200)
    notice = parked(client, intent)
    fleet.stop_process("router")
    fleet.start_process("router", ["router"])
    fleet.wait_consuming("reach.intents")
    decision = approvals.approve(store, BROKER_URL, notice.approval_id, "alice")
    assert decision.ok, decision
    receipt = client.wait(intent, timeout=30)
    assert receipt.success, receipt
    assert system.executions()["big-restart"] == 1
    # and the restarted router parks new ones as before
    after = refund(client, "big-after-restart", 1300)
    assert parked(client, after).intent_id == after
    assert approvals.deny(store, BROKER_URL, parked(client, after).approval_id, "alice").ok
    assert client.wait(after, timeout=20).error.code == ErrorCode.APPROVAL_DENIED  # type: ignore[union-attr]


def test_the_cli_lists_shows_and_decides(client: ReachClient, system: CountingSystem, fleet: Fleet) -> None:
    from click.testing import CliRunner

    from workers.cli import main

    env = {"REACH_REDIS_URL": REDIS_URL, "REACH_BROKER_URL": BROKER_URL}
    runner = CliRunner()
    intent = refund(client, "big-cli", 2500, card="5500-0000")
    notice = parked(client, intent)

    listed = runner.invoke(main, ["approvals", "list"], env=env)
    assert listed.exit_code == 0 and notice.approval_id in listed.output and "approval_shop.refund" in listed.output
    shown = runner.invoke(main, ["approvals", "show", notice.approval_id], env=env)
    assert shown.exit_code == 0, shown.output
    doc = json.loads(shown.stdout)
    assert doc["params"]["card"] == "[redacted]" and doc["state"] == "pending" and len(doc["payload_hash"]) == 64

    refused = runner.invoke(main, ["approvals", "approve", notice.approval_id, "--as", "bob"], env=env)
    assert refused.exit_code == 1 and "self_approval" in refused.output
    wrong = runner.invoke(
        main, ["approvals", "approve", notice.approval_id, "--as", "alice", "--hash", "0" * 64], env=env
    )
    assert wrong.exit_code == 1 and "hash_mismatch" in wrong.output
    done = runner.invoke(
        main, ["approvals", "approve", notice.approval_id, "--as", "alice", "--hash", doc["payload_hash"]], env=env
    )
    assert done.exit_code == 0 and done.stdout.startswith("approved:"), done.output
    assert '"stage":"approval_approved"' in done.stderr  # the audit line, on stderr
    assert client.wait(intent, timeout=20).success
    assert [c["body"] for c in system.requests(title="big-cli")] == [
        {"title": "big-cli", "amount": 2500, "card": "5500-0000"}
    ]
    missing = runner.invoke(main, ["approvals", "show", "f" * 32], env=env)
    assert missing.exit_code == 1


def router_metric(fleet: Fleet, name: str) -> float:
    """``name``'s value (summed over its labels) on the router's /metrics."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{fleet.metrics_port('router')}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name)


def test_the_router_shows_what_was_parked_and_what_waits(client: ReachClient, fleet: Fleet, store: redis.Redis) -> None:
    waiting = ApprovalStore(store)
    parked_before = router_metric(fleet, "reach_approvals_parked_total")
    intent = refund(client, "big-metrics", 5000)
    notice = parked(client, intent)
    assert router_metric(fleet, "reach_approvals_parked_total") == parked_before + 1

    def shown_and_true() -> float | None:  # (earlier tests' approvals may expire meanwhile: read both again)
        truth = waiting.pending_total()
        return truth if router_metric(fleet, "reach_approvals_pending") == truth else None

    pending = wait_for(shown_and_true, 10, "reach_approvals_pending is not the fleet's count", until=lambda n: n)
    assert approvals.deny(store, BROKER_URL, notice.approval_id, "alice", "metrics test", receipt_ttl_seconds=600).ok
    assert client.wait(intent, timeout=20).error.code == ErrorCode.APPROVAL_DENIED  # type: ignore[union-attr]
    after = wait_for(
        shown_and_true, 10, "reach_approvals_pending is not the fleet's count", until=lambda n: n is not None
    )
    assert after <= pending - 1
