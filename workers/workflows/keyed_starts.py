"""Starts that share an idempotency key: what a start's key is compared by, how long its claim
is kept, and the answers to a start whose key belongs to another run (workers/workflows/runner.py
gives the run's own outcome when the input matches)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from connectors.workflows.spec import WorkflowSpec
from producers.wire import ErrorCode
from workers.transport.job import Job
from workers.transport.receipts import build_receipt
from workers.workflows import machine

STARTING_RETRY_MS = 1000  # a start whose key's run is not written yet is told to come back this soon


def input_digest(params: dict[str, Any]) -> str:
    """What a start's idempotency key is compared by: its input (defaults applied by the router)."""
    return hashlib.sha256(json.dumps(params, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:32]


def longest_life(workflow: WorkflowSpec) -> float:
    """The longest a run of ``workflow`` goes on (seconds from its start): its timeout, then as long
    again for undoing, and the grace on each."""
    return 2 * (workflow.timeout + machine.GRACE_SECONDS)


def refusal(
    job: Job, code: ErrorCode, message: str, suggestion: str, retry_after_ms: int | None = None
) -> dict[str, Any]:
    """The receipt a workflow start gets when it starts no run of its own."""
    receipt = build_receipt(
        intent_id=job.intent_id,
        agent_id=job.agent_id,
        action=job.action,
        connector=None,
        trace_id=job.trace_id,
        received_at=job.received_at,
        code=code,
        message=message,
        suggestion=suggestion,
        retry_after_ms=retry_after_ms,
    )
    return receipt.to_doc()


def key_reused(job: Job, run_id: str) -> dict[str, Any]:
    return refusal(
        job,
        ErrorCode.IDEMPOTENCY_KEY_REUSED,
        f"idempotency key was already used by run {run_id} of {job.action} with different input",
        "Use a new idempotency_key for a different request, or resend the original input.",
    )


def key_busy(job: Job, run_id: str, why: str) -> dict[str, Any]:
    return refusal(
        job,
        ErrorCode.CONNECTOR_UNAVAILABLE,
        f"run {run_id} with the same idempotency key {why}",
        f"Send it again after retry_after_ms, with a new intent id and the same idempotency_key: "
        f"it will get run {run_id}'s outcome.",
        retry_after_ms=STARTING_RETRY_MS,
    )
