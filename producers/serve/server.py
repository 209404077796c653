"""Serving an agent: :class:`AgentServer` consumes the agent's request queue, runs each request's
handler on a thread and publishes its answer; :func:`serve` runs it until interrupted,
reconnecting after a lost connection."""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import unquote, urlsplit

import amqp
from amqp.exceptions import AMQPError, NotFound
from kombu import Connection
from pydantic import ValidationError

from producers.client import ReachClient
from producers.client_settings import ClientSettings
from producers.serve.contract import (
    AGENT_REPLIES_EXCHANGE_NAME,
    REQUEST_VERSION,
    AgentAnswer,
    AgentRequest,
    AnswerError,
    agent_queue_name,
    encode_answer,
    parse_deadline,
)
from producers.serve.handlers import AgentError, Handler, Request
from producers.wire import AGENT_ID_PATTERN, NAME_RULE, ErrorCode

log = logging.getLogger(__name__)


class AgentServeError(RuntimeError):
    """The agent cannot serve: the fleet's queue or exchange is missing, or the broker refused it."""


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
            replies.put((reply_to, correlation_id, encode_answer(AgentAnswer(status="failed", error=error)), tag))
            return
        deadline = parse_deadline(request.deadline)
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
            replies.put((reply_to, correlation_id, encode_answer(AgentAnswer(status="failed", error=error)), tag))
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
            return encode_answer(AgentAnswer(status="succeeded", data={} if data is None else data))
        except AgentError as exc:
            return encode_answer(AgentAnswer(status="failed", error=exc.error))
        except Exception:
            log.exception(
                "agent %s: handler for %s failed on intent %s", self.agent_id, request.action, request.intent_id
            )
            error = AnswerError(
                code=ErrorCode.DOWNSTREAM_ERROR,
                message=f"agent {self.agent_id} failed while handling {request.action}",
                suggestion="Retry later; the agent's operators can find the error in its log.",
            )
            return encode_answer(AgentAnswer(status="failed", error=error))

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
