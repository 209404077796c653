"""Workflows through the real fleet: router, the shop's pool and the runner (``reach workflows``),
against a fake shop that keeps an ordered log of what it *did* (tests/integration/workflow_shop.py).

Every test starts runs of its own (order ids of its own) and reads the shop's log for them: the
happy path (three calls, one final receipt), a conflict on the last step (undo 2 then undo 1, once
each), a renamed output field (step 2 never called, the receipt names the reference), a runner
killed at each crash point (each call exactly once, one final receipt), a start sent twice, a
start resent after or during its run (the same one final receipt), starts sharing an idempotency
key (the work done once, each answered), and what another agent may not do.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator

import pytest
from click.testing import CliRunner

from producers.client import ReachClient
from tests.fleet import Fleet
from tests.integration.workflow_shop import AGENT, OTHER, Shop, catalog, order, run, running_shop, start_runner
from tests.waiting import wait_for
from workers.cli import main
from workers.transport.topology import ON_BEHALF_OF_HEADER, RUN_ID_HEADER, WORKFLOW_REPLY_KEY


@pytest.fixture(scope="module")
def shop() -> Iterator[Shop]:
    with running_shop() as server:
        yield server


@pytest.fixture(scope="module")
def fleet(shop: Shop) -> Iterator[Fleet]:
    with Fleet(catalog(shop.url), ["wfshop"]) as running:
        start_runner(running)
        yield running


@pytest.fixture()
def agent(fleet: Fleet) -> Iterator[ReachClient]:
    with ReachClient(AGENT, fleet.broker_url, drop_duplicates=False) as client:
        yield client


def test_a_run_calls_three_steps_in_order_and_answers_once(fleet: Fleet, shop: Shop, agent: ReachClient) -> None:
    order_id = order()
    receipt = run(agent, order_id)
    assert receipt.status == "succeeded", receipt
    assert receipt.action == "refund_order" and receipt.connector is None
    assert receipt.data == {"refund_id": f"R-{order_id}"}
    steps = receipt.execution.steps
    assert steps is not None and [s["step"] for s in steps] == ["hold", "refund", "notify"]
    assert all(s["status"] == "succeeded" and s["undone"] is False and s["intent_id"] for s in steps)
    assert shop.calls(order_id) == ["/holds", "/refunds", "/notify"]
    with pytest.raises(TimeoutError):
        agent.wait(receipt.intent_id, timeout=1)  # one final receipt, no other
    # each step is in its owner's history (reach.history), with the run it belonged to
    remembered = agent.call("reach.history", {"action": "wfshop.hold_order", "limit": 50}, timeout=30)
    assert remembered.success, remembered.error
    hold = next(r for r in remembered.data["records"] if r["intent_id"] == steps[0]["intent_id"])
    assert hold["run_id"] == receipt.intent_id and hold["params"] == {"order_id": order_id}
    # and the run itself, by the workflow's name: its input, its final status
    runs = agent.call("reach.history", {"action": "refund_order", "limit": 50}, timeout=30)
    assert runs.success, runs.error
    mine = next(r for r in runs.data["records"] if r["intent_id"] == receipt.intent_id)
    assert mine["connector"] is None and mine["status"] == "succeeded" and mine["run_id"] == receipt.intent_id
    assert mine["params"]["order_id"] == order_id


def test_a_conflict_on_the_last_step_undoes_the_others_newest_first(
    fleet: Fleet, shop: Shop, agent: ReachClient
) -> None:
    order_id = order()
    shop.conflict_on.add(order_id)
    receipt = run(agent, order_id)
    assert receipt.status == "failed" and receipt.error is not None and receipt.error.code == "STEP_FAILED"
    assert "notify" in receipt.error.message and receipt.error.retryable is False
    assert shop.calls(order_id) == ["/holds", "/refunds", "/refunds/cancel", "/holds/release"]
    assert [(s["step"], s["undone"]) for s in receipt.execution.steps or []] == [
        ("hold", True),
        ("refund", True),
        ("notify", False),
    ]


def test_a_renamed_output_field_stops_the_run_before_the_step_that_reads_it(
    fleet: Fleet, shop: Shop, agent: ReachClient
) -> None:
    """The pool refuses an answer without a declared output field (DOWNSTREAM_CONTRACT_VIOLATION),
    so a rename is caught at the step that answers, before any step reads it. (A reference with no
    value at run time — a nested path, an answer too large to keep — fails the run naming the
    reference: tests/unit/test_workflow_machine.py.)"""
    order_id = order()
    shop.rename_for.add(order_id)
    receipt = run(agent, order_id)
    assert receipt.error is not None and receipt.error.code == "STEP_FAILED"
    assert "'hold'" in receipt.error.message and receipt.error.details[0]["code"] == "DOWNSTREAM_CONTRACT_VIOLATION"
    assert shop.calls(order_id) == ["/holds"]  # refund never called


@pytest.mark.parametrize("point", ["after_state_write", "after_publish", "before_ack"])
def test_a_runner_killed_at_each_point_repeats_nothing(
    fleet: Fleet, shop: Shop, agent: ReachClient, point: str
) -> None:
    fleet.stop_process("workflows")
    start_runner(fleet, {"REACH_WORKFLOW_CRASH_AT": point})
    order_id = order()
    intent_id = agent.publish("refund_order", {"order_id": order_id})
    proc = fleet.processes.proc("workflows")
    wait_for(lambda: proc.poll() is not None, 30, f"the runner never reached {point}")
    start_runner(fleet)
    receipt = agent.wait(intent_id, timeout=30)
    assert receipt.status == "succeeded", receipt
    assert shop.calls(order_id) == ["/holds", "/refunds", "/notify"]
    with pytest.raises(TimeoutError):
        agent.wait(intent_id, timeout=1)


def test_a_start_sent_twice_runs_once(fleet: Fleet, shop: Shop, agent: ReachClient) -> None:
    order_id = order()
    intent_id = uuid.uuid4().hex
    agent.publish("refund_order", {"order_id": order_id}, intent_id=intent_id)
    agent.publish("refund_order", {"order_id": order_id}, intent_id=intent_id)
    receipt = agent.wait(intent_id, timeout=30)
    assert receipt.status == "succeeded"
    time.sleep(1)
    assert shop.calls(order_id) == ["/holds", "/refunds", "/notify"]


def test_a_start_resent_after_its_run_ended_gets_the_same_final_receipt(
    fleet: Fleet, shop: Shop, agent: ReachClient
) -> None:
    order_id = order()
    intent_id = agent.publish("refund_order", {"order_id": order_id})
    first = agent.wait(intent_id, timeout=30)
    assert first.status == "succeeded"
    agent.publish("refund_order", {"order_id": order_id}, intent_id=intent_id)
    assert agent.wait(intent_id, timeout=15) == first  # the stored receipt, as it was sent
    with pytest.raises(TimeoutError):
        agent.wait(intent_id, timeout=1)
    assert shop.calls(order_id) == ["/holds", "/refunds", "/notify"]


def test_a_start_resent_while_its_run_goes_on_gets_one_final_receipt(
    fleet: Fleet, shop: Shop, agent: ReachClient
) -> None:
    order_id = order()
    held = shop.gate("/refunds", order_id)
    try:
        intent_id = agent.publish("refund_order", {"order_id": order_id})
        wait_for(lambda: shop.reached("/refunds", order_id), 20, "the refund never reached the shop")
        agent.publish("refund_order", {"order_id": order_id}, intent_id=intent_id)
        time.sleep(1)  # the resend reaches the runner while the step is held
    finally:
        held.set()
    assert agent.wait(intent_id, timeout=30).status == "succeeded"
    with pytest.raises(TimeoutError):
        agent.wait(intent_id, timeout=2)
    assert shop.calls(order_id) == ["/holds", "/refunds", "/notify"]


def test_two_starts_with_one_idempotency_key_do_the_work_once(fleet: Fleet, shop: Shop, agent: ReachClient) -> None:
    """The second start comes while the first run is at its refund, a third after it ended: the
    shop does each step once and every start gets the run's outcome under its own intent id."""
    order_id = order()
    key = f"refund-{order_id}"
    held = shop.gate("/refunds", order_id)
    try:
        first = agent.publish("refund_order", {"order_id": order_id}, idempotency_key=key)
        wait_for(lambda: shop.reached("/refunds", order_id), 20, "the refund never reached the shop")
        second = agent.publish("refund_order", {"order_id": order_id}, idempotency_key=key)
        time.sleep(1)
    finally:
        held.set()
    done = agent.wait(first, timeout=30)
    waited = agent.wait(second, timeout=30)
    assert done.status == waited.status == "succeeded" and waited.data == done.data == {"refund_id": f"R-{order_id}"}
    assert waited.execution.deduplicated is True and done.execution.deduplicated is False
    late = agent.call("refund_order", {"order_id": order_id}, idempotency_key=key, timeout=30)
    assert late.status == "succeeded" and late.execution.deduplicated is True and late.data == done.data
    agent.publish("refund_order", {"order_id": order_id}, intent_id=second, idempotency_key=key)
    assert agent.wait(second, timeout=15) == waited  # resent once answered: its receipt again
    assert shop.calls(order_id) == ["/holds", "/refunds", "/notify"]


def test_an_idempotency_key_reused_with_other_input_is_refused_and_runs_nothing(
    fleet: Fleet, shop: Shop, agent: ReachClient
) -> None:
    order_id, other = order(), order()
    key = f"refund-{order_id}"
    assert agent.call("refund_order", {"order_id": order_id}, idempotency_key=key, timeout=30).status == "succeeded"
    refused = agent.call("refund_order", {"order_id": other}, idempotency_key=key, timeout=30)
    assert refused.status == "rejected" and refused.error is not None
    assert refused.error.code == "IDEMPOTENCY_KEY_REUSED" and refused.error.retryable is False
    time.sleep(1)
    assert shop.calls(other) == [] and shop.calls(order_id) == ["/holds", "/refunds", "/notify"]


def test_another_agent_cannot_drive_or_read_a_run(fleet: Fleet, shop: Shop, agent: ReachClient) -> None:
    order_id = order()
    receipt = run(agent, order_id)
    step = (receipt.execution.steps or [])[0]["intent_id"]
    with ReachClient(OTHER, fleet.broker_url, drop_duplicates=False) as other:
        # a step intent of the run, as another agent would forge it
        forged = {
            "intent_id": f"{step}x",
            "agent_id": OTHER,
            "action": "wfshop.hold_order",
            "params": {"order_id": order_id},
            "reply_to": WORKFLOW_REPLY_KEY,
        }
        other.publish_raw(
            json.dumps(forged).encode(),
            headers={"agent_id": OTHER, RUN_ID_HEADER: receipt.intent_id},
            message_id=f"{step}x",
        )
        refused = other.wait(f"{step}x", timeout=15)
        assert refused.status == "rejected" and refused.error is not None
        assert refused.error.code in ("PERMISSION_DENIED", "INVALID_INTENT")
        # claiming to act for the owner
        other.publish_raw(
            json.dumps({**forged, "intent_id": f"{step}y"}).encode(),
            headers={"agent_id": OTHER, ON_BEHALF_OF_HEADER: AGENT, RUN_ID_HEADER: receipt.intent_id},
            message_id=f"{step}y",
        )
        assert other.wait(f"{step}y", timeout=15).status == "rejected"
        # the workflow is not bound to it
        denied = other.call("refund_order", {"order_id": order_id}, timeout=15)
        assert denied.error is not None and denied.error.code in ("PERMISSION_DENIED", "UNKNOWN_ACTION")
    assert shop.calls(order_id) == ["/holds", "/refunds", "/notify"]
    env = {"REACH_BROKER_URL": fleet.broker_url, "REACH_REDIS_URL": fleet.redis_url}
    shown = CliRunner().invoke(main, ["workflow", "show", receipt.intent_id, "--agent", OTHER], env=env)
    assert shown.exit_code == 1 and "no run" in shown.output
    mine = CliRunner().invoke(main, ["workflow", "show", receipt.intent_id, "--agent", AGENT], env=env)
    assert mine.exit_code == 0 and step in mine.output
    listed = CliRunner().invoke(main, ["workflow", "list", "--json", "--agent", AGENT], env=env)
    rows = json.loads(listed.output)
    assert {"run_id", "intent_id", "workflow", "state"} <= set(rows[0])
    assert any(r["run_id"] == receipt.intent_id and r["state"] == "succeeded" for r in rows)
