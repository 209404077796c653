"""The job: what the router hands a connector's pool for one checked intent.

One frozen, versioned model on both sides of ``reach.dispatch`` (and in ``reach dlq replay``).
Its JSON is the pool task's only argument, with the keys of the previous version's job, so a pool
reads jobs queued by an older router. A change that an older pool could not read is a new ``v``.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from workers.state.approval_store import payload_hash

JOB_VERSION: Literal[1] = 1


class Job(BaseModel):
    """One checked intent on its way to the pool of ``connector``.

    Times are epoch seconds; ``deadline`` None means none was given.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    v: Literal[1] = JOB_VERSION
    intent_id: str = Field(min_length=1)
    agent_id: str = Field(min_length=1)
    connector: str = Field(min_length=1)
    action: str = Field(min_length=1)
    params: dict[str, Any]
    idempotency_key: str = Field(min_length=1)  # the intent's own, or its intent id
    reply_to: str = Field(min_length=1)  # the receipt's routing key on reach.receipts
    deadline: float | None
    trace_id: str
    traceparent: str | None
    format: str  # the intent's wire format (for the audit trail)
    received_at: float
    dispatched_at: float
    # agents calling agents (connector type agent): how many agent-to-agent calls led here. Left
    # out of the JSON when 0, so a pool that predates it reads every job without one.
    hops: int = Field(default=0, ge=0, le=64)
    # how semantic routing chose the connector (workers/router/semantic.py), for the receipt's
    # execution.routing; None (and left out of the JSON) when the action named one connector
    routing: dict[str, Any] | None = None
    # the workflow run a step intent belongs to (the router checked it: x-reach-run-id), for its
    # history record; None (and left out of the JSON) for an agent's own intent
    run_id: str | None = Field(default=None, max_length=256)

    def payload_hash(self) -> str:
        """The hash of what this job asks: what a parked approval is bound to, and the tag its
        budgets were counted under (``workers.state.budgets.budget_tag``)."""
        return payload_hash(self.agent_id, self.connector, self.action, self.params, self.idempotency_key)


class JobDecodeError(ValueError):
    """A task argument that is not a job this pool can run; ``doc`` is it when it was an object."""

    def __init__(self, reason: str, doc: dict[str, Any] | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.doc = doc


def parse_job(doc: Any) -> Job:
    """The job in ``doc`` (a task argument, or a dead letter's body); raises JobDecodeError
    with the validation's reason, short enough for a dead letter's header."""
    if not isinstance(doc, dict):
        raise JobDecodeError("the task's argument is not a job object")
    try:
        return Job.model_validate(doc)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '(job)'}: {e['msg']}"
            for e in exc.errors(include_url=False, include_input=False)[:5]
        )
        raise JobDecodeError(f"not a valid job (v{JOB_VERSION}): {problems}"[:1000], doc) from exc


def parse_job_json(body: bytes | str) -> Job:
    """A job from JSON text (a dead letter's body)."""
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise JobDecodeError("the body is not JSON") from exc
    return parse_job(doc)
