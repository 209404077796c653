"""The one receipt the agent gets for a run: ``action`` the workflow's name, ``connector`` null,
``data`` the workflow's ``output`` (on success), and each step in ``execution.steps``; and the same
outcome as the answer to a later start with the run's idempotency key (``repeated``)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from producers.wire import ErrorCode, ErrorInfo, Execution, Receipt
from workers.transport.receipts import iso
from workers.workflows.model import Run


def step_rows(run: Run) -> list[dict[str, Any]]:
    """``execution.steps``: the steps that were sent, or that failed before they could be."""
    return [
        {"step": r.step, "intent_id": r.intent_id, "status": r.status, "code": r.code, "undone": r.undone}
        for r in run.steps
        if r.intent_id is not None or r.status == "not_sent"
    ]


def final_receipt(run: Run, state: str, now: float, data: Any = None) -> dict[str, Any]:
    """The final receipt's document for a run ending in ``state`` (its ``error`` when not succeeded)."""
    error = None
    status = "succeeded"
    if state != "succeeded":
        assert run.error is not None
        code = ErrorCode(run.error.code)
        status = code.status
        error = ErrorInfo(
            code=code,
            message=run.error.message,
            # STEP_FAILED is retryable as the failed step's error was; the others never are
            retryable=run.error.retryable if code == ErrorCode.STEP_FAILED else code.retryable,
            suggestion=run.error.suggestion,
            details=run.error.details,
        )
    receipt = Receipt(
        intent_id=run.run_id,
        agent_id=run.owner,
        action=run.workflow,
        connector=None,
        status=status,  # type: ignore[arg-type]
        success=error is None,
        data=data if error is None else None,
        error=error,
        execution=Execution(
            trace_id=run.trace_id,
            attempts=run.intents_sent,
            latency_ms=round((now - run.started_at) * 1000, 3),
            received_at=iso(run.started_at),
            finished_at=iso(now),
            steps=step_rows(run),
        ),
    )
    return receipt.to_doc()


def repeated(final: dict[str, Any], intent_id: str, trace_id: str, received_at: float) -> dict[str, Any]:
    """The run's final receipt as the receipt of a later start with the same idempotency key and
    input: under that start's own ``intent_id`` and trace, ``deduplicated``, no attempts (nothing
    ran for it), as the pools answer a repeated key. It depends on nothing but its arguments, so
    built again after a crash it is the same receipt."""
    original = Receipt.model_validate(final)
    finished = max(datetime.fromisoformat(original.execution.finished_at).timestamp(), received_at)
    execution = original.execution.model_copy(
        update={
            "trace_id": trace_id,
            "attempts": 0,
            "latency_ms": round((finished - received_at) * 1000, 3),
            "received_at": iso(received_at),
            "finished_at": iso(finished),
            "deduplicated": True,
        }
    )
    return original.model_copy(update={"intent_id": intent_id, "execution": execution}).to_doc()
