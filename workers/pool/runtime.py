"""A connector's isolated pool: executes dispatched intents against one system.

One ``PoolRuntime`` per worker process holds the connector spec, its adapter (one httpx client),
what the pool keeps in Redis (``PoolState``: ledger, breaker, batcher) and where its answers go
(``PoolOutput``: receipts, dead letters, audit trail). ``workers.pool.consumer`` reads each
``reach.execute`` message, parses its job with the one :class:`~workers.transport.job.Job`
model and hands it to ``execute``. Per job, in order:

    receipt already sent?  -> ack silently (a redelivery)           exactly one receipt
    delivered too often?   -> INTERNAL receipt + dead letter          poison messages stop
    deadline passed?       -> DEADLINE_EXCEEDED                      checked right before the call
    ledger claim           -> completed: the stored outcome (deduplicated), no second call
                              reused: IDEMPOTENCY_KEY_REUSED; held by a live worker: wait for it
                              held by a dead worker: OUTCOME_UNKNOWN unless repeating is safe
    call with retries      -> receipt; the ledger keeps every final outcome

Everything one delivery needs travels in a :class:`JobContext`.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis

from connectors.adapters.base import Adapter, CallContext, Outcome
from connectors.catalog import ActionRef, Catalog
from connectors.spec import ConnectorSpec
from producers.wire import AMQP_SHORT_STRING_BYTES, ErrorCode, Execution, Receipt
from workers.ids import hex_id
from workers.observability import metrics
from workers.observability.audit import Audit
from workers.observability.redaction import REDACTED, REDACTED_HEADER, redact_params
from workers.observability.tracing import child_traceparent, span, tracing_on
from workers.pool.retry import Result, run_with_retries
from workers.state import keys
from workers.state.batcher import Batcher, Write
from workers.state.breaker import Permit, SharedBreaker
from workers.state.budgets import budget_index, gives_back, refund_into
from workers.state.control import PoolStatus
from workers.state.ledger import Begin, Claim, Ledger, params_hash
from workers.transport.delivery import Delivery, Refused
from workers.transport.job import Job
from workers.transport.publisher import Publisher
from workers.transport.receipts import ReceiptSink, iso, job_receipt
from workers.transport.topology import DEFAULT_EXCHANGE, DLQ, connector_queue_name

log = logging.getLogger("reach.pool")
Stage = tuple[str, dict[str, Any]]


@dataclass(frozen=True)
class PoolOptions:
    max_deliveries: int = 5
    wait_for_holder_seconds: float = 30.0
    wait_for_sent_seconds: float = 5.0  # see PoolRuntime._sent_by_first_delivery


SENT_POLL_SECONDS = 0.1


@dataclass(frozen=True)
class PoolState:
    """What the pool keeps in Redis. ``batcher`` carries its round trips; the sink's publisher
    must write its ``then`` commands through the same batcher (a ``BatchPublisher`` built with it)."""

    redis: redis.Redis
    batcher: Batcher
    ledger: Ledger
    breaker: SharedBreaker | None = None
    status: PoolStatus | None = None


@dataclass(frozen=True)
class PoolOutput:
    """Where the pool's answers go: receipts, dead letters (``publisher``), the audit trail."""

    sink: ReceiptSink
    publisher: Publisher
    audit: Audit


@dataclass(frozen=True)
class JobContext:
    """One delivery of one job on this pool, checked (right connector, known action)."""

    job: Job
    ref: ActionRef
    key: str  # the idempotency record
    attempt: str  # this delivery's own claim: see Ledger.abandon
    safe: bool  # repeating the call is harmless (ConnectorSpec.safe_to_repeat)
    params_hash: str
    queue_ms: float

    @property
    def intent_id(self) -> str:
        return self.job.intent_id

    @property
    def agent_id(self) -> str:
        return self.job.agent_id

    @property
    def deadline(self) -> float | None:
        return self.job.deadline

    def receipt(self, **outcome: Any) -> Receipt:
        return job_receipt(self.job, self.queue_ms, **outcome)


class PoolRuntime:
    def __init__(
        self,
        connector: ConnectorSpec,
        catalog: Catalog,
        adapter: Adapter,
        *,
        state: PoolState,
        output: PoolOutput,
        options: PoolOptions = PoolOptions(),
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.connector = connector
        self.catalog = catalog
        self.adapter = adapter
        self.state = state
        self.output = output
        self.options = options
        self.sleep = sleep
        # the parts used on every job, by their short names
        self.ledger, self.breaker, self.batcher = state.ledger, state.breaker, state.batcher
        self.sink, self.publisher, self.audit = output.sink, output.publisher, output.audit
        # this connector's series, looked up once rather than per job
        name = connector.name
        self._queue_wait = metrics.QUEUE_WAIT_SECONDS.labels(connector=name)
        self._downstream = metrics.DOWNSTREAM_SECONDS.labels(connector=name)
        self._latency = metrics.INTENT_LATENCY_SECONDS.labels(connector=name)
        # (agent, action) -> the value budgets that counted its intents when they were dispatched
        self.budgets = {(a, act): b for (a, c, act), b in budget_index(catalog).items() if c == connector.name}

    # -- one job, top to bottom ------------------------------------------------------------

    def execute(self, job: Job, redelivered: bool = False) -> None:
        """Run one dispatched intent and publish its receipt (raises only if the receipt cannot be sent)."""
        if self.state.status is not None:
            self.state.status.enter()
        try:
            self._execute(job, redelivered)
        finally:
            if self.state.status is not None:
                self.state.status.leave()

    def _execute(self, job: Job, redelivered: bool) -> None:
        started = time.time()
        if redelivered:
            decided = self.sink.stored(job.agent_id, job.intent_id)
            if decided is not None and decided.agent_id == job.agent_id:
                self._send(decided, job, "redelivered")  # (silently skipped if it was sent)
                return
        queue_ms = max(0.0, (started - job.dispatched_at) * 1000)
        self._queue_wait.observe(queue_ms / 1000)
        ref = self.catalog.refs.get((job.connector, job.action))
        if job.connector != self.connector.name or ref is None:
            # only the router publishes here; anything else is a misrouted or forged message
            log.error("misrouted job for %s.%s on pool %s", job.connector, job.action, self.connector.name)
            self._send(
                job_receipt(
                    job,
                    queue_ms,
                    code=ErrorCode.INTERNAL,
                    message=(f"pool {self.connector.name} received an intent for {job.connector}.{job.action}"),
                    suggestion="Retry later; operators were told.",
                ),
                job,
                "misrouted",
            )
            return
        if job.deadline is not None and time.time() >= job.deadline:
            self._send(
                job_receipt(
                    job,
                    queue_ms,
                    code=ErrorCode.DEADLINE_EXCEEDED,
                    message="the deadline passed while the intent waited in the queue",
                    suggestion="Send a new intent with a later deadline if the action is still wanted.",
                ),
                job,
                "deadline",
            )
            return
        ctx = JobContext(
            job=job,
            ref=ref,
            attempt=hex_id(12),
            safe=self.connector.safe_to_repeat(ref.action),
            key=keys.idempotency(job.agent_id, self.connector.name, ref.action.action, job.idempotency_key),
            params_hash=params_hash(job.params),
            queue_ms=queue_ms,
        )
        try:
            self._claim_and_run(ctx)
        except Exception:
            # Redis or the broker failed before the outcome was kept or its receipt went out (or
            # before we knew whether our claim was made): the job goes back to the queue, and its
            # next delivery must not wait for this attempt
            self.ledger.abandon(ctx.key, ctx.attempt)
            raise

    def _claim_and_run(self, ctx: JobContext) -> None:
        # one round trip: receipt already sent? delivery count (poison)? claim the idempotency key,
        # and the first attempt's breaker permit while the breaker is closed
        begin = self.ledger.begin(
            keys.sent(ctx.agent_id, ctx.intent_id),
            keys.deliveries(ctx.agent_id, ctx.intent_id),
            ctx.key,
            ctx.params_hash,
            ctx.intent_id,
            ctx.attempt,
            self.options.max_deliveries,
            breaker_key=self.breaker.key if self.breaker is not None else None,
            batcher=self.batcher,
        )
        if begin.state == "abandoned":  # cannot happen while we wait for it: see Ledger.abandon
            raise RuntimeError(f"attempt {ctx.attempt} of intent {ctx.intent_id} was given up")
        if begin.state == "sent":
            log.info("intent=%s already has its receipt; redelivery acked without a second one", ctx.intent_id)
            return
        if begin.state == "poison":
            self.dead_letter_job(
                ctx.job, f"delivered {begin.deliveries} times without finishing (a worker died each time)"
            )
            self._answer(
                ctx,
                ErrorCode.INTERNAL,
                f"the intent was delivered {begin.deliveries - 1} times and never finished",
                "Do not resend it unchanged; operators can inspect it in reach.dlq.",
                "poison",
            )
            return
        claim = self._settle_claim(ctx, begin)
        if claim.state == "completed":
            if self._sent_by_first_delivery(ctx, claim.receipt_json):
                log.info(
                    "intent=%s was answered by its first delivery; this one is acked without a receipt", ctx.intent_id
                )
                return
            self._send(self._deduplicated(ctx, claim.receipt_json), ctx.job, "deduplicated")
        elif claim.state == "reused":
            self._answer(
                ctx,
                ErrorCode.IDEMPOTENCY_KEY_REUSED,
                f"idempotency key was already used by intent {claim.holder_intent} with different params",
                "Use a new idempotency_key for a different request, or resend the original params.",
                "reused",
            )
        elif claim.state == "in_progress" and claim.holder_intent == ctx.intent_id:
            log.info(
                "intent=%s is still running in another worker; this delivery leaves the answer to it", ctx.intent_id
            )
        elif claim.state == "in_progress":
            self._answer(
                ctx,
                ErrorCode.CONNECTOR_UNAVAILABLE,
                f"the intent {claim.holder_intent} with the same idempotency key is still running",
                "Send it again after retry_after_ms; it will get that intent's outcome.",
                "in_progress",
                retry_after_ms=int(self.options.wait_for_holder_seconds * 1000),
            )
        elif claim.state == "orphaned":
            receipt = self._answer(
                ctx,
                ErrorCode.OUTCOME_UNKNOWN,
                "a worker died while calling the system for this idempotency key; "
                "the call may or may not have taken effect",
                _check_first(ctx),
                "orphaned",
            )
            self.ledger.complete(ctx.key, receipt.to_json().decode())
        else:  # claimed (begin.permit is only ever set on a fresh claim)
            self._run(ctx, permit=begin.permit, clean=begin.clean)

    def _settle_claim(self, ctx: JobContext, begin: Begin) -> Claim:
        """The claim this delivery acts on, after waiting for a live holder and taking over a
        dead one's record where repeating the call is safe."""
        claim = Claim(begin.state, begin.receipt_json, begin.holder_intent)  # type: ignore[arg-type]
        was_sending = begin.was_sending
        if claim.state == "in_progress" and claim.holder_intent == ctx.intent_id:
            # this very intent is held: by a live worker still running it (a broker redelivery after
            # a connection loss), or by one that just died and whose heartbeat has not expired yet.
            # Wait until it finishes or is seen dead, instead of dropping the only delivery left.
            give_up = time.monotonic() + self.options.wait_for_holder_seconds
            while claim.state == "in_progress" and time.monotonic() < give_up:
                self.sleep(0.25)
                claim = self._claim(ctx)
            was_sending = self.ledger.was_sending(ctx.key) if claim.state == "orphaned" else was_sending
        if claim.state == "orphaned" and (ctx.safe or not was_sending):
            # the dead worker's call is safe to repeat, or it never reached the system
            if self.ledger.take_over(ctx.key, ctx.intent_id, ctx.attempt):
                return Claim("claimed")
            claim = self._claim(ctx)
        if claim.state == "in_progress" and claim.holder_intent != ctx.intent_id:
            wait = self.options.wait_for_holder_seconds
            if ctx.deadline is not None:
                wait = max(0.0, min(wait, ctx.deadline - time.time()))
            settled = self.ledger.wait_completed(ctx.key, wait)
            if settled is not None and settled.state == "completed":
                return settled
            if settled is not None:  # released by its holder: ours to try
                return self._claim(ctx)
        return claim

    def _sent_by_first_delivery(self, ctx: JobContext, stored_json: str) -> bool:
        """The record was completed by this very intent: its job came twice (the router got the
        intent again after a broker connection loss), and the first delivery may still be publishing
        the receipt. Wait (bounded) for it to be marked sent, so that the intent gets that one
        receipt and not a second, deduplicated one. A replayed dead letter of an executed intent
        waits this long before its deduplicated receipt."""
        stored = Receipt.model_validate_json(stored_json)
        if stored.intent_id != ctx.intent_id or stored.agent_id != ctx.agent_id:
            return False
        for _ in range(max(1, int(self.options.wait_for_sent_seconds / SENT_POLL_SECONDS))):
            if self.sink.already_sent(ctx.agent_id, ctx.intent_id):
                return True
            self.sleep(SENT_POLL_SECONDS)
        return self.sink.already_sent(ctx.agent_id, ctx.intent_id)

    def _claim(self, ctx: JobContext) -> Claim:
        return self.ledger.claim(ctx.key, ctx.params_hash, ctx.intent_id, ctx.attempt)

    def _run(self, ctx: JobContext, permit: bool = False, clean: bool = False) -> None:
        """Call the system (with retries), keep the outcome, publish the receipt."""
        self._queue_wait_span(ctx)
        gate = (
            _AttemptGate(self.breaker, self.state.redis, ctx.key, granted=permit, clean=clean)
            if self.breaker is not None
            else None
        )
        stages: list[Stage] = []
        result = run_with_retries(
            functools.partial(self._call_once, ctx, self._call_context(ctx)),
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
        self._finish(ctx, result, gate, stages)

    def _finish(self, ctx: JobContext, result: Result, gate: _AttemptGate | None, stages: list[Stage]) -> None:
        """One round trip for everything decided (breaker, ledger, attempt audit lines, the
        receipt), stored before the receipt is published; then the receipt, whose sent mark
        rides with the publisher's confirms."""
        outcome = result.outcome
        receipt, body = self.sink.encode(
            ctx.receipt(
                data=outcome.data,
                code=outcome.code,
                message=outcome.message,
                suggestion=_check_first(ctx) if outcome.code is ErrorCode.OUTCOME_UNKNOWN else outcome.suggestion,
                details=outcome.details,
                retry_after_ms=outcome.retry_after_ms,
                attempts=result.attempts,
                downstream_ms=result.downstream_ms,
            )
        )
        lines = self.audit.render(ctx.intent_id, stages, level=self._audit_level(ctx.agent_id))
        receipt_lines = self._receipt_lines(receipt)
        traced = lines + receipt_lines
        refund = self._refund(receipt, ctx.job)

        def decided(pipe: Any) -> None:
            if gate is not None:
                gate.flush_into(pipe)
            if outcome.code is not None and outcome.code.retryable:
                pipe.delete(ctx.key)  # nothing took effect (or repeating is safe): a re-send may execute
            else:
                self.ledger.complete_into(pipe, ctx.key, body.decode())
            if traced:
                # the receipt's line too: one push per intent, not a second one with the sent mark
                self.audit.push_into(pipe, ctx.agent_id, ctx.intent_id, traced)
            self.sink.store_into(pipe, receipt, body)
            if refund is not None:
                refund(pipe)

        # stored before the receipt goes out, by the publisher's batch (one hand-over for both);
        # the attempt lines go to stdout in the same batch, the receipt's once it is confirmed;
        # the outcome waits for a replica (durable)
        first = Write(decided, lines or None, (ctx.key,))
        mark = self._sent_mark(receipt, [])
        self.sink.publish(receipt, body, ctx.job.reply_to, then=mark, first=first)
        if receipt_lines:
            self.audit.write_lines(receipt_lines)
        self._count(receipt, "succeeded" if outcome.ok else (outcome.code.value if outcome.code else "failed"))

    # -- the downstream call ---------------------------------------------------------------

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

    # -- answers ---------------------------------------------------------------------------

    def _answer(
        self, ctx: JobContext, code: ErrorCode, message: str, suggestion: str, outcome: str, **extra: Any
    ) -> Receipt:
        """A receipt decided without calling the system, sent on the general path."""
        receipt = ctx.receipt(code=code, message=message, suggestion=suggestion, **extra)
        self._send(receipt, ctx.job, outcome)
        return receipt

    def _deduplicated(self, ctx: JobContext, stored_json: str) -> Receipt:
        original = Receipt.model_validate_json(stored_json)
        now = time.time()
        execution = Execution(
            trace_id=ctx.job.trace_id,
            attempts=0,
            latency_ms=round((now - ctx.job.received_at) * 1000, 3),
            queue_ms=round(ctx.queue_ms, 3),
            downstream_ms=None,
            received_at=iso(ctx.job.received_at),
            finished_at=iso(now),
            deduplicated=True,
            routing=ctx.job.routing,
        )
        return original.model_copy(update={"intent_id": ctx.intent_id, "execution": execution})

    # -- dead letters ----------------------------------------------------------------------

    def dead_letter_job(self, job: Job | dict[str, Any], reason: str) -> None:
        """Keep a job that cannot be finished (or one that does not parse as a job) in reach.dlq,
        params redacted; a full queue is counted."""
        doc = job.model_dump(mode="json") if isinstance(job, Job) else job
        self._dead_letter(doc, reason)

    def _dead_letter(self, job: dict[str, Any], reason: str) -> None:
        ref = self.catalog.refs.get((str(job.get("connector")), str(job.get("action"))))
        params = job.get("params")
        safe_params = redact_params(params, ref.action.input) if ref else REDACTED
        intent_id = _short(str(job.get("intent_id") or ""))
        headers = {
            "x-reach-reason": reason[:1000],
            "x-reach-intent-id": intent_id,
            "x-reach-agent-id": _short(str(job.get("agent_id") or "")),
            "x-reach-connector": self.connector.name,
        }
        kept = "full"
        if safe_params != params:
            headers[REDACTED_HEADER] = "true"  # `reach dlq replay` must not send the marker downstream
            kept = "redacted"
        self._letter(json.dumps(dict(job, params=safe_params), default=str).encode(), intent_id, headers, kept)

    def dead_letter_raw(self, message: Delivery, reason: str) -> None:
        """A message on this pool's queue that is not a job: kept in reach.dlq as it came."""
        # no x-reach-connector: `reach dlq replay` sends letters with one back to that pool as jobs
        queue = connector_queue_name(self.connector.name)
        headers = {"x-reach-reason": f"{reason} (found on {queue})"[:1000], "x-reach-queue": queue}
        self._letter(message.body, _short(message.message_id or ""), headers, "full")

    def _letter(self, body: bytes, message_id: str, headers: dict[str, Any], kept: str) -> None:
        """Publish one dead letter (counted by how much of it was ``kept``); a full reach.dlq
        refuses it, which is counted, not retried."""
        try:
            self.publisher.publish(
                body, exchange=DEFAULT_EXCHANGE, routing_key=DLQ.name, message_id=message_id, headers=headers
            )
        except Refused:
            log.warning("reach.dlq is full; dead letter %s dropped (%s)", message_id, headers["x-reach-reason"][:200])
            metrics.DEAD_LETTERS_DROPPED.labels(reason="dlq_full").inc()
            return
        metrics.DEAD_LETTERS.labels(kept=kept).inc()

    # -- sending and counting --------------------------------------------------------------

    def _send(self, receipt: Receipt, job: Job, outcome: str) -> None:
        """The general path (rare answers): checks the sent marker itself, then marks the receipt
        sent and writes its audit line (stored before this returns and the job is acked). A
        dispatched job's receipt is marked by the publisher instead (``_finish``)."""
        refund = self._refund(receipt, job)
        if refund is not None:
            try:
                self.batcher.call(refund)
            except redis.RedisError as exc:
                log.error("could not give back intent %s's budget: %s", receipt.intent_id, exc)
        if not self.sink.send(receipt, job.reply_to, mark=False):
            return
        lines = self._receipt_lines(receipt)
        mark = self._sent_mark(receipt, lines)
        if lines:
            self.audit.write_lines(lines)
        try:
            self.batcher.call(mark)
        except redis.RedisError as exc:
            log.error("could not mark receipt %s as sent: %s", receipt.intent_id, exc)
        self._count(receipt, outcome)

    def _receipt_lines(self, receipt: Receipt) -> list[str]:
        """The receipt's audit line (none below the agent's audit level)."""
        error = receipt.error
        return self.audit.render(
            receipt.intent_id,
            [
                (
                    "receipt",
                    {
                        "agent": receipt.agent_id,
                        "action": receipt.action,
                        "connector": self.connector.name,
                        "trace_id": receipt.execution.trace_id,
                        "status": receipt.status,
                        "code": error.code.value if error else None,
                        "attempts": receipt.execution.attempts,
                        "latency_ms": receipt.execution.latency_ms,
                        "queue_ms": receipt.execution.queue_ms,
                        "deduplicated": receipt.execution.deduplicated or None,
                    },
                )
            ],
            level=self._audit_level(receipt.agent_id or ""),
        )

    def _sent_mark(self, receipt: Receipt, lines: list[str]) -> Callable[[Any], None]:
        """The Redis commands that mark the receipt sent (and keep its trace ``lines``)."""

        def mark(pipe: Any) -> None:
            # the delivery count guards against a job that kills its pool before it is answered;
            # once the receipt is out, a redelivery stops at the sent mark (checked first)
            pipe.delete(keys.deliveries(receipt.agent_id, receipt.intent_id))
            self.sink.mark_sent_into(pipe, receipt)
            if lines:
                self.audit.push_into(pipe, receipt.agent_id, receipt.intent_id, lines)

        return mark

    def _refund(self, receipt: Receipt, job: Job) -> Callable[[Any], None] | None:
        """The commands that give a failed intent's amount back, or None when nothing goes back.
        They run before its receipt is published: an agent that reads the failure and tries again
        must find the amount already returned. Once (the script deletes the intent's entry, so a
        redelivery finds nothing), and only if it was counted for this payload (not for another
        that reused the id)."""
        budgets = self.budgets.get((receipt.agent_id or "", receipt.action or "")) if self.budgets else None
        if not budgets or not gives_back(receipt):
            return None
        agent, connector, tag = receipt.agent_id or "", self.connector.name, job.payload_hash()

        def refund(pipe: Any) -> None:
            refund_into(pipe, agent, connector, receipt.intent_id, tag, budgets)

        return refund

    def _audit_level(self, agent_id: str) -> str:
        binding = self.catalog.binding(agent_id, self.connector.name)
        return binding.audit_level if binding else "full"

    def _count(self, receipt: Receipt, outcome: str) -> None:
        error = receipt.error
        if error is not None and self.state.status is not None and receipt.status != "rejected":
            self.state.status.record_error(error.code.value, error.message)
        metrics.ACTIONS_EXECUTED.labels(
            connector=self.connector.name, action=str(receipt.action), outcome=outcome
        ).inc()
        metrics.RECEIPTS_PUBLISHED.labels(status=receipt.status).inc()
        self._latency.observe(receipt.execution.latency_ms / 1000)


class _AttemptGate:
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


def _check_first(ctx: JobContext) -> str:
    return (
        ctx.ref.connector.check_first_suggestion(ctx.ref.action.action)
        + " Resending with the same idempotency_key returns this same answer."
    )


def _short(text: str) -> str:
    """At most an AMQP short string's 255 bytes of ``text``."""
    return text.encode("utf-8")[:AMQP_SHORT_STRING_BYTES].decode("utf-8", "ignore")
