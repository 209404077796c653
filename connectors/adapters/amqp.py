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

    a value JSON or an AMQP frame cannot carry     VALIDATION_FAILED        sent False (not retried, not
                                                                            counted by the breaker)
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
dropped. :class:`RequestReply` is shared with the agent adapter, which replies through a queue of
its own instead (connectors.adapters.agent).
"""

from __future__ import annotations

import json
import logging
import struct
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import amqp
from amqp import spec as amqp_spec
from amqp.exceptions import AMQPError, ChannelError, FrameSyntaxError, MessageNacked
from kombu import Connection
from pydantic import ValidationError

from connectors.adapters.auth import read_secret
from connectors.adapters.base import CallContext, Outcome, ProbeResult
from connectors.adapters.common import OMIT, convert_for_system
from connectors.adapters.errors import Unsendable, refused_outcome, violation_suggestion
from connectors.adapters.json_nesting import json_depth
from connectors.schema import MAX_HEADER_VALUE_BYTES, Check, FieldProblem, Problems, compile_field
from connectors.spec import ActionSpec, ConnectorSpec
from producers.serve import AnswerError
from producers.wire import ErrorCode

log = logging.getLogger("reach.amqp")

DIRECT_REPLY_TO = "amq.rabbitmq.reply-to"
DEFAULT_MAX_ANSWER_BYTES = 1 << 20
DEFAULT_MAX_DEPTH = 32
CONNECT_TIMEOUT = 5.0
STALE_FRAMES = 1000  # late answers read off a line before a request, at most
# a short wait, not 0: py-amqp spins on a non-blocking socket while a frame is half read
STALE_READ_SECONDS = 0.001
ERROR_CODE_HEADER = "x-error-code"
ERROR_MESSAGE_HEADER = "x-error-message"
MAX_SYSTEM_TEXT = 500


class NotSent(Exception):
    """The request certainly did not reach the system (no connection, unroutable, nacked)."""


class Lost(Exception):
    """The request may have reached the system, but the connection broke before its answer."""


class NoAnswer(Exception):
    """The request was delivered to the broker and no answer came within the timeout."""


class BadAnswer(ValueError):
    """An answer that cannot be read: too large, too deep, not JSON, or not the agreed shape."""


@dataclass
class _Line:
    """One thread's connection and channel, and the one answer it is waiting for."""

    conn: Connection
    channel: amqp.Channel
    reply_to: str
    waiting: str | None = None
    answer: amqp.Message | None = None
    returned: str | None = None

    def on_answer(self, message: amqp.Message) -> None:
        # anything else is an answer to an attempt that gave up (or not ours at all): dropped
        if self.waiting is not None and self.answer is None:
            if message.properties.get("correlation_id") == self.waiting:
                self.answer = message

    def on_return(self, exc: Exception, exchange: str, routing_key: str, message: amqp.Message) -> None:
        if message.properties.get("correlation_id") == self.waiting:
            self.returned = str(exc)


# opens a thread's reply path on a fresh channel: returns the reply_to value for its requests and
# makes every answer reach ``on_answer``
ReplySetup = Callable[[amqp.Channel, Callable[[amqp.Message], None]], str]


def direct_reply_to(channel: amqp.Channel, on_answer: Callable[[amqp.Message], None]) -> str:
    """RabbitMQ's direct reply-to: no queue, answers go straight to this channel's consumer."""
    channel.basic_consume(DIRECT_REPLY_TO, callback=on_answer, no_ack=True)
    return DIRECT_REPLY_TO


@dataclass(frozen=True)
class RequestMessage:
    """One request message: where it goes and what it carries."""

    exchange: str
    routing_key: str
    body: bytes
    timeout: float
    message_id: str | None = None
    headers: dict[str, Any] = field(default_factory=dict)


class RequestReply:
    """Request/reply over AMQP with one connection per calling thread, opened on first use and
    opened again after a failure. ``before_publish(channel, request)`` may refuse a request by
    raising NotSent (the agent adapter checks that someone consumes)."""

    def __init__(
        self,
        url: str,
        *,
        reply_setup: ReplySetup = direct_reply_to,
        before_publish: Callable[[amqp.Channel, RequestMessage], None] | None = None,
        connect_timeout: float = CONNECT_TIMEOUT,
    ) -> None:
        self._url = url
        self._reply_setup = reply_setup
        self._before_publish = before_publish
        self._connect_timeout = connect_timeout
        self._local = threading.local()
        self._lines: list[_Line] = []
        self._lock = threading.Lock()

    def connect(self, timeout: float) -> Connection:
        """A new connection (the caller releases it). Raises OSError or AMQPError."""
        conn = Connection(self._url, transport="pyamqp", connect_timeout=timeout, heartbeat=0)
        try:
            # one attempt: the pool's retry policy decides about more (kombu's connect() sleeps 2 s and tries again)
            conn.ensure_connection(max_retries=0, reraise_as_library_errors=False)
        except BaseException:
            conn.release()
            raise
        return conn

    def request(self, request: RequestMessage) -> amqp.Message:
        """Publish ``request`` and return its answer. Raises NotSent, Lost, NoAnswer or Unsendable."""
        started = time.monotonic()
        line = self._ready_line(min(request.timeout, self._connect_timeout))
        correlation_id = uuid.uuid4().hex
        line.waiting, line.answer, line.returned = correlation_id, None, None
        message = amqp.Message(
            request.body,
            content_type="application/json",
            correlation_id=correlation_id,
            reply_to=line.reply_to,
            delivery_mode=2,
            expiration=str(max(1, int(request.timeout * 1000))),
            application_headers=request.headers,
            **({"message_id": request.message_id} if request.message_id else {}),
        )
        try:
            if self._before_publish is not None:
                self._before_publish(line.channel, request)
            line.channel.basic_publish(
                message, exchange=request.exchange, routing_key=request.routing_key, mandatory=True
            )
        except NotSent:
            raise
        except (FrameSyntaxError, struct.error) as exc:
            # py-amqp serialises the whole method and header before writing a byte: a value an AMQP
            # frame cannot carry is refused here, with the line still whole
            line.waiting = None
            raise Unsendable(f"the request cannot be written as an AMQP message: {exc}") from exc
        except (OSError, AMQPError) as exc:
            self._drop(line)  # the frames did not all go out: the broker routes nothing partial
            raise NotSent(f"publishing failed: {broker_error_text(exc)}") from exc
        try:
            line.channel.wait(
                [amqp_spec.Basic.Ack, amqp_spec.Basic.Nack],
                callback=_confirm,
                timeout=max(0.05, request.timeout - (time.monotonic() - started)),
            )
        except MessageNacked as exc:
            raise NotSent("the broker refused the request (nack)") from exc
        except ChannelError as exc:
            # the broker closed the channel over this publish (no such exchange, access refused,
            # too large): it routed nothing
            self._drop(line)
            raise NotSent(f"the broker refused the request: {broker_error_text(exc)}") from exc
        except TimeoutError as exc:
            self._drop(line)  # a late confirm would be taken for the next request's
            raise NoAnswer("the broker did not confirm the request in time") from exc
        except (OSError, AMQPError) as exc:
            self._drop(line)
            raise Lost(
                f"the connection broke before the broker confirmed the request: {broker_error_text(exc)}"
            ) from exc
        if line.returned is not None:
            raise NotSent(f"the request could not be routed ({line.returned})")
        while line.answer is None:
            remaining = request.timeout - (time.monotonic() - started)
            if remaining <= 0:
                raise NoAnswer()
            try:
                line.conn.connection.drain_events(timeout=remaining)
            except TimeoutError:
                continue
            except (OSError, AMQPError) as exc:
                self._drop(line)
                raise Lost(f"the connection broke while waiting for the answer: {broker_error_text(exc)}") from exc
        line.waiting = None
        return line.answer

    def _ready_line(self, timeout: float) -> _Line:
        """This thread's line, with any late answers read off it; a new one if it broke meanwhile."""
        line: _Line | None = getattr(self._local, "line", None)
        if line is not None:
            try:
                line.waiting = None
                for _ in range(STALE_FRAMES):
                    line.conn.connection.drain_events(timeout=STALE_READ_SECONDS)
            except TimeoutError:
                return line  # nothing more to read: the line is alive
            except (OSError, AMQPError) as exc:
                log.info("reconnecting a line to the broker: %s", broker_error_text(exc))
                self._drop(line)
            else:
                return line  # still busy with late answers; they are dropped on the next wait
        try:
            conn = self.connect(timeout)
        except (OSError, AMQPError) as exc:
            raise NotSent(f"cannot connect to the broker: {broker_error_text(exc)}") from exc
        try:
            channel = conn.connection.channel()
            channel.auto_decode = False
            line = _Line(conn, channel, "")
            line.reply_to = self._reply_setup(channel, line.on_answer)
            channel.events["basic_return"].add(line.on_return)
            channel.confirm_select()
        except (OSError, AMQPError) as exc:
            release_quietly(conn)
            raise NotSent(f"cannot open a channel for requests: {broker_error_text(exc)}") from exc
        self._local.line = line
        with self._lock:
            self._lines.append(line)
        return line

    def _drop(self, line: _Line) -> None:
        if getattr(self._local, "line", None) is line:
            self._local.line = None
        with self._lock:
            if line in self._lines:
                self._lines.remove(line)
        release_quietly(line.conn)

    def close(self) -> None:
        with self._lock:
            lines, self._lines = self._lines, []
        for line in lines:
            release_quietly(line.conn)


def _confirm(method: Any, *args: Any) -> None:
    if method == amqp_spec.Basic.Nack:
        raise MessageNacked()


def release_quietly(conn: Connection) -> None:
    try:
        conn.release()
    except (OSError, AMQPError) as exc:  # already gone: nothing left to close
        log.debug("closing a broker connection failed: %s", exc)


def broker_error_text(exc: BaseException) -> str:
    # py-amqp's messages name the reply code and text; they never carry the URL or password
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text[:300]}" if text else type(exc).__name__


# -- reading answers -----------------------------------------------------------------------------


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def parse_answer(body: bytes, max_bytes: int, max_depth: int) -> Any:
    """The JSON value of an answer's body, within bounds checked before any parsing. Raises BadAnswer."""
    if len(body) > max_bytes:
        raise BadAnswer(f"the answer is {len(body)} bytes; the limit is {max_bytes}")
    depth = json_depth(body)
    if depth > max_depth:
        raise BadAnswer(f"the answer nests {depth} levels; the limit is {max_depth}")
    try:
        return json.loads(body.decode("utf-8-sig"), parse_constant=_no_constants)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise BadAnswer(f"the answer is not UTF-8 JSON: {str(exc)[:200]}") from exc


def answer_error(doc: Any) -> AnswerError:
    """An error reported in an answer, checked against the agreed shape. Raises BadAnswer."""
    try:
        return AnswerError.model_validate(doc)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '(error)'}: {e['msg']}"
            for e in exc.errors(include_url=False, include_input=False)[:5]
        )
        raise BadAnswer(f"the answer's error is malformed: {problems}") from exc


def error_outcome(error: AnswerError, elapsed_ms: float) -> Outcome:
    return Outcome(
        False,
        code=ErrorCode(error.code),
        message=error.message,
        suggestion=error.suggestion or _SUGGESTIONS.get(ErrorCode(error.code), "See the error message."),
        details=list(error.details),
        retry_after_ms=error.retry_after_ms,
        downstream_ms=elapsed_ms,
    )


def compile_outputs(connector: ConnectorSpec) -> dict[str, dict[str, Check]]:
    """Each action's declared ``output`` fields as checks, compiled once."""
    return {
        action.action: {name: compile_field(spec) for name, spec in (action.output or {}).items()}
        for action in connector.actions
    }


def output_problems(checks: Mapping[str, Check], data: dict[str, Any]) -> list[dict[str, Any]]:
    """What ``data`` breaks of the declared output, as receipt details (bounded)."""
    problems = Problems()
    for name, check in checks.items():
        if name not in data:
            problems.append(FieldProblem(name, "required", "is missing from the answer"))
            continue
        check(data[name], name, problems)
    return [p.to_detail() for p in problems]


def success_outcome(
    connector: str, action: ActionSpec, checks: Mapping[str, Check], value: Any, elapsed_ms: float
) -> Outcome:
    """An answer's value as ``data`` (an object as it is, anything else as ``{"result": value}``),
    checked against the declared output."""
    data = value if isinstance(value, dict) else {"result": value}
    problems = output_problems(checks, data)
    if problems:
        return Outcome(
            False,
            code=ErrorCode.DOWNSTREAM_CONTRACT_VIOLATION,
            message=f"{connector} answered, but the answer breaks the declared output",
            suggestion=violation_suggestion(action, "ask an operator to check the connector's output schema."),
            details=problems,
            downstream_ms=elapsed_ms,
        )
    return Outcome(True, data=data, downstream_ms=elapsed_ms)


def violation(connector: str, action: ActionSpec, reason: str, elapsed_ms: float) -> Outcome:
    return Outcome(
        False,
        code=ErrorCode.DOWNSTREAM_CONTRACT_VIOLATION,
        message=f"{connector} answered in a way that breaks the agreed answer format: {reason}",
        suggestion=violation_suggestion(action, "tell an operator (the answer cannot be read)."),
        downstream_ms=elapsed_ms,
    )


def failure_outcome(
    exc: NotSent | Lost | NoAnswer, connector: ConnectorSpec, action: ActionSpec, timeout: float, elapsed_ms: float
) -> Outcome:
    """What a request that got no answer means: never sent, lost in flight, or unanswered."""
    name = connector.name
    if isinstance(exc, NotSent):
        return Outcome(
            False,
            code=ErrorCode.DOWNSTREAM_UNREACHABLE,
            message=f"{name} could not be reached: {exc}",
            suggestion="The system is unreachable; retry later.",
            sent=False,
            downstream_ms=elapsed_ms,
        )
    safe = connector.safe_to_repeat(action)
    if isinstance(exc, Lost):
        if safe:
            return Outcome(
                False,
                code=ErrorCode.DOWNSTREAM_ERROR,
                message=f"the request to {name} was sent but {exc}",
                suggestion="Retry later; the action is safe to repeat.",
                downstream_ms=elapsed_ms,
            )
        message = f"the request to {name} was sent but {exc}"
    else:
        if safe:
            return Outcome(
                False,
                code=ErrorCode.DOWNSTREAM_TIMEOUT,
                message=f"{name} did not answer within {timeout:g}s{_why(exc)}",
                suggestion="Retry later; the action is safe to repeat.",
                downstream_ms=elapsed_ms,
            )
        message = f"{name} did not answer within {timeout:g}s after the request was sent{_why(exc)}"
    return Outcome(
        False,
        code=ErrorCode.OUTCOME_UNKNOWN,
        message=message,
        suggestion=connector.check_first_suggestion(action.action),
        downstream_ms=elapsed_ms,
    )


_SUGGESTIONS = {
    ErrorCode.DOWNSTREAM_VALIDATION_FAILED: "The system rejected the params; fix them as its message says and send again.",
    ErrorCode.DOWNSTREAM_AUTH_FAILED: "The system refused the request as unauthorised; do not retry. Tell an operator.",
    ErrorCode.DOWNSTREAM_NOT_FOUND: "The record does not exist; check the id (for example with a search or list action).",
    ErrorCode.DOWNSTREAM_CONFLICT: "The record changed or already exists; read its current state before trying again.",
    ErrorCode.DOWNSTREAM_RATE_LIMITED: "The system is throttling requests; wait retry_after_ms (or a few seconds) and send again.",
    ErrorCode.DOWNSTREAM_ERROR: "The system failed; retry later.",
}


# -- the adapter --------------------------------------------------------------------------------


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

    def call(self, action: ActionSpec, params: dict[str, Any], ctx: CallContext) -> Outcome:
        """One attempt. Never raises for anything the broker or the system does."""
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
            converted = convert_for_system(value, spec) if spec is not None else value
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


def _why(exc: Exception) -> str:
    return f" ({exc})" if str(exc) else ""


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return value.strip()[:MAX_SYSTEM_TEXT] if isinstance(value, str) else ""


def _ms(started: float) -> float:
    return (time.perf_counter() - started) * 1000
