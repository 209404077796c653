"""Receipts: built from an outcome, published (confirmed, persistent), stored in Redis by agent and intent id."""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import redis

from producers.wire import NACK_PAUSES_SECONDS, ErrorCode, ErrorInfo, Execution, Receipt
from workers.state import keys
from workers.state.batcher import Write
from workers.transport.delivery import Refused
from workers.transport.job import Job
from workers.transport.publisher import Publisher
from workers.transport.topology import RECEIPTS_EXCHANGE

log = logging.getLogger("reach.receipts")


def iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def build_receipt(
    *,
    intent_id: str,
    agent_id: str | None,
    action: str | None,
    connector: str | None,
    trace_id: str,
    received_at: float,
    data: Any = None,
    code: ErrorCode | None = None,
    message: str = "",
    suggestion: str = "",
    details: list[dict[str, Any]] | None = None,
    retry_after_ms: int | None = None,
    attempts: int = 0,
    queue_ms: float | None = None,
    downstream_ms: float | None = None,
    deduplicated: bool = False,
    routing: dict[str, Any] | None = None,
) -> Receipt:
    """One receipt; ``code`` None means success. Status and retryable follow the code table."""
    finished = time.time()
    error = None
    if code is not None:
        error = ErrorInfo(
            code=code,
            message=message,
            retryable=code.retryable,
            suggestion=suggestion,
            details=details or [],
            retry_after_ms=retry_after_ms,
        )
    return Receipt(
        intent_id=intent_id,
        agent_id=agent_id,
        action=action,
        connector=connector,
        status="succeeded" if code is None else code.status,
        success=code is None,
        data=data if code is None else None,
        error=error,
        execution=Execution(
            trace_id=trace_id,
            attempts=attempts,
            latency_ms=round((finished - received_at) * 1000, 3),
            queue_ms=None if queue_ms is None else round(queue_ms, 3),
            downstream_ms=None if downstream_ms is None else round(downstream_ms, 3),
            received_at=iso(received_at),
            finished_at=iso(finished),
            deduplicated=deduplicated,
            routing=routing,
        ),
    )


def job_receipt(job: Job, queue_ms: float | None = None, **outcome: Any) -> Receipt:
    """The receipt for ``job`` with ``outcome`` (``build_receipt``'s code, message, data, ...)."""
    return build_receipt(
        intent_id=job.intent_id,
        agent_id=job.agent_id,
        action=job.action,
        connector=job.connector,
        trace_id=job.trace_id,
        received_at=job.received_at,
        queue_ms=queue_ms,
        routing=job.routing,
        **outcome,
    )


class ReceiptSink:
    """Publishes each receipt to reach.receipts and keeps a copy in Redis for ``ttl`` seconds.

    Exactly one receipt per intent, also under redelivery: the receipt is stored before it is
    published and marked sent after the broker confirmed it. A redelivered intent whose receipt
    was sent is acked silently; one whose receipt was decided but maybe not sent gets that same
    receipt again (a duplicate only if the process died between confirm and mark).

    A receipt the broker nacks (a queue bound for its routing key refused it: one an agent bounded
    with ``reject-publish``, a quorum queue electing a leader) is published again after each of
    ``nack_pauses``; only then does the nack reach the caller, with the receipt still stored. One
    thread at a time retries an agent's receipts, and for ``REFUSING_MEMORY_SECONDS`` after its
    tries ran out that agent's receipts get one try each: an agent whose own queue keeps refusing
    must not hold the router's or the pools' threads for seconds per intent.
    A queue that took the nacked message may get it twice: the same receipt, which agents drop.
    """

    def __init__(
        self,
        publisher: Publisher,
        redis_client: redis.Redis,
        ttl_seconds: int,
        limits: ReceiptLimits | None = None,
        *,
        nack_pauses: Sequence[float] = NACK_PAUSES_SECONDS,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._publisher = publisher
        self._redis = redis_client
        self._ttl = ttl_seconds
        self.limits = limits or ReceiptLimits()
        self._nack_pauses = tuple(nack_pauses)
        self._sleep = sleep
        self._clock = clock
        self._refusing: OrderedDict[str, float] = OrderedDict()  # routing key -> until (monotonic), bounded
        self._refusing_lock = threading.Lock()

    def encode(self, receipt: Receipt) -> tuple[Receipt, bytes]:
        """The receipt as it will be sent (within the limits) and its JSON."""
        return fit(receipt, self.limits)

    def send(self, receipt: Receipt, routing_key: str | None, mark: bool = True) -> bool:
        """Store, publish with a confirm, mark sent. False when this intent already had its receipt.

        Raises if the broker refuses, so the caller does not ack and the intent is redelivered.
        """
        receipt, body = self.encode(receipt)
        try:
            if self._redis.exists(keys.sent(receipt.agent_id, receipt.intent_id)):
                log.info("receipt for %s was already sent; not sending another", receipt.intent_id)
                return False
            self._redis.set(keys.receipt(receipt.agent_id, receipt.intent_id), body, ex=self._ttl)
        except redis.RedisError as exc:
            # the receipt still reaches the agent; lookup by id and redelivery dedupe are lost
            log.error("could not store receipt %s in Redis: %s", receipt.intent_id, exc)
        self.publish(receipt, body, routing_key)
        if mark:  # (a caller with more writes to make marks it in its own round trip)
            try:
                self._redis.set(keys.sent(receipt.agent_id, receipt.intent_id), "1", ex=self._ttl)
            except redis.RedisError as exc:
                log.error("could not mark receipt %s as sent: %s", receipt.intent_id, exc)
        return True

    # the pool's pipelined path: store with other writes, publish, then mark with other writes

    def store_into(self, pipe: Any, receipt: Receipt, body: bytes) -> None:
        pipe.set(keys.receipt(receipt.agent_id, receipt.intent_id), body, ex=self._ttl)

    def publish(
        self, receipt: Receipt, body: bytes, routing_key: str | None, then: Any = None, first: Write | None = None
    ) -> None:
        """``first``: Redis writes stored before the receipt goes out (raises their error, and
        nothing is published, if they fail); ``then``: Redis commands written once the broker
        confirmed the receipt, before this returns, e.g. its sent mark. The pools' publisher
        batches both with other receipts'."""
        if routing_key is None:
            log.warning("receipt %s has no agent or reply_to to route to; stored only", receipt.intent_id)
            if first is not None:
                self._publisher.store_first(first)
            if then is not None:
                pipe = self._redis.pipeline(transaction=False)
                then(pipe)
                pipe.execute()
            return
        sender = receipt.agent_id or routing_key  # every routing key of one agent counts as one
        pauses = iter(self._nack_pauses)
        retrying = False
        tries = 1
        while True:
            try:
                self._publisher.publish(
                    body,
                    exchange=RECEIPTS_EXCHANGE,
                    routing_key=routing_key,
                    correlation_id=receipt.intent_id,
                    message_id=receipt.intent_id,
                    headers={"status": receipt.status},
                    then=then,
                    first=first,
                )
                if retrying:
                    self._refusing_done(sender, None)
                return
            except Refused as exc:
                # one thread at a time retries for an agent: the others, and every receipt for it
                # shortly after its retries ran out, get one try
                retrying = retrying or self._start_retrying(sender)
                pause = next(pauses, None) if retrying else None
                if pause is None:
                    if retrying:
                        self._refusing_done(sender, REFUSING_MEMORY_SECONDS)
                    raise ReceiptRefused(receipt.intent_id, routing_key, tries) from exc
                log.warning(
                    "the broker nacked receipt %s for %s; publishing it again in %g s",
                    receipt.intent_id,
                    routing_key,
                    pause,
                )
                first = None  # stored with the first try (the publisher stores it before it publishes)
                self._sleep(pause)
                tries += 1

    def _start_retrying(self, sender: str) -> bool:
        """Whether this thread may retry ``sender``'s receipt (no other one does, and its receipts
        were not refused to the end lately)."""
        now = self._clock()
        with self._refusing_lock:
            until = self._refusing.get(sender)
            if until is not None and until > now:
                return False
            self._refusing.pop(sender, None)
            self._refusing[sender] = now + sum(self._nack_pauses) + REFUSING_MEMORY_SECONDS  # while retrying
            while len(self._refusing) > REFUSING_MEMORY_KEYS:
                self._refusing.popitem(last=False)
            return True

    def _refusing_done(self, sender: str, remember_seconds: float | None) -> None:
        with self._refusing_lock:
            self._refusing.pop(sender, None)
            if remember_seconds is not None:
                self._refusing[sender] = self._clock() + remember_seconds

    def mark_sent_into(self, pipe: Any, receipt: Receipt) -> None:
        pipe.set(keys.sent(receipt.agent_id, receipt.intent_id), "1", ex=self._ttl)

    def already_sent(self, agent_id: str | None, intent_id: str) -> bool:
        return bool(self._redis.exists(keys.sent(agent_id, intent_id)))

    def stored(self, agent_id: str | None, intent_id: str) -> Receipt | None:
        """The receipt decided for this agent's intent, if it is still kept."""
        raw = self._redis.get(keys.receipt(agent_id, intent_id))
        return None if raw is None else Receipt.model_validate_json(raw)


REFUSING_MEMORY_SECONDS = 5.0
REFUSING_MEMORY_KEYS = 10_000  # agents remembered as refusing, the oldest forgotten first


class ReceiptRefused(Refused):
    """The broker nacked a receipt on every try. It stays stored in Redis (``keys.receipt``): the
    pool dead-letters its job, and ``reach dlq replay`` sends the outcome again."""

    def __init__(self, intent_id: str, routing_key: str, tries: int) -> None:
        super().__init__(f"the broker refused the receipt of {intent_id} for {routing_key!r} on {tries} tries (nack)")
        self.intent_id = intent_id
        self.routing_key = routing_key
        self.tries = tries


@dataclass(frozen=True)
class ReceiptLimits:
    """What one receipt may cost: its error details and its size (REACH_MAX_DETAILS,
    REACH_MAX_RECEIPT_BYTES)."""

    max_details: int = 50
    max_bytes: int = 1024 * 1024


TEXT_LIMIT = 2000  # characters of a message or suggestion kept when a receipt must shrink


def fit(receipt: Receipt, limits: ReceiptLimits) -> tuple[Receipt, bytes]:
    """Cut a receipt down to the limits: at most ``max_details`` details (the last one says how
    many more there were), then, if it is still too large, shorter texts, no details, and ``data``
    replaced by a note saying what was left out. Returns the receipt and its JSON."""
    error = receipt.error
    if error is not None and len(error.details) > limits.max_details:
        kept = error.details[: limits.max_details - 1]
        more = len(error.details) - len(kept)
        kept.append({"field": "(more)", "code": "more_details", "message": f"and {more} more"})
        receipt = receipt.model_copy(update={"error": error.model_copy(update={"details": kept})})
    body = receipt.to_json()
    if len(body) <= limits.max_bytes:
        return receipt, body
    update: dict[str, Any] = {}
    if receipt.data is not None:
        update["data"] = {
            "_reach_omitted": f"the answer was {len(body)} bytes as a receipt; "
            f"receipts are limited to {limits.max_bytes} bytes"
        }
    if error is not None:
        update["error"] = error.model_copy(
            update={
                "message": error.message[:TEXT_LIMIT],
                "suggestion": error.suggestion[:TEXT_LIMIT],
                "details": [
                    {
                        "field": "(all)",
                        "code": "omitted",
                        "message": f"{len(error.details)} details left out: the receipt was {len(body)} bytes",
                    }
                ],
            }
        )
    receipt = receipt.model_copy(update=update)
    return receipt, receipt.to_json()
