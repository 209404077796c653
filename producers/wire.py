"""The wire contract: intents in, receipts out, and the error codes that connect them.

Everything that crosses the broker is JSON described here; every other package imports these
models instead of re-declaring them (docs/contract.md sections 2 and 3).

Error codes, grouped by the receipt status they produce::

    rejected  (the downstream system was never called; fix and resend)
      INVALID_INTENT  UNKNOWN_ACTION  AMBIGUOUS_ACTION  PERMISSION_DENIED  RATE_LIMITED*
      VALIDATION_FAILED  OUTSIDE_TIME_WINDOW*  DEADLINE_EXCEEDED  CONNECTOR_UNAVAILABLE*
      IDEMPOTENCY_KEY_REUSED  BUDGET_EXCEEDED*  APPROVAL_DENIED  APPROVAL_EXPIRED*
    failed    (the system answered, or could not be reached)
      DOWNSTREAM_VALIDATION_FAILED  DOWNSTREAM_AUTH_FAILED  DOWNSTREAM_NOT_FOUND
      DOWNSTREAM_CONFLICT  DOWNSTREAM_RATE_LIMITED*  DOWNSTREAM_ERROR*  DOWNSTREAM_UNREACHABLE*
      DOWNSTREAM_TIMEOUT*  DOWNSTREAM_CONTRACT_VIOLATION  INTERNAL*
      STEP_FAILED (a workflow's step failed; retryable as that step's error was)
    unknown   (the call may or may not have taken effect)
      OUTCOME_UNKNOWN  STEP_OUTCOME_UNKNOWN  COMPENSATION_FAILED (a workflow's run)

    * retryable: sending the same intent again later can succeed.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

INTENT_ID_PATTERN = re.compile(r"^[A-Za-z0-9._:-]{1,128}\Z")
# agent and connector names: no ':' or '.', so the Redis keys and routing keys built from them
# cannot collide (agent "a" with intent "b:c" is not agent "a:b" with intent "c")
AGENT_ID_PATTERN = re.compile(r"^[a-z][a-z0-9_]{0,62}\Z")  # \Z: "$" lets a final "\n" through
NAME_RULE = "1-63 characters: a lowercase letter, then lowercase letters, digits or _"
# sent downstream as a header: visible ASCII only
IDEMPOTENCY_KEY_PATTERN = re.compile(r"^[\x21-\x7e]{1,255}\Z")

# AMQP short strings (routing keys, reply_to, message ids) are counted in bytes, not characters
AMQP_SHORT_STRING_BYTES = 255

# the names agents use: intents go to INTENTS_EXCHANGE with INTENT_ROUTING_KEY, receipts come
# from RECEIPTS_EXCHANGE under the agent's reply_to; the router answers LIST_TOOLS_ACTION itself
INTENTS_EXCHANGE_NAME = "reach.intents"
RECEIPTS_EXCHANGE_NAME = "reach.receipts"
INTENT_ROUTING_KEY = "intent"
# between publishes of a message the broker nacked, onto a queue the fleet declares without a length
# bound (reach.intents, reach.connector.*): a nack there is the broker failing to take it, e.g. a
# quorum queue while its leader stops and another is elected; about four seconds in all
NACK_PAUSES_SECONDS = (0.25, 0.5, 1.0, 2.0)
LIST_TOOLS_ACTION = "reach.list_tools"
FIND_TOOLS_ACTION = "reach.find_tools"  # the agent's best-matching tools for a description
HISTORY_ACTION = "reach.history"  # what the agent already did (its tool name: reach__history)

Status = Literal["succeeded", "rejected", "failed", "unknown"]


class ErrorCode(StrEnum):
    INVALID_INTENT = "INVALID_INTENT"
    UNKNOWN_ACTION = "UNKNOWN_ACTION"
    AMBIGUOUS_ACTION = "AMBIGUOUS_ACTION"
    PERMISSION_DENIED = "PERMISSION_DENIED"
    RATE_LIMITED = "RATE_LIMITED"
    VALIDATION_FAILED = "VALIDATION_FAILED"
    OUTSIDE_TIME_WINDOW = "OUTSIDE_TIME_WINDOW"
    DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
    CONNECTOR_UNAVAILABLE = "CONNECTOR_UNAVAILABLE"
    IDEMPOTENCY_KEY_REUSED = "IDEMPOTENCY_KEY_REUSED"
    BUDGET_EXCEEDED = "BUDGET_EXCEEDED"
    APPROVAL_DENIED = "APPROVAL_DENIED"
    APPROVAL_EXPIRED = "APPROVAL_EXPIRED"
    DOWNSTREAM_VALIDATION_FAILED = "DOWNSTREAM_VALIDATION_FAILED"
    DOWNSTREAM_AUTH_FAILED = "DOWNSTREAM_AUTH_FAILED"
    DOWNSTREAM_NOT_FOUND = "DOWNSTREAM_NOT_FOUND"
    DOWNSTREAM_CONFLICT = "DOWNSTREAM_CONFLICT"
    DOWNSTREAM_RATE_LIMITED = "DOWNSTREAM_RATE_LIMITED"
    DOWNSTREAM_ERROR = "DOWNSTREAM_ERROR"
    DOWNSTREAM_UNREACHABLE = "DOWNSTREAM_UNREACHABLE"
    DOWNSTREAM_TIMEOUT = "DOWNSTREAM_TIMEOUT"
    OUTCOME_UNKNOWN = "OUTCOME_UNKNOWN"
    DOWNSTREAM_CONTRACT_VIOLATION = "DOWNSTREAM_CONTRACT_VIOLATION"
    INTERNAL = "INTERNAL"
    # the final receipt of a workflow run (docs/contract.md "Workflows")
    STEP_FAILED = "STEP_FAILED"
    STEP_OUTCOME_UNKNOWN = "STEP_OUTCOME_UNKNOWN"
    COMPENSATION_FAILED = "COMPENSATION_FAILED"

    @property
    def status(self) -> Status:
        return _CODE_TABLE[self][0]

    @property
    def retryable(self) -> bool:
        return _CODE_TABLE[self][1]


# code -> (receipt status, retryable), exactly docs/contract.md section 3
_CODE_TABLE: dict[ErrorCode, tuple[Status, bool]] = {
    ErrorCode.INVALID_INTENT: ("rejected", False),
    ErrorCode.UNKNOWN_ACTION: ("rejected", False),
    ErrorCode.AMBIGUOUS_ACTION: ("rejected", False),
    ErrorCode.PERMISSION_DENIED: ("rejected", False),
    ErrorCode.RATE_LIMITED: ("rejected", True),
    ErrorCode.VALIDATION_FAILED: ("rejected", False),
    ErrorCode.OUTSIDE_TIME_WINDOW: ("rejected", True),
    ErrorCode.DEADLINE_EXCEEDED: ("rejected", False),
    ErrorCode.CONNECTOR_UNAVAILABLE: ("rejected", True),
    ErrorCode.IDEMPOTENCY_KEY_REUSED: ("rejected", False),
    ErrorCode.BUDGET_EXCEEDED: ("rejected", True),
    ErrorCode.APPROVAL_DENIED: ("rejected", False),
    ErrorCode.APPROVAL_EXPIRED: ("rejected", True),
    ErrorCode.DOWNSTREAM_VALIDATION_FAILED: ("failed", False),
    ErrorCode.DOWNSTREAM_AUTH_FAILED: ("failed", False),
    ErrorCode.DOWNSTREAM_NOT_FOUND: ("failed", False),
    ErrorCode.DOWNSTREAM_CONFLICT: ("failed", False),
    ErrorCode.DOWNSTREAM_RATE_LIMITED: ("failed", True),
    ErrorCode.DOWNSTREAM_ERROR: ("failed", True),
    ErrorCode.DOWNSTREAM_UNREACHABLE: ("failed", True),
    ErrorCode.DOWNSTREAM_TIMEOUT: ("failed", True),
    ErrorCode.OUTCOME_UNKNOWN: ("unknown", False),
    ErrorCode.DOWNSTREAM_CONTRACT_VIOLATION: ("failed", False),
    ErrorCode.INTERNAL: ("failed", True),
    ErrorCode.STEP_FAILED: ("failed", False),  # the receipt says retryable as the failed step's error was
    ErrorCode.STEP_OUTCOME_UNKNOWN: ("unknown", False),
    ErrorCode.COMPENSATION_FAILED: ("unknown", False),
}


class ErrorInfo(BaseModel):
    """Why an intent did not succeed, in a form a model can act on."""

    model_config = ConfigDict(frozen=True)

    code: ErrorCode
    message: str
    retryable: bool
    suggestion: str
    details: list[dict[str, Any]] = Field(default_factory=list)
    retry_after_ms: int | None = None


class Execution(BaseModel):
    model_config = ConfigDict(frozen=True)

    trace_id: str
    attempts: int = 0
    latency_ms: float = 0.0
    queue_ms: float | None = None
    downstream_ms: float | None = None
    received_at: str
    finished_at: str
    deduplicated: bool = False
    # how the connector was chosen when several offer the bare action (docs/contract.md "Semantic
    # routing"): method, candidates with scores, lead and margin; absent otherwise
    routing: dict[str, Any] | None = None
    # a workflow run's final receipt: each step's {"step", "intent_id", "status", "code", "undone"};
    # absent otherwise
    steps: list[dict[str, Any]] | None = None


class Receipt(BaseModel):
    """Exactly one per intent, on the reach.receipts exchange (docs/contract.md section 3)."""

    model_config = ConfigDict(frozen=True)

    intent_id: str
    agent_id: str | None
    action: str | None
    connector: str | None
    status: Status
    success: bool
    data: Any = None
    error: ErrorInfo | None = None
    execution: Execution

    def to_doc(self) -> dict[str, Any]:
        """The receipt as the JSON document the wire carries."""
        # retry_after_ms appears only when set, as the contract writes it with a "?"
        try:
            doc = self.model_dump(mode="json")
        except UnicodeEncodeError:  # a system answered with a lone surrogate in a key (values pass)
            doc = self.model_copy(update={"data": valid_text(self.data)}).model_dump(mode="json")
        if doc["error"] is not None and doc["error"].get("retry_after_ms") is None:
            doc["error"].pop("retry_after_ms", None)
        if doc["execution"].get("routing") is None:
            doc["execution"].pop("routing", None)
        if doc["execution"].get("steps") is None:
            doc["execution"].pop("steps", None)
        return doc

    def to_json(self) -> bytes:
        doc = self.to_doc()
        body = json.dumps(doc, separators=(",", ":")).encode()  # ASCII only: the rest as escapes
        if _LONE_SURROGATE_ESCAPE.search(body) is None:
            return body
        # a system's answer held lone surrogates: not Unicode text, and strict JSON parsers (the
        # SDK's, other languages') refuse them, so the agent would never read its receipt
        return json.dumps(valid_text(doc), separators=(",", ":")).encode()


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")  # (a str holds a pair as one code point)
# in ASCII JSON: a high surrogate escape not followed by a low one, or a low one not after a high one
# (an escaped backslash before it may make this match where there is none: then nothing changes)
_LONE_SURROGATE_ESCAPE = re.compile(
    rb"\\ud[89ab][0-9a-f]{2}(?!\\ud[c-f][0-9a-f]{2})|(?<!\\ud[89ab][0-9a-f]{2})\\ud[c-f][0-9a-f]{2}"
)


def valid_text(value: Any) -> Any:
    """``value`` with every lone surrogate in its strings and mapping keys replaced by U+FFFD.

    A system's JSON answer can hold ``"\\ud800"``; it decodes to a str that is not Unicode text:
    pydantic cannot serialize it as a key, and strict parsers refuse it anywhere (RFC 7493)."""
    if isinstance(value, str):
        return _LONE_SURROGATE.sub("\ufffd", value)
    if isinstance(value, dict):
        return {valid_text(key): valid_text(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [valid_text(item) for item in value]
    return value


# the AMQP ``type`` of a notice (not a receipt) on reach.receipts
APPROVAL_PENDING: Literal["approval_pending"] = "approval_pending"


class ApprovalNotice(BaseModel):
    """Sent on the agent's reply topic when its intent waits for a person (AMQP ``type``
    ``approval_pending``, ``correlation_id`` = the intent id). Not a receipt: the intent's one
    receipt follows once it was approved and ran, was denied (APPROVAL_DENIED) or expired
    (APPROVAL_EXPIRED)."""

    model_config = ConfigDict(frozen=True)

    type: Literal["approval_pending"] = APPROVAL_PENDING
    intent_id: str
    approval_id: str
    expires_at: str  # RFC 3339, UTC
    summary: str

    def to_json(self) -> bytes:
        return json.dumps(self.model_dump(mode="json"), separators=(",", ":")).encode()


# agent-to-agent calls one intent may descend from (the fleet refuses calls past its own, lower limit)
MAX_HOPS = 64


class IntentContext(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)

    description: str | None = None
    domain: str | None = None
    # set by an agent that sends intents while answering an agent connector's request: that
    # request's hops (producers.serve does it), so a loop of agents calling agents is stopped
    hops: int = Field(default=0, ge=0, le=MAX_HOPS, strict=True)


class Intent(BaseModel):
    """A request by an agent to perform one semantic action (docs/contract.md section 2)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    intent_id: str | None = None
    agent_id: str | None = None
    action: str = Field(min_length=1, max_length=300)
    params: dict[str, Any] = Field(default_factory=dict)
    idempotency_key: str | None = Field(default=None, min_length=1, max_length=255)
    reply_to: str | None = Field(default=None, min_length=1)  # at most 255 bytes: see _reply_to
    deadline: datetime | None = None
    context: IntentContext | None = None
    traceparent: str | None = Field(default=None, max_length=128)

    @field_validator("intent_id")
    @classmethod
    def _intent_id(cls, v: str | None) -> str | None:
        if v is not None and not INTENT_ID_PATTERN.match(v):
            raise ValueError("must be 1-128 characters of A-Z a-z 0-9 . _ : -")
        return v

    @field_validator("idempotency_key")
    @classmethod
    def _idempotency_key(cls, v: str | None) -> str | None:
        if v is not None and not IDEMPOTENCY_KEY_PATTERN.match(v):
            raise ValueError("must be 1-255 visible ASCII characters (no spaces or control characters)")
        return v

    @field_validator("agent_id")
    @classmethod
    def _agent_id(cls, v: str | None) -> str | None:
        if v is not None and not AGENT_ID_PATTERN.match(v):
            raise ValueError(f"must be {NAME_RULE}")
        return v

    @field_validator("deadline", mode="before")
    @classmethod
    def _deadline(cls, v: Any) -> Any:
        # strict mode refuses strings for datetimes; RFC 3339 text is what the wire carries
        if isinstance(v, str):
            try:
                parsed = datetime.fromisoformat(v.replace("Z", "+00:00"))
            except ValueError as exc:
                raise ValueError("must be an RFC 3339 time such as 2026-01-31T12:00:00Z") from exc
            if parsed.tzinfo is None:
                raise ValueError("must carry a timezone offset (e.g. Z or +02:00)")
            return parsed
        if v is not None:
            raise ValueError("must be an RFC 3339 time string")
        return v

    @field_validator("reply_to")
    @classmethod
    def _reply_to(cls, v: str | None) -> str | None:
        if v is not None and any(c in v for c in "*#"):
            raise ValueError("must not contain topic wildcards * or #")
        if v is not None and len(v.encode("utf-8", "surrogatepass")) > AMQP_SHORT_STRING_BYTES:
            raise ValueError(f"must be at most {AMQP_SHORT_STRING_BYTES} bytes in UTF-8 (an AMQP routing key)")
        return v
