"""The agent-connector contract, the agent's half: the fleet's names for an agent's queue and
exchanges, the request a pool sends, and the answer an agent may give (docs/contract.md section 5).

The fleet (``workers.transport.topology``, ``connectors.adapters.agent``) imports these, so both
sides read and write the same shapes.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from producers.wire import ErrorCode

# the fleet declares these (workers.transport.topology) for every connector of type agent
AGENTS_EXCHANGE_NAME = "reach.agents"  # direct: routing key = the agent's name
# topic: the pools' reply queues are bound with "<agent>.<token>", and an agent's broker user may
# publish only keys that start with its own name (agents cannot answer for each other). Not
# "reach.agent.replies": that is the request queue of an agent named "replies".
AGENT_REPLIES_EXCHANGE_NAME = "reach.agent-replies"
AGENT_QUEUE_PREFIX = "reach.agent."
REQUEST_VERSION: Literal[1] = 1

# what an answer may claim: the system's own verdicts. Timeouts, unreachability and unknown
# outcomes are the fleet's to observe, never an agent's to assert.
ANSWER_CODES = frozenset(
    {
        ErrorCode.DOWNSTREAM_VALIDATION_FAILED,
        ErrorCode.DOWNSTREAM_AUTH_FAILED,
        ErrorCode.DOWNSTREAM_NOT_FOUND,
        ErrorCode.DOWNSTREAM_CONFLICT,
        ErrorCode.DOWNSTREAM_RATE_LIMITED,
        ErrorCode.DOWNSTREAM_ERROR,
    }
)
MAX_MESSAGE_CHARS = 4000
MAX_SUGGESTION_CHARS = 1000
MAX_ANSWER_DETAILS = 50


def agent_queue_name(agent: str) -> str:
    """The queue the fleet sends ``agent``'s requests to (agent names have no dots: no collisions)."""
    return AGENT_QUEUE_PREFIX + agent


class AgentRequest(BaseModel):
    """What a pool sends the agent that answers its connector (the body of a request message)."""

    # the agent side tolerates fields a newer fleet adds; ``v`` changes when the meaning does
    model_config = ConfigDict(extra="ignore", frozen=True, strict=True)

    v: Literal[1] = REQUEST_VERSION
    intent_id: str
    agent_id: str  # who asked: the agent that sent the intent
    connector: str
    action: str
    params: dict[str, Any]
    idempotency_key: str | None = None  # the same on every attempt and re-send: dedupe by it
    hops: int = Field(ge=1)  # agent-to-agent calls that led here, this one included
    deadline: str | None = None  # RFC 3339: the fleet stops waiting for the answer then
    traceparent: str | None = None


class AnswerError(BaseModel):
    """Why a request failed, as the agent (or a legacy system over AMQP) tells it."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    code: str
    message: str = Field(min_length=1, max_length=MAX_MESSAGE_CHARS)
    suggestion: str = Field(default="", max_length=MAX_SUGGESTION_CHARS)
    details: list[dict[str, Any]] = Field(default_factory=list, max_length=MAX_ANSWER_DETAILS)
    retry_after_ms: int | None = Field(default=None, ge=0, le=86_400_000)

    @field_validator("code")
    @classmethod
    def _claimable(cls, v: str) -> str:
        if v not in ANSWER_CODES:
            raise ValueError(f"must be one of {', '.join(sorted(ANSWER_CODES))}")
        return v


class AgentAnswer(BaseModel):
    """The answer to one request (the body of a reply message)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    status: Literal["succeeded", "failed"]
    data: Any = None
    error: AnswerError | None = None

    @model_validator(mode="after")
    def _consistent(self) -> AgentAnswer:
        if self.status == "succeeded" and self.error is not None:
            raise ValueError("a succeeded answer carries no error")
        if self.status == "failed" and self.error is None:
            raise ValueError("a failed answer needs an error")
        if self.status == "failed" and self.data is not None:
            raise ValueError("a failed answer carries no data")
        return self


def encode_answer(answer: AgentAnswer) -> bytes:
    """An answer's bytes; a handler's data that JSON cannot carry becomes a failed answer."""
    try:
        return json.dumps(answer.model_dump(mode="json", exclude_none=True), allow_nan=False).encode()
    except (TypeError, ValueError):
        error = AnswerError(
            code=ErrorCode.DOWNSTREAM_ERROR,
            message="the agent's answer is not JSON (a value that JSON cannot carry)",
            suggestion="Tell the agent's operators: a handler returned data that is not JSON.",
        )
        return json.dumps(AgentAnswer(status="failed", error=error).model_dump(mode="json", exclude_none=True)).encode()


def parse_deadline(text: str | None) -> datetime | None:
    """A request's RFC 3339 ``deadline`` (UTC when it names no zone); None if absent or unreadable."""
    if text is None:
        return None
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)
