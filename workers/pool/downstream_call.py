"""The call to the system for one job: attempts with retries (``workers.pool.retry``), each under
the connector's shared breaker, traced, with an audit stage per attempt.

The breaker costs as few Redis round trips as possible (:class:`AttemptGate`): the first permit
usually comes with the ledger's begin, and the last attempt's result is recorded in the pool's
final pipeline (``workers.pool.answers``).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any

import redis

from connectors.adapters.base import Adapter, CallContext, Outcome
from connectors.spec import ConnectorSpec
from producers.wire import ErrorCode
from workers.observability import metrics
from workers.observability.tracing import child_traceparent, span, tracing_on
from workers.pool.job_context import JobContext
from workers.pool.retry import Result, run_with_retries
from workers.state.breaker import Permit, SharedBreaker
from workers.state.ledger import Ledger

log = logging.getLogger("reach.pool")
Stage = tuple[str, dict[str, Any]]


class DownstreamCall:
    """Calls one connector's system through its adapter (one client per worker process)."""

    def __init__(
        self,
        connector: ConnectorSpec,
        adapter: Adapter,
        *,
        ledger: Ledger,
        breaker: SharedBreaker | None,
        client: redis.Redis,
        sleep: Callable[[float], None],
    ) -> None:
        self.connector = connector
        self.adapter = adapter
        self.ledger = ledger
        self.breaker = breaker
        self.client = client
        self.sleep = sleep
        self._downstream = metrics.DOWNSTREAM_SECONDS.labels(connector=connector.name)

    def run(
        self, ctx: JobContext, permit: bool = False, clean: bool = False
    ) -> tuple[Result, AttemptGate | None, list[Stage]]:
        """Call the system with retries: the result, the gate whose last result is still to be
        recorded, and the attempts' audit stages."""
        self._queue_wait_span(ctx)
        gate = (
            AttemptGate(self.breaker, self.client, ctx.key, granted=permit, clean=clean)
            if self.breaker is not None
            else None
        )
        stages: list[Stage] = []
        result = run_with_retries(
            # the context per attempt: each one's timeout is capped by the time left to the deadline,
            # so the last retry cannot run past it (a workflow takes a step as unknown soon after)
            lambda: self._call_once(ctx, self._call_context(ctx)),
            ctx.ref.action.retry or self.connector.retry,
            safe_to_repeat=ctx.safe,
            deadline=ctx.deadline,
            gate=gate,
            before_attempt=None if gate else (lambda n: self.ledger.mark_sending(ctx.key)),
            after_attempt=lambda n, outcome: stages.append(self._attempt_stage(ctx, n, outcome)),
            sleep=self.sleep,
        )
        self._downstream.observe(result.downstream_ms / 1000)
        if result.attempts > 1:
            metrics.RETRIES.labels(connector=self.connector.name).inc(result.attempts - 1)
        return result, gate, stages

    def _call_context(self, ctx: JobContext) -> CallContext:
        remaining = None if ctx.deadline is None else max(0.1, ctx.deadline - time.time())
        timeout = ctx.ref.action.timeout_seconds
        return CallContext(
            intent_id=ctx.intent_id,
            idempotency_key=ctx.job.idempotency_key,
            traceparent=ctx.job.traceparent,
            timeout=min(timeout, remaining) if remaining is not None else None,
            agent_id=ctx.job.agent_id,
            connector=ctx.job.connector,
            action=ctx.job.action,
            hops=ctx.job.hops,
        )

    def _queue_wait_span(self, ctx: JobContext) -> None:
        if ctx.job.traceparent and tracing_on():
            with span(
                "reach.queue_wait",
                ctx.job.traceparent,
                start_time=ctx.job.dispatched_at,
                attributes={"reach.connector": self.connector.name},
            ):
                pass

    def _call_once(self, ctx: JobContext, call_ctx: CallContext) -> Outcome:
        """One attempt; an adapter bug becomes an INTERNAL outcome (nothing was sent)."""
        parent = ctx.job.traceparent
        try:
            if not parent:
                return self.adapter.call(ctx.ref.action, ctx.job.params, call_ctx)
            if not tracing_on():  # the system still gets the trace, with a span id of this attempt
                return self.adapter.call(
                    ctx.ref.action, ctx.job.params, dataclasses.replace(call_ctx, traceparent=child_traceparent(parent))
                )
            with span(
                "reach.downstream_call",
                parent,
                attributes={"reach.connector": self.connector.name, "reach.action": ctx.ref.action.action},
            ) as current:
                context = current.get_span_context() if current is not None else None
                recording = current is not None and current.is_recording()
                child = (
                    f"00-{context.trace_id:032x}-{context.span_id:016x}-01"
                    if recording and context is not None and context.is_valid
                    else child_traceparent(parent)
                )
                return self.adapter.call(
                    ctx.ref.action, ctx.job.params, dataclasses.replace(call_ctx, traceparent=child)
                )
        except Exception:
            log.exception("adapter failed on intent=%s", ctx.intent_id)
            return Outcome(
                False,
                code=ErrorCode.INTERNAL,
                message="the connector's adapter failed on this intent",
                suggestion="Retry later; operators were told.",
                sent=False,
            )

    def _attempt_stage(self, ctx: JobContext, attempt: int, outcome: Outcome) -> Stage:
        return (
            "attempt",
            {
                "agent": ctx.agent_id,
                "action": ctx.ref.action.action,
                "connector": self.connector.name,
                "trace_id": ctx.job.trace_id,
                "ts": round(time.time(), 6),
                "attempt": attempt,
                "outcome": "ok" if outcome.ok else (outcome.code.value if outcome.code else "failed"),
                "http_status": outcome.http_status,
                "sent": outcome.sent,
                "downstream_ms": round(outcome.downstream_ms, 3),
            },
        )


class AttemptGate:
    """The breaker for one intent's attempts, in as few round trips as possible: the first permit
    usually comes with the ledger's begin (breaker closed), each later permit marks the idempotency
    record "sending" once granted, and each result is recorded with the next permit or, for the
    last attempt, in the pool's final pipeline. A success is not recorded while the breaker, as
    the begin saw it, was closed with no failures counted and none was recorded since: it would
    change nothing (one command per intent fewer)."""

    def __init__(
        self, breaker: SharedBreaker, client: redis.Redis, ledger_key: str, granted: bool = False, clean: bool = False
    ) -> None:
        self._breaker = breaker
        self._client = client
        self._ledger_key = ledger_key
        self._pending: str | None = None
        self._granted = granted  # the ledger's begin script already took the first permit
        self._clean = clean

    def acquire(self) -> Permit:
        if self._granted:
            self._granted = False
            return Permit(True, "closed")
        pipe = self._client.pipeline(transaction=False)
        self.flush_into(pipe)  # the last attempt's outcome, in the permit's round trip
        return self._breaker.acquire(mark_sending=self._ledger_key, pipe=pipe)

    def success(self) -> str:
        self._pending = None if self._clean else "success"
        return "success"

    def failure(self) -> str:
        self._clean = False
        self._pending = "failure"
        return self._pending

    def flush_into(self, pipe: Any) -> None:
        if self._pending is not None:
            self._breaker.record_into(pipe, self._pending)
            self._pending = None
