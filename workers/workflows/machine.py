"""A run's transitions: pure functions from a run and what happened to the next run.

Nothing here touches Redis or the broker, or reads the clock: ``now`` is given. Each function
returns the new run (its ``outbound`` is what must be published next) or None when the event
changes nothing (a receipt already recorded, a late one, a sweep with nothing due): the runner
then only makes sure the run's current outbound was published (``workers.workflows.runner``).

Forward, steps run in order; a step whose params cannot be resolved (a reference without a value)
is never sent. On a failed step the run *compensates*: the completed steps that declare
``compensate`` are undone newest first, one at a time; a failing undo is tried again with backoff
until the run's time for undoing (``undo_until``: the workflow's ``timeout`` from the moment
compensation began) runs out, then the run is *parked*. An ``unknown`` step halts the run
(``on_unknown: halt``) or compensates. Whatever the end, the final receipt is decided once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from connectors.workflows.references import Missing, resolve
from connectors.workflows.spec import WorkflowSpec
from producers.wire import ErrorCode, Receipt
from workers.transport.receipts import iso
from workers.transport.topology import WORKFLOW_REPLY_KEY
from workers.workflows.final import final_receipt
from workers.workflows.ids import step_intent_id
from workers.workflows.model import SETTLED, Outbound, Run, RunError, StepRecord, Undo, kept_data

GRACE_SECONDS = 30.0  # a step or undo still out this long past its time is taken as unknown
RESEND_AFTER_SECONDS = 5.0  # an outbound not confirmed this long after it was written is sent again
BACKOFF_FIRST_SECONDS = 1.0
BACKOFF_MAX_SECONDS = 60.0


class NotAllowed(ValueError):
    """An operator action the run's state does not allow (the message says why)."""


@dataclass(frozen=True)
class Start:
    """What the runner knows of a run when its start job arrives."""

    run_id: str
    owner: str
    input: dict[str, Any]
    reply_to: str
    trace_id: str
    traceparent: str | None
    received_at: float


def start(
    begin: Start,
    workflow: WorkflowSpec,
    snapshot: tuple[dict[str, Any], str, dict[str, list[str]]],
    now: float,
) -> Run:
    """A new run of ``workflow`` (``snapshot``: ``model.snapshot`` of it), its first step outbound."""
    doc, digest, outputs = snapshot
    run = Run(
        run_id=begin.run_id,
        owner=begin.owner,
        workflow=workflow.name,
        spec=doc,
        spec_digest=digest,
        outputs=outputs,
        input=begin.input,
        reply_to=begin.reply_to,
        trace_id=begin.trace_id,
        traceparent=begin.traceparent,
        started_at=begin.received_at,
        deadline=begin.received_at + workflow.timeout,
        steps=[StepRecord(step=s.id, action=s.action) for s in workflow.steps],
    )
    return _advance(run, workflow, 0, now)


# -- events --------------------------------------------------------------------------------------


def on_receipt(run: Run, receipt: Receipt, now: float) -> Run | None:
    """A step's or an undo's receipt; None if it was recorded already or is not awaited any more."""
    spec = run.definition()
    for index, record in enumerate(run.steps):
        if record.intent_id == receipt.intent_id:
            if record.status not in ("sent", "waiting_approval"):
                return None
            return _step_answered(run, spec, index, receipt, now)
        if record.undo is not None and record.undo.intent_id == receipt.intent_id:
            if record.undo.status not in ("sent", "waiting_approval"):
                return None
            return _undo_answered(run, spec, index, receipt, now)
    return None


def on_approval(run: Run, intent_id: str, approval_id: str, now: float) -> Run | None:
    """A step or undo waits for a person (an ``approval_pending`` notice)."""
    steps = list(run.steps)
    for index, record in enumerate(steps):
        if record.intent_id == intent_id and record.status == "sent":
            steps[index] = record.model_copy(update={"status": "waiting_approval", "approval_id": approval_id})
            return run.model_copy(update={"steps": steps})
        if record.undo is not None and record.undo.intent_id == intent_id and record.undo.status == "sent":
            undo = record.undo.model_copy(update={"status": "waiting_approval"})
            steps[index] = record.model_copy(update={"undo": undo, "approval_id": approval_id})
            return run.model_copy(update={"steps": steps})
    return None


def on_due(run: Run, now: float) -> Run | None:
    """What the sweep does when it looks at a run: try a failed undo again, or stop waiting for a
    step or undo whose receipt is overdue. None: nothing is due yet."""
    spec = run.definition()
    outbound = run.outbound
    overdue_at = _overdue_at(run, spec)
    if run.state == "running" and overdue_at is not None and outbound is not None and outbound.step is not None:
        if now >= overdue_at:
            overdue = "no receipt came in time (its own timeout or the run's, and 30 s more)"
            return _step_unknown(run, spec, outbound.step, ErrorCode.OUTCOME_UNKNOWN.value, overdue, now)
    if run.state != "compensating":
        return None
    if overdue_at is not None and outbound is not None and outbound.step is not None:
        if now >= overdue_at:
            return _park(run, spec, outbound.step, "no receipt came for its undo in time", now)
        return None
    if run.retry_at is not None and now >= run.retry_at:
        return _next_undo(run.model_copy(update={"retry_at": None}), spec, now)
    return None


def _overdue_at(run: Run, spec: WorkflowSpec) -> float | None:
    """When the step or undo out now is taken as unknown: 30 s past its intent's deadline (the
    step's ``timeout`` from when it was written, within the run's time); while a person decides on
    it, 30 s past the run's time. None when nothing is out."""
    outbound = run.outbound
    if outbound is None or outbound.step is None or outbound.kind == "final":
        return None
    record = run.steps[outbound.step]
    if outbound.kind == "step":
        if run.state != "running" or record.status not in ("sent", "waiting_approval"):
            return None
        status, until = record.status, run.deadline
    else:
        if run.state != "compensating" or record.undo is None or record.undo.status not in ("sent", "waiting_approval"):
            return None
        status, until = record.undo.status, run.undo_until if run.undo_until is not None else run.deadline
    timeout = spec.steps[outbound.step].timeout
    if timeout and status == "sent":
        until = min(outbound.written_at + timeout, until)
    return until + GRACE_SECONDS


def resume(run: Run, now: float, by: str) -> Run:
    """An operator resumes a parked or halted run: its completed steps are undone (again tried
    until the workflow's ``timeout`` from now). The agent got its final receipt already and gets no other."""
    if run.state not in ("parked", "unknown"):
        raise NotAllowed(f"run {run.run_id} is {run.state}: only a parked or unknown run can be resumed")
    spec = run.definition()
    resumed = run.model_copy(
        update={
            "state": "compensating",
            "undo_until": now + spec.timeout,
            "retry_at": None,
            "events": run.noted("resumed: undoing the completed steps", now, by),
        }
    )
    return _next_undo(resumed, spec, now)


def abort(run: Run, now: float, by: str) -> Run:
    """An operator gives up on a parked or halted run: it is failed, nothing more is sent for it
    (a final receipt not yet confirmed is still sent)."""
    if run.state not in ("parked", "unknown"):
        raise NotAllowed(f"run {run.run_id} is {run.state}: only a parked or unknown run can be aborted")
    keep = run.outbound if run.outbound is not None and run.outbound.kind == "final" else None
    return run.model_copy(
        update={
            "state": "failed",
            "outbound": keep,
            "retry_at": None,
            "events": run.noted("aborted: nothing more is undone", now, by),
        }
    )


def keep_until(run: Run) -> float | None:
    """Until when a run still going must be kept (then the retention on top); None once settled."""
    if run.state in SETTLED:
        return None
    return max(run.deadline, run.undo_until or 0.0) + GRACE_SECONDS


def next_look(run: Run, sent: str | None, now: float) -> float | None:
    """When the sweep must look at the run next (None: never, unless an operator acts)."""
    times = []
    outbound = run.outbound
    if outbound is not None and sent != outbound.marker:
        times.append(outbound.written_at + RESEND_AFTER_SECONDS)
    overdue_at = _overdue_at(run, run.definition())
    if overdue_at is not None:
        times.append(overdue_at)
    elif run.state == "running":
        times.append(run.deadline + GRACE_SECONDS)
    elif run.state == "compensating":
        times.append(run.retry_at if run.retry_at is not None else (run.undo_until or run.deadline) + GRACE_SECONDS)
    return min(times) if times else None


# -- forward ---------------------------------------------------------------------------------------


def _done(run: Run) -> dict[str, Any]:
    """Each completed step's kept answer, as references read them."""
    return {r.step: r.data for r in run.steps if r.status == "succeeded" and r.data is not None}


def _advance(run: Run, spec: WorkflowSpec, index: int, now: float) -> Run:
    """Send step ``index``, or finish when there is none."""
    if index >= len(spec.steps):
        try:
            data = resolve(spec.output_values, run.input, _done(run))
        except Missing as exc:
            error = _reference_error("the output", exc.reference)
            return _compensate(run.model_copy(update={"error": error}), spec, now)
        return _finish(run.model_copy(update={"outbound": None}), spec, "succeeded", now, data)
    step = spec.steps[index]
    try:
        params = resolve(step.values, run.input, _done(run))
    except Missing as exc:
        steps = list(run.steps)
        steps[index] = steps[index].model_copy(
            update={"status": "not_sent", "message": f"{exc.reference} has no value"}
        )
        error = _reference_error(f"step {step.id!r}", exc.reference)
        return _compensate(run.model_copy(update={"steps": steps, "error": error}), spec, now)
    intent_id = step_intent_id(run.owner, run.run_id, index, "do")
    until = min(now + step.timeout, run.deadline) if step.timeout else run.deadline
    steps = list(run.steps)
    steps[index] = steps[index].model_copy(update={"intent_id": intent_id, "status": "sent"})
    body = _intent(run, intent_id, step.action, params, until)
    return run.model_copy(
        update={
            "steps": steps,
            "outbound": Outbound(kind="step", intent_id=intent_id, step=index, body=body, written_at=now),
            "intents_sent": run.intents_sent + 1,
        }
    )


def _step_answered(run: Run, spec: WorkflowSpec, index: int, receipt: Receipt, now: float) -> Run:
    record = run.steps[index]
    error = receipt.error
    code = error.code.value if error is not None else None
    message = error.message[:1000] if error is not None else None
    if receipt.status == "unknown":
        return _step_unknown(run, spec, index, code or ErrorCode.OUTCOME_UNKNOWN.value, message or "", now)
    steps = list(run.steps)
    if receipt.status == "succeeded":
        kept = kept_data(receipt.data, run.outputs.get(record.step, []))
        steps[index] = record.model_copy(
            update={
                "status": "succeeded",
                "data": kept,
                "message": None if kept is not None else "answer too large to keep",
            }
        )
        return _advance(run.model_copy(update={"steps": steps, "outbound": None}), spec, index + 1, now)
    retryable = bool(error.retryable) if error is not None else False
    suggestion = error.suggestion[:1000] if error is not None and error.suggestion else ""
    if code == ErrorCode.DOWNSTREAM_CONTRACT_VIOLATION.value:
        # the system did answer (a write took effect) but without what its action declares, which
        # is what an undo would read: the other steps are undone, this one cannot be
        suggestion = (
            f"Step {record.step!r} may have taken effect and was not undone (its answer broke the action's "
            "declared output); check the system before starting the workflow again."
        )
    steps[index] = record.model_copy(
        update={"status": receipt.status, "code": code, "message": message, "retryable": retryable}
    )
    failed = RunError(
        code=ErrorCode.STEP_FAILED.value,
        message=f"step {record.step!r} ({record.action}) {receipt.status}: {code}: {message}"[:2000],
        retryable=retryable,
        suggestion=suggestion
        or "The steps done before it were undone; fix what the step's error says, then start the workflow again.",
        details=[{"field": f"steps.{record.step}", "code": code, "message": message}],
    )
    return _compensate(run.model_copy(update={"steps": steps, "error": failed, "outbound": None}), spec, now)


def _step_unknown(run: Run, spec: WorkflowSpec, index: int, code: str, message: str, now: float) -> Run:
    record = run.steps[index]
    steps = list(run.steps)
    steps[index] = record.model_copy(update={"status": "unknown", "code": code, "message": message[:1000]})
    error = RunError(
        code=ErrorCode.STEP_OUTCOME_UNKNOWN.value,
        message=f"step {record.step!r} ({record.action}) may or may not have taken effect: {code}: {message}"[:2000],
        suggestion="Check the system before doing anything again; an operator can resume the run "
        "(undo the completed steps) or abort it (reach workflow resume|abort RUN).",
        details=[{"field": f"steps.{record.step}", "code": code, "message": message[:1000]}],
    )
    run = run.model_copy(update={"steps": steps, "error": error, "outbound": None})
    if spec.steps[index].on_unknown == "compensate":
        return _compensate(run, spec, now)
    return _finish(run, spec, "unknown", now)


def _reference_error(where: str, reference: str) -> RunError:
    return RunError(
        code=ErrorCode.STEP_FAILED.value,
        message=f"{where} was not sent: the reference {reference} has no value",
        retryable=False,
        suggestion="A step's answer lacks a field the workflow reads (the system may have renamed it): "
        "tell an operator; the steps done before it were undone.",
        details=[{"field": reference, "code": "missing_reference", "message": f"{reference} has no value"}],
    )


# -- compensation ------------------------------------------------------------------------------------


def _compensate(run: Run, spec: WorkflowSpec, now: float) -> Run:
    until = run.undo_until if run.undo_until is not None else now + spec.timeout
    return _next_undo(run.model_copy(update={"state": "compensating", "undo_until": until}), spec, now)


def _next_undo(run: Run, spec: WorkflowSpec, now: float) -> Run:
    """Undo the newest completed step not undone yet; finish when none is left."""
    for index in range(len(run.steps) - 1, -1, -1):
        record = run.steps[index]
        if record.status == "succeeded" and not record.undone and spec.steps[index].compensate is not None:
            return _send_undo(run, spec, index, now)
    unknown = run.error is not None and run.error.code == ErrorCode.STEP_OUTCOME_UNKNOWN.value
    return _finish(run.model_copy(update={"outbound": None}), spec, "unknown" if unknown else "failed", now)


def _send_undo(run: Run, spec: WorkflowSpec, index: int, now: float) -> Run:
    step = spec.steps[index]
    compensate = step.compensate
    assert compensate is not None
    record = run.steps[index]
    try:
        params = resolve(compensate.values, run.input, _done(run))
    except Missing as exc:
        return _park(run, spec, index, f"its undo reads {exc.reference}, which has no value", now)
    attempt = record.undo.attempt + 1 if record.undo is not None else 1
    intent_id = step_intent_id(run.owner, run.run_id, index, "undo", attempt)
    key = _undo_key(record.undo, intent_id)
    undo_until = run.undo_until if run.undo_until is not None else run.deadline
    until = min(now + step.timeout, undo_until) if step.timeout else undo_until
    steps = list(run.steps)
    steps[index] = record.model_copy(update={"undo": Undo(intent_id=intent_id, attempt=attempt, key=key)})
    body = _intent(run, intent_id, compensate.action, params, until, key)
    return run.model_copy(
        update={
            "steps": steps,
            "state": "compensating",
            "outbound": Outbound(kind="undo", intent_id=intent_id, step=index, body=body, written_at=now),
            "intents_sent": run.intents_sent + 1,
        }
    )


def _undo_key(last: Undo | None, intent_id: str) -> str:
    """The idempotency key of an undo's next try: the last try's, so that a system behind
    ``idempotency_header`` applies the undo once even when a try's answer was lost (a timeout, a
    5xx). A new one only after a definite no (a failed, not retryable answer: nothing took effect,
    and the pool keeps that answer under the old key, so the same key would only repeat it)."""
    if last is None or last.key is None:
        return intent_id
    code = ErrorCode._value2member_map_.get(last.code or "")
    # an answer that may have landed (unknown, or one that broke its contract) parks the run at
    # once; the try after it comes from an operator who checked the system, and the pool keeps that
    # answer under the old key too
    kept_under_key = isinstance(code, ErrorCode) and (
        (code.status in ("failed", "unknown") and not code.retryable) or code is ErrorCode.IDEMPOTENCY_KEY_REUSED
    )
    return intent_id if kept_under_key else last.key


def _undo_answered(run: Run, spec: WorkflowSpec, index: int, receipt: Receipt, now: float) -> Run:
    record = run.steps[index]
    undo = record.undo
    assert undo is not None
    steps = list(run.steps)
    if receipt.status == "succeeded":
        steps[index] = record.model_copy(
            update={"undone": True, "undo": undo.model_copy(update={"status": "succeeded"})}
        )
        return _next_undo(run.model_copy(update={"steps": steps, "outbound": None}), spec, now)
    error = receipt.error
    failed = undo.model_copy(
        update={
            "status": "failed",
            "code": error.code.value if error is not None else None,
            "message": error.message[:1000] if error is not None else None,
        }
    )
    steps[index] = record.model_copy(update={"undo": failed})
    run = run.model_copy(update={"steps": steps, "outbound": None})
    if receipt.status == "unknown" or failed.code == ErrorCode.DOWNSTREAM_CONTRACT_VIOLATION.value:
        # trying again would not tell: the pool answers the same key from its ledger, and a new key
        # could undo twice. A person checks the system (then resumes or aborts)
        return _park(run, spec, index, f"its undo may or may not have taken effect ({failed.code})", now)
    retry_at = now + min(BACKOFF_MAX_SECONDS, BACKOFF_FIRST_SECONDS * 2 ** (undo.attempt - 1))
    if retry_at >= (run.undo_until if run.undo_until is not None else run.deadline):
        return _park(run, spec, index, f"its undo failed {undo.attempt} time(s), last with {failed.code}", now)
    return run.model_copy(update={"retry_at": retry_at})


def _park(run: Run, spec: WorkflowSpec, index: int, why: str, now: float) -> Run:
    record = run.steps[index]
    first = run.error.details if run.error is not None else []
    error = RunError(
        code=ErrorCode.COMPENSATION_FAILED.value,
        message=f"step {record.step!r} ({record.action}) could not be undone: {why}"[:2000],
        suggestion="The run is parked for an operator (reach workflow show|resume|abort RUN); "
        "do not start the workflow again before they have looked at it.",
        details=[*first, {"field": f"steps.{record.step}.undo", "code": "undo_failed", "message": why[:1000]}],
    )
    parked = run.model_copy(update={"error": error, "outbound": None, "retry_at": None})
    return _finish(parked, spec, "parked", now)


# -- the end -------------------------------------------------------------------------------------------


def _finish(run: Run, spec: WorkflowSpec, state: str, now: float, data: Any = None) -> Run:
    """The run ends in ``state``; its final receipt is decided here, once: a run an operator
    resumed after the agent was told keeps the receipt it sent."""
    if run.final is not None:
        return run.model_copy(update={"state": state, "events": run.noted(f"ended {state}", now)})
    receipt = final_receipt(run, state, now, data)
    outbound = Outbound(kind="final", intent_id=run.run_id, written_at=now)  # its body is ``final``
    return run.model_copy(update={"state": state, "final": receipt, "outbound": outbound, "retry_at": None})


def _intent(
    run: Run, intent_id: str, action: str, params: dict[str, Any], until: float, key: str | None = None
) -> dict[str, Any]:
    """A step's or an undo's intent, sent for the run's owner; its receipt comes to the runner."""
    body: dict[str, Any] = {
        "intent_id": intent_id,
        "agent_id": run.owner,
        "action": action,
        "params": params,
        "idempotency_key": key or intent_id,
        "reply_to": WORKFLOW_REPLY_KEY,
        "deadline": iso(until),
    }
    if run.traceparent is not None:
        body["traceparent"] = run.traceparent
    return body
