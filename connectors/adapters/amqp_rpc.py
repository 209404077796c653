"""Request/reply over AMQP 0-9-1: one request message per attempt, its answer on ``reply_to``, one
connection and channel per calling thread (py-amqp is not thread-safe). Shared by the amqp adapter
(RabbitMQ's direct reply-to) and the agent adapter (a reply queue of its own).

A request ends one of four ways: its answer, NotSent (it certainly did not reach the system), Lost
(it may have, then the connection broke) or NoAnswer (none within the timeout); a value an AMQP
frame cannot carry is Unsendable, refused before anything was written.
"""

from __future__ import annotations

import logging
import struct
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import amqp
from amqp import spec as amqp_spec
from amqp.exceptions import AMQPError, ChannelError, FrameSyntaxError, MessageNacked
from kombu import Connection

from connectors.adapters.errors import Unsendable

log = logging.getLogger("reach.amqp")

DIRECT_REPLY_TO = "amq.rabbitmq.reply-to"
CONNECT_TIMEOUT = 5.0
STALE_FRAMES = 1000  # late answers read off a line before a request, at most
# a short wait, not 0: py-amqp spins on a non-blocking socket while a frame is half read
STALE_READ_SECONDS = 0.001


class NotSent(Exception):
    """The request certainly did not reach the system (no connection, unroutable, nacked)."""


class Lost(Exception):
    """The request may have reached the system, but the connection broke before its answer."""


class NoAnswer(Exception):
    """The request was delivered to the broker and no answer came within the timeout."""


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
