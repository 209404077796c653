"""The approval store's atomic steps against the real Redis, without a fleet (no router's sweep
runs beside these): a decision is taken once however many people press at once, two sweepers
never settle one expired approval twice, and a decision whose process died before carrying it
out is carried out by the sweep."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator

import amqp
import pytest
import redis

from connectors.approval_policy import ApprovalPolicy
from connectors.spec import ApprovalSpec
from producers.wire import ErrorCode, Receipt
from tests.fleet import REDIS_URL
from workers.observability.audit import Audit
from workers.router.approval_parking import Park, Parking
from workers.router.approval_settling import Settler
from workers.router.approval_sweep import Sweeper
from workers.state import keys
from workers.state.approval_store import ApprovalStore, Parked, payload_hash
from workers.transport.job import Job
from workers.transport.receipts import ReceiptSink

AGENT = "sweep_bot"


class CountingOutlet:
    """Records what a settled decision sends (the broker side is tested through the fleet)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.dispatched: list[Job] = []
        self.answered: list[Receipt] = []

    def dispatch(self, job: Job) -> None:
        with self.lock:
            self.dispatched.append(job)

    def answer(self, receipt: Receipt, routing_key: str) -> None:
        with self.lock:
            self.answered.append(receipt)


@pytest.fixture
def client() -> Iterator[redis.Redis]:
    connection = redis.Redis.from_url(REDIS_URL)
    connection.delete(keys.approvals_due(), keys.approvals_count())
    yield connection
    connection.delete(keys.approvals_due(), keys.approvals_count())


def make_job(intent: str, deadline: float | None, amount: int = 900) -> Job:
    return Job(
        intent_id=intent,
        agent_id=AGENT,
        connector="shop",
        action="refund",
        params={"amount": amount},
        idempotency_key=intent,
        reply_to=AGENT,
        deadline=deadline,
        trace_id=uuid.uuid4().hex,
        traceparent=None,
        format="native",
        received_at=time.time(),
        dispatched_at=time.time(),
    )


def park(store: ApprovalStore, expires_in_ms: int, amount: int = 900, deadline: float | None = None) -> tuple[str, Job]:
    intent = uuid.uuid4().hex
    job = make_job(intent, deadline, amount)
    result = store.park(
        Parked(
            approval_id=uuid.uuid4().hex,
            job_json=job.model_dump_json(),
            payload_hash=payload_hash(AGENT, "shop", "refund", job.params, intent),
            agent=AGENT,
            connector="shop",
            action="refund",
            intent_id=intent,
            reply_to=AGENT,
            trace_id=job.trace_id,
            approvers=["finance"],
            people=["alice"],
            owners=[],
            summary="test",
            redacted_params=job.params,
            expires_in_ms=expires_in_ms,
        ),
        max_per_agent=1000,
    )
    assert result.outcome == "parked"
    return result.approval_id, job


def test_one_decision_wins_however_many_are_made_at_once(client: redis.Redis) -> None:
    store = ApprovalStore(client)
    approval_id, _ = park(store, 60_000)
    record = store.get(approval_id)
    assert record is not None
    outcomes: list[str] = []
    barrier = threading.Barrier(8)

    def decide(i: int) -> None:
        barrier.wait()
        claim = "approving" if i % 2 else "denying"
        outcomes.append(store.decide(approval_id, claim, f"person{i}", "", record.payload_hash))

    threads = [threading.Thread(target=decide, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert Counter(outcomes) == {"ok": 1, "already_decided": 7}
    assert store.pending_count(AGENT) == 0


def test_two_sweepers_settle_each_expired_approval_once(client: redis.Redis) -> None:
    store = ApprovalStore(client)
    parked = [park(store, 1) for _ in range(30)]
    time.sleep(0.05)
    outlets = [CountingOutlet(), CountingOutlet()]
    sweepers = [Sweeper(store, Settler(store, outlet, Audit(None, "test"))) for outlet in outlets]
    barrier = threading.Barrier(2)

    def run(sweeper: Sweeper) -> None:
        barrier.wait()
        for _ in range(3):
            sweeper.sweep()

    threads = [threading.Thread(target=run, args=(s,)) for s in sweepers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    answered = [r for o in outlets for r in o.answered]
    assert sorted(r.intent_id for r in answered) == sorted(job.intent_id for _, job in parked)
    assert {r.error.code.value for r in answered if r.error} == {"APPROVAL_EXPIRED"}
    assert all(o.dispatched == [] for o in outlets)
    assert {store.get(i).state for i, _ in parked} == {"expired"}  # type: ignore[union-attr]
    assert store.pending_count(AGENT) == 0 and client.zcard(keys.approvals_due()) == 0


def test_a_decision_left_unfinished_is_carried_out_by_the_sweep_once(client: redis.Redis) -> None:
    store = ApprovalStore(client, grace_ms=1000)
    approval_id, job = park(store, 60_000)
    record = store.get(approval_id)
    assert record is not None
    # the deciding process dies right after its claim: nothing was dispatched
    assert store.decide(approval_id, "approving", "alice", "ok", record.payload_hash) == "ok"
    outlet = CountingOutlet()
    sweeper = Sweeper(store, Settler(store, outlet, Audit(None, "test")))
    assert sweeper.sweep() == 0  # within its grace the claim is the decider's
    time.sleep(1.1)
    assert sweeper.sweep() == 1
    assert sweeper.sweep() == 0
    assert [j.params for j in outlet.dispatched] == [job.params] and outlet.answered == []
    assert store.get(approval_id).state == "approved"  # type: ignore[union-attr]


@pytest.mark.parametrize("corrupt", ["changed", "unreadable"])
def test_a_corrupt_parked_job_is_never_dispatched_and_answered_once(client: redis.Redis, corrupt: str) -> None:
    store = ApprovalStore(client, grace_ms=100)
    approval_id, job = park(store, 60_000)
    record = store.get(approval_id)
    assert record is not None
    assert store.decide(approval_id, "approving", "alice", "", record.payload_hash) == "ok"
    changed = job.model_copy(update={"params": {"amount": 90_000}}).model_dump_json()
    client.hset(keys.approval(approval_id), "job", changed if corrupt == "changed" else '{"intent_id": 1')
    time.sleep(0.2)
    outlet = CountingOutlet()
    sweeper = Sweeper(store, Settler(store, outlet, Audit(None, "test")))
    assert sweeper.sweep() == 1
    time.sleep(0.2)
    assert sweeper.sweep() == 0  # answered once, not retried until the record is dropped
    assert outlet.dispatched == []
    [receipt] = outlet.answered
    assert receipt.intent_id == job.intent_id and receipt.error is not None
    assert receipt.error.code == ErrorCode.APPROVAL_DENIED and receipt.error.retryable is False
    assert receipt.error.details[0]["reason"] == "parked job corrupt"
    finished = store.get(approval_id)
    assert finished is not None and finished.state == "failed" and finished.job_json == ""
    assert client.zscore(keys.approvals_due(), approval_id) is None


def test_a_finished_record_keeps_no_parked_job(client: redis.Redis) -> None:
    store = ApprovalStore(client)
    settler = Settler(store, CountingOutlet(), Audit(None, "test"))
    for claim in ("approving", "denying"):
        approval_id, _ = park(store, 60_000)
        record = store.get(approval_id)
        assert record is not None and client.hexists(keys.approval(approval_id), "job")
        assert store.decide(approval_id, claim, "alice", "", record.payload_hash) == "ok"  # type: ignore[arg-type]
        settler.settle(store.get(approval_id), claim)  # type: ignore[arg-type]
        kept = client.hgetall(keys.approval(approval_id))
        assert b"job" not in kept
        assert kept[b"hash"] == record.payload_hash.encode() and b"params" in kept  # for `show` and audits


def test_an_approval_cut_short_by_the_deadline_ends_deadline_exceeded(client: redis.Redis) -> None:
    store = ApprovalStore(client)
    approval_id, job = park(store, 1, deadline=time.time() + 0.001)
    time.sleep(0.05)
    outlet = CountingOutlet()
    assert Sweeper(store, Settler(store, outlet, Audit(None, "test"))).sweep() == 1
    [receipt] = outlet.answered
    assert receipt.error is not None and receipt.error.code == ErrorCode.DEADLINE_EXCEEDED
    assert receipt.error.retryable is False
    assert store.get(approval_id).state == "expired"  # type: ignore[union-attr]


class RefusingPublisher:
    """The broker refuses every publish (e.g. the agent's reply queue is full, reject-publish)."""

    def publish(self, body: bytes, **kwargs: object) -> None:
        raise amqp.exceptions.MessageNacked("reject-publish")


def test_a_parked_intent_whose_notice_is_refused_stays_parked_and_counted(client: redis.Redis) -> None:
    store = ApprovalStore(client)
    intent = uuid.uuid4().hex
    job = make_job(intent, None)
    publisher = RefusingPublisher()
    parking = Parking(store, publisher, ReceiptSink(publisher, client, 60), Audit(None, "test"), 100)  # type: ignore[arg-type]
    policy = ApprovalPolicy(ApprovalSpec(approvers=["finance"], required=True), None, frozenset({"alice"}), frozenset())
    parking.park(Park(job, policy, {"amount": 900}, "required"), {"ts": 0, "bytes": 1})
    [pending] = [r for r in store.entries(1000) if r.intent_id == intent]
    assert pending.state == "pending" and store.pending_count(AGENT) == 1


def test_the_pending_bound_refuses_more_of_one_agent_only(client: redis.Redis) -> None:
    store = ApprovalStore(client)
    first, _ = park(store, 60_000)
    intent = uuid.uuid4().hex
    refused = store.park(
        Parked(
            approval_id=uuid.uuid4().hex,
            job_json="{}",
            payload_hash="x",
            agent=AGENT,
            connector="shop",
            action="refund",
            intent_id=intent,
            reply_to=AGENT,
            trace_id="t",
            approvers=["finance"],
            people=["alice"],
            owners=[],
            summary="",
            redacted_params={},
            expires_in_ms=60_000,
        ),
        max_per_agent=1,
    )
    assert refused.outcome == "full"
    assert store.get(refused.approval_id) is None and store.pending_count(AGENT) == 1
    assert store.pending_count("other_bot") == 0
