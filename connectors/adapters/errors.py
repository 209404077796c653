"""What adapters raise among themselves before a failure becomes an Outcome.

Adapters never raise to the pool for anything a system, a network or an agent's params do: each
turns its library's exceptions into an :class:`~connectors.adapters.base.Outcome` at its own
boundary. This module holds the one notion they share::

    ValueError
     └── Unsendable               a value the client library refuses to put on the wire, raised
          │                       before anything was sent (a NUL in PostgreSQL text, a character
          │                       the connection's encoding lacks, a value JSON, XML or an AMQP
          │                       frame cannot carry, a request that would leave its endpoint)
          └── http.UnsafeRequest  the HTTP adapter's own (URL, path and header rules)

An Unsendable is the agent's input, not the system's health: :func:`refused_outcome` makes it
VALIDATION_FAILED with ``sent`` False, which the pool neither retries nor counts on the breaker
(workers.pool.retry), so one agent's odd value cannot open a connector's breaker for all.
"""

from __future__ import annotations

import time

from connectors.adapters.base import Outcome
from connectors.spec import ActionSpec
from producers.wire import ErrorCode

MAX_REASON_CHARS = 300
DEFAULT_SUGGESTION = (
    "The system's client could not send one of the params (for example a NUL or other control "
    "character, or text the system's encoding lacks); change that value and send again."
)


class Unsendable(ValueError):
    """A value the client library refused before sending; nothing reached the system.

    ``field`` names the param at fault when it is known, ``code`` the problem as the params
    validator would name it, ``suggestion`` what to send instead when the raiser knows better than
    the adapter's general advice.
    """

    def __init__(
        self, message: str, field: str | None = None, code: str = "unsendable", suggestion: str | None = None
    ) -> None:
        super().__init__(message[:MAX_REASON_CHARS])
        self.field = field
        self.code = code
        self.suggestion = suggestion


def refused_outcome(exc: Unsendable, *, suggestion: str = DEFAULT_SUGGESTION, started: float | None = None) -> Outcome:
    """The Outcome of a request that was refused before sending: VALIDATION_FAILED, ``sent`` False."""
    details = [{"field": exc.field, "code": exc.code, "message": str(exc)}] if exc.field else []
    elapsed = (time.perf_counter() - started) * 1000 if started is not None else 0.0
    return Outcome(
        False,
        code=ErrorCode.VALIDATION_FAILED,
        message=str(exc),
        suggestion=exc.suggestion or suggestion,
        details=details,
        sent=False,
        downstream_ms=elapsed,
    )


def violation_suggestion(action: ActionSpec, next_step: str) -> str:
    """The advice on DOWNSTREAM_CONTRACT_VIOLATION, true to the action's kind: a write may have
    taken effect (check before sending it again); a read changed nothing. ``next_step`` says
    who can fix it ("tell an operator ...")."""
    if action.is_write:
        return f"The action may have taken effect: check its result before sending it again; {next_step}"
    return f"Nothing was changed ({action.action} is a read); resending will not help. {next_step[:1].upper()}{next_step[1:]}"


__all__ = ["Unsendable", "refused_outcome", "violation_suggestion"]
