"""The agent side of an ``agent`` connector: answer the fleet's requests from Python in a few lines.

A connector with ``type: agent`` and ``agent: NAME`` is answered by the agent NAME. The fleet checks
each intent as for any other connector (permission, params, rate limit, idempotency, breaker), then
its pool sends the agent a request and waits for the answer::

    from producers.serve import AgentError, serve

    def lookup_order(params, request):
        order = orders.get(params["order_id"])
        if order is None:
            raise AgentError("DOWNSTREAM_NOT_FOUND", f"no order {params['order_id']}", "Check the order id.")
        return {"status": order.status}

    serve("orders_bot", "amqp://orders_bot:<password>@broker:5672//", {"lookup_order": lookup_order})

Intents a handler sends through ``request.call`` carry the request's hop count (``context.hops``),
so a chain of agents calling agents is refused past the fleet's limit instead of looping.

The wire, for agents written in other languages (docs/contract.md section 5, "Agent connectors")::

    request   queue reach.agent.<agent> (consume with manual ack; only this agent may read it)
              properties: correlation_id, reply_to, message_id = intent id, expiration
              body: AgentRequest as JSON
    answer    publish to exchange reach.agent-replies, routing key = the request's reply_to,
              correlation_id = the request's, content_type application/json
              body: {"status": "succeeded", "data": {...}}
                 or {"status": "failed", "error": {"code", "message", "suggestion"?, "details"?, "retry_after_ms"?}}
              then ack the request

Errors::

    AgentError        raised by a handler: the request failed with one of ANSWER_CODES
    AgentServeError   the fleet's queue or exchange is missing, or the broker refused the agent
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal
from urllib.parse import unquote, urlsplit

import amqp
from amqp.exceptions import AMQPError, NotFound
from kombu import Connection
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from producers.client import ReachClient
from producers.settings import ClientSettings
from producers.wire import AGENT_ID_PATTERN, NAME_RULE, ErrorCode, Receipt

log = logging.getLogger(__name__)

# the fleet declares these (workers.transport.topology) for every connector of type agent
AGENTS_EXCHANGE_NAME = "reach.agents"  # direct: routing key = the agent's name
# topic: the pools' reply queues are bound with "<agent>.<token>", and an agent's broker user may
# publish only keys that start with its own name (agents cannot answer for each other). Not
# "reach.agent.replies": that is the request queue of an agent named "replies".
AGENT_REPLIES_EXCHANGE_NAME = "reach.agent-replies"
AGENT_QUEUE_PREFIX = "reach.agent."
REQUEST_VERSION: Literal[1] = 1

# what an answer may claim: the system's own verdicts. Timeouts, unreachability and unknown
# outcomes are the fleet's to observe, never an agent's to assert.
ANSWER_CODES = frozenset(
    {
        ErrorCode.DOWNSTREAM_VALIDATION_FAILED,
        ErrorCode.DOWNSTREAM_AUTH_FAILED,
        ErrorCode.DOWNSTREAM_NOT_FOUND,
        ErrorCode.DOWNSTREAM_CONFLICT,
        ErrorCode.DOWNSTREAM_RATE_LIMITED,
        ErrorCode.DOWNSTREAM_ERROR,
    }
)
MAX_MESSAGE_CHARS = 4000
MAX_SUGGESTION_CHARS = 1000
MAX_ANSWER_DETAILS = 50


def agent_queue_name(agent: str) -> str:
    """The queue the fleet sends ``agent``'s requests to (agent names have no dots: no collisions)."""
    return AGENT_QUEUE_PREFIX + agent


class AgentRequest(BaseModel):
    """What a pool sends the agent that answers its connector (the body of a request message)."""

    # the agent side tolerates fields a newer fleet adds; ``v`` changes when the meaning does
    model_config = ConfigDict(extra="ignore", frozen=True, strict=True)

    v: Literal[1] = REQUEST_VERSION
    intent_id: str
    agent_id: str  # who asked: the agent that sent the intent
    connector: str
    action: str
    params: dict[str, Any]
    idempotency_key: str | None = None  # the same on every attempt and re-send: dedupe by it
    hops: int = Field(ge=1)  # agent-to-agent calls that led here, this one included
    deadline: str | None = None  # RFC 3339: the fleet stops waiting for the answer then
    traceparent: str | None = None


class AnswerError(BaseModel):
    """Why a request failed, as the agent (or a legacy system over AMQP) tells it."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    code: str
    message: str = Field(min_length=1, max_length=MAX_MESSAGE_CHARS)
    suggestion: str = Field(default="", max_length=MAX_SUGGESTION_CHARS)
    details: list[dict[str, Any]] = Field(default_factory=list, max_length=MAX_ANSWER_DETAILS)
    retry_after_ms: int | None = Field(default=None, ge=0, le=86_400_000)

    @field_validator("code")
    @classmethod
    def _claimable(cls, v: str) -> str:
        if v not in ANSWER_CODES:
            raise ValueError(f"must be one of {', '.join(sorted(ANSWER_CODES))}")
        return v


class AgentAnswer(BaseModel):
    """The answer to one request (the body of a reply message)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    status: Literal["succeeded", "failed"]
    data: Any = None
    error: AnswerError | None = None

    @model_validator(mode="after")
    def _consistent(self) -> AgentAnswer:
        if self.status == "succeeded" and self.error is not None:
            raise ValueError("a succeeded answer carries no error")
        if self.status == "failed" and self.error is None:
            raise ValueError("a failed answer needs an error")
        if self.status == "failed" and self.data is not None:
            raise ValueError("a failed answer carries no data")
        return self


class AgentError(Exception):
    """Raised by a handler: the request failed, for the reason a model can act on.

    Args:
        code: One of :data:`ANSWER_CODES`, e.g. ``"DOWNSTREAM_NOT_FOUND"``.
        message: What went wrong, in words a model can use.
        suggestion: What to do next.
        retry_after_ms: With ``DOWNSTREAM_RATE_LIMITED``: when to try again.
    """

    def __init__(
        self,
        code: str | ErrorCode,
        message: str,
        suggestion: str = "",
        *,
        details: list[dict[str, Any]] | None = None,
        retry_after_ms: int | None = None,
    ) -> None:
        super().__init__(message)
        # checked here, so a handler's typo fails in the handler's own traceback
        self.error = AnswerError(
            code=str(code),
            message=message[:MAX_MESSAGE_CHARS] or "failed",
            suggestion=suggestion[:MAX_SUGGESTION_CHARS],
            details=(details or [])[:MAX_ANSWER_DETAILS],
            retry_after_ms=retry_after_ms,
        )


class AgentServeError(RuntimeError):
    """The agent cannot serve: the fleet's queue or exchange is missing, or the broker refused it."""


@dataclass(frozen=True)
class Request:
    """One request as a handler sees it (its params come as the handler's first argument)."""

    intent_id: str
    caller: str  # the agent whose intent this is
    connector: str
    action: str
    hops: int
    idempotency_key: str | None
    deadline: datetime | None
    traceparent: str | None
    redelivered: bool  # the broker delivered it before (the agent died before answering)
    _server: AgentServer | None = field(default=None, repr=False, compare=False)

    @property
    def seconds_left(self) -> float | None:
        """Until the fleet stops waiting for the answer (None: no deadline was sent)."""
        return None if self.deadline is None else self.deadline.timestamp() - time.time()

    def context(self, **extra: Any) -> dict[str, Any]:
        """The intent ``context`` for intents sent while handling this request: it carries the hop
        count, so the fleet can stop a loop of agents calling each other."""
        return {**extra, "hops": self.hops}

    def call(
        self, action: str, params: dict[str, Any] | None = None, *, timeout: float | None = None, **kw: Any
    ) -> Receipt:
        """Send an intent as this agent while handling the request, and wait for its receipt.

        Args:
            action: As for :meth:`ReachClient.publish`.
            params: The action's inputs.
            timeout: Seconds to wait; default: the time left before this request's deadline.
            **kw: The other keyword arguments of :meth:`ReachClient.publish`; ``context`` gets
                the hop count added, ``traceparent`` defaults to this request's.

        Raises:
            ReceiptTimeout: No receipt in time.
            ReachError: The broker did not accept the intent.
        """
        if self._server is None:
            raise RuntimeError("this request is not being served: send intents with your own ReachClient")
        kw["context"] = self.context(**(kw.get("context") or {}))
        kw.setdefault("traceparent", self.traceparent)
        if timeout is None:
            left = self.seconds_left
            timeout = 30.0 if left is None else max(0.1, left)
        return self._server.client().call(action, params, timeout=timeout, **kw)


Handler = Callable[[dict[str, Any], Request], Any]
_Reply = tuple[str, str, bytes, int]  # reply_to, correlation_id, body, delivery tag


class AgentServer:
    """Consumes ``reach.agent.<agent_id>`` and answers each request with its handler.

    One connection carries the requests and the answers (publisher confirms; a request is acked
    only after its answer is confirmed); handlers run on ``concurrency`` threads, which is also how
    many requests the broker hands out at once. Requests run at least once: one that was being
    handled when the connection broke is delivered again (``request.redelivered``); dedupe writes
    by ``request.idempotency_key``. ``request.call`` uses one more connection per handler thread.

    Use :func:`serve` to run until stopped with reconnects, or this class as a context manager to
    serve from a background thread (tests, agents that do other work)::

        with AgentServer("orders_bot", url, {"lookup_order": lookup_order}):
            ...
    """

    def __init__(
        self,
        agent_id: str,
        broker_url: str | None,
        handlers: Mapping[str, Handler],
        *,
        concurrency: int = 4,
        connect_timeout: float = 10.0,
    ) -> None:
        """Args:
        agent_id: This agent (the ``agent:`` of the connectors it answers).
        broker_url: The fleet's broker as this agent's user; default ``$REACH_BROKER_URL``.
        handlers: Action name -> ``handler(params, request)``, which returns the answer's data
            (a JSON value; None is ``{}``) or raises :class:`AgentError`.
        concurrency: Requests handled at once (threads).
        connect_timeout: Seconds to connect, and to wait for each answer's confirm.
        """
        if not isinstance(agent_id, str) or not AGENT_ID_PATTERN.match(agent_id):
            raise ValueError(f"agent_id must be {NAME_RULE}")
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.agent_id = agent_id
        self.url = broker_url or ClientSettings.from_env().broker_url
        self.handlers = dict(handlers)
        self.concurrency = concurrency
        self.connect_timeout = connect_timeout
        # intents carry user_id when this agent logs in as itself (REACH_REQUIRE_USER_ID fleets)
        self._authenticated = unquote(urlsplit(self.url).username or "") == agent_id
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self._failure: BaseException | None = None
        self._local = threading.local()
        self._clients: list[ReachClient] = []
        self._clients_lock = threading.Lock()

    # -- running -----------------------------------------------------------------------------

    def run(self) -> None:
        """Serve until :meth:`stop` is called; raises AgentServeError or a connection error when the
        broker connection cannot be opened or is lost (unanswered requests are delivered again)."""
        self._stop.clear()
        conn = Connection(self.url, transport="pyamqp", connect_timeout=self.connect_timeout, heartbeat=0)
        replies: queue.SimpleQueue[_Reply] = queue.SimpleQueue()
        try:
            conn.connect()
            channel = self._open(conn)
            with ThreadPoolExecutor(self.concurrency, thread_name_prefix=f"serve-{self.agent_id}") as pool:

                def on_request(message: amqp.Message) -> None:
                    self._accept(message, pool, replies)

                channel.basic_consume(agent_queue_name(self.agent_id), callback=on_request, no_ack=False)
                self._ready.set()
                log.info("agent %s: serving %s", self.agent_id, ", ".join(sorted(self.handlers)))
                while not self._stop.is_set():
                    try:
                        conn.connection.drain_events(timeout=0.05)
                    except TimeoutError:
                        pass
                    self._flush(channel, replies)
                pool.shutdown(wait=True, cancel_futures=True)
                self._flush(channel, replies)  # answers of the requests that were running
        finally:
            self._ready.clear()
            conn.release()
            self._close_clients()

    def _open(self, conn: Connection) -> amqp.Channel:
        channel = conn.connection.channel()
        channel.auto_decode = False  # bodies stay the bytes that were sent
        try:
            channel.exchange_declare(AGENT_REPLIES_EXCHANGE_NAME, "topic", passive=True)
            channel.queue_declare(agent_queue_name(self.agent_id), passive=True)
        except NotFound as exc:
            raise AgentServeError(
                f"the fleet has not declared {agent_queue_name(self.agent_id)} or {AGENT_REPLIES_EXCHANGE_NAME}: "
                f"start the fleet with a connector of type agent and `agent: {self.agent_id}` in its catalog"
            ) from exc
        channel.basic_qos(0, self.concurrency, False)
        channel.confirm_select()
        return channel

    def start(self, timeout: float = 30.0) -> AgentServer:
        """Serve from a background thread; returns once consuming. Raises what stopped it early."""
        self._failure = None
        self._thread = threading.Thread(target=self._run_in_thread, name=f"agent-{self.agent_id}", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._ready.wait(0.05):
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                if self._failure is not None:
                    raise self._failure
                raise AgentServeError(f"agent {self.agent_id} did not start consuming within {timeout:g} s")
        return self

    def _run_in_thread(self) -> None:
        try:
            self.run()
        except BaseException as exc:  # handed to start() or logged: a background thread has no caller
            self._failure = exc
            if self._ready.is_set() or not self._stop.is_set():
                log.error("agent %s stopped serving: %s", self.agent_id, exc)

    def stop(self, timeout: float = 30.0) -> None:
        """Stop taking requests, finish the running ones and close."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def __enter__(self) -> AgentServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- one request ---------------------------------------------------------------------------

    def _accept(self, message: amqp.Message, pool: ThreadPoolExecutor, replies: queue.SimpleQueue[_Reply]) -> None:
        """On the connection's thread: check the request, hand it to a handler thread."""
        props = message.properties
        reply_to, correlation_id = props.get("reply_to"), props.get("correlation_id")
        tag = message.delivery_tag
        if not isinstance(reply_to, str) or not isinstance(correlation_id, str) or not reply_to or not correlation_id:
            log.warning("agent %s: dropping a request without reply_to or correlation_id", self.agent_id)
            replies.put(("", "", b"", tag))  # only acked
            return
        try:
            request = AgentRequest.model_validate_json(message.body)
        except ValidationError as exc:
            log.warning("agent %s: malformed request: %s", self.agent_id, exc)
            error = AnswerError(
                code=ErrorCode.DOWNSTREAM_ERROR,
                message=f"agent {self.agent_id} could not read the request (expected version {REQUEST_VERSION})",
                suggestion="Tell an operator: the agent and the fleet disagree on the request format.",
            )
            replies.put((reply_to, correlation_id, _encode(AgentAnswer(status="failed", error=error)), tag))
            return
        deadline = _parse_time(request.deadline)
        if deadline is not None and deadline.timestamp() <= time.time():
            log.info(
                "agent %s: request %s arrived after its deadline; nobody waits for it", self.agent_id, request.intent_id
            )
            replies.put(("", "", b"", tag))
            return
        handler = self.handlers.get(request.action)
        if handler is None:
            error = AnswerError(
                code=ErrorCode.DOWNSTREAM_ERROR,
                message=f"agent {self.agent_id} does not handle {request.action}",
                suggestion="Tell an operator: the catalog offers an action this agent does not serve.",
            )
            replies.put((reply_to, correlation_id, _encode(AgentAnswer(status="failed", error=error)), tag))
            return
        seen = Request(
            intent_id=request.intent_id,
            caller=request.agent_id,
            connector=request.connector,
            action=request.action,
            hops=request.hops,
            idempotency_key=request.idempotency_key,
            deadline=deadline,
            traceparent=request.traceparent,
            redelivered=bool(message.delivery_info.get("redelivered")),
            _server=self,
        )
        params = request.params
        pool.submit(lambda: replies.put((reply_to, correlation_id, self._answer(handler, params, seen), tag)))

    def _answer(self, handler: Handler, params: dict[str, Any], request: Request) -> bytes:
        """On a handler thread: run the handler; its result or failure as an answer's bytes."""
        try:
            data = handler(dict(params), request)
            return _encode(AgentAnswer(status="succeeded", data={} if data is None else data))
        except AgentError as exc:
            return _encode(AgentAnswer(status="failed", error=exc.error))
        except Exception:
            log.exception(
                "agent %s: handler for %s failed on intent %s", self.agent_id, request.action, request.intent_id
            )
            error = AnswerError(
                code=ErrorCode.DOWNSTREAM_ERROR,
                message=f"agent {self.agent_id} failed while handling {request.action}",
                suggestion="Retry later; the agent's operators can find the error in its log.",
            )
            return _encode(AgentAnswer(status="failed", error=error))

    def _flush(self, channel: amqp.Channel, replies: queue.SimpleQueue[_Reply]) -> None:
        """On the connection's thread: publish the finished answers, then ack their requests."""
        while True:
            try:
                reply_to, correlation_id, body, tag = replies.get_nowait()
            except queue.Empty:
                return
            if reply_to:
                answer = amqp.Message(body, content_type="application/json", correlation_id=correlation_id)
                # not mandatory: a pool that stopped waiting has no reply queue left, and that is fine
                channel.basic_publish_confirm(
                    answer,
                    exchange=AGENT_REPLIES_EXCHANGE_NAME,
                    routing_key=reply_to,
                    confirm_timeout=self.connect_timeout,
                )
            channel.basic_ack(tag)

    # -- sending intents while handling ------------------------------------------------------------

    def client(self) -> ReachClient:
        """This handler thread's client (its own receipt queue, so threads never share receipts)."""
        client: ReachClient | None = getattr(self._local, "client", None)
        if client is None:
            client = ReachClient(
                self.agent_id,
                self.url,
                reply_to=f"{self.agent_id}.serve-{uuid.uuid4().hex[:12]}",
                authenticated=self._authenticated,
            )
            self._local.client = client
            with self._clients_lock:
                self._clients.append(client)
        return client

    def _close_clients(self) -> None:
        with self._clients_lock:
            clients, self._clients = self._clients, []
        for client in clients:
            client.close()
        self._local = threading.local()


def serve(
    agent_id: str,
    broker_url: str | None,
    handlers: Mapping[str, Handler],
    *,
    concurrency: int = 4,
    reconnect_delay: float = 1.0,
    max_reconnect_delay: float = 30.0,
) -> None:
    """Answer ``agent_id``'s requests until interrupted, reconnecting after a lost connection.

    See :class:`AgentServer` for the arguments. AgentServeError (the fleet is not set up for this
    agent, or the broker refused its login or permissions) is raised, not retried.
    """
    server = AgentServer(agent_id, broker_url, handlers, concurrency=concurrency)
    delay = reconnect_delay
    while True:
        started = time.monotonic()
        try:
            server.run()
            return
        except (AgentServeError, KeyboardInterrupt):
            raise
        except (OSError, AMQPError) as exc:
            if time.monotonic() - started > max_reconnect_delay:
                delay = reconnect_delay  # it served a while: start the backoff afresh
            log.warning("agent %s: broker connection lost (%s); reconnecting in %.1f s", agent_id, exc, delay)
            time.sleep(delay)
            delay = min(max_reconnect_delay, delay * 2)


def _encode(answer: AgentAnswer) -> bytes:
    try:
        return json.dumps(answer.model_dump(mode="json", exclude_none=True), allow_nan=False).encode()
    except (TypeError, ValueError):
        error = AnswerError(
            code=ErrorCode.DOWNSTREAM_ERROR,
            message="the agent's answer is not JSON (a value that JSON cannot carry)",
            suggestion="Tell the agent's operators: a handler returned data that is not JSON.",
        )
        return json.dumps(AgentAnswer(status="failed", error=error).model_dump(mode="json", exclude_none=True)).encode()


def _parse_time(text: str | None) -> datetime | None:
    if text is None:
        return None
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)
