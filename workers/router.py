"""The router: every intent is checked here, in the order of design.md section 6, before any
connector queue sees it.

``Router.decide`` is pure (catalog lookups and checks, no I/O) so it can be driven by property
tests; ``RouterRuntime.process`` carries the decision out: dispatch, or receipt (+ dead letter),
then ack.

The router's Celery worker consumes ``reach.intents`` as *plain JSON data*. Celery's task
handler is replaced (``workers.consuming``) so no message, whatever headers it carries, can make
this worker run a task by name.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable

from celery import Celery
from celery.worker.consumer import Consumer
from kombu.message import Message

from connectors.catalog import ActionRef, Catalog, Refusal
from connectors.hours import parse_window
from connectors.schema import suggestion_for
from producers.wire import ErrorCode, Receipt
from workers import metrics
from workers.app import JobMessages
from workers.breaker import AlwaysAvailable
from workers.consuming import threaded_consumer
from workers.intake import ParseFailure, ParsedIntent, RawMessage, fail_identity, new_trace_id, parse
from workers.publisher import Publisher
from workers.guards import Guards, SeparateGuards
from workers.ratelimit import NoRateLimit, RateLimiter, parse_rate
from workers.receipts import ReceiptSink, build_receipt
from workers.audit import Audit, params_digest
from workers.redact import redact_body, redact_params
from workers.topology import DEFAULT_EXCHANGE, DISPATCH_EXCHANGE, DLQ, connector_queue_name
from workers.tracing import span, traceparent_for

log = logging.getLogger("reach.router")
LIST_TOOLS = "reach.list_tools"


@dataclass(frozen=True)
class Dispatch:
    """A checked intent on its way to ``queue``; ``job`` is the pool task's only argument."""

    queue: str
    job: dict[str, Any]
    intent_id: str


@dataclass(frozen=True)
class Answer:
    """The router answers itself: a rejection (or a built-in action), maybe with a dead letter."""

    receipt: Receipt
    routing_key: str | None
    dead_letter_reason: str | None = None
    audit: dict[str, Any] | None = None  # what the audit trail may say about the params (redacted)


Decision = Dispatch | Answer


class Router:
    def __init__(self, catalog: Catalog, *, max_intent_bytes: int, guards: Guards | None = None,
                 limiter: RateLimiter | None = None, availability: Any = None, require_user_id: bool = False,
                 clock: Callable[[], float] = time.time) -> None:
        self.catalog = catalog
        # the running router passes RedisGuards (one round trip); tests may pass the parts
        self.guards = guards or SeparateGuards(limiter or NoRateLimit(), availability or AlwaysAvailable())
        self.max_intent_bytes = max_intent_bytes
        self.require_user_id = require_user_id
        self.clock = clock

    def decide(self, raw: RawMessage) -> Decision:
        received_at = raw.received_at or self.clock()
        parsed = parse(raw, self.max_intent_bytes, self.require_user_id)
        if isinstance(parsed, ParseFailure):
            return self._invalid(parsed, received_at)
        metrics.INTENTS_RECEIVED.labels(format=parsed.format).inc()
        intent = parsed.intent
        agent_id = intent.agent_id
        assert agent_id is not None and intent.intent_id is not None

        def refuse(code: ErrorCode, message: str, suggestion: str, *, ref: ActionRef | None = None,
                   details: list[dict[str, Any]] | None = None, retry_after_ms: int | None = None) -> Answer:
            metrics.INTENTS_REJECTED.labels(code=code.value).inc()
            receipt = build_receipt(
                intent_id=intent.intent_id or "", agent_id=agent_id, action=ref.action.action if ref else intent.action,
                connector=ref.connector.name if ref else None, trace_id=parsed.trace_id, received_at=received_at,
                code=code, message=message, suggestion=suggestion, details=details, retry_after_ms=retry_after_ms)
            audit = None
            if ref is not None:
                redacted = redact_params(intent.params, ref.action.input)
                audit = {"param_keys": sorted(redacted), "params_digest": params_digest(redacted)}
            return Answer(receipt, intent.reply_to or agent_id, audit=audit)

        if intent.action == LIST_TOOLS:
            return self._list_tools(parsed, received_at)
        resolved = self.catalog.resolve(intent.action, agent_id, intent.context.domain if intent.context else None)
        if isinstance(resolved, Refusal):
            return refuse(resolved.code, resolved.message, resolved.suggestion)
        ref = resolved
        refusal = self.catalog.check_permission(agent_id, ref)
        if refusal is not None:
            return refuse(refusal.code, refusal.message, refusal.suggestion, ref=ref)
        now = self.clock()
        binding = self.catalog.binding(agent_id, ref.connector.name)
        assert binding is not None  # check_permission passed
        for text in (ref.action.allowed_hours, binding.allowed_hours):
            if text:
                window = parse_window(text)
                moment = datetime.fromtimestamp(now, timezone.utc)
                if not window.is_open(moment):
                    return refuse(ErrorCode.OUTSIDE_TIME_WINDOW, f"{ref.qualified} may only run {text}",
                                  f"Send it again when the window opens (in about {_human_ms(window.ms_until_open(moment))}).",
                                  ref=ref, retry_after_ms=window.ms_until_open(moment))
        # one round trip for the rate limit and the breaker/health state; judged in contract order
        verdict, unavailable = self.guards.check(agent_id, ref.connector.name,
                                                 parse_rate(binding.rate_limit) if binding.rate_limit else None)
        if not verdict.allowed:
            return refuse(ErrorCode.RATE_LIMITED, f"rate limit {binding.rate_limit} on {ref.connector.name} reached",
                          f"Wait {_human_ms(verdict.retry_after_ms)} before sending more intents to {ref.connector.name}.",
                          ref=ref, retry_after_ms=verdict.retry_after_ms)
        params, problems = ref.validator.validate(intent.params)
        if problems:
            summary = "; ".join(f"{p.field} {p.message}" for p in problems[:3]) + ("; …" if len(problems) > 3 else "")
            return refuse(ErrorCode.VALIDATION_FAILED, f"invalid params for {ref.qualified}: {summary}",
                          suggestion_for(problems), ref=ref, details=[p.to_detail() for p in problems])
        if unavailable is not None:
            reason, retry_after_ms = unavailable
            return refuse(ErrorCode.CONNECTOR_UNAVAILABLE, reason,
                          f"{ref.connector.name} is failing; send the intent again after {_human_ms(retry_after_ms)}.",
                          ref=ref, retry_after_ms=retry_after_ms)
        if intent.deadline is not None and intent.deadline.timestamp() <= now:
            return refuse(ErrorCode.DEADLINE_EXCEEDED, f"the deadline {intent.deadline.isoformat()} has passed",
                          "Send a new intent with a later deadline if the action is still wanted.", ref=ref)
        job = {
            "v": 1,
            "intent_id": intent.intent_id,
            "agent_id": agent_id,
            "connector": ref.connector.name,
            "action": ref.action.action,
            "params": params,
            "idempotency_key": intent.idempotency_key or intent.intent_id,
            "reply_to": intent.reply_to or agent_id,
            "deadline": intent.deadline.timestamp() if intent.deadline else None,
            "trace_id": parsed.trace_id,
            "traceparent": traceparent_for(parsed.trace_id, parsed.traceparent),
            "format": parsed.format,
            "received_at": received_at,
            "dispatched_at": now,
        }
        return Dispatch(connector_queue_name(ref.connector.name), job, intent.intent_id)

    def _invalid(self, failure: ParseFailure, received_at: float) -> Answer:
        metrics.INTENTS_RECEIVED.labels(format="invalid").inc()
        metrics.INTENTS_REJECTED.labels(code=failure.code.value).inc()
        suggestion = (
            "Send a UTF-8 JSON object with at least an 'action' (see the intent contract), within the size limit."
            if failure.code is ErrorCode.INVALID_INTENT else
            "Send intents only under your own identity: the AMQP user_id property set to your broker login."
        )
        receipt = build_receipt(
            intent_id=failure.intent_id, agent_id=failure.agent_id, action=None, connector=None,
            trace_id=new_trace_id(), received_at=received_at, code=failure.code, message=failure.reason,
            suggestion=suggestion, details=failure.details)
        return Answer(receipt, failure.reply_to, dead_letter_reason=failure.reason if failure.dead_letter else None)

    def _list_tools(self, parsed: ParsedIntent, received_at: float) -> Answer:
        intent = parsed.intent
        agent_id = intent.agent_id or ""
        if agent_id not in self.catalog.agents:
            code = ErrorCode.PERMISSION_DENIED
            receipt = build_receipt(intent_id=intent.intent_id or "", agent_id=agent_id, action=LIST_TOOLS, connector=None,
                                    trace_id=parsed.trace_id, received_at=received_at, code=code,
                                    message=f"agent {agent_id!r} is not registered in the catalog",
                                    suggestion="Use the agent id your operator registered as an agent_app.")
        else:
            tools = [t.to_dict() for t in self.catalog.tools_for(agent_id)]
            receipt = build_receipt(intent_id=intent.intent_id or "", agent_id=agent_id, action=LIST_TOOLS, connector=None,
                                    trace_id=parsed.trace_id, received_at=received_at, data={"tools": tools})
        return Answer(receipt, intent.reply_to or agent_id)


class RouterRuntime:
    """Carries decisions out with confirmed publishes; the message is acked only afterwards."""

    def __init__(self, router: Router, app: Celery, sink: ReceiptSink, publisher: Publisher, audit: Audit) -> None:
        self.router = router
        self.jobs = JobMessages(app)
        self.sink = sink
        self.publisher = publisher
        self.audit = audit

    def process(self, message: Message) -> Callable[[], None]:
        """Route one message; return what must then happen to it on the consumer's own thread
        (ack, or requeue when the decision could not be carried out)."""
        raw = RawMessage(
            body=_raw_body(message),
            headers=dict(message.headers or {}),
            user_id=message.properties.get("user_id"),
            message_id=message.properties.get("message_id"),
            content_type=message.content_type,
            received_at=time.time(),
        )
        try:
            decision = self.router.decide(raw)
        except Exception:  # a bug, not a bad message: answer INTERNAL rather than stall the queue
            log.exception("router failed on a message; answering INTERNAL")
            decision = self._internal(raw)
        try:
            self._carry_out(decision, raw)
        except Exception:
            # broker or Redis trouble: leave the message unacked so it is redelivered, not lost
            log.exception("could not complete a routing decision; the intent will be redelivered")
            return message.requeue
        return message.ack

    def _carry_out(self, decision: Decision, raw: RawMessage) -> None:
        received = {"ts": round(raw.received_at, 6), "bytes": len(raw.body)}
        if isinstance(decision, Dispatch):
            job = decision.job
            with span("reach.route", job["traceparent"], start_time=raw.received_at,
                      attributes={"reach.connector": job["connector"], "reach.action": job["action"]}) as route:
                if route is not None and route.is_recording():
                    # the pool's spans become children of this one
                    context = route.get_span_context()
                    job = {**job, "traceparent": f"00-{context.trace_id:032x}-{context.span_id:016x}-01"}
                body, headers, properties = self.jobs.build(job, f"{decision.intent_id}:{time.time_ns()}")
                self.publisher.publish(body, exchange=DISPATCH_EXCHANGE, routing_key=decision.queue, headers=headers,
                                       **properties)
            metrics.INTENTS_DISPATCHED.labels(connector=job["connector"]).inc()
            ref = self.router.catalog.refs[(job["connector"], job["action"])]
            binding = self.router.catalog.binding(job["agent_id"], job["connector"])
            redacted = redact_params(job["params"], ref.action.input)
            common = {"agent": job["agent_id"], "action": job["action"], "connector": job["connector"],
                      "trace_id": job["trace_id"]}
            self.audit.events(decision.intent_id, [
                ("received", {**received, **common, "format": job["format"]}),
                ("dispatched", {**common, "param_keys": sorted(redacted), "params_digest": params_digest(redacted),
                                "route_ms": round((time.time() - raw.received_at) * 1000, 3)}),
            ], level=binding.audit_level if binding else "full")
            return
        if decision.dead_letter_reason is not None:
            self._dead_letter(raw, decision)
        receipt = decision.receipt
        self.sink.send(receipt, decision.routing_key)
        metrics.RECEIPTS_PUBLISHED.labels(status=receipt.status).inc()
        error = receipt.error
        common = {"agent": receipt.agent_id, "action": receipt.action, "connector": receipt.connector,
                  "trace_id": receipt.execution.trace_id}
        binding = self.router.catalog.binding(receipt.agent_id or "", receipt.connector or "")
        self.audit.events(receipt.intent_id, [
            ("received", {**received, **common}),
            ("rejected" if error else "answered", {**common, "code": error.code.value if error else None,
                                                   "dead_lettered": decision.dead_letter_reason is not None,
                                                   **(decision.audit or {})}),
            ("receipt", {**common, "status": receipt.status, "code": error.code.value if error else None,
                         "latency_ms": receipt.execution.latency_ms}),
        ], level=binding.audit_level if binding else "full")

    def _dead_letter(self, raw: RawMessage, decision: Answer) -> None:
        headers = {
            "x-reach-reason": (decision.dead_letter_reason or "")[:1000],
            "x-reach-intent-id": decision.receipt.intent_id,
            "x-reach-agent-id": decision.receipt.agent_id or "",
            "x-reach-received-at": datetime.fromtimestamp(raw.received_at, timezone.utc).isoformat(),
        }
        body = redact_body(raw.body, self.router.catalog)
        self.publisher.publish(body, exchange=DEFAULT_EXCHANGE, routing_key=DLQ.name, headers=headers,
                               message_id=decision.receipt.intent_id)

    def _internal(self, raw: RawMessage) -> Answer:
        intent_id, agent_id = fail_identity(raw)
        receipt = build_receipt(intent_id=intent_id, agent_id=agent_id, action=None, connector=None, trace_id=new_trace_id(),
                                received_at=raw.received_at, code=ErrorCode.INTERNAL,
                                message="the router failed on this intent", suggestion="Retry later; operators were told.")
        return Answer(receipt, agent_id, dead_letter_reason="router error")


def _human_ms(ms: int) -> str:
    if ms < 1000:
        return f"{ms} ms"
    if ms < 120_000:
        return f"{ms / 1000:.0f} s"
    if ms < 7_200_000:
        return f"{ms / 60_000:.0f} min"
    return f"{ms / 3_600_000:.1f} h"


def _raw_body(message: Message) -> bytes:
    """The bytes the agent sent. py-amqp decodes bodies by their declared content_encoding;
    encoding back with the same codec restores the original bytes, so UTF-8 is checked on what
    was actually sent."""
    body = message.body
    if isinstance(body, (bytes, bytearray, memoryview)):
        return bytes(body)
    try:
        return str(body).encode(message.content_encoding or "utf-8")
    except (LookupError, UnicodeEncodeError):
        return str(body).encode("utf-8", "surrogateescape") if isinstance(body, str) else b""


def consumer_class(runtime: RouterRuntime, threads: int) -> type[Consumer]:
    """The router's consumer: raw JSON intents routed on ``threads`` threads, so that several
    publisher confirms are in flight at once (each thread publishes on its own connection).
    Intents of one agent may therefore be dispatched in a different order than they were sent."""
    return threaded_consumer(runtime.process, threads, "reach-route")
