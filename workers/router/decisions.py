"""What the router decides for an intent, and how its own answers are written.

Dispatch  the checked job goes to its connector's queue (its pool sends the receipt)
Answer    the router answers itself: a rejection or a built-in action, maybe with a dead letter
Park      the job waits for a person (``workers.router.approval_parking``)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from connectors.catalog import ActionRef
from producers.wire import ErrorCode, Receipt
from workers.observability import metrics
from workers.observability.audit import params_digest
from workers.observability.redaction import redact_params
from workers.router.approval_parking import Park
from workers.router.intake import ParsedIntent, ParseFailure, new_trace_id
from workers.transport.job import Job
from workers.transport.receipts import build_receipt
from workers.transport.topology import connector_queue_name


@dataclass(frozen=True)
class Dispatch:
    """A checked intent on its way to ``queue``; ``job`` is the pool task's only argument."""

    job: Job

    @property
    def intent_id(self) -> str:
        return self.job.intent_id

    @property
    def queue(self) -> str:
        return connector_queue_name(self.job.connector)


@dataclass(frozen=True)
class Answer:
    """The router answers itself: a rejection (or a built-in action), maybe with a dead letter."""

    receipt: Receipt
    routing_key: str | None
    dead_letter_reason: str | None = None
    audit: dict[str, Any] | None = None  # what the audit trail may say about the params (redacted)


Decision = Dispatch | Answer | Park


def refuse(
    parsed: ParsedIntent,
    received_at: float,
    code: ErrorCode,
    message: str,
    suggestion: str,
    *,
    ref: ActionRef | None = None,
    details: list[dict[str, Any]] | None = None,
    retry_after_ms: int | None = None,
    routing: dict[str, Any] | None = None,
) -> Answer:
    """The router's own answer to a parsed intent it will not dispatch."""
    intent = parsed.intent
    agent_id = intent.agent_id or ""
    metrics.INTENTS_REJECTED.labels(code=code.value).inc()
    receipt = build_receipt(
        intent_id=intent.intent_id or "",
        agent_id=agent_id,
        action=ref.action.action if ref else intent.action,
        connector=ref.connector.name if ref else None,
        trace_id=parsed.trace_id,
        received_at=received_at,
        code=code,
        message=message,
        suggestion=suggestion,
        details=details,
        retry_after_ms=retry_after_ms,
        routing=routing,
    )
    audit: dict[str, Any] | None = None
    if ref is not None:
        redacted = redact_params(intent.params, ref.action.input)
        audit = {"param_keys": sorted(redacted), "params_digest": params_digest(redacted)}
    if routing is not None:
        audit = {**(audit or {}), "routing": routing}
    return Answer(receipt, intent.reply_to or agent_id, audit=audit)


def invalid(failure: ParseFailure, received_at: float) -> Answer:
    """The answer to a message that did not parse as an intent (or claimed someone else's identity)."""
    metrics.INTENTS_RECEIVED.labels(format="invalid").inc()
    metrics.INTENTS_REJECTED.labels(code=failure.code.value).inc()
    suggestion = (
        "Send a UTF-8 JSON object with at least an 'action' (see the intent contract), within the size limit."
        if failure.code is ErrorCode.INVALID_INTENT
        else "Send intents only under your own identity: the AMQP user_id property set to your broker login."
    )
    receipt = build_receipt(
        intent_id=failure.intent_id,
        agent_id=failure.agent_id,
        action=None,
        connector=None,
        trace_id=new_trace_id(),
        received_at=received_at,
        code=failure.code,
        message=failure.reason,
        suggestion=suggestion,
        details=failure.details,
    )
    return Answer(receipt, failure.reply_to, dead_letter_reason=failure.reason if failure.dead_letter else None)


def human_ms(ms: int) -> str:
    """A wait, as an answer tells it to people and agents (ms, s, min or h)."""
    if ms < 1000:
        return f"{ms} ms"
    if ms < 120_000:
        return f"{ms / 1000:.0f} s"
    if ms < 7_200_000:
        return f"{ms / 60_000:.0f} min"
    return f"{ms / 3_600_000:.1f} h"
