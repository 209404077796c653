"""What the runner counts (reach_workflow_* metrics) and what it puts in the trace of a run's
starting intent, for each transition it wrote."""

from __future__ import annotations

from typing import Any

from workers.observability import metrics
from workers.workflows.model import Run

_AWAITING = ("sent", "waiting_approval")


def observe(before: Run | None, after: Run, now: float) -> None:
    """Count what a transition just written did: a run started, a step's or an undo's answer taken
    (its time since the intent was written), a failed undo, the final receipt decided."""
    workflow = after.workflow
    if before is None:
        metrics.WORKFLOW_RUNS_STARTED.labels(workflow).inc()
    elif before.outbound is not None and before.outbound.kind != "final" and before.outbound.step is not None:
        index, kind = before.outbound.step, before.outbound.kind
        was, now_is = before.steps[index], after.steps[index]
        if kind == "step" and was.status in _AWAITING and now_is.status not in _AWAITING:
            metrics.WORKFLOW_STEP_SECONDS.labels(workflow, was.step, "do").observe(now - before.outbound.written_at)
        elif kind == "undo" and was.undo is not None and was.undo.status in _AWAITING:
            undo = now_is.undo
            if undo is None or undo.intent_id != was.undo.intent_id or undo.status not in _AWAITING:
                seconds = now - before.outbound.written_at
                metrics.WORKFLOW_STEP_SECONDS.labels(workflow, was.step, "undo").observe(seconds)
                if undo is not None and undo.intent_id == was.undo.intent_id and undo.status == "failed":
                    metrics.WORKFLOW_UNDOS_FAILED.labels(workflow).inc()
    if after.final is not None and (before is None or before.final is None):
        metrics.WORKFLOW_RUNS.labels(workflow, after.state).inc()


def stage(run: Run) -> tuple[str, dict[str, Any]]:
    """What the trace of the run's starting intent says about the outbound just sent."""
    outbound = run.outbound
    assert outbound is not None
    if outbound.kind == "final":
        code = (run.final or {}).get("error") or {}
        return "workflow_finished", {"agent": run.owner, "state": run.state, "code": code.get("code")}
    step = run.steps[outbound.step or 0]
    return f"workflow_{outbound.kind}", {"agent": run.owner, "step": step.step, "step_intent": outbound.intent_id}
