"""Where a pool's answers go: each job's one receipt, kept and marked sent, its audit lines,
a failed intent's budget given back, and the counts.

Two paths. A job that called the system is finished by :meth:`Answers.finish`: one round trip
for everything decided (breaker, ledger, audit lines, the stored receipt), then the receipt,
whose sent mark rides with the publisher's confirms. Rare answers decided without calling the
system go through :meth:`Answers.send`, which checks the sent marker itself.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import redis

from connectors.catalog import Catalog
from producers.wire import ErrorCode, Execution, Receipt
from workers.observability import metrics
from workers.observability.audit import Audit
from workers.pool.downstream_call import AttemptGate, Stage
from workers.pool.history_writes import HistoryWrites
from workers.pool.job_context import JobContext
from workers.pool.retry import Result
from workers.state import keys
from workers.state.batcher import Batcher, Write
from workers.state.budgets import budget_index, gives_back, refund_into
from workers.state.control import PoolStatus
from workers.state.ledger import Ledger
from workers.transport.job import Job
from workers.transport.receipts import ReceiptSink, iso

log = logging.getLogger("reach.pool")


class Answers:
    """One connector's receipts, with what goes along with each."""

    def __init__(
        self,
        connector: str,
        catalog: Catalog,
        *,
        sink: ReceiptSink,
        audit: Audit,
        batcher: Batcher,
        ledger: Ledger,
        status: PoolStatus | None = None,
        history: HistoryWrites | None = None,
    ) -> None:
        self.connector = connector
        self.catalog = catalog
        self.sink = sink
        self.audit = audit
        self.batcher = batcher
        self.ledger = ledger
        self.status = status
        self.history = history or HistoryWrites(catalog, None, 0)  # each dispatched intent's record
        self._latency = metrics.INTENT_LATENCY_SECONDS.labels(connector=connector)
        # (agent, action) -> the value budgets that counted its intents when they were dispatched
        self.budgets = {(a, act): b for (a, c, act), b in budget_index(catalog).items() if c == connector}

    def answer(
        self, ctx: JobContext, code: ErrorCode, message: str, suggestion: str, outcome: str, **extra: Any
    ) -> Receipt:
        """A receipt decided without calling the system, sent on the general path."""
        receipt = ctx.receipt(code=code, message=message, suggestion=suggestion, **extra)
        self.send(receipt, ctx.job, outcome)
        return receipt

    def deduplicated(self, ctx: JobContext, stored_json: str) -> Receipt:
        """The stored outcome of the request, as this intent's receipt (nothing was called)."""
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

    def send(self, receipt: Receipt, job: Job, outcome: str) -> None:
        """The general path (rare answers): checks the sent marker itself, then marks the receipt
        sent and writes its audit line (stored before this returns and the job is acked). A
        dispatched job's receipt is marked by the publisher instead (``finish``)."""
        refund = self._refund(receipt, job)
        if refund is not None:
            try:
                self.batcher.call(refund)
            except redis.RedisError as exc:
                log.error("could not give back intent %s's budget: %s", receipt.intent_id, exc)
        if not self.sink.send(receipt, job.reply_to, mark=False):
            return
        lines = self._receipt_lines(receipt)
        # a redelivered job's receipt was recorded with its first storing
        record = None if outcome == "redelivered" else self.history.record(receipt, job)
        mark = self._sent_mark(receipt, lines, self.history.commands(record))
        if lines:
            self.audit.write_lines(lines)
        try:
            self.batcher.call(mark)
        except redis.RedisError as exc:
            log.error("could not mark receipt %s as sent: %s", receipt.intent_id, exc)
        self.history.write_after(record)
        self._count(receipt, outcome)

    def finish(self, ctx: JobContext, result: Result, gate: AttemptGate | None, stages: list[Stage]) -> None:
        """One round trip for everything decided (breaker, ledger, attempt audit lines, the
        receipt), stored before the receipt is published; then the receipt, whose sent mark
        rides with the publisher's confirms."""
        outcome = result.outcome
        receipt, body = self.sink.encode(
            ctx.receipt(
                data=outcome.data,
                code=outcome.code,
                message=outcome.message,
                suggestion=ctx.check_first() if outcome.code is ErrorCode.OUTCOME_UNKNOWN else outcome.suggestion,
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
        record = self.history.record(receipt, ctx.job)
        remember = self.history.commands(record)

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
            if remember is not None:  # its history record, with the receipt it remembers
                remember(pipe)
            if refund is not None:
                refund(pipe)

        # stored before the receipt goes out, by the publisher's batch (one hand-over for both);
        # the attempt lines go to stdout in the same batch, the receipt's once it is confirmed;
        # the outcome waits for a replica (durable)
        first = Write(decided, lines or None, (ctx.key,))
        mark = self._sent_mark(receipt, [])
        self.sink.publish(receipt, body, ctx.job.reply_to, then=mark, first=first)
        self.history.write_after(record)
        if receipt_lines:
            self.audit.write_lines(receipt_lines)
        self._count(receipt, "succeeded" if outcome.ok else (outcome.code.value if outcome.code else "failed"))

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
                        "connector": self.connector,
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

    def _sent_mark(
        self, receipt: Receipt, lines: list[str], also: Callable[[Any], None] | None = None
    ) -> Callable[[Any], None]:
        """The Redis commands that mark the receipt sent (and keep its trace ``lines``, and run
        ``also``: a history record's)."""

        def mark(pipe: Any) -> None:
            if also is not None:
                also(pipe)
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
        agent, connector, tag = receipt.agent_id or "", self.connector, job.payload_hash()

        def refund(pipe: Any) -> None:
            refund_into(pipe, agent, connector, receipt.intent_id, tag, budgets)

        return refund

    def _audit_level(self, agent_id: str) -> str:
        binding = self.catalog.binding(agent_id, self.connector)
        return binding.audit_level if binding else "full"

    def _count(self, receipt: Receipt, outcome: str) -> None:
        error = receipt.error
        if error is not None and self.status is not None and receipt.status != "rejected":
            self.status.record_error(error.code.value, error.message)
        metrics.ACTIONS_EXECUTED.labels(connector=self.connector, action=str(receipt.action), outcome=outcome).inc()
        metrics.RECEIPTS_PUBLISHED.labels(status=receipt.status).inc()
        self._latency.observe(receipt.execution.latency_ms / 1000)
