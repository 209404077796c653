"""The job the router dispatches for an intent it let through: to a connector's pool (an action)
or to the workflow runner (a workflow's start), built the same way for both."""

from __future__ import annotations

from typing import Any

from workers.observability.tracing import traceparent_for
from workers.router.intake import ParsedIntent
from workers.transport.job import Job


def job_for(
    parsed: ParsedIntent,
    *,
    connector: str,
    action: str,
    params: dict[str, Any],
    received_at: float,
    dispatched_at: float,
    routing: dict[str, Any] | None = None,
) -> Job:
    """The job for ``parsed`` with its checked ``params`` (defaults applied). Defaults of the
    intent are filled in here: the idempotency key is the intent id, replies go to the agent."""
    intent = parsed.intent
    assert intent.intent_id is not None and intent.agent_id is not None  # intake gave both
    return Job(
        intent_id=intent.intent_id,
        agent_id=intent.agent_id,
        connector=connector,
        action=action,
        params=params,
        idempotency_key=intent.idempotency_key or intent.intent_id,
        reply_to=intent.reply_to or intent.agent_id,
        deadline=intent.deadline.timestamp() if intent.deadline else None,
        trace_id=parsed.trace_id,
        traceparent=traceparent_for(parsed.trace_id, parsed.traceparent),
        format=parsed.format,
        received_at=received_at,
        dispatched_at=dispatched_at,
        hops=intent.context.hops if intent.context else 0,
        routing=routing,
        run_id=parsed.run_id,
    )
