"""Retry decisions, without a network: which failures are retried, how long it waits, when it stops."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from connectors.adapters.base import Outcome
from connectors.spec import RetryPolicy
from producers.wire import ErrorCode
from workers.pool.retry import backoff, run_with_retries, should_retry
from workers.state.breaker import Permit

POLICY = RetryPolicy(max_attempts=3, initial_backoff="100ms", max_backoff="5s")


def outcomes(*items: Outcome) -> Iterator[Outcome]:
    yield from items


def failing(code: ErrorCode, *, sent: bool = True, retry_after_ms: int | None = None) -> Outcome:
    return Outcome(False, code=code, sent=sent, retry_after_ms=retry_after_ms, downstream_ms=1.0)


OK = Outcome(True, data={"ok": True}, downstream_ms=1.0)


def run(
    seq: list[Outcome], *, safe: bool, deadline: float | None = None, gate: object = None, now: float = 1000.0
) -> tuple[object, list[float], int]:
    calls = iter(seq)
    sleeps: list[float] = []
    count = 0

    def call() -> Outcome:
        nonlocal count
        count += 1
        return next(calls)

    result = run_with_retries(
        call,
        POLICY,
        safe_to_repeat=safe,
        deadline=deadline,
        gate=gate,  # type: ignore[arg-type]
        sleep=sleeps.append,
        clock=lambda: now + sum(sleeps),
        rand=lambda: 0.5,
    )
    return result, sleeps, count


@pytest.mark.parametrize(
    "outcome, safe, retried",
    [
        (failing(ErrorCode.DOWNSTREAM_UNREACHABLE, sent=False), False, True),  # never reached the system
        (failing(ErrorCode.DOWNSTREAM_ERROR, sent=False), False, True),  # e.g. a deadlock a database rolled back
        (failing(ErrorCode.DOWNSTREAM_TIMEOUT, sent=False), False, True),  # a cancelled statement, rolled back
        (failing(ErrorCode.DOWNSTREAM_RATE_LIMITED), False, True),  # 429: the system refused it
        (failing(ErrorCode.DOWNSTREAM_ERROR), True, True),  # 5xx on a safe call
        (failing(ErrorCode.DOWNSTREAM_ERROR), False, False),  # 5xx on a non-idempotent write
        (failing(ErrorCode.DOWNSTREAM_TIMEOUT), True, True),
        (failing(ErrorCode.OUTCOME_UNKNOWN), False, False),  # sent, no answer: never again
        (failing(ErrorCode.DOWNSTREAM_VALIDATION_FAILED), True, False),  # 4xx never
        (failing(ErrorCode.DOWNSTREAM_NOT_FOUND), True, False),
        (failing(ErrorCode.DOWNSTREAM_CONFLICT), True, False),
        (failing(ErrorCode.DOWNSTREAM_AUTH_FAILED), True, False),
    ],
)
def test_only_transient_failures_are_retried(outcome: Outcome, safe: bool, retried: bool) -> None:
    assert should_retry(outcome, safe) is retried
    result, sleeps, count = run([outcome, outcome, outcome], safe=safe)
    assert count == (3 if retried else 1)
    assert result.attempts == count  # type: ignore[attr-defined]


def test_success_after_transient_failures_reports_attempts_and_backs_off_exponentially() -> None:
    unreachable = failing(ErrorCode.DOWNSTREAM_UNREACHABLE, sent=False)
    result, sleeps, count = run([unreachable, unreachable, OK], safe=False)
    assert result.outcome.ok and result.attempts == 3  # type: ignore[attr-defined]
    # half fixed, half jitter (rand = 0.5): 100 ms base -> 75 ms, 200 ms base -> 150 ms
    assert sleeps == pytest.approx([0.075, 0.15])


def test_backoff_is_bounded_by_max_backoff_and_jittered() -> None:
    policy = RetryPolicy(max_attempts=10, initial_backoff="1s", max_backoff="4s")
    assert backoff(policy, 10, rand=lambda: 1.0) == 4.0
    assert backoff(policy, 10, rand=lambda: 0.0) == 2.0
    assert backoff(policy, 1, rand=lambda: 0.0) == 0.5


def test_retry_after_is_honoured() -> None:
    limited = failing(ErrorCode.DOWNSTREAM_RATE_LIMITED, retry_after_ms=2000)
    result, sleeps, count = run([limited, OK], safe=False)
    assert sleeps == [2.0] and result.outcome.ok  # type: ignore[attr-defined]


def test_retry_after_longer_than_max_backoff_is_passed_to_the_agent_instead() -> None:
    limited = failing(ErrorCode.DOWNSTREAM_RATE_LIMITED, retry_after_ms=60_000)
    result, sleeps, count = run([limited, OK], safe=False)
    assert count == 1 and sleeps == []
    assert result.outcome.retry_after_ms == 60_000  # type: ignore[attr-defined]


def test_no_retry_would_end_after_the_deadline() -> None:
    unreachable = failing(ErrorCode.DOWNSTREAM_UNREACHABLE, sent=False)
    result, sleeps, count = run([unreachable, OK], safe=False, deadline=1000.05, now=1000.0)
    assert count == 1 and sleeps == []


class FakeGate:
    def __init__(self, allow: bool = True) -> None:
        self.allow = allow
        self.events: list[str] = []

    def acquire(self) -> Permit:
        return Permit(self.allow, "closed" if self.allow else "open", 0 if self.allow else 1500)

    def success(self) -> str:
        self.events.append("success")
        return "closed"

    def failure(self) -> str:
        self.events.append("failure")
        return "closed"


def test_breaker_counts_transient_failures_only() -> None:
    gate = FakeGate()
    run([failing(ErrorCode.DOWNSTREAM_ERROR), failing(ErrorCode.DOWNSTREAM_TIMEOUT), OK], safe=True, gate=gate)
    assert gate.events == ["failure", "failure", "success"]
    gate = FakeGate()
    run([failing(ErrorCode.DOWNSTREAM_NOT_FOUND)], safe=True, gate=gate)
    assert gate.events == ["success"]  # the system answered: it is alive


def test_open_breaker_means_no_call_and_connector_unavailable() -> None:
    gate = FakeGate(allow=False)
    result, sleeps, count = run([OK], safe=True, gate=gate)
    assert count == 0
    assert result.outcome.code is ErrorCode.CONNECTOR_UNAVAILABLE and result.outcome.retry_after_ms == 1500  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "bad",
    [
        {"max_attempts": 0},
        {"max_attempts": 100},
        {"initial_backoff": "10s", "max_backoff": "1s"},
        {"initial_backoff": "soon"},
    ],
)
def test_nonsense_retry_policies_are_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        RetryPolicy(**bad)  # type: ignore[arg-type]
