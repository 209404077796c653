"""When and how much an agent may ask of the router beyond its bindings' rate limits: an
action's time windows, its allowance of invalid intents (``invalid_rate``), and of intents that
make the router run its model (``semantic_rate``). Both allowances are kept by the rate limiter
under a "connector" name no connector can have."""

from __future__ import annotations

from datetime import UTC, datetime

from connectors.hours import parse_window
from producers.wire import ErrorCode
from workers.observability import metrics
from workers.router.decisions import Answer, human_ms
from workers.state.ratelimit import Rate, RateLimiter

# rejections that mean the sender got something wrong; they count against its invalid allowance
COUNTED_AS_INVALID = frozenset(
    {ErrorCode.INVALID_INTENT, ErrorCode.UNKNOWN_ACTION, ErrorCode.PERMISSION_DENIED, ErrorCode.VALIDATION_FAILED}
)
INVALID_ALLOWANCE = "(invalid)"  # the rate limiter's "connector" for it: no connector can be named so
SEMANTIC_ALLOWANCE = "(semantic)"  # the same for the model work an agent may cause (REACH_SEMANTIC_RATE)


def count_invalid(limiter: RateLimiter, answer: Answer, agent_id: str, rate: Rate) -> Answer:
    """Invalid intents cost their sender too: past its allowance the answer is RATE_LIMITED
    (still saying what was wrong) and nothing is dead-lettered."""
    verdict = limiter.hit(agent_id, INVALID_ALLOWANCE, rate)
    if verdict.allowed:
        return answer
    error = answer.receipt.error
    assert error is not None
    if answer.dead_letter_reason is not None:
        metrics.DEAD_LETTERS_DROPPED.labels(reason="sender_over_limit").inc()
    metrics.INTENTS_REJECTED.labels(code=ErrorCode.RATE_LIMITED.value).inc()
    limited = error.model_copy(
        update={
            "code": ErrorCode.RATE_LIMITED,
            "retryable": True,
            "retry_after_ms": verdict.retry_after_ms,
            "details": [],
            "message": f"{agent_id} sent more invalid intents than {rate.count} per {human_ms(int(rate.period_ms))}; "
            f"this one was {error.code.value}: {error.message}"[:4000],
            "suggestion": f"Fix what is wrong ({error.suggestion[:500]}) and wait {human_ms(verdict.retry_after_ms)} "
            "before sending more.",
        }
    )
    receipt = answer.receipt.model_copy(update={"error": limited, "status": "rejected"})
    return Answer(receipt, answer.routing_key, dead_letter_reason=None, audit=answer.audit)


def model_allowance(limiter: RateLimiter, agent_id: str, rate: Rate | None) -> int | None:
    """None when the agent may make the router run its model now, else ms until it may."""
    if rate is None:
        return None
    verdict = limiter.hit(agent_id, SEMANTIC_ALLOWANCE, rate)
    return None if verdict.allowed else verdict.retry_after_ms


def closed_window(now: float, *windows: str | None) -> tuple[str, int] | None:
    """The first of the action's and the binding's time windows that is closed now, and the ms
    until it opens."""
    moment = datetime.fromtimestamp(now, UTC)
    for text in windows:
        if text:
            window = parse_window(text)
            if not window.is_open(moment):
                return text, window.ms_until_open(moment)
    return None
