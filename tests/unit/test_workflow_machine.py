"""The runner's transitions, without Redis or a broker: a run of the shop's refund workflow is
driven with made-up receipts, and each test checks what the runner would publish next."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from connectors.catalog import Catalog, build
from connectors.loader import load_directory
from producers.wire import ErrorCode, ErrorInfo, Execution, Receipt
from tests.unit.test_workflow_catalog import SHOP, WORKFLOW
from workers.transport.topology import WORKFLOW_REPLY_KEY
from workers.workflows import machine
from workers.workflows.ids import parse_step_intent_id, run_digest, step_intent_id
from workers.workflows.model import Run, kept_data, snapshot

T0 = 1_700_000_000.0


@pytest.fixture(scope="module")
def catalog(tmp_path_factory: pytest.TempPathFactory) -> Catalog:
    folder: Path = tmp_path_factory.mktemp("shop")
    (folder / "shop.yaml").write_text(SHOP + "---\n" + WORKFLOW)
    built, problems = build(load_directory(folder))
    assert problems == []
    return built


def begin(catalog: Catalog, **input: Any) -> Run:
    workflow = catalog.workflows["refund_order"]
    start = machine.Start(
        "run-1", "support", input or {"order_id": "o-1", "amount": 5.0}, "support", "t" * 32, None, T0
    )
    return machine.start(start, workflow, snapshot(workflow, catalog), T0)


def receipt(intent_id: str, data: Any = None, code: ErrorCode | None = None, retryable: bool | None = None) -> Receipt:
    error = None
    if code is not None:
        error = ErrorInfo(
            code=code,
            message=f"{code.value} said the system",
            retryable=code.retryable if retryable is None else retryable,
            suggestion="",
        )
    return Receipt(
        intent_id=intent_id,
        agent_id="support",
        action="x",
        connector="shop",
        status="succeeded" if code is None else code.status,
        success=code is None,
        data=data if code is None else None,
        error=error,
        execution=Execution(trace_id="t", received_at="2024-01-01T00:00:00Z", finished_at="2024-01-01T00:00:00Z"),
    )


HOLD = {"hold_id": "H1", "level": "soft", "card": "4111", "qty": 1, "note": "n", "undeclared": "x" * 10}
REFUND = {"refund_id": "R1", "count": 1}


def answer(run: Run, data: Any = None, code: ErrorCode | None = None, now: float = T0 + 1) -> Run:
    assert run.outbound is not None and run.outbound.kind in ("step", "undo")
    moved = machine.on_receipt(run, receipt(run.outbound.intent_id, data, code), now)
    assert moved is not None
    return moved


def test_the_first_step_goes_out_for_the_owner_with_its_receipt_to_the_runner(catalog: Catalog) -> None:
    run = begin(catalog)
    out = run.outbound
    assert out is not None and out.kind == "step" and out.step == 0
    assert out.body["action"] == "shop.hold_order" and out.body["params"] == {"order_id": "o-1"}
    assert out.body["agent_id"] == "support" and out.body["reply_to"] == WORKFLOW_REPLY_KEY
    assert out.body["idempotency_key"] == out.intent_id == step_intent_id("support", "run-1", 0, "do")
    assert run.state == "running" and run.deadline == T0 + 600


def test_a_happy_run_sends_three_steps_then_one_final_receipt(catalog: Catalog) -> None:
    run = answer(begin(catalog), HOLD)
    assert run.outbound is not None and run.outbound.body["params"] == {
        "order_id": "o-1",
        "amount": 5.0,
        "level": "soft",
        "memo": "none",
    }
    run = answer(run, REFUND)
    assert run.outbound is not None and run.outbound.body["params"]["text"] == "Refund R1 for o-1 (n)"
    run = answer(run, {})
    final = run.outbound
    assert run.state == "succeeded" and final is not None and final.kind == "final" and final.intent_id == "run-1"
    doc = run.final
    assert doc is not None and final.body == {}  # the receipt is kept once, in ``final``
    assert doc["status"] == "succeeded" and doc["data"] == {"refund_id": "R1"} and doc["connector"] is None
    assert doc["action"] == "refund_order" and doc["execution"]["attempts"] == 3
    assert [s["step"] for s in doc["execution"]["steps"]] == ["hold", "refund", "notify"]
    assert all(s["status"] == "succeeded" and not s["undone"] for s in doc["execution"]["steps"])
    assert run.steps[0].data is not None and "undeclared" not in run.steps[0].data  # declared fields only


def test_a_receipt_recorded_already_changes_nothing(catalog: Catalog) -> None:
    first = begin(catalog)
    assert first.outbound is not None
    run = answer(first, HOLD)
    assert machine.on_receipt(run, receipt(first.outbound.intent_id, HOLD), T0 + 2) is None
    assert machine.on_receipt(run, receipt("someone-else", HOLD), T0 + 2) is None


def test_a_conflict_on_the_last_step_undoes_the_others_newest_first(catalog: Catalog) -> None:
    run = answer(answer(begin(catalog), HOLD), REFUND)
    run = answer(run, code=ErrorCode.DOWNSTREAM_CONFLICT)
    assert run.state == "compensating"
    assert run.outbound is not None and run.outbound.kind == "undo" and run.outbound.step == 1
    assert run.outbound.body["action"] == "shop.cancel_refund" and run.outbound.body["params"] == {"refund_id": "R1"}
    assert run.outbound.intent_id == step_intent_id("support", "run-1", 1, "undo", 1)
    run = answer(run, {})
    assert run.outbound is not None and run.outbound.step == 0 and run.outbound.body["params"] == {"hold_id": "H1"}
    run = answer(run, {})
    doc = run.final
    assert run.state == "failed" and doc is not None and doc["error"]["code"] == "STEP_FAILED"
    assert doc["status"] == "failed" and doc["error"]["retryable"] is False and "notify" in doc["error"]["message"]
    assert [(s["step"], s["status"], s["undone"]) for s in doc["execution"]["steps"]] == [
        ("hold", "succeeded", True),
        ("refund", "succeeded", True),
        ("notify", "failed", False),
    ]


def test_step_failed_is_retryable_as_the_steps_error_was(catalog: Catalog) -> None:
    run = answer(begin(catalog), code=ErrorCode.DOWNSTREAM_ERROR)
    assert run.final is not None and run.final["error"]["retryable"] is True and run.state == "failed"


def test_a_write_whose_answer_breaks_its_contract_says_it_may_have_taken_effect(catalog: Catalog) -> None:
    run = answer(answer(begin(catalog), HOLD), code=ErrorCode.DOWNSTREAM_CONTRACT_VIOLATION)
    assert run.outbound is not None and run.outbound.kind == "undo" and run.outbound.step == 0  # the hold is undone
    run = answer(run, {})
    assert run.final is not None and run.final["error"]["code"] == "STEP_FAILED"
    assert "may have taken effect and was not undone" in run.final["error"]["suggestion"]
    assert [s["undone"] for s in run.final["execution"]["steps"]] == [True, False]


def test_a_reference_without_a_value_fails_before_the_step_is_sent(catalog: Catalog) -> None:
    renamed = {k: v for k, v in HOLD.items() if k != "level"} | {"holdLevel": "soft"}
    run = answer(begin(catalog), renamed)
    assert run.steps[1].status == "not_sent" and run.steps[1].intent_id is None
    assert run.outbound is not None and run.outbound.kind == "undo" and run.outbound.step == 0
    run = answer(run, {})
    assert run.final is not None
    error = run.final["error"]
    assert error["code"] == "STEP_FAILED" and "$steps.hold.level" in error["message"] and "'refund'" in error["message"]
    assert error["details"][0]["field"] == "$steps.hold.level"
    assert {"step": "refund", "intent_id": None, "status": "not_sent", "code": None, "undone": False} in run.final[
        "execution"
    ]["steps"]


def test_an_unknown_outcome_halts_and_tells_the_agent_at_once(catalog: Catalog) -> None:
    run = answer(answer(begin(catalog), HOLD), code=ErrorCode.OUTCOME_UNKNOWN)
    assert run.state == "unknown" and run.final is not None
    assert run.final["status"] == "unknown" and run.final["error"]["code"] == "STEP_OUTCOME_UNKNOWN"
    assert run.final["error"]["retryable"] is False
    assert run.outbound is not None and run.outbound.kind == "final" and not run.steps[0].undone


def test_a_failing_undo_is_tried_again_then_the_run_is_parked(catalog: Catalog) -> None:
    run = answer(answer(answer(begin(catalog), HOLD), REFUND), code=ErrorCode.DOWNSTREAM_CONFLICT)
    run = answer(run, code=ErrorCode.DOWNSTREAM_ERROR, now=T0 + 2)  # undo of refund fails
    assert run.state == "compensating" and run.outbound is None and run.retry_at == T0 + 3
    assert machine.on_due(run, T0 + 2.5) is None
    again = machine.on_due(run, T0 + 3)
    assert again is not None and again.outbound is not None
    assert again.outbound.intent_id == step_intent_id("support", "run-1", 1, "undo", 2)
    # past the time for undoing: parked, and the agent is told
    late = machine.on_receipt(again, receipt(again.outbound.intent_id, code=ErrorCode.DOWNSTREAM_ERROR), T0 + 2 + 600)
    assert late is not None and late.state == "parked" and late.final is not None
    assert late.final["error"]["code"] == "COMPENSATION_FAILED" and late.final["status"] == "unknown"
    # an operator resumes it: the undo is tried once more; no second final receipt
    resumed = machine.resume(late, T0 + 700, "ops")
    assert resumed.state == "compensating" and resumed.outbound is not None and resumed.outbound.kind == "undo"
    assert resumed.outbound.intent_id == step_intent_id("support", "run-1", 1, "undo", 3)
    done = answer(answer(resumed, {}, now=T0 + 701), {}, now=T0 + 702)
    assert done.state == "failed" and done.outbound is None and done.final == late.final
    assert [e.what for e in done.events][-2:] == ["resumed: undoing the completed steps", "ended failed"]


def test_an_undos_tries_share_one_idempotency_key_until_the_system_says_a_definite_no(catalog: Catalog) -> None:
    run = answer(answer(answer(begin(catalog), HOLD), REFUND), code=ErrorCode.DOWNSTREAM_CONFLICT)
    assert run.outbound is not None and run.outbound.body is not None
    first = run.outbound.body["idempotency_key"]
    assert first == run.outbound.intent_id  # a step's and an undo's first try: the intent id

    def next_try(run: Run, code: ErrorCode, now: float) -> Run:
        failed = answer(run, code=code, now=now)
        assert failed.retry_at is not None
        again = machine.on_due(failed, failed.retry_at)
        assert again is not None and again.outbound is not None and again.outbound.body is not None
        return again

    # a timeout or a 5xx may have landed: the next try carries the same key, so the system dedupes it
    run = next_try(next_try(run, ErrorCode.DOWNSTREAM_TIMEOUT, T0 + 2), ErrorCode.DOWNSTREAM_ERROR, T0 + 4)
    assert run.outbound is not None and run.outbound.body is not None
    assert run.outbound.intent_id == step_intent_id("support", "run-1", 1, "undo", 3)
    assert run.outbound.body["idempotency_key"] == first
    # a definite no took no effect, and the pool keeps it under the old key: a new key, or it repeats
    run = next_try(run, ErrorCode.DOWNSTREAM_CONFLICT, T0 + 8)
    assert run.outbound is not None and run.outbound.body is not None
    assert run.outbound.body["idempotency_key"] == run.outbound.intent_id != first


@pytest.mark.parametrize("code", [ErrorCode.OUTCOME_UNKNOWN, ErrorCode.DOWNSTREAM_CONTRACT_VIOLATION])
def test_an_undo_that_may_have_taken_effect_parks_at_once_and_a_resume_sends_it_under_a_new_key(
    catalog: Catalog, code: ErrorCode
) -> None:
    run = answer(answer(answer(begin(catalog), HOLD), REFUND), code=ErrorCode.DOWNSTREAM_CONFLICT)
    assert run.outbound is not None
    first = run.outbound.body["idempotency_key"]
    parked = answer(run, code=code, now=T0 + 2)
    assert parked.state == "parked" and parked.retry_at is None and parked.final is not None
    assert parked.final["error"]["code"] == "COMPENSATION_FAILED"
    assert "may or may not have taken effect" in parked.final["error"]["message"]
    resumed = machine.resume(parked, T0 + 100, "ops")
    assert resumed.outbound is not None and resumed.outbound.kind == "undo"
    assert resumed.outbound.body["idempotency_key"] == resumed.outbound.intent_id != first


def test_only_parked_or_halted_runs_take_operator_actions(catalog: Catalog) -> None:
    run = begin(catalog)
    with pytest.raises(machine.NotAllowed):
        machine.resume(run, T0, "ops")
    with pytest.raises(machine.NotAllowed):
        machine.abort(run, T0, "ops")
    halted = answer(run, code=ErrorCode.OUTCOME_UNKNOWN)
    aborted = machine.abort(halted, T0 + 5, "ops")
    assert aborted.state == "failed" and aborted.outbound == halted.outbound  # the final receipt still goes


def test_a_step_with_no_receipt_past_the_deadline_is_unknown(catalog: Catalog) -> None:
    run = begin(catalog)
    assert machine.on_due(run, run.deadline + 1) is None
    overdue = machine.on_due(run, run.deadline + machine.GRACE_SECONDS)
    assert overdue is not None and overdue.state == "unknown" and overdue.steps[0].status == "unknown"


def test_a_step_with_its_own_timeout_is_unknown_30_s_past_it_not_at_the_runs_end(tmp_path: Path) -> None:
    timed = WORKFLOW.replace(
        "      params: { order_id: $input.order_id }\n      compensate:",
        "      timeout: 20s\n      params: { order_id: $input.order_id }\n      compensate:",
        1,
    )
    assert timed != WORKFLOW
    (tmp_path / "shop.yaml").write_text(SHOP + "---\n" + timed)
    catalog, problems = build(load_directory(tmp_path))
    assert problems == []
    run = begin(catalog)
    assert run.outbound is not None and run.outbound.body["deadline"].startswith("2023-11-14T22:13:40")  # T0 + 20 s
    assert machine.next_look(run, run.outbound.marker, T0) == T0 + 20 + machine.GRACE_SECONDS
    assert machine.on_due(run, T0 + 20 + machine.GRACE_SECONDS - 1) is None
    overdue = machine.on_due(run, T0 + 20 + machine.GRACE_SECONDS)
    assert overdue is not None and overdue.state == "unknown" and overdue.final is not None
    assert overdue.final["error"]["code"] == "STEP_OUTCOME_UNKNOWN"
    # while a person decides on it, the run's own time is what counts
    waiting = machine.on_approval(run, run.outbound.intent_id, "ap-1", T0 + 1)
    assert waiting is not None and machine.on_due(waiting, T0 + 20 + machine.GRACE_SECONDS) is None
    assert machine.on_due(waiting, waiting.deadline + machine.GRACE_SECONDS) is not None


def test_an_approval_notice_marks_the_step_waiting(catalog: Catalog) -> None:
    run = begin(catalog)
    assert run.outbound is not None
    waiting = machine.on_approval(run, run.outbound.intent_id, "ap-1", T0 + 1)
    assert waiting is not None and waiting.steps[0].status == "waiting_approval" and waiting.outbound == run.outbound
    assert machine.on_approval(waiting, run.outbound.intent_id, "ap-1", T0 + 1) is None
    assert answer(waiting, HOLD).steps[0].status == "succeeded"


def test_the_sweep_looks_again_until_the_outbound_is_confirmed(catalog: Catalog) -> None:
    run = begin(catalog)
    assert run.outbound is not None
    assert machine.next_look(run, None, T0) == T0 + machine.RESEND_AFTER_SECONDS
    assert machine.next_look(run, run.outbound.marker, T0) == run.deadline + machine.GRACE_SECONDS
    final = answer(answer(answer(run, HOLD), REFUND), {})
    assert final.outbound is not None and machine.next_look(final, final.outbound.marker, T0) is None


def test_a_run_keeps_its_definition_across_a_catalog_change(catalog: Catalog) -> None:
    run = Run.from_json(begin(catalog).to_json())
    assert run.definition() == catalog.workflows["refund_order"]
    assert json.loads(run.to_json())["spec"]["name"] == "refund_order"


def test_step_intent_ids_are_deterministic_short_and_parse_back() -> None:
    one = step_intent_id("support", "run-1", 2, "undo", 3)
    assert one == step_intent_id("support", "run-1", 2, "undo", 3) != step_intent_id("other", "run-1", 2, "undo", 3)
    assert len(step_intent_id("a" * 63, "x" * 128, 19, "undo", 999999)) <= 128
    parsed = parse_step_intent_id(one)
    assert parsed is not None and (parsed.owner, parsed.digest, parsed.step, parsed.kind, parsed.attempt) == (
        "support",
        run_digest("support", "run-1"),
        2,
        "undo",
        3,
    )
    assert parse_step_intent_id("wf.support.zz.1.d0") is None
    assert parse_step_intent_id(one.replace("wf.support", "wf.Support")) is None


def test_kept_data_is_declared_fields_within_the_bound() -> None:
    assert kept_data({"a": 1, "b": 2}, ["a"]) == {"a": 1}
    assert kept_data({"a": "x" * 300_000}, ["a"]) is None
    assert kept_data(["not", "an", "object"], ["a"]) == {}
