"""A connector's isolated pool: executes dispatched intents against one system.

One ``PoolRuntime`` per worker process holds the connector spec, its adapter (one httpx client),
the idempotency ledger, the shared breaker and the receipt sink. The pool's Celery worker reads
``reach.execute`` task messages as data (``consumer_class``) and hands each job to ``execute``.
Per job, in order:

    receipt already sent?  -> ack silently (a redelivery)           exactly one receipt
    delivered too often?   -> INTERNAL receipt + dead letter          poison messages stop
    deadline passed?       -> DEADLINE_EXCEEDED                      checked right before the call
    ledger claim           -> completed: the stored outcome (deduplicated), no second call
                              reused: IDEMPOTENCY_KEY_REUSED; held by a live worker: wait for it
                              held by a dead worker: OUTCOME_UNKNOWN unless repeating is safe
    call with retries      -> receipt; the ledger keeps every final outcome
"""
from __future__ import annotations

import dataclasses
import json
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import amqp.exceptions
import kombu.exceptions
import redis
from celery.worker.consumer import Consumer
from kombu.message import Message

from connectors.adapters.base import Adapter, CallContext, Outcome
from connectors.catalog import ActionRef, Catalog
from connectors.spec import ConnectorSpec
from producers.wire import ErrorCode, Execution, Receipt
from workers.state import keys
from workers.observability import metrics
from workers.transport.app import EXECUTE_TASK
from workers.observability.audit import Audit
from workers.state.breaker import Permit, SharedBreaker, permit_from
from workers.transport.consuming import threaded_consumer
from workers.state.control import PoolStatus
from workers.state.ledger import Begin, Claim, Ledger, payload_hash
from workers.transport.publisher import Publisher
from workers.transport.receipts import ReceiptSink, build_receipt, iso
from workers.pool.retry import run_with_retries
from workers.transport.topology import DEFAULT_EXCHANGE, DLQ, connector_queue_name
from workers.observability.tracing import child_traceparent, span
from workers.state.batcher import Batcher

log = logging.getLogger("reach.pool")
REQUEUE_PAUSE_SECONDS = 1.0
# failures after which the job may well finish on its next delivery (the delivery count bounds it)
TRANSIENT_ERRORS = (OSError, redis.ConnectionError, redis.TimeoutError, amqp.exceptions.RecoverableConnectionError,
                    kombu.exceptions.OperationalError)


@dataclass(frozen=True)
class PoolOptions:
    max_deliveries: int = 5
    wait_for_holder_seconds: float = 30.0


class PoolRuntime:
    def __init__(self, connector: ConnectorSpec, catalog: Catalog, adapter: Adapter, sink: ReceiptSink, *,
                 ledger: Ledger, breaker: SharedBreaker | None, redis_client: redis.Redis, publisher: Publisher,
                 batcher: Batcher, audit: Audit | None = None, status: PoolStatus | None = None,
                 options: PoolOptions = PoolOptions(), sleep: Callable[[float], None] = time.sleep) -> None:
        """``batcher`` carries the pool's Redis round trips, and ``sink``'s publisher must write
        ``then`` commands through it (a ``BatchPublisher`` built with the same batcher)."""
        self.connector = connector
        self.catalog = catalog
        self.adapter = adapter
        self.sink = sink
        self.ledger = ledger
        self.breaker = breaker
        self.redis = redis_client
        self.publisher = publisher
        self.options = options
        self.sleep = sleep
        self.audit = audit or Audit(None, f"pool:{connector.name}")
        self.status = status
        self.batcher = batcher

    def execute(self, job: dict[str, Any], redelivered: bool = False) -> None:
        """Run one dispatched intent and publish its receipt (raises only if the receipt cannot be sent)."""
        if self.status is not None:
            self.status.enter()
        try:
            self._execute(job, redelivered)
        finally:
            if self.status is not None:
                self.status.leave()

    def _execute(self, job: dict[str, Any], redelivered: bool) -> None:
        started = time.time()
        intent_id = str(job.get("intent_id") or "")
        agent_id = str(job.get("agent_id") or "")
        reply_to = job.get("reply_to") or agent_id
        if redelivered:
            decided = self.sink.stored(agent_id, intent_id)
            if decided is not None and decided.agent_id == agent_id:
                self._send(decided, reply_to, "redelivered")  # (silently skipped if it was sent)
                return
        connector_name, action_name = job.get("connector"), job.get("action")
        ref = self.catalog.refs.get((str(connector_name), str(action_name)))
        common = dict(intent_id=intent_id, agent_id=agent_id, action=action_name, connector=connector_name,
                      trace_id=str(job.get("trace_id") or ""), received_at=float(job.get("received_at") or started),
                      queue_ms=max(0.0, (started - float(job.get("dispatched_at") or started)) * 1000))

        def answer(code: ErrorCode, message: str, suggestion: str, outcome: str, **extra: Any) -> Receipt:
            receipt = build_receipt(**common, code=code, message=message, suggestion=suggestion, **extra)
            self._send(receipt, reply_to, outcome)
            return receipt

        metrics.QUEUE_WAIT_SECONDS.labels(connector=self.connector.name).observe(common["queue_ms"] / 1000)
        if connector_name != self.connector.name or ref is None:
            # only the router publishes here; anything else is a misrouted or forged message
            log.error("misrouted job for %s.%s on pool %s", connector_name, action_name, self.connector.name)
            answer(ErrorCode.INTERNAL, f"pool {self.connector.name} received an intent for {connector_name}.{action_name}",
                   "Retry later; operators were told.", "misrouted")
            return
        deadline = float(job["deadline"]) if job.get("deadline") is not None else None
        if deadline is not None and time.time() >= deadline:
            answer(ErrorCode.DEADLINE_EXCEEDED, "the deadline passed while the intent waited in the queue",
                   "Send a new intent with a later deadline if the action is still wanted.", "deadline")
            return

        params = dict(job.get("params") or {})
        attempt = uuid.uuid4().hex[:12]  # this delivery's own claim: see Ledger.abandon
        key = keys.idempotency(agent_id, self.connector.name, ref.action.action, str(job.get("idempotency_key") or intent_id))
        safe = ref.action.is_idempotent or bool(self.connector.idempotency_header)
        try:
            self._claim_and_run(job, ref, params, attempt, key, safe, deadline, common, reply_to, answer)
        except Exception:
            # Redis or the broker failed before the outcome was kept or its receipt went out (or
            # before we knew whether our claim was made): the job goes back to the queue, and its
            # next delivery must not wait for this attempt
            self.ledger.abandon(key, attempt)
            raise

    def _claim_and_run(self, job: dict[str, Any], ref: ActionRef, params: dict[str, Any], attempt: str, key: str,
                       safe: bool, deadline: float | None, common: dict[str, Any], reply_to: str,
                       answer: Callable[..., Receipt]) -> None:
        intent_id, agent_id = common["intent_id"], common["agent_id"]
        params_hash = payload_hash(params)
        # one round trip: receipt already sent? delivery count (poison)? claim the idempotency key,
        # and the first attempt's breaker permit while the breaker is closed
        begin = self.ledger.begin(keys.sent(agent_id, intent_id), keys.deliveries(agent_id, intent_id), key,
                                  params_hash, intent_id, attempt, self.options.max_deliveries,
                                  breaker_key=self.breaker.key if self.breaker is not None else None,
                                  batcher=self.batcher)
        if begin.state == "abandoned":  # cannot happen while we wait for it: see Ledger.abandon
            raise RuntimeError(f"attempt {attempt} of intent {intent_id} was given up")
        if begin.state == "sent":
            log.info("intent=%s already has its receipt; redelivery acked without a second one", intent_id)
            return
        if begin.state == "poison":
            self.dead_letter_job(job, f"delivered {begin.deliveries} times without finishing (a worker died each time)")
            answer(ErrorCode.INTERNAL, f"the intent was delivered {begin.deliveries - 1} times and never finished",
                   "Do not resend it unchanged; operators can inspect it in reach.dlq.", "poison")
            return
        claim = self._settle_claim(begin, key, params_hash, intent_id, attempt, deadline, safe)
        if claim.state == "completed":
            self._send(self._deduplicated(claim.receipt_json, common), reply_to, "deduplicated")
            return
        if claim.state == "reused":
            answer(ErrorCode.IDEMPOTENCY_KEY_REUSED,
                   f"idempotency key was already used by intent {claim.holder_intent} with different params",
                   "Use a new idempotency_key for a different request, or resend the original params.", "reused")
            return
        if claim.state == "in_progress":
            if claim.holder_intent == intent_id:
                log.info("intent=%s is still running in another worker; this delivery leaves the answer to it", intent_id)
                return
            answer(ErrorCode.CONNECTOR_UNAVAILABLE,
                   f"the intent {claim.holder_intent} with the same idempotency key is still running",
                   "Send it again after retry_after_ms; it will get that intent's outcome.", "in_progress",
                   retry_after_ms=int(self.options.wait_for_holder_seconds * 1000))
            return
        if claim.state == "orphaned":
            receipt = answer(ErrorCode.OUTCOME_UNKNOWN,
                             "a worker died while calling the system for this idempotency key; the call may or may not have taken effect",
                             _check_first(self.connector, ref), "orphaned")
            self.ledger.complete(key, receipt.to_json().decode())
            return
        # (begin.permit is only ever set on a fresh claim)
        self._run(ref, job, params, key, deadline, safe, common, reply_to, permit=begin.permit)

    def _run(self, ref: ActionRef, job: dict[str, Any], params: dict[str, Any], key: str, deadline: float | None,
             safe: bool, common: dict[str, Any], reply_to: str, permit: bool = False) -> None:
        remaining = None if deadline is None else max(0.1, deadline - time.time())
        ctx = CallContext(
            intent_id=common["intent_id"],
            idempotency_key=job.get("idempotency_key"),
            traceparent=job.get("traceparent"),
            timeout=min(ref.action.timeout_seconds, remaining) if remaining is not None else None,
        )

        parent = job.get("traceparent")
        if parent:
            with span("reach.queue_wait", parent, start_time=float(job.get("dispatched_at") or time.time()),
                      attributes={"reach.connector": self.connector.name}):
                pass

        def call() -> Outcome:
            try:
                if not parent:
                    return self.adapter.call(ref.action, params, ctx)
                with span("reach.downstream_call", parent, attributes={"reach.connector": self.connector.name,
                                                                       "reach.action": ref.action.action}) as current:
                    context = current.get_span_context() if current is not None else None
                    recording = current is not None and current.is_recording()
                    child = (f"00-{context.trace_id:032x}-{context.span_id:016x}-01"
                             if recording and context is not None and context.is_valid else child_traceparent(parent))
                    return self.adapter.call(ref.action, params, dataclasses.replace(ctx, traceparent=child))
            except Exception:
                log.exception("adapter failed on intent=%s", common["intent_id"])
                return Outcome(False, code=ErrorCode.INTERNAL, message="the connector's adapter failed on this intent",
                               suggestion="Retry later; operators were told.", sent=False)

        binding = self.catalog.binding(common["agent_id"], self.connector.name)
        level = binding.audit_level if binding else "full"
        audit_common = {"agent": common["agent_id"], "action": ref.action.action, "connector": self.connector.name,
                        "trace_id": common["trace_id"]}
        attempts: list[tuple[str, dict[str, Any]]] = []

        def after_attempt(attempt: int, outcome: Outcome) -> None:
            attempts.append(("attempt", {**audit_common, "ts": round(time.time(), 6), "attempt": attempt,
                                         "outcome": "ok" if outcome.ok else (outcome.code.value if outcome.code else "failed"),
                                         "http_status": outcome.http_status, "sent": outcome.sent,
                                         "downstream_ms": round(outcome.downstream_ms, 3)}))

        gate = _AttemptGate(self.breaker, self.redis, key, granted=permit) if self.breaker is not None else None
        result = run_with_retries(call, ref.action.retry or self.connector.retry, safe_to_repeat=safe, deadline=deadline,
                                  gate=gate, before_attempt=None if gate else (lambda n: self.ledger.mark_sending(key)),
                                  after_attempt=after_attempt, sleep=self.sleep)
        outcome = result.outcome
        metrics.DOWNSTREAM_SECONDS.labels(connector=self.connector.name).observe(result.downstream_ms / 1000)
        if result.attempts > 1:
            metrics.RETRIES.labels(connector=self.connector.name).inc(result.attempts - 1)
        receipt = build_receipt(**common, data=outcome.data, code=outcome.code, message=outcome.message,
                                suggestion=_check_first(self.connector, ref) if outcome.code is ErrorCode.OUTCOME_UNKNOWN
                                else outcome.suggestion, details=outcome.details, retry_after_ms=outcome.retry_after_ms,
                                attempts=result.attempts, downstream_ms=result.downstream_ms)
        receipt, body = self.sink.encode(receipt)
        lines = self.audit.render(common["intent_id"], attempts, level=level)

        def decided(pipe: Any) -> None:
            if gate is not None:
                gate.flush_into(pipe)
            if outcome.code is not None and outcome.code.retryable:
                pipe.delete(key)  # nothing took effect (or repeating is safe): a re-send may execute
            else:
                self.ledger.complete_into(pipe, key, body.decode())
            if lines:
                self.audit.push_into(pipe, common["agent_id"], common["intent_id"], lines)
            self.sink.store_into(pipe, receipt, body)

        # one round trip for everything decided (breaker, ledger, attempt audit lines, the receipt),
        # stored before the receipt is published; the attempt lines go to stdout in the same batch
        self.batcher.call(decided, lines=lines or None)
        # the sent mark rides with the publisher's confirms (one hand-over less per intent)
        lines, mark = self._sent_record(receipt)
        self.sink.publish(receipt, body, reply_to, then=mark)
        if lines:
            self.audit.write_lines(lines)
        self._count(receipt, "succeeded" if outcome.ok else (outcome.code.value if outcome.code else "failed"))

    def _settle_claim(self, begin: Begin, key: str, params_hash: str, intent_id: str, attempt: str,
                      deadline: float | None, safe: bool) -> Claim:
        claim = Claim(begin.state, begin.receipt_json, begin.holder_intent)  # type: ignore[arg-type]
        if claim.state == "in_progress" and claim.holder_intent == intent_id:
            # this very intent is held: by a live worker still running it (a broker redelivery after
            # a connection loss), or by one that just died and whose heartbeat has not expired yet.
            # Wait until it finishes or is seen dead, instead of dropping the only delivery left.
            give_up = time.monotonic() + self.options.wait_for_holder_seconds
            while claim.state == "in_progress" and time.monotonic() < give_up:
                self.sleep(0.25)
                claim = self.ledger.claim(key, params_hash, intent_id, attempt)
            was_sending = self.ledger.was_sending(key) if claim.state == "orphaned" else begin.was_sending
            begin = dataclasses.replace(begin, was_sending=was_sending)
        if claim.state == "orphaned" and (safe or not begin.was_sending):
            # the dead worker's call is safe to repeat, or it never reached the system
            if self.ledger.take_over(key, intent_id, attempt):
                return Claim("claimed")
            claim = self.ledger.claim(key, params_hash, intent_id, attempt)
        if claim.state == "in_progress" and claim.holder_intent != intent_id:
            wait = self.options.wait_for_holder_seconds
            if deadline is not None:
                wait = max(0.0, min(wait, deadline - time.time()))
            settled = self.ledger.wait_completed(key, wait)
            if settled is not None and settled.state == "completed":
                return settled
            if settled is not None:  # released by its holder: ours to try
                return self.ledger.claim(key, params_hash, intent_id, attempt)
        return claim

    def _deduplicated(self, stored_json: str, common: dict[str, Any]) -> Receipt:
        original = Receipt.model_validate_json(stored_json)
        now = time.time()
        execution = Execution(trace_id=common["trace_id"], attempts=0,
                              latency_ms=round((now - common["received_at"]) * 1000, 3),
                              queue_ms=round(common["queue_ms"], 3), downstream_ms=None,
                              received_at=iso(common["received_at"]), finished_at=iso(now), deduplicated=True)
        return original.model_copy(update={"intent_id": common["intent_id"], "execution": execution})

    def dead_letter_job(self, job: dict[str, Any], reason: str) -> None:
        """Keep a job that cannot be finished in reach.dlq (params redacted); a full queue is counted."""
        try:
            self._dead_letter(job, reason)
        except amqp.exceptions.MessageNacked:
            log.warning("reach.dlq is full; dead letter of intent %s dropped", job.get("intent_id"))
            metrics.DEAD_LETTERS_DROPPED.labels(reason="dlq_full").inc()

    def _dead_letter(self, job: dict[str, Any], reason: str) -> None:
        from workers.observability.redaction import REDACTED, REDACTED_HEADER, redact_params

        ref = self.catalog.refs.get((str(job.get("connector")), str(job.get("action"))))
        params = job.get("params")
        safe_params = redact_params(params, ref.action.input) if ref else REDACTED
        headers = {"x-reach-reason": reason, "x-reach-intent-id": str(job.get("intent_id") or ""),
                   "x-reach-agent-id": str(job.get("agent_id") or ""), "x-reach-connector": self.connector.name}
        if safe_params != params:
            headers[REDACTED_HEADER] = "true"  # `reach dlq replay` must not send the marker downstream
        self.publisher.publish(json.dumps(dict(job, params=safe_params), default=str).encode(), exchange=DEFAULT_EXCHANGE,
                               routing_key=DLQ.name, message_id=str(job.get("intent_id") or ""), headers=headers)

    def dead_letter_raw(self, message: Message, reason: str) -> None:
        """A message on this pool's queue that is not a job: kept in reach.dlq as it came."""
        body = message.body if isinstance(message.body, bytes) else str(message.body).encode("utf-8", "replace")
        # no x-reach-connector: `reach dlq replay` sends letters with one back to that pool as jobs
        self.publisher.publish(body, exchange=DEFAULT_EXCHANGE, routing_key=DLQ.name,
                               message_id=str(message.properties.get("message_id") or ""),
                               headers={"x-reach-reason": f"{reason} (found on {connector_queue_name(self.connector.name)})"[:1000],
                                        "x-reach-queue": connector_queue_name(self.connector.name)})

    def _send(self, receipt: Receipt, reply_to: str | None, outcome: str) -> None:
        """The general path (rare answers): checks the sent marker itself."""
        if not self.sink.send(receipt, reply_to, mark=False):
            return
        self._after_publish(receipt, outcome)

    def _after_publish(self, receipt: Receipt, outcome: str) -> None:
        """Mark the receipt sent and write its audit line (stored before this returns and the job
        is acked); count it. The rare answers' path: a dispatched job's receipt is marked by the
        publisher (``_run``)."""
        lines, mark = self._sent_record(receipt)
        if lines:
            self.audit.write_lines(lines)
        try:
            self.batcher.call(mark)
        except redis.RedisError as exc:
            log.error("could not mark receipt %s as sent: %s", receipt.intent_id, exc)
        self._count(receipt, outcome)

    def _sent_record(self, receipt: Receipt) -> tuple[list[str], Callable[[Any], None]]:
        """The receipt's audit line, and the Redis commands that mark it sent and keep that line."""
        error = receipt.error
        binding = self.catalog.binding(receipt.agent_id or "", self.connector.name)
        lines = self.audit.render(receipt.intent_id, [("receipt", {
            "agent": receipt.agent_id, "action": receipt.action, "connector": self.connector.name,
            "trace_id": receipt.execution.trace_id, "status": receipt.status, "code": error.code.value if error else None,
            "attempts": receipt.execution.attempts, "latency_ms": receipt.execution.latency_ms,
            "queue_ms": receipt.execution.queue_ms, "deduplicated": receipt.execution.deduplicated or None})],
            level=binding.audit_level if binding else "full")

        def mark(pipe: Any) -> None:
            # the delivery count guards against a job that kills its pool before it is answered;
            # once the receipt is out, a redelivery stops at the sent mark (checked first)
            pipe.delete(keys.deliveries(receipt.agent_id, receipt.intent_id))
            self.sink.mark_sent_into(pipe, receipt)
            if lines:
                self.audit.push_into(pipe, receipt.agent_id, receipt.intent_id, lines)

        return lines, mark

    def _count(self, receipt: Receipt, outcome: str) -> None:
        error = receipt.error
        if error is not None and self.status is not None and receipt.status != "rejected":
            self.status.record_error(error.code.value, error.message)
        metrics.ACTIONS_EXECUTED.labels(connector=self.connector.name, action=str(receipt.action), outcome=outcome).inc()
        metrics.RECEIPTS_PUBLISHED.labels(status=receipt.status).inc()
        metrics.INTENT_LATENCY_SECONDS.labels(connector=self.connector.name).observe(receipt.execution.latency_ms / 1000)


class _AttemptGate:
    """The breaker for one intent's attempts, in as few round trips as possible: the first permit
    usually comes with the ledger's begin script (breaker closed), each later permit also marks the
    idempotency record "sending" (same script), and each result is recorded with the next permit
    or, for the last attempt, in the pool's final pipeline."""

    def __init__(self, breaker: SharedBreaker, client: redis.Redis, ledger_key: str, granted: bool = False) -> None:
        self._breaker = breaker
        self._client = client
        self._ledger_key = ledger_key
        self._pending: str | None = None
        self._granted = granted  # the ledger's begin script already took the first permit

    def acquire(self) -> Permit:
        if self._granted:
            self._granted = False
            return Permit(True, "closed")
        if self._pending is None:
            return self._breaker.acquire(mark_sending=self._ledger_key)
        pipe = self._client.pipeline(transaction=False)
        self.flush_into(pipe)
        self._breaker.acquire(mark_sending=self._ledger_key, pipe=pipe)
        return permit_from(pipe.execute()[-1])

    def success(self) -> str:
        self._pending = "success"
        return self._pending

    def failure(self) -> str:
        self._pending = "failure"
        return self._pending

    def flush_into(self, pipe: Any) -> None:
        if self._pending is not None:
            self._breaker.record_into(pipe, self._pending)
            self._pending = None


def _check_first(connector: ConnectorSpec, ref: ActionRef) -> str:
    return (connector.check_first_suggestion(ref.action.action)
            + " Resending with the same idempotency_key returns this same answer.")


def decode_job(message: Message) -> tuple[dict[str, Any] | None, str]:
    """The job in a ``reach.execute`` task message (Celery protocol 2: ``[[job], {}, {...}]``),
    or None and why not."""
    task = (message.headers or {}).get("task")
    if task != EXECUTE_TASK:
        return None, f"not a {EXECUTE_TASK} message (task header {str(task)[:100]!r})"
    try:
        body = message.body
        args = json.loads(body if isinstance(body, (bytes, str)) else bytes(body))[0]
        job = args[0] if isinstance(args, list) and len(args) == 1 else None
    except (ValueError, TypeError, IndexError, KeyError):
        return None, "the message body is not a task message of JSON"
    if not isinstance(job, dict):
        return None, "the task's argument is not a job object"
    return job, ""


def consumer_class(runtime: PoolRuntime, threads: int) -> type[Consumer]:
    """The pool's consumer: each job runs on one of ``threads`` threads (see ``job_handler``)."""
    return threaded_consumer(job_handler(runtime), threads, "reach-pool")


def job_handler(runtime: PoolRuntime, requeue_pause: float = REQUEUE_PAUSE_SECONDS) -> Callable[[Message], Callable[[], None]]:
    """One message -> what to do with it. A job is acked after its receipt went out. A job that
    could not be finished because Redis or the broker failed goes back to the queue (after a
    pause, so an outage does not become a redelivery storm) instead of being acked without a
    receipt; a message that is not a job is dead-lettered."""

    def handle(message: Message) -> Callable[[], None]:
        job, problem = decode_job(message)
        if job is None:
            log.error("dead-lettering a message that is not a job: %s", problem)
            try:
                runtime.dead_letter_raw(message, problem)
            except Exception:
                log.exception("could not dead-letter it; it will be redelivered")
                time.sleep(requeue_pause)
                return message.requeue
            return message.ack
        try:
            runtime.execute(job, redelivered=bool(message.delivery_info.get("redelivered")))
        except TRANSIENT_ERRORS:
            log.exception("could not finish intent %s; it goes back to the queue", job.get("intent_id"))
            time.sleep(requeue_pause)
            return message.requeue
        except Exception as exc:
            # not the broker or Redis: the same job would fail the same way on every delivery
            log.exception("giving up on intent %s", job.get("intent_id"))
            metrics.MESSAGES_DROPPED.labels(reason=type(exc).__name__[:40]).inc()
            try:
                runtime.dead_letter_job(job, f"could not be finished: {type(exc).__name__}: {exc}"[:1000])
            except Exception as again:
                log.error("could not dead-letter intent %s either (%s); dropped", job.get("intent_id"), again)
                metrics.DEAD_LETTERS_DROPPED.labels(reason="publish_failed").inc()
        return message.ack

    return handle
