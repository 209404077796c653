"""A connector's isolated pool: executes dispatched intents against one system.

One ``PoolRuntime`` per worker process holds the connector spec, its adapter (one httpx client),
what the pool keeps in Redis (``PoolState``: ledger, breaker, batcher) and where its answers go
(``PoolOutput``: receipts, dead letters, audit trail). ``workers.pool.consumer`` reads each
``reach.execute`` message, parses its job with the one :class:`~workers.transport.job.Job`
model and hands it to ``execute``. Per job, in order:

    receipt already sent?  -> ack silently (a redelivery)           exactly one receipt
    delivered too often?   -> INTERNAL receipt + dead letter          poison messages stop
    deadline passed?       -> DEADLINE_EXCEEDED                      unless a delivery before may have sent it
    ledger claim           -> completed: the stored outcome (deduplicated), no second call
                              reused: IDEMPOTENCY_KEY_REUSED; held by a live worker: wait for it
                              held by a dead worker: OUTCOME_UNKNOWN unless repeating is safe
    call with retries      -> receipt; the ledger keeps every final outcome

This module holds that order. Everything one delivery needs travels in a
:class:`~workers.pool.job_context.JobContext`; the waits on another delivery's claim are in
``workers.pool.claim_waits``, the call in ``workers.pool.downstream_call``, the receipts in
``workers.pool.answers`` and the dead letters in ``workers.pool.dead_letters``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis

from connectors.adapters.base import Adapter
from connectors.catalog import Catalog
from connectors.spec import ConnectorSpec
from producers.wire import ErrorCode
from workers.ids import hex_id
from workers.observability import metrics
from workers.observability.audit import Audit
from workers.pool.answers import Answers
from workers.pool.claim_waits import sent_by_first_delivery, settle_claim
from workers.pool.dead_letters import job_letter, post, raw_letter
from workers.pool.downstream_call import DownstreamCall
from workers.pool.history_writes import HistoryWrites
from workers.pool.job_context import JobContext
from workers.state import keys
from workers.state.batcher import Batcher
from workers.state.breaker import SharedBreaker
from workers.state.control import PoolStatus
from workers.state.ledger import Ledger, params_hash
from workers.transport.delivery import Delivery
from workers.transport.job import Job
from workers.transport.publisher import Publisher
from workers.transport.receipts import ReceiptSink, job_receipt

log = logging.getLogger("reach.pool")


@dataclass(frozen=True)
class PoolOptions:
    max_deliveries: int = 5
    wait_for_holder_seconds: float = 30.0
    wait_for_sent_seconds: float = 5.0  # see workers.pool.claim_waits.sent_by_first_delivery


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
    history: HistoryWrites | None = None  # each dispatched intent's history record (None: none kept)


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
        self.sink, self.publisher = output.sink, output.publisher
        self.call = DownstreamCall(
            connector, adapter, ledger=state.ledger, breaker=state.breaker, client=state.redis, sleep=sleep
        )
        self.answers = Answers(
            connector.name,
            catalog,
            sink=output.sink,
            audit=output.audit,
            batcher=state.batcher,
            ledger=state.ledger,
            status=state.status,
            history=output.history,
        )
        self._queue_wait = metrics.QUEUE_WAIT_SECONDS.labels(connector=connector.name)

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
                self.answers.send(decided, job, "redelivered")  # (silently skipped if it was sent)
                return
        queue_ms = max(0.0, (started - job.dispatched_at) * 1000)
        self._queue_wait.observe(queue_ms / 1000)
        ref = self.catalog.refs.get((job.connector, job.action))
        if job.connector != self.connector.name or ref is None:
            # only the router publishes here; anything else is a misrouted or forged message
            log.error("misrouted job for %s.%s on pool %s", job.connector, job.action, self.connector.name)
            self.answers.send(
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
        key = keys.idempotency(job.agent_id, self.connector.name, ref.action.action, job.idempotency_key)
        # past its deadline, a job is refused unless an earlier delivery of it may have called the
        # system (its worker died mid-call): then the ledger's answer (its outcome, or OUTCOME_UNKNOWN)
        # is the truth, not "it was never run"
        if job.deadline is not None and time.time() >= job.deadline:
            if not (redelivered and self.ledger.was_sending(key)):
                self.answers.send(
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
            key=key,
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
            self.answers.answer(
                ctx,
                ErrorCode.INTERNAL,
                f"the intent was delivered {begin.deliveries - 1} times and never finished",
                "Do not resend it unchanged; operators can inspect it in reach.dlq.",
                "poison",
            )
            return
        claim = settle_claim(self.ledger, ctx, begin, self.options.wait_for_holder_seconds, self.sleep)
        if claim.state == "completed":
            if sent_by_first_delivery(
                self.sink, ctx, claim.receipt_json, self.options.wait_for_sent_seconds, self.sleep
            ):
                log.info(
                    "intent=%s was answered by its first delivery; this one is acked without a receipt", ctx.intent_id
                )
                return
            self.answers.send(self.answers.deduplicated(ctx, claim.receipt_json), ctx.job, "deduplicated")
        elif claim.state == "reused":
            self.answers.answer(
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
            self.answers.answer(
                ctx,
                ErrorCode.CONNECTOR_UNAVAILABLE,
                f"the intent {claim.holder_intent} with the same idempotency key is still running",
                "Send it again after retry_after_ms; it will get that intent's outcome.",
                "in_progress",
                retry_after_ms=int(self.options.wait_for_holder_seconds * 1000),
            )
        elif claim.state == "orphaned":
            receipt = self.answers.answer(
                ctx,
                ErrorCode.OUTCOME_UNKNOWN,
                "a worker died while calling the system for this idempotency key; "
                "the call may or may not have taken effect",
                ctx.check_first(),
                "orphaned",
            )
            self.ledger.complete(ctx.key, receipt.to_json().decode())
        else:  # claimed (begin.permit is only ever set on a fresh claim)
            result, gate, stages = self.call.run(ctx, permit=begin.permit, clean=begin.clean)
            self.answers.finish(ctx, result, gate, stages)

    # -- dead letters (workers.pool.dead_letters) --------------------------------------------

    def dead_letter_job(self, job: Job | dict[str, Any], reason: str) -> None:
        """Keep a job that cannot be finished (or one that does not parse as a job) in reach.dlq,
        params redacted; a full queue is counted."""
        doc = job.model_dump(mode="json") if isinstance(job, Job) else job
        self._dead_letter(doc, reason)

    def _dead_letter(self, job: dict[str, Any], reason: str) -> None:
        post(self.publisher, job_letter(self.catalog, self.connector.name, job, reason))

    def dead_letter_raw(self, message: Delivery, reason: str) -> None:
        """A message on this pool's queue that is not a job: kept in reach.dlq as it came."""
        post(self.publisher, raw_letter(self.connector.name, message, reason))
