"""AMQP adapter: one semantic action -> one request message -> one answer message -> one Outcome.

For legacy systems that take requests from a message queue and answer on ``reply_to`` (RPC over
AMQP 0-9-1). The system's broker is named by the connector's ``url_env`` and may be another broker
than the fleet's. The wire (docs/contract.md section 5, "AMQP connectors")::

    request   exchange and routing_key of the action ("" = the default exchange), mandatory,
              persistent, publisher-confirmed; body: the params as a JSON object (field ``name``,
              ``as``, ``format``/``timezone`` and ``null_as`` applied); properties content_type
              application/json, correlation_id (new per attempt), reply_to amq.rabbitmq.reply-to,
              expiration = the attempt's timeout in ms; headers traceparent and, when the connector
              declares ``idempotency_header``, that header with the idempotency key
    answer    to the default exchange with routing key = reply_to and the same correlation_id;
              body: JSON (an object is ``data``; another value is ``{"result": value}``).
              An error: header ``x-error-code`` (with ``x-error-message``), or a body
              ``{"error": {"code", "message", "suggestion"?, "retry_after_ms"?}}``; the code is one of
              producers.serve.ANSWER_CODES

Failures, in the order they can happen::

    a value JSON or an AMQP frame cannot carry,    VALIDATION_FAILED        sent False (not retried, not
    or a date-time its timezone cannot hold                                 counted by the breaker)
    no connection / channel before the publish     DOWNSTREAM_UNREACHABLE   sent False
    unroutable (mandatory return) or nacked        DOWNSTREAM_UNREACHABLE   sent False
    connection lost after the publish              DOWNSTREAM_ERROR if safe to repeat, else OUTCOME_UNKNOWN
    no answer within the timeout                   DOWNSTREAM_TIMEOUT if safe to repeat, else OUTCOME_UNKNOWN
    answer too large, too deep, not JSON           DOWNSTREAM_CONTRACT_VIOLATION
    unknown error code, or the declared output     DOWNSTREAM_CONTRACT_VIOLATION
    is broken

Threads: each pool thread has its own connection and channel (py-amqp is not thread-safe), which
also carries its direct reply-to consumer (RabbitMQ delivers replies only to the channel that
published the request). A late answer to an earlier attempt carries another correlation_id and is
dropped. The request/reply (amqp_rpc.py) and the reading of answers (amqp_answers.py) are shared with
the agent adapter, which replies through a queue of its own instead (connectors.adapters.agent).
"""

from __future__ import annotations

import json
import time
from typing import Any
from urllib.parse import urlsplit

import amqp
from amqp.exceptions import AMQPError

from connectors.adapters.amqp_answers import (
    BadAnswer,
    answer_error,
    error_outcome,
    failure_outcome,
    parse_answer,
    success_outcome,
    violation,
)
from connectors.adapters.amqp_rpc import (
    CONNECT_TIMEOUT,
    Lost,
    NoAnswer,
    NotSent,
    RequestMessage,
    RequestReply,
    broker_error_text,
    release_quietly,
)
from connectors.adapters.auth import read_secret
from connectors.adapters.base import CallContext, Outcome, ProbeResult
from connectors.adapters.common import OMIT, compile_outputs, convert_for_system
from connectors.adapters.errors import Unsendable, refused_outcome
from connectors.adapters.scrub import Scrubber
from connectors.schema import MAX_HEADER_VALUE_BYTES
from connectors.spec import ActionSpec, ConnectorSpec

DEFAULT_MAX_ANSWER_BYTES = 1 << 20
DEFAULT_MAX_DEPTH = 32
ERROR_CODE_HEADER = "x-error-code"
ERROR_MESSAGE_HEADER = "x-error-message"
MAX_SYSTEM_TEXT = 500


class AmqpAdapter:
    """Calls a legacy system over its message broker, one request message per attempt."""

    def __init__(self, connector: ConnectorSpec, options: Any) -> None:
        """``options``: connectors.adapters.factory.AdapterOptions (``extra`` may set
        ``max_answer_bytes`` and ``connect_timeout``). Raises MissingSecret when ``url_env`` is unset."""
        self.connector = connector
        url = read_secret(connector.url_env, connector.name, options.environ)
        self._max_bytes = int(options.extra.get("max_answer_bytes", DEFAULT_MAX_ANSWER_BYTES))
        self._max_depth = options.max_depth if options.max_depth is not None else DEFAULT_MAX_DEPTH
        self._rpc = RequestReply(url, connect_timeout=float(options.extra.get("connect_timeout", CONNECT_TIMEOUT)))
        self._outputs = compile_outputs(connector)
        # a system's error text that echoes the broker's password must not pass it on to the agent
        self._scrub = Scrubber([urlsplit(url).password or ""])

    def call(self, action: ActionSpec, params: dict[str, Any], ctx: CallContext) -> Outcome:
        """One attempt. Never raises for anything the broker or the system does."""
        return self._scrub.outcome(self._call(action, params, ctx))

    def _call(self, action: ActionSpec, params: dict[str, Any], ctx: CallContext) -> Outcome:
        try:
            body, headers = self._request_parts(action, params, ctx)
        except Unsendable as exc:
            return refused_outcome(exc, suggestion="Keep the params within the limits and send again.")
        timeout = ctx.timeout if ctx.timeout is not None else action.timeout_seconds
        request = RequestMessage(action.exchange or "", action.routing_key or "", body, timeout, headers=headers)
        started = time.perf_counter()
        try:
            answer = self._rpc.request(request)
        except (NotSent, Lost, NoAnswer) as exc:
            return failure_outcome(exc, self.connector, action, timeout, _ms(started))
        except Unsendable as exc:
            return refused_outcome(exc, started=started)
        return self._read(action, answer, _ms(started), ctx)

    def _request_parts(
        self, action: ActionSpec, params: dict[str, Any], ctx: CallContext
    ) -> tuple[bytes, dict[str, Any]]:
        body: dict[str, Any] = {}
        for name, value in params.items():
            spec = action.input.get(name)
            converted = convert_for_system(value, spec, name) if spec is not None else value
            if converted is not OMIT:
                body[(spec.name if spec is not None else None) or name] = converted
        try:
            raw = json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
        except (RecursionError, ValueError) as exc:
            raise Unsendable(
                "the params cannot be written as JSON (too deep, not finite numbers, or not UTF-8)"
            ) from exc
        headers: dict[str, Any] = {}
        for header, value in (
            ("traceparent", ctx.traceparent),
            (self.connector.idempotency_header, ctx.idempotency_key),
        ):
            if header and value:
                if len(value.encode()) > MAX_HEADER_VALUE_BYTES:
                    raise Unsendable(f"the {header} value is longer than {MAX_HEADER_VALUE_BYTES} bytes")
                headers[header] = value
        return raw, headers

    def _read(self, action: ActionSpec, answer: amqp.Message, elapsed_ms: float, ctx: CallContext) -> Outcome:
        name = self.connector.name
        body = answer.body if isinstance(answer.body, bytes) else str(answer.body).encode()
        headers = answer.properties.get("application_headers") or {}
        max_depth = ctx.max_depth if ctx.max_depth is not None else self._max_depth
        header_code = headers.get(ERROR_CODE_HEADER)
        if header_code is not None:
            return self._header_error(
                action, header_code, headers.get(ERROR_MESSAGE_HEADER), body, max_depth, elapsed_ms
            )
        try:
            value = parse_answer(body, self._max_bytes, max_depth)
            if isinstance(value, dict) and isinstance(value.get("error"), dict):
                return error_outcome(answer_error(value["error"]), elapsed_ms)
        except BadAnswer as exc:
            return violation(name, action, str(exc), elapsed_ms)
        return success_outcome(name, action, self._outputs[action.action], value, elapsed_ms)

    def _header_error(
        self, action: ActionSpec, code: Any, message: Any, body: bytes, max_depth: int, elapsed_ms: float
    ) -> Outcome:
        """An error named by the ``x-error-code`` header; the message is ``x-error-message``, else the
        body's ``error.message`` / ``message``, else the body's text."""
        text = _text(message)
        if not text:
            try:
                doc = parse_answer(body, self._max_bytes, max_depth)
            except BadAnswer:
                doc = None
            if isinstance(doc, dict):
                inner = doc.get("error")
                text = _text(inner.get("message") if isinstance(inner, dict) else doc.get("message"))
            if not text and len(body) <= self._max_bytes:
                text = body.decode("utf-8", "replace").strip()[:MAX_SYSTEM_TEXT]
        try:
            error = answer_error({"code": _text(code) or "?", "message": text or f"the system answered {code}"})
        except BadAnswer as exc:
            return violation(self.connector.name, action, f"header {ERROR_CODE_HEADER}: {exc}", elapsed_ms)
        return error_outcome(error, elapsed_ms)

    def probe(self, timeout: float) -> ProbeResult:
        """Connects to the system's broker, and checks that every exchange the actions name exists."""
        try:
            conn = self._rpc.connect(timeout)
        except (OSError, AMQPError) as exc:
            return ProbeResult(False, f"cannot connect to the broker: {broker_error_text(exc)}")
        try:
            channel = conn.connection.channel()
            for exchange in sorted({a.exchange for a in self.connector.actions if a.exchange}):
                try:
                    channel.exchange_declare(exchange, "direct", passive=True)
                except AMQPError as exc:
                    return ProbeResult(False, f"exchange {exchange}: {broker_error_text(exc)}")
            return ProbeResult(True, "broker connected")
        except (OSError, AMQPError) as exc:
            return ProbeResult(False, broker_error_text(exc))
        finally:
            release_quietly(conn)

    def close(self) -> None:
        self._rpc.close()


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return value.strip()[:MAX_SYSTEM_TEXT] if isinstance(value, str) else ""


def _ms(started: float) -> float:
    return (time.perf_counter() - started) * 1000
