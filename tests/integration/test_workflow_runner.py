"""The runner's order per message against real Redis, without a broker: the outlet records what
would be published. A crash (REACH_WORKFLOW_CRASH_AT's three points) is an exception out of the
handler; the message is then handled again by a new runner, as a redelivery would be."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import redis

from connectors.catalog import Catalog, build
from connectors.loader import load_directory
from producers.wire import ErrorCode
from tests.fleet import REDIS_URL
from tests.unit.test_workflow_catalog import SHOP, WORKFLOW
from tests.unit.test_workflow_machine import HOLD, REFUND, receipt
from workers.state import keys
from workers.state.workflow_runs import WorkflowRuns
from workers.transport.app import EXECUTE_TASK
from workers.transport.delivery import Delivery
from workers.transport.job import Job
from workers.workflows.ids import parse_step_intent_id
from workers.workflows.runner import CRASH_POINTS, Crash, WorkflowRunner


class Died(BaseException):
    pass


class Outlet:
    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []
        self.to: list[tuple[str, str]] = []  # (intent id, reply_to) of every receipt

    def send_intent(self, body: dict[str, Any], owner: str, run_id: str) -> None:
        assert owner == body["agent_id"]
        self.sent.append(("intent", body))

    def send_final(self, receipt: dict[str, Any], reply_to: str) -> None:
        self.sent.append(("final", receipt))
        self.to.append((receipt["intent_id"], reply_to))

    def send_again(self, receipt: dict[str, Any], reply_to: str) -> None:
        self.sent.append(("again", receipt))
        self.to.append((receipt["intent_id"], reply_to))

    def answered(self, owner: str, intent_id: str) -> dict[str, Any] | None:
        """The first receipt sent for the intent (what the receipt sink keeps)."""
        return next((b for k, b in self.sent if k == "final" and b["intent_id"] == intent_id), None)

    def confirmed(self, owner: str, intent_id: str) -> bool:
        return self.answered(owner, intent_id) is not None

    def intents(self) -> list[str]:
        return [body["intent_id"] for kind, body in self.sent if kind == "intent"]

    def receipts(self, kind: str = "final") -> list[dict[str, Any]]:
        return [body for k, body in self.sent if k == kind]


@pytest.fixture(scope="module")
def catalog(tmp_path_factory: pytest.TempPathFactory) -> Catalog:
    folder: Path = tmp_path_factory.mktemp("shop")
    (folder / "shop.yaml").write_text(SHOP + "---\n" + WORKFLOW)
    built, problems = build(load_directory(folder))
    assert problems == []
    return built


@pytest.fixture()
def runs() -> Any:
    client = redis.Redis.from_url(REDIS_URL)
    yield WorkflowRuns(client, 3600)
    for pattern in ("reach:wf-*",):
        for key in client.scan_iter(pattern):
            client.delete(key)
    client.close()


def start_message(
    run_id: str,
    agent: str = "support",
    *,
    key: str | None = None,
    order_id: str = "o-1",
    received_at: float = 1.0e9,
    reply_to: str | None = None,
) -> Delivery:
    """A start job as the router builds it; ``received_at``: when the router read the intent (a
    resend of the same intent id is read again, later)."""
    job = Job(
        intent_id=run_id,
        agent_id=agent,
        connector="(workflow)",
        action="refund_order",
        params={"order_id": order_id, "amount": 5.0},
        idempotency_key=key or run_id,
        reply_to=reply_to or agent,
        deadline=None,
        trace_id="a" * 32,
        traceparent=None,
        format="native",
        received_at=received_at,
        dispatched_at=received_at,
    )
    body = json.dumps([[job.model_dump(mode="json")], {}, {}]).encode()
    return Delivery(body=body, headers={"task": EXECUTE_TASK})


def reply(intent_id: str, data: Any = None, code: ErrorCode | None = None) -> Delivery:
    return Delivery(body=receipt(intent_id, data, code).to_json())


def runner(catalog: Catalog, runs: WorkflowRuns, outlet: Outlet, crash_at: str | None = None) -> WorkflowRunner:
    def die(code: int) -> None:
        raise Died(code)

    clock = iter(range(10**9))
    return WorkflowRunner(catalog, runs, outlet, crash=Crash(crash_at, die), clock=lambda: 1.0e9 + next(clock))


def drive(catalog: Catalog, runs: WorkflowRuns, outlet: Outlet, run_id: str, crash_at: str | None = None) -> None:
    """A whole happy run; at every message the runner dies once at ``crash_at`` and the message comes again."""

    def handle(kind: str, message: Delivery) -> None:
        first = runner(catalog, runs, outlet, crash_at)
        try:
            (first.handle_start if kind == "start" else first.handle_reply)(message)
        except Died:
            again = runner(catalog, runs, outlet)
            assert (again.handle_start if kind == "start" else again.handle_reply)(message) == "ack"

    handle("start", start_message(run_id))
    for data in (HOLD, REFUND, {}):
        last = outlet.intents()[-1]
        handle("reply", reply(last, data))


@pytest.mark.parametrize("crash_at", [None, *CRASH_POINTS])
def test_each_step_is_sent_once_per_intent_id_and_one_final_receipt_whatever_the_crash(
    catalog: Catalog, runs: WorkflowRuns, crash_at: str | None
) -> None:
    outlet = Outlet()
    drive(catalog, runs, outlet, f"run-{crash_at}", crash_at)
    intents = outlet.intents()
    assert len(set(intents)) == 3  # three steps, each one intent id (sent again only after a crash)
    finals = [body for kind, body in outlet.sent if kind == "final"]
    assert len({json.dumps(f, sort_keys=True) for f in finals}) == 1 and finals[0]["status"] == "succeeded"
    if crash_at in (None, "before_ack"):
        assert len(intents) == 3 and len(finals) == 1  # confirmed and marked: nothing again
    stored = runs.load("support", f"run-{crash_at}")
    assert stored is not None and json.loads(stored.doc)["state"] == "succeeded"


def test_a_start_that_comes_twice_runs_once(catalog: Catalog, runs: WorkflowRuns) -> None:
    outlet = Outlet()
    one = runner(catalog, runs, outlet)
    one.handle_start(start_message("twice"))
    one.handle_start(start_message("twice"))
    assert len(outlet.intents()) == 1


def test_the_same_run_id_of_two_agents_is_two_runs(catalog: Catalog, runs: WorkflowRuns) -> None:
    outlet = Outlet()
    one = runner(catalog, runs, outlet)
    one.handle_start(start_message("shared"))
    one.handle_start(start_message("shared", agent="other"))
    assert len(set(outlet.intents())) == 2
    assert runs.owners_of("shared") == ["other", "support"]


def test_a_receipt_that_comes_twice_moves_the_run_once(catalog: Catalog, runs: WorkflowRuns) -> None:
    outlet = Outlet()
    one = runner(catalog, runs, outlet)
    one.handle_start(start_message("dup"))
    first = outlet.intents()[0]
    one.handle_reply(reply(first, HOLD))
    one.handle_reply(reply(first, HOLD))
    assert outlet.intents()[1:] == [outlet.intents()[1]]  # the second step once


def test_a_failing_undo_is_tried_again_by_the_sweep(catalog: Catalog, runs: WorkflowRuns) -> None:
    outlet = Outlet()
    now = [1.0e9]
    one = WorkflowRunner(catalog, runs, outlet, clock=lambda: now[0])
    one.handle_start(start_message("undo"))
    one.handle_reply(reply(outlet.intents()[-1], HOLD))
    one.handle_reply(reply(outlet.intents()[-1], code=ErrorCode.DOWNSTREAM_CONFLICT))
    undo = outlet.intents()[-1]
    one.handle_reply(reply(undo, code=ErrorCode.DOWNSTREAM_ERROR))
    assert outlet.intents()[-1] == undo
    now[0] += 5
    assert one.sweep() >= 1
    assert outlet.intents()[-1] != undo and outlet.intents()[-1].endswith(".u2")
    one.handle_reply(reply(outlet.intents()[-1], {}))
    finals = [body for kind, body in outlet.sent if kind == "final"]
    assert len(finals) == 1 and finals[0]["error"]["code"] == "STEP_FAILED"
    assert finals[0]["execution"]["steps"][0]["undone"] is True


def test_an_outbound_written_but_never_confirmed_is_sent_by_the_sweep(catalog: Catalog, runs: WorkflowRuns) -> None:
    outlet = Outlet()
    now = [1.0e9]

    def die(code: int) -> None:
        raise Died(code)

    dying = WorkflowRunner(catalog, runs, outlet, crash=Crash("after_state_write", die), clock=lambda: now[0])
    with pytest.raises(Died):
        dying.handle_start(start_message("lost"))
    assert outlet.intents() == []
    now[0] += 10
    WorkflowRunner(catalog, runs, outlet, clock=lambda: now[0]).sweep()
    assert len(outlet.intents()) == 1


def test_a_run_finished_leaves_the_sweep_and_expires(catalog: Catalog, runs: WorkflowRuns) -> None:
    outlet = Outlet()
    drive(catalog, runs, outlet, "done")
    client = runs.client
    assert client.zscore(keys.workflow_due(), "support:done") is None
    assert 0 < client.ttl(keys.workflow_run("support", "done")) <= 3600


def test_a_resume_racing_the_runners_last_look_keeps_the_run_in_the_sweeps_sight(
    catalog: Catalog, runs: WorkflowRuns
) -> None:
    """The runner works out its next look from the run it just published; an operator's resume
    written meanwhile must not be put out of sight by it (found live: the resumed undo waited
    until the run's time for undoing had nearly gone)."""
    from workers.ops.workflow_commands import resume_run

    outlet = Outlet()
    now = [1.0e9]
    one = WorkflowRunner(catalog, runs, outlet, clock=lambda: now[0])
    one.handle_start(start_message("race"))
    one.handle_reply(reply(outlet.intents()[-1], HOLD))
    one.handle_reply(reply(outlet.intents()[-1], code=ErrorCode.DOWNSTREAM_CONFLICT))
    while (stored := runs.load("support", "race")) is not None and json.loads(stored.doc)["state"] == "compensating":
        one.handle_reply(reply(outlet.intents()[-1], code=ErrorCode.DOWNSTREAM_ERROR))
        now[0] += 120
        one.sweep()
    assert stored is not None and json.loads(stored.doc)["state"] == "parked"
    resume_run(runs, "race", "ann", agent="support")
    runs.reschedule("support", "race", stored.version, None)  # the runner's stale "never again"
    due = runs.client.zscore(keys.workflow_due(), "support:race")
    assert due is not None
    now[0] = due + 1.5  # the sweep's next round
    sent = len(outlet.intents())
    one.sweep()
    assert len(outlet.intents()) == sent + 1 and parse_step_intent_id(outlet.intents()[-1]).kind == "undo"  # type: ignore[union-attr]


def finish(one: WorkflowRunner, outlet: Outlet) -> None:
    """Answer the run's three steps (the last one sent first)."""
    for data in (HOLD, REFUND, {}):
        one.handle_reply(reply(outlet.intents()[-1], data))


def test_a_start_resent_after_its_run_ended_gets_the_stored_final_receipt_again(
    catalog: Catalog, runs: WorkflowRuns
) -> None:
    outlet = Outlet()
    one = runner(catalog, runs, outlet)
    one.handle_start(start_message("again"))
    one.handle_start(start_message("again", received_at=1.0e9 + 1))  # resent while it runs: absorbed
    finish(one, outlet)
    assert len(outlet.receipts()) == 1 and outlet.receipts("again") == []
    one.handle_start(start_message("again"))  # the same start job delivered again: nothing
    assert outlet.receipts("again") == []
    one.handle_start(start_message("again", received_at=1.0e9 + 60, reply_to="support.s2"))
    assert outlet.receipts("again") == outlet.receipts()  # the very receipt, to where the resend asks
    assert outlet.to[-1] == ("again", "support.s2")
    assert len(outlet.intents()) == 3


def dead_at_the_end(catalog: Catalog, runs: WorkflowRuns, run_id: str, point: str) -> tuple[WorkflowRunner, Outlet]:
    """A run whose last step answered, the runner that took that answer dead at ``point``."""
    outlet = Outlet()
    one = runner(catalog, runs, outlet)
    one.handle_start(start_message(run_id))
    one.handle_reply(reply(outlet.intents()[-1], HOLD))
    one.handle_reply(reply(outlet.intents()[-1], REFUND))
    with pytest.raises(Died):
        runner(catalog, runs, outlet, point).handle_reply(reply(outlet.intents()[-1], {}))
    return one, outlet


def test_a_resend_that_comes_while_the_final_receipt_is_confirmed_but_not_yet_marked_gets_it_again(
    catalog: Catalog, runs: WorkflowRuns
) -> None:
    """The agent has the final receipt and resends before the delivery that sent it wrote the
    run's sent mark (it still holds the publish claim): the resend is answered all the same."""
    one, outlet = dead_at_the_end(catalog, runs, "unmarked", "after_publish")  # confirmed, the run's mark not written
    assert len(outlet.receipts()) == 1
    one.handle_start(start_message("unmarked", received_at=1.0e9 + 5))
    assert outlet.receipts("again") == outlet.receipts()
    assert len(outlet.receipts()) == 1 and len(outlet.intents()) == 3


def test_a_resend_of_a_run_whose_final_receipt_never_went_out_gets_it_once(
    catalog: Catalog, runs: WorkflowRuns
) -> None:
    one, outlet = dead_at_the_end(catalog, runs, "unsent", "after_state_write")  # written, never published
    assert outlet.receipts() == []
    one.handle_start(start_message("unsent", received_at=1.0e9 + 5))
    assert len(outlet.receipts()) == 1 and outlet.receipts("again") == []  # one copy, to the same place


def test_a_new_intent_with_the_key_of_an_ended_run_gets_its_outcome_as_its_own(
    catalog: Catalog, runs: WorkflowRuns
) -> None:
    outlet = Outlet()
    one = runner(catalog, runs, outlet)
    one.handle_start(start_message("first", key="order-o-1"))
    finish(one, outlet)
    one.handle_start(start_message("second", key="order-o-1", received_at=1.0e9 + 60))
    one.handle_start(start_message("second", key="order-o-1", received_at=1.0e9 + 60))  # redelivered
    first, second = outlet.receipts()[0], outlet.receipts()[1]
    assert len(outlet.receipts()) == 3 and outlet.receipts()[2] == second  # the same receipt, built again
    assert len(outlet.intents()) == 3  # no step of its own
    assert second["intent_id"] == "second" and second["data"] == first["data"] == {"refund_id": "R1"}
    assert second["execution"]["deduplicated"] is True and second["execution"]["attempts"] == 0
    assert second["execution"]["steps"] == first["execution"]["steps"]


def test_a_new_intent_with_the_key_of_a_running_run_is_answered_when_it_ends(
    catalog: Catalog, runs: WorkflowRuns
) -> None:
    outlet = Outlet()
    one = runner(catalog, runs, outlet)
    one.handle_start(start_message("lead", key="k-2"))
    one.handle_reply(reply(outlet.intents()[-1], HOLD))
    one.handle_start(start_message("waits", key="k-2", received_at=1.0e9 + 1, reply_to="support.s2"))
    one.handle_start(start_message("waits", key="k-2", received_at=1.0e9 + 1, reply_to="support.s2"))
    assert outlet.receipts() == [] and len(outlet.intents()) == 2
    one.handle_reply(reply(outlet.intents()[-1], REFUND))
    one.handle_reply(reply(outlet.intents()[-1], {}))
    assert [r["intent_id"] for r in outlet.receipts()] == ["lead", "waits"]
    assert ("waits", "support.s2") in outlet.to
    waited = outlet.receipts()[1]
    assert waited["status"] == "succeeded" and waited["execution"]["deduplicated"] is True
    assert len(outlet.intents()) == 3
    one.handle_start(start_message("waits", key="k-2", received_at=1.0e9 + 90))  # resent once answered
    assert outlet.receipts("again") == [waited] and outlet.to[-1] == ("waits", "support")


def test_the_key_of_a_run_with_other_input_is_refused(catalog: Catalog, runs: WorkflowRuns) -> None:
    outlet = Outlet()
    one = runner(catalog, runs, outlet)
    one.handle_start(start_message("mine", key="k-3"))
    one.handle_start(start_message("other", key="k-3", order_id="o-2", received_at=1.0e9 + 1))
    refused = outlet.receipts()[:]
    assert len(refused) == 1 and refused[0]["intent_id"] == "other" and refused[0]["status"] == "rejected"
    assert refused[0]["error"]["code"] == "IDEMPOTENCY_KEY_REUSED" and "mine" in refused[0]["error"]["message"]
    assert len(outlet.intents()) == 1
    # redelivered: answered on the path that sends once per intent id (the receipt sink drops it)
    one.handle_start(start_message("other", key="k-3", order_id="o-2", received_at=1.0e9 + 1))
    assert outlet.receipts("again") == [] and len(outlet.intents()) == 1
    one.handle_start(start_message("other", key="k-3", order_id="o-2", received_at=1.0e9 + 5))  # resent
    assert outlet.receipts("again") == refused[:1]


def test_the_same_key_of_two_agents_is_two_runs(catalog: Catalog, runs: WorkflowRuns) -> None:
    outlet = Outlet()
    one = runner(catalog, runs, outlet)
    one.handle_start(start_message("a1", key="k-4"))
    one.handle_start(start_message("b1", agent="other", key="k-4"))
    assert len(outlet.intents()) == 2 and outlet.receipts() == []


def test_the_sweep_trims_index_entries_of_runs_past_retention(catalog: Catalog, runs: WorkflowRuns) -> None:
    """Entries older than the retention plus twice the longest workflow timeout (and the grace)
    go; a run started within it stays listed."""
    outlet = Outlet()
    now = 1.0e9
    one = WorkflowRunner(catalog, runs, outlet, clock=lambda: now)
    one.handle_start(start_message("live", received_at=now - 10))
    horizon = one.index_horizon()
    assert horizon == 3600 + 2 * (max(w.timeout for w in catalog.workflows.values()) + 30)
    old = {f"support:old{i}": now - horizon - 1 - i for i in range(3)}
    runs.client.zadd(keys.workflow_runs(), {**old, "support:edge": now - horizon + 1})
    one.sweep()
    left = {m.decode() for m in runs.client.zrange(keys.workflow_runs(), 0, -1)}
    assert left == {"support:live", "support:edge"}
    assert runs.trim(now - horizon, limit=1) == 0


def test_a_run_written_with_the_final_receipt_in_its_outbound_still_sends_it(
    catalog: Catalog, runs: WorkflowRuns
) -> None:
    """Runs written before the final receipt was kept once (in ``final`` only) carried a copy in
    the outbound's body: such a run, left unconfirmed by a crash, is read and its receipt sent."""
    outlet = Outlet()
    one = runner(catalog, runs, outlet)
    one.handle_start(start_message("older"))
    one.handle_reply(reply(outlet.intents()[-1], HOLD))
    one.handle_reply(reply(outlet.intents()[-1], REFUND))
    last = outlet.intents()[-1]
    with pytest.raises(Died):
        runner(catalog, runs, outlet, "after_state_write").handle_reply(reply(last, {}))
    key = keys.workflow_run("support", "older")
    doc = json.loads(runs.client.hget(key, "doc"))
    assert doc["outbound"]["kind"] == "final" and doc["outbound"]["body"] == {}
    doc["outbound"]["body"] = doc["final"]  # as the runner wrote it before
    runs.client.hset(key, "doc", json.dumps(doc))
    assert outlet.receipts() == []
    one.handle_reply(reply(last, {}))  # the reply comes again
    assert outlet.receipts() == [doc["final"]]
