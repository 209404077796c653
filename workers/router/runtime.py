"""Carrying the router's decisions out: dispatch, or receipt (+ dead letter), then ack or requeue.

The router's worker consumes ``reach.intents`` as plain JSON data (``workers.transport.consuming``):
no message, whatever headers it carries, can make it run a task by name.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import OrderedDict
from datetime import UTC, datetime
from typing import Any

from producers.wire import ErrorCode
from workers.observability import metrics
from workers.observability.audit import Audit, params_digest
from workers.observability.redaction import redact_body, redact_params
from workers.observability.tracing import span
from workers.router.approval_parking import Park, Parking
from workers.router.decisions import Answer, Decision, Dispatch
from workers.router.intake import RawMessage, fail_identity, new_trace_id, vouched_identity
from workers.router.routing import Router
from workers.state.budgets import gives_back
from workers.state.redeliveries import Redeliveries
from workers.transport.delivery import TRANSIENT_ERRORS, Refused, Settle
from workers.transport.dispatch import Dispatcher
from workers.transport.job import Job
from workers.transport.publisher import Publisher, Unroutable
from workers.transport.receipts import ReceiptSink, build_receipt, job_receipt
from workers.transport.topology import DEFAULT_EXCHANGE, DLQ

log = logging.getLogger("reach.router")


class RouterRuntime:
    """Carries decisions out with confirmed publishes; the message is acked only afterwards.

    A message is requeued only when the broker or Redis failed (its next delivery may go
    through), and at most ``max_deliveries`` times; anything else that stops a decision from
    being carried out is a property of the message, so it is dead-lettered once (or, if even
    that fails, dropped with a log line and a metric) and acked: nothing loops.
    """

    def __init__(
        self,
        router: Router,
        dispatcher: Dispatcher,
        sink: ReceiptSink,
        publisher: Publisher,
        audit: Audit,
        *,
        keep_unparsable: bool = False,
        max_deliveries: int = 5,
        parking: Parking | None = None,
        redeliveries: Redeliveries | None = None,
    ) -> None:
        self.router = router
        self.dispatcher = dispatcher  # jobs onto connector queues (the publisher: receipts and letters)
        self.sink = sink
        self.publisher = publisher
        self.audit = audit
        self.keep_unparsable = keep_unparsable
        self.retries = RetryCounts(max_deliveries)
        self.max_deliveries = max_deliveries
        self.redeliveries = redeliveries  # returns seen by any router (None: only this process's requeues)
        self.parking = parking  # intents that wait for a person (workers/router/approval_parking.py)

    def handle(self, raw: RawMessage) -> Settle:
        """Route one delivery; say what must then happen to it (ack, or requeue when the decision
        could not be carried out for a passing reason)."""
        try:
            deliveries = self._deliveries(raw)
            if deliveries > self.max_deliveries:
                log.error("intent delivered %d times without a decision; answering and dead-lettering it", deliveries)
                decision: Decision = self.router.undecided(raw, deliveries)
            else:
                decision = self.router.decide(raw)
        except TRANSIENT_ERRORS as exc:  # Redis away or failing over: the guards could not be asked
            if self.retries.again(raw):
                log.warning("could not route an intent (%s); it will be redelivered", exc)
                time.sleep(TRANSIENT_PAUSE_SECONDS)  # an outage must not become a redelivery storm
                return "requeue"
            log.exception("router could not route a message; answering INTERNAL")
            decision = self._internal(raw)
        except Exception:  # a bug, not a bad message: answer INTERNAL rather than stall the queue
            log.exception("router failed on a message; answering INTERNAL")
            decision = self._internal(raw)
        try:
            try:
                self._carry_out(decision, raw)
            except (Unroutable, Refused) as exc:
                if not isinstance(decision, Dispatch):
                    raise  # a receipt or letter the broker would not take
                decision = self._not_queued(decision, exc)  # answered as any rejection
                self._carry_out(decision, raw)
        except TRANSIENT_ERRORS as exc:
            if self.retries.again(raw):
                log.warning(
                    "could not complete a routing decision (%s: %s); the intent will be redelivered",
                    type(exc).__name__,
                    exc,
                )
                time.sleep(TRANSIENT_PAUSE_SECONDS)  # a broker failover takes seconds: spread the tries over it
                return "requeue"
            self._give_up(decision, raw, exc)
        except Exception as exc:
            self._give_up(decision, raw, exc)
        self.retries.forget(raw)
        return "ack"

    def _deliveries(self, raw: RawMessage) -> int:
        """This delivery's number: 1 for a first delivery; for a redelivery, the larger of the
        quorum queue's own count (``x-delivery-count``: returns before this one) and the routers'
        count in Redis (which classic queues need). A header an agent set itself only ever makes
        its own intent stop sooner."""
        if not raw.redelivered:
            return 1
        returned = raw.headers.get("x-delivery-count")
        counted = returned + 1 if isinstance(returned, int) and not isinstance(returned, bool) and returned > 0 else 2
        if self.redeliveries is not None:
            try:
                counted = max(counted, self.redeliveries.count(raw.body, raw.message_id, raw.user_id))
            except TRANSIENT_ERRORS as exc:  # Redis away: decide; a failing decision is requeued and counted here
                log.warning("could not count a redelivery (%s)", exc)
        return counted

    def _give_up(self, decision: Decision, raw: RawMessage, exc: BaseException) -> None:
        """The decision cannot be carried out for this message: keep it once, then let it go."""
        intent_id = decision.receipt.intent_id if isinstance(decision, Answer) else decision.intent_id
        log.error("giving up on intent %s: %s: %s", intent_id, type(exc).__name__, str(exc)[:300])
        metrics.MESSAGES_DROPPED.labels(reason=type(exc).__name__[:40]).inc()
        answer = decision if isinstance(decision, Answer) else self._internal(raw)
        if not isinstance(decision, Answer):  # a Dispatch, or a Park never parked
            # (a Dispatch may have been queued by an earlier delivery whose confirm was lost, so
            # it is not answered here: only a job known not to be queued is, in handle)
            try:
                self.router.release(decision.job)  # never dispatched: its budgets get their amount back
            except Exception as again:
                log.error("could not give back the budget of intent %s (%s)", intent_id, again)
        try:
            self._dead_letter(raw, answer, f"could not be answered: {type(exc).__name__}: {exc}")
        except Exception as again:
            log.error("could not dead-letter intent %s either (%s); dropped", intent_id, again)
            metrics.DEAD_LETTERS_DROPPED.labels(reason="publish_failed").inc()

    def _answered_before(self, decision: Park) -> None:
        """This intent id already had its receipt (e.g. it was rejected RATE_LIMITED and resent with
        the same id): one receipt per intent, so it is not parked again (an approval would run it
        with nobody told, or answer nothing). Its budget is given back and its receipt sent again."""
        job = decision.job
        log.info("intent %s of %s already had its receipt; not parked again", job.intent_id, job.agent_id)
        stored = self.sink.stored(job.agent_id, job.intent_id)
        if stored is None or gives_back(stored):  # (one that took effect keeps what it was counted)
            self.router.release(job)
        if stored is not None and stored.agent_id == job.agent_id:
            receipt, body = self.sink.encode(stored)
            self.sink.publish(receipt, body, job.reply_to)

    def _carry_out(self, decision: Decision, raw: RawMessage) -> None:
        received = {"ts": round(raw.received_at, 6), "bytes": raw.size}
        if self.parking is not None and not isinstance(decision, Park) and self._held(decision):
            return  # its intent id waits for a person: that approval's work gets the one receipt
        if isinstance(decision, Dispatch):
            self._dispatch(decision, received, raw.received_at)  # raises Unroutable, Refused: see handle
            return
        if isinstance(decision, Park):
            if self.parking is None:
                raise RuntimeError("this router was started without approvals (no Parking)")
            if self.sink.already_sent(decision.job.agent_id, decision.intent_id):
                self._answered_before(decision)
                return
            granted = self.parking.park(decision, received)
            if granted is not None:  # the very request a person approved: its pool answers it from the ledger
                self._dispatch(Dispatch(granted), received, raw.received_at)
            return
        receipt = decision.receipt
        self.sink.send(receipt, decision.routing_key)
        metrics.RECEIPTS_PUBLISHED.labels(status=receipt.status).inc()
        error = receipt.error
        common = {
            "agent": receipt.agent_id,
            "action": receipt.action,
            "connector": receipt.connector,
            "trace_id": receipt.execution.trace_id,
        }
        binding = self.router.catalog.binding(receipt.agent_id or "", receipt.connector or "")
        self.audit.events(
            receipt.intent_id,
            [
                ("received", {**received, **common}),
                (
                    "rejected" if error else "answered",
                    {
                        **common,
                        "code": error.code.value if error else None,
                        "dead_lettered": decision.dead_letter_reason is not None,
                        **(decision.audit or {}),
                    },
                ),
                (
                    "receipt",
                    {
                        **common,
                        "status": receipt.status,
                        "code": error.code.value if error else None,
                        "latency_ms": receipt.execution.latency_ms,
                    },
                ),
            ],
            level=binding.audit_level if binding else "full",
            agent=receipt.agent_id,
        )
        # after the receipt: a receipt that cannot be sent must not leave a letter per attempt
        if decision.dead_letter_reason is not None:
            self._dead_letter(raw, decision, decision.dead_letter_reason)

    def _held(self, decision: Dispatch | Answer) -> bool:
        assert self.parking is not None
        if isinstance(decision, Dispatch):
            job = decision.job
            return self.parking.hold(self.router.catalog.approvals, job.agent_id, job.intent_id, job.reply_to)
        receipt = decision.receipt
        return self.parking.hold(
            self.router.catalog.approvals, receipt.agent_id, receipt.intent_id, decision.routing_key
        )

    def _dispatch(self, decision: Dispatch, received: dict[str, Any], received_at: float) -> None:
        """Publish the job to its connector's queue (confirmed), then write its audit stages. Raises
        only if the job is not queued."""
        job = decision.job
        with span(
            "reach.route",
            job.traceparent,
            start_time=received_at,
            attributes={"reach.connector": job.connector, "reach.action": job.action},
        ) as route:
            if route is not None and route.is_recording():
                # the pool's spans become children of this one
                context = route.get_span_context()
                job = job.model_copy(update={"traceparent": f"00-{context.trace_id:032x}-{context.span_id:016x}-01"})
            # the stage's time is the dispatch, not the confirm: the pool may log its attempt before
            # the confirm comes back, and `reach trace` orders stages by time
            dispatched_at = round(time.time(), 6)
            self.dispatcher.dispatch(job)
        metrics.INTENTS_DISPATCHED.labels(connector=job.connector).inc()
        try:
            self._audit_dispatch(job, received, received_at, dispatched_at)
        except Exception as exc:  # the job is queued: a lost audit line must not queue it again
            log.error("could not write the audit stages of intent %s: %s", job.intent_id, exc)

    def _audit_dispatch(self, job: Job, received: dict[str, Any], received_at: float, dispatched_at: float) -> None:
        ref = self.router.catalog.refs[(job.connector, job.action)]
        binding = self.router.catalog.binding(job.agent_id, job.connector)
        redacted = redact_params(job.params, ref.action.input)
        common = {"agent": job.agent_id, "action": job.action, "connector": job.connector, "trace_id": job.trace_id}
        self.audit.events(
            job.intent_id,
            [
                ("received", {**received, **common, "format": job.format}),
                (
                    "dispatched",
                    {
                        "ts": dispatched_at,
                        **common,
                        "param_keys": sorted(redacted),
                        "params_digest": params_digest(redacted),
                        "route_ms": round((time.time() - received_at) * 1000, 3),
                        "routing": job.routing,
                    },
                ),
            ],
            level=binding.audit_level if binding else "full",
            agent=job.agent_id,
        )

    def _dead_letter(self, raw: RawMessage, decision: Answer, reason: str) -> None:
        """Keep the message in reach.dlq for operators, without anything sensitive: an oversize
        body is never read, and one that cannot be parsed is kept only if the operator opted in."""
        body, kept = self._letter_body(raw)
        headers = {
            "x-reach-reason": reason[:1000],
            "x-reach-intent-id": decision.receipt.intent_id,
            "x-reach-agent-id": decision.receipt.agent_id or "",
            # the broker (or the fleet) vouched for that agent: `reach dlq replay` may restore it
            "x-reach-agent-verified": bool(agent := decision.receipt.agent_id)
            and vouched_identity(raw, self.router.fleet_user) == agent,
            "x-reach-received-at": datetime.fromtimestamp(raw.received_at, UTC).isoformat(),
            "x-reach-body-bytes": raw.size,
            "x-reach-body-sha256": raw.oversize[1] if raw.oversize else hashlib.sha256(raw.body).hexdigest(),
            "x-reach-body-kept": kept,
        }
        try:
            self.publisher.publish(
                body,
                exchange=DEFAULT_EXCHANGE,
                routing_key=DLQ.name,
                headers=headers,
                message_id=decision.receipt.intent_id,
            )
        except Refused:
            # reach.dlq is full (its bounds refuse new letters): counted, not retried
            log.warning(
                "reach.dlq is full; dead letter of intent %s dropped (%s)", decision.receipt.intent_id, reason[:200]
            )
            metrics.DEAD_LETTERS_DROPPED.labels(reason="dlq_full").inc()
            return
        metrics.DEAD_LETTERS.labels(kept=kept).inc()

    def _letter_body(self, raw: RawMessage) -> tuple[bytes, str]:
        """(what is kept of the body, "redacted" | "full" | "none")."""
        if raw.oversize is not None or len(raw.body) > self.router.max_intent_bytes:
            return b"", "none"
        redacted = redact_body(raw.body, self.router.catalog, self.router.max_depth)
        if redacted is None:
            return (raw.body, "full") if self.keep_unparsable else (b"", "none")
        return redacted, "redacted" if redacted != raw.body else "full"

    def _not_queued(self, decision: Dispatch, exc: Unroutable | Refused) -> Answer:
        """The broker did not take the job (its connector's queue is missing and could not be
        declared again, or it nacked every try): the intent ran nowhere, so it is answered
        CONNECTOR_UNAVAILABLE (retryable) and its budget given back."""
        job = decision.job
        if isinstance(exc, Unroutable):
            log.error("intent %s not dispatched: %s", job.intent_id, exc)
            message, reason = f"the queue of connector {job.connector} is missing on the broker", "queue missing"
        else:
            log.error("intent %s not dispatched: the broker nacked its job on every try", job.intent_id)
            message, reason = f"the broker refused to queue the job for connector {job.connector}", "nacked"
        try:
            self.router.release(job)
        except Exception as exc:
            log.error("could not give back the budget of intent %s (%s)", job.intent_id, exc)
        receipt = job_receipt(
            job,
            None,
            code=ErrorCode.CONNECTOR_UNAVAILABLE,
            message=message,
            suggestion="Retry later; operators were told.",
            retry_after_ms=NOT_QUEUED_RETRY_MS,
        )
        return Answer(receipt, job.reply_to, audit={"reason": reason})

    def _internal(self, raw: RawMessage) -> Answer:
        intent_id, agent_id = fail_identity(raw)
        receipt = build_receipt(
            intent_id=intent_id,
            agent_id=agent_id,
            action=None,
            connector=None,
            trace_id=new_trace_id(),
            received_at=raw.received_at,
            code=ErrorCode.INTERNAL,
            message="the router failed on this intent",
            suggestion="Retry later; operators were told.",
        )
        return Answer(receipt, agent_id, dead_letter_reason="router error")


NOT_QUEUED_RETRY_MS = 5000  # a pool that reconnects declares its queue again, a new leader is elected, within seconds
TRANSIENT_PAUSE_SECONDS = 1.0  # as the pools' pause: REACH_MAX_DELIVERIES tries span a Redis failover of seconds


class RetryCounts:
    """How often this process requeued a message (by a digest of its id and body), so a message
    that keeps failing for a passing reason still stops after ``limit`` deliveries. Bounded: the
    oldest entries are forgotten first."""

    def __init__(self, limit: int, size: int = 10_000) -> None:
        self._limit = limit
        self._size = size
        self._counts: OrderedDict[bytes, int] = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def _key(raw: RawMessage) -> bytes:
        return hashlib.blake2b(raw.body[:65536] + (raw.message_id or "").encode(), digest_size=16).digest()

    def again(self, raw: RawMessage) -> bool:
        key = self._key(raw)
        with self._lock:
            count = self._counts.pop(key, 0) + 1
            self._counts[key] = count
            while len(self._counts) > self._size:
                self._counts.popitem(last=False)
        return count < self._limit

    def forget(self, raw: RawMessage) -> None:
        if self._counts:
            with self._lock:
                self._counts.pop(self._key(raw), None)
