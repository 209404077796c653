"""A connector's isolated pool: executes dispatched intents against one system.

One ``PoolRuntime`` per worker process holds the connector spec, its adapter (one httpx client)
and the receipt sink. The Celery task ``reach.execute`` is a thin shell around ``execute``.
"""
from __future__ import annotations

import logging
import time
from typing import Any

from celery import Celery

from connectors.adapters.base import Adapter, CallContext, Outcome
from connectors.catalog import Catalog
from connectors.spec import ConnectorSpec
from producers.wire import ErrorCode
from workers import metrics
from workers.app import EXECUTE_TASK
from workers.receipts import ReceiptSink, build_receipt

log = logging.getLogger("reach.pool")


class PoolRuntime:
    def __init__(self, connector: ConnectorSpec, catalog: Catalog, adapter: Adapter, sink: ReceiptSink) -> None:
        self.connector = connector
        self.catalog = catalog
        self.adapter = adapter
        self.sink = sink

    def execute(self, job: dict[str, Any], redelivered: bool = False) -> None:
        """Run one dispatched intent and publish its receipt (raises only if the receipt cannot be sent)."""
        started = time.time()
        intent_id = str(job.get("intent_id") or "")
        agent_id = job.get("agent_id")
        reply_to = job.get("reply_to") or agent_id
        if redelivered:
            # the receipt may already exist: a crash after publishing must not execute twice
            previous = self.sink.stored(intent_id)
            if previous is not None and previous.agent_id == agent_id:
                log.info("redelivered intent=%s already has a receipt; re-sending it", intent_id)
                self.sink.send(previous, reply_to)
                return
        connector_name = job.get("connector")
        action_name = job.get("action")
        ref = self.catalog.refs.get((str(connector_name), str(action_name)))
        common = dict(intent_id=intent_id, agent_id=agent_id, action=action_name, connector=connector_name,
                      trace_id=str(job.get("trace_id") or ""), received_at=float(job.get("received_at") or started),
                      queue_ms=max(0.0, (started - float(job.get("dispatched_at") or started)) * 1000))
        if connector_name != self.connector.name or ref is None:
            # only the router publishes here; anything else is a misrouted or forged message
            receipt = build_receipt(**common, code=ErrorCode.INTERNAL,
                                    message=f"pool {self.connector.name} received an intent for {connector_name}.{action_name}",
                                    suggestion="Retry later; operators were told.")
            log.error("misrouted job for %s.%s on pool %s", connector_name, action_name, self.connector.name)
            self._send(receipt, reply_to, "misrouted")
            return
        deadline = job.get("deadline")
        if deadline is not None and time.time() >= float(deadline):
            receipt = build_receipt(**common, code=ErrorCode.DEADLINE_EXCEEDED,
                                    message="the deadline passed while the intent waited in the queue",
                                    suggestion="Send a new intent with a later deadline if the action is still wanted.")
            self._send(receipt, reply_to, "deadline")
            return
        remaining = None if deadline is None else max(0.1, float(deadline) - time.time())
        ctx = CallContext(
            intent_id=intent_id,
            idempotency_key=job.get("idempotency_key"),
            traceparent=job.get("traceparent"),
            timeout=min(ref.action.timeout_seconds, remaining) if remaining is not None else None,
        )
        try:
            outcome = self.adapter.call(ref.action, dict(job.get("params") or {}), ctx)
        except Exception:
            log.exception("adapter failed on intent=%s", intent_id)
            outcome = Outcome(False, code=ErrorCode.INTERNAL, message="the connector's adapter failed on this intent",
                              suggestion="Retry later; operators were told.")
        metrics.DOWNSTREAM_SECONDS.labels(connector=self.connector.name).observe(outcome.downstream_ms / 1000)
        receipt = build_receipt(**common, data=outcome.data, code=outcome.code, message=outcome.message,
                                suggestion=outcome.suggestion, details=outcome.details,
                                retry_after_ms=outcome.retry_after_ms, attempts=1, downstream_ms=outcome.downstream_ms)
        self._send(receipt, reply_to, "succeeded" if outcome.ok else (outcome.code.value if outcome.code else "failed"))

    def _send(self, receipt: Any, reply_to: str | None, outcome: str) -> None:
        self.sink.send(receipt, reply_to)
        metrics.ACTIONS_EXECUTED.labels(connector=self.connector.name, action=str(receipt.action), outcome=outcome).inc()
        metrics.RECEIPTS_PUBLISHED.labels(status=receipt.status).inc()
        error = receipt.error
        log.info("executed intent=%s agent=%s action=%s.%s status=%s code=%s downstream_ms=%s trace=%s",
                 receipt.intent_id, receipt.agent_id, self.connector.name, receipt.action, receipt.status,
                 error.code.value if error else None, receipt.execution.downstream_ms, receipt.execution.trace_id)


def register_task(app: Celery, runtime: PoolRuntime) -> None:
    @app.task(name=EXECUTE_TASK, bind=True, acks_late=True, reject_on_worker_lost=True, ignore_result=True)
    def execute(task: Any, job: dict[str, Any]) -> None:
        if not isinstance(job, dict):
            log.error("dropping a malformed job: %r", type(job).__name__)
            return
        runtime.execute(job, redelivered=bool(task.request.delivery_info.get("redelivered")))
