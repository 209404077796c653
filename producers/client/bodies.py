"""The bytes a client sends and reads: a native intent's JSON body out, and a receipt or an
approval notice in. Shared with the MCP facade, which speaks the same wire for its agents."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from producers.wire import APPROVAL_PENDING, ApprovalNotice, Intent, Receipt


def intent_body(
    agent_id: str,
    action: str,
    params: dict[str, Any] | None,
    *,
    intent_id: str,
    idempotency_key: str | None = None,
    reply_to: str | None = None,
    deadline: datetime | str | None = None,
    context: dict[str, Any] | None = None,
    traceparent: str | None = None,
) -> bytes:
    """A native intent's JSON body, checked against the contract first.

    Raises:
        ValueError: The intent is malformed (the router would reject it anyway).
    """
    doc: dict[str, Any] = {
        "intent_id": intent_id,
        "agent_id": agent_id,
        "action": action,
        "params": {} if params is None else params,
    }
    if isinstance(deadline, datetime):
        if deadline.tzinfo is None:
            raise ValueError("deadline must be timezone-aware (e.g. datetime.now(timezone.utc))")
        deadline = deadline.isoformat()
    optional = {
        "idempotency_key": idempotency_key,
        "reply_to": reply_to,
        "deadline": deadline,
        "context": context,
        "traceparent": traceparent,
    }
    doc.update((k, v) for k, v in optional.items() if v is not None)
    # fail here rather than with an INVALID_INTENT receipt later
    try:
        Intent.model_validate(doc)
    except ValidationError as exc:
        raise ValueError(f"invalid intent: {exc}") from exc
    return json.dumps(doc, ensure_ascii=False, allow_nan=False).encode("utf-8")


def read_reply(body: bytes, content_type: str | None, message_type: str | None) -> Receipt | ApprovalNotice:
    """What arrived on a receipt queue: a receipt, or an approval notice (AMQP ``type``
    ``approval_pending``: the intent waits for a person, its receipt comes later).

    Raises:
        ValueError: Not JSON, or not a receipt or notice (to be ignored, not taken for one).
    """
    kind = (content_type or "application/json").split(";")[0].strip().lower()
    if kind != "application/json":
        raise ValueError(f"content type {kind!r}: only JSON is accepted")
    try:
        if message_type == APPROVAL_PENDING:
            return ApprovalNotice.model_validate_json(body)
        return Receipt.model_validate_json(body)
    except ValidationError as exc:
        what = "approval notice" if message_type == APPROVAL_PENDING else "receipt"
        raise ValueError(f"a malformed {what}: {exc}") from exc
