"""What every protocol adapter returns: an Outcome, never an exception about the system."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from connectors.spec import ActionSpec
from producers.wire import ErrorCode


@dataclass(frozen=True)
class Outcome:
    """The result of one attempt at one action.

    ``sent`` says whether the request may have reached the system: a failure with ``sent`` False
    is always safe to retry, one with ``sent`` True only when the action is idempotent.
    """

    ok: bool
    data: Any = None
    code: ErrorCode | None = None
    message: str = ""
    suggestion: str = ""
    details: list[dict[str, Any]] = field(default_factory=list)
    retry_after_ms: int | None = None
    http_status: int | None = None
    sent: bool = True
    downstream_ms: float = 0.0


@dataclass(frozen=True)
class CallContext:
    """Per-intent facts an adapter may forward: never used to choose the host or path."""

    intent_id: str
    idempotency_key: str | None = None
    traceparent: str | None = None
    timeout: float | None = None
    max_depth: int | None = None  # nesting of ``data`` passed on (REACH_MAX_DEPTH); None: the adapter's own
    agent_id: str | None = None  # who asked (a jwt's subject; the agent adapter's caller)
    connector: str | None = None
    action: str | None = None
    hops: int = 0  # agent-to-agent calls that led to this one (the agent adapter's loop guard)


@dataclass(frozen=True)
class AdapterOptions:
    """What the process around an adapter gives it."""

    max_connections: int = 20  # the pool's threads: connections it may need at once
    max_depth: int | None = None  # nesting of ``data`` passed on (REACH_MAX_DEPTH)
    redis: Any = None  # shared state (rotated OAuth2 refresh tokens); None in single-process tools
    broker_url: str | None = None  # the fleet's broker (the agent adapter's way to other agents)
    environ: Mapping[str, str] | None = None  # where secrets are read; None: the process environment
    extra: dict[str, Any] = field(default_factory=dict)  # per-adapter knobs for tests


@dataclass(frozen=True)
class ProbeResult:
    """One health probe of a system: ``reach beat`` marks the connector up or down from these."""

    healthy: bool
    detail: str


class Adapter(Protocol):
    """One connector's way to its system; one instance per pool process, called from many threads."""

    def call(self, action: ActionSpec, params: dict[str, Any], ctx: CallContext) -> Outcome: ...

    def probe(self, timeout: float) -> ProbeResult:
        """Is the system there? Cheap, side-effect free, never raises."""
        ...

    def close(self) -> None: ...
