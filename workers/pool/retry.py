"""Retrying one action's call: only transient failures, exponential backoff with jitter,
Retry-After honoured, never past the intent's deadline, gated by the connector's breaker."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from connectors.adapters.base import Outcome
from connectors.spec import RetryPolicy
from producers.wire import ErrorCode
from workers.state.breaker import Permit

# failures that say the system is in trouble (a breaker counts these, nothing else)
TRANSIENT = frozenset(
    {
        ErrorCode.DOWNSTREAM_UNREACHABLE,
        ErrorCode.DOWNSTREAM_TIMEOUT,
        ErrorCode.DOWNSTREAM_ERROR,
        ErrorCode.OUTCOME_UNKNOWN,
    }
)
# transient failures an adapter may report with sent=False: retried whatever the action
_NOT_TAKEN_EFFECT = frozenset(
    {ErrorCode.DOWNSTREAM_UNREACHABLE, ErrorCode.DOWNSTREAM_ERROR, ErrorCode.DOWNSTREAM_TIMEOUT}
)


def should_retry(outcome: Outcome, safe_to_repeat: bool) -> bool:
    """Transient failures that certainly took no effect (``sent`` False) and 429 always; 5xx and
    timeouts only when repeating the call is safe (idempotent action, or the system dedupes by
    idempotency_header)."""
    if outcome.ok or outcome.code is None:
        return False
    if not outcome.sent and outcome.code in _NOT_TAKEN_EFFECT:
        return True  # certainly without effect (never sent, or a database rolled it back)
    if outcome.code is ErrorCode.DOWNSTREAM_RATE_LIMITED:
        return True
    return safe_to_repeat and outcome.code in (ErrorCode.DOWNSTREAM_ERROR, ErrorCode.DOWNSTREAM_TIMEOUT)


def backoff(policy: RetryPolicy, attempt: int, rand: Callable[[], float] = random.random) -> float:
    """Seconds before attempt ``attempt + 1``: half fixed, half jitter, doubling up to max_backoff."""
    base = min(policy.max_backoff, policy.initial_backoff * (2 ** (attempt - 1)))
    return base / 2 + rand() * base / 2


class Gate(Protocol):
    """What the retry loop needs from a breaker (workers.state.breaker.SharedBreaker)."""

    def acquire(self) -> Permit: ...
    def success(self) -> str: ...
    def failure(self) -> str: ...


@dataclass(frozen=True)
class Result:
    outcome: Outcome
    attempts: int
    downstream_ms: float


def run_with_retries(
    call: Callable[[], Outcome],
    policy: RetryPolicy,
    *,
    safe_to_repeat: bool,
    deadline: float | None = None,
    gate: Gate | None = None,
    before_attempt: Callable[[int], None] | None = None,
    after_attempt: Callable[[int, Outcome], None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.time,
    rand: Callable[[], float] = random.random,
) -> Result:
    downstream_ms = 0.0
    attempt = 0
    last: Outcome | None = None
    while True:
        attempt += 1
        if gate is not None:
            permit = gate.acquire()
            if not permit.allowed and last is not None:
                # the breaker opened between attempts: the earlier call did reach the system,
                # so its own outcome is the truth, not "never called"
                return Result(last, attempt - 1, downstream_ms)
            if not permit.allowed:
                return Result(
                    Outcome(
                        False,
                        code=ErrorCode.CONNECTOR_UNAVAILABLE,
                        sent=False,
                        message=f"the connector's circuit breaker is {permit.state}",
                        suggestion="The system is failing; retry after retry_after_ms.",
                        retry_after_ms=permit.retry_after_ms,
                    ),
                    attempt - 1,
                    downstream_ms,
                )
        if before_attempt is not None:
            before_attempt(attempt)
        outcome = last = call()
        downstream_ms += outcome.downstream_ms
        if after_attempt is not None:
            after_attempt(attempt, outcome)
        if gate is not None:
            if outcome.code in TRANSIENT:
                gate.failure()
            elif outcome.code is not ErrorCode.VALIDATION_FAILED or outcome.sent:
                gate.success()  # the system answered: it is alive
        if attempt >= policy.max_attempts or not should_retry(outcome, safe_to_repeat):
            return Result(outcome, attempt, downstream_ms)
        delay = backoff(policy, attempt, rand)
        if outcome.retry_after_ms is not None:
            wanted = outcome.retry_after_ms / 1000
            if wanted > policy.max_backoff:
                return Result(outcome, attempt, downstream_ms)  # the agent can wait retry_after_ms itself
            delay = max(delay, wanted)
        if deadline is not None and clock() + delay >= deadline:
            return Result(outcome, attempt, downstream_ms)
        sleep(delay)
