"""The facade's broker link: one asyncio AMQP connection (aiormq) that publishes every agent's
intents and takes in their receipts, on the facade's own event loop.

A call costs no thread: the intent is published and confirmed, and its receipt arrives, on the
loop that serves the MCP request (the kombu ``ReachClient`` blocks, and handing each call to a
worker thread and back was most of what the facade added to a call's latency).

Receipts come back on one exclusive, server-named queue per connection, bound once per agent
with the key ``<agent>.mcp.<32 hex digits>`` (the digits drawn once per facade process), which
each intent names as its ``reply_to``. A receipt is handed to the call waiting for its intent id, and only if
it is that call's agent's; anything else (a repeat, a receipt after its call gave up) is dropped,
so nothing is buffered. Each agent has REACH_MCP_CLIENTS_PER_AGENT calls at once; one agent's
slow calls never hold another's.

Publishing and consuming use two channels: a refused publish (a facade login without the
``impersonator`` tag setting ``user_id``) closes only the publishing channel, which is opened
again for the next call. When the connection is lost, every waiting call fails at once
(``Undelivered``, published) and the next call connects again, to the next node of a cluster's
URL list; a publish the lost connection did not confirm is sent once more on the new one with the
same intent id and idempotency key (the fleet answers a repeat of a key from its ledger).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import aiormq
import anyio
from aiormq.abc import DeliveredMessage
from pamqp import commands as spec

from producers.client import intent_body, read_reply
from producers.client_settings import broker_urls
from producers.wire import (
    AGENT_ID_PATTERN,
    INTENT_ROUTING_KEY,
    INTENTS_EXCHANGE_NAME,
    NACK_PAUSES_SECONDS,
    RECEIPTS_EXCHANGE_NAME,
    ApprovalNotice,
    Receipt,
)

log = logging.getLogger("reach.mcp")

REPLY_KEY_INFIX = ".mcp."
# the receipt keys the facade binds: the facade's broker user may read exactly these
REPLY_KEY_PATTERN = r"[a-z][a-z0-9_]{0,62}\.mcp\.[0-9a-f]{32}"


def reply_key(agent: str, suffix: str) -> str:
    """The receipt routing key of ``agent``'s calls through the facade whose digits are ``suffix``."""
    return f"{agent}{REPLY_KEY_INFIX}{suffix}"


class Undelivered(Exception):
    """No receipt came back. ``published``: True when the broker confirmed the intent, None when
    it may or may not have it, False when it surely has not (nothing was sent)."""

    def __init__(self, why: str, published: bool | None) -> None:
        super().__init__(why)
        self.published = published


@dataclass(frozen=True)
class Call:
    """One intent to publish as ``agent`` and the receipt to wait for."""

    agent: str
    action: str
    params: dict[str, Any]
    intent_id: str
    idempotency_key: str | None
    traceparent: str | None
    wait: float  # seconds to wait for the receipt


@dataclass
class _Waiter:
    """A call waiting for its receipt (and the approval notice, if one came)."""

    agent: str
    receipt: asyncio.Future[Receipt]
    notice: ApprovalNotice | None = None
    link: _Link | None = None  # the connection its intent went out on


@dataclass
class _Sent:
    """Whether a call's intent may have reached the broker: ``writing`` while an attempt is under
    way, ``earlier`` once an attempt was cut off by a lost connection or channel."""

    earlier: bool = False
    writing: bool = False


@dataclass
class _Link:
    """One connection: its channels, its receipt queue and the agents bound to it."""

    connection: aiormq.abc.AbstractConnection
    consuming: aiormq.abc.AbstractChannel
    queue: str
    publishing: aiormq.abc.AbstractChannel | None = None
    bound: set[str] = field(default_factory=set)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # opening a channel, binding an agent

    @property
    def lost(self) -> bool:
        return self.connection.is_closed


class AgentClients:
    """The calls of every agent the facade acts for, over one broker connection."""

    def __init__(self, broker_url: str, *, per_agent: int, set_user_id: bool, connect_timeout: float = 10.0) -> None:
        """
        Args:
            broker_url: The facade's broker login (a cluster's nodes: several URLs split by ``;``).
            per_agent: Calls at once per agent.
            set_user_id: Publish with AMQP ``user_id`` = the agent: the broker then vouches for the
                identity (the facade's login needs the ``impersonator`` tag, unless it is the agent).
            connect_timeout: Seconds to connect, and to wait for each publish's confirm.
        """
        self._urls = broker_urls(broker_url)
        if not self._urls:
            raise ValueError("broker_url names no broker")
        self._node = 0  # the URL tried first
        self._per_agent = per_agent
        self._set_user_id = set_user_id
        self._timeout = connect_timeout
        self._slots: dict[str, anyio.Semaphore] = {}
        self._suffix = uuid.uuid4().hex
        self._waiting: dict[str, _Waiter] = {}
        self._link: _Link | None = None
        self._attempt: asyncio.Future[_Link] | None = None  # the connect every waiting call shares
        self._closed = False

    async def call(self, call: Call, on_published: Callable[[], Coroutine[Any, Any, None]] | None = None) -> Receipt:
        """Publish the intent and return its receipt; ``on_published`` runs once the broker has it.
        Everything, connecting and publishing included, ends within ``call.wait`` seconds.

        Raises:
            ValueError: The intent is malformed; nothing was sent.
            Undelivered: No receipt: not published, or none within ``call.wait`` seconds.
        """
        if not AGENT_ID_PATTERN.match(call.agent):
            raise ValueError(f"agent {call.agent!r} is not an agent name")
        body = intent_body(
            call.agent,
            call.action,
            call.params,
            intent_id=call.intent_id,
            idempotency_key=call.idempotency_key,
            reply_to=reply_key(call.agent, self._suffix),
            traceparent=call.traceparent,
        )
        if self._closed:
            raise Undelivered("the facade is shutting down", published=False)
        deadline = anyio.current_time() + call.wait
        slot = self._slots.setdefault(call.agent, anyio.Semaphore(self._per_agent))
        async with slot:
            waiter = _Waiter(call.agent, asyncio.get_running_loop().create_future())
            self._waiting[call.intent_id] = waiter
            try:
                await self._publish_by(deadline, call, body, waiter)
                if on_published is not None:
                    await on_published()
                return await self._receipt(deadline, call, waiter)
            finally:
                if self._waiting.get(call.intent_id) is waiter:
                    del self._waiting[call.intent_id]
                _retrieve(waiter.receipt)

    async def aclose(self) -> None:
        """Close the connection (at shutdown); the broker deletes its receipt queue. Later calls
        are refused."""
        self._closed = True
        link, self._link = self._link, None
        if link is not None and not link.lost:
            await _close(link.connection)

    # -- publishing -------------------------------------------------------------------------------

    async def _publish_by(self, deadline: float, call: Call, body: bytes, waiter: _Waiter) -> None:
        """``_publish`` within what is left of the call's time."""
        sent = _Sent()
        try:
            with anyio.fail_after(max(0.0, deadline - anyio.current_time())):
                await self._publish(call, body, waiter, sent)
        except TimeoutError as exc:
            maybe = sent.earlier or sent.writing
            raise Undelivered(
                f"could not publish the intent within {call.wait:g} s", published=None if maybe else False
            ) from exc
        except Undelivered as exc:
            if sent.earlier and exc.published is False:
                exc.published = None  # the first attempt, lost with its connection, may have reached the broker
            raise

    async def _publish(self, call: Call, body: bytes, waiter: _Waiter, sent: _Sent) -> None:
        """Publish ``call``'s intent and wait for the broker's confirm; once more on a new
        connection if the one it went out on was lost before confirming it."""
        nack_pauses = iter(NACK_PAUSES_SECONDS)
        reconnected = False  # once per call, on a new connection
        while True:
            link = waiter.link = await self._ready(call.agent)
            if waiter.receipt.done():  # failed with the connection lost under the first attempt
                _retrieve(waiter.receipt)
                waiter.receipt = asyncio.get_running_loop().create_future()
            channel = await self._publishing(link)
            try:
                sent.writing = True
                await channel.basic_publish(
                    body,
                    exchange=INTENTS_EXCHANGE_NAME,
                    routing_key=INTENT_ROUTING_KEY,
                    properties=spec.Basic.Properties(
                        content_type="application/json",
                        content_encoding="utf-8",
                        delivery_mode=2,
                        headers={"agent_id": call.agent},
                        message_id=call.intent_id,
                        user_id=call.agent if self._set_user_id else None,
                    ),
                    mandatory=True,
                    timeout=self._timeout,
                )
                return
            except aiormq.exceptions.PublishError as exc:
                raise Undelivered(
                    f"the intent was not routed: no queue is bound to exchange {INTENTS_EXCHANGE_NAME!r} "
                    f"with key {INTENT_ROUTING_KEY!r}; is the fleet set up (reach setup, reach router)?",
                    published=False,
                ) from exc
            except aiormq.exceptions.DeliveryError as exc:
                # reach.intents has no length bound: a nack is the broker's passing trouble
                sent.writing = False  # a nacked message is not queued
                pause = next(nack_pauses, None)
                if pause is None:
                    raise Undelivered(
                        f"the broker refused the intent (nack) on {len(NACK_PAUSES_SECONDS) + 1} tries; it was not queued",
                        published=False,
                    ) from exc
                log.info("the broker nacked intent %s; publishing it again in %g s", call.intent_id, pause)
                await anyio.sleep(pause)
            except TimeoutError as exc:
                raise Undelivered(
                    f"the broker did not confirm the intent within {self._timeout:g} s; it may or may not be queued",
                    published=None,
                ) from exc
            except aiormq.exceptions.ChannelClosed as exc:
                # the broker closed the shared publishing channel: over this message only if it
                # names this agent's user_id; any other unconfirmed publish may have been queued
                refused = self._set_user_id and f"user_id property set to '{call.agent}'" in str(exc)
                raise Undelivered(self._refused(exc), published=False if refused else None) from exc
            except (aiormq.exceptions.AMQPConnectionError, ConnectionError, RuntimeError) as exc:
                # RuntimeError: aiormq's word for a channel or connection that closed under the call
                if link.lost:
                    self._drop(link, exc)
                elif not isinstance(exc, aiormq.exceptions.ChannelInvalidStateError):
                    raise
                # (else the publishing channel closed under this call, over another's message: a new one)
                sent.earlier, sent.writing = sent.earlier or sent.writing, False
                if reconnected:
                    raise Undelivered(f"lost the broker connection while publishing: {exc}", published=None) from exc
                reconnected = True
                log.info("the broker connection failed while publishing (%s); sending from a new one", exc)

    def _refused(self, exc: Exception) -> str:
        text = str(exc)
        if "user_id" in text and self._set_user_id:
            log.error(
                "the broker refused to let the facade publish as an agent: its login needs the "
                "impersonator tag (reach mcp-user create): %s",
                text,
            )
        return f"the broker did not take the intent: {text}"

    # -- receipts ---------------------------------------------------------------------------------

    async def _receipt(self, deadline: float, call: Call, waiter: _Waiter) -> Receipt:
        with anyio.move_on_after(max(0.0, deadline - anyio.current_time())):
            return await waiter.receipt
        notice = waiter.notice
        # an approval notice is not a receipt: the intent waits for a person, say so
        waiting = (
            f"; it waits for a person's approval {notice.approval_id} until {notice.expires_at}"
            if notice is not None
            else ""
        )
        raise Undelivered(f"no receipt within {call.wait:g} s{waiting}", published=True)

    async def _on_reply(self, message: DeliveredMessage) -> None:
        """A message on the receipt queue: the waiting call's receipt or notice, or dropped."""
        properties = message.header.properties
        try:
            reply = read_reply(message.body, properties.content_type, properties.message_type)
        except ValueError as exc:
            log.warning("ignoring a message on the facade's receipt queue: %s", exc)
            return
        waiter = self._waiting.get(reply.intent_id)
        # only through the waiting agent's own binding: the routing key says whose intent it answers
        if waiter is None or waiter.receipt.done() or message.routing_key != reply_key(waiter.agent, self._suffix):
            log.debug("no call waits for this %s of intent %s; dropped", type(reply).__name__, reply.intent_id)
            return
        if isinstance(reply, ApprovalNotice):
            waiter.notice = reply
        else:
            waiter.receipt.set_result(reply)

    # -- the connection ---------------------------------------------------------------------------

    async def _ready(self, agent: str) -> _Link:
        """A live connection whose receipt queue is bound for ``agent``."""
        link = self._link
        if link is None or link.lost:
            if self._closed:
                raise Undelivered("the facade is shutting down", published=False)
            # one attempt at a time, shared by every call that needs it (not one after another)
            if self._attempt is None or self._attempt.done():
                self._attempt = asyncio.ensure_future(self._connect())
                self._attempt.add_done_callback(_retrieve)
            link = await asyncio.shield(self._attempt)
        if agent not in link.bound:
            async with link.lock:
                if agent not in link.bound:
                    await self._bind(link, agent)
                    link.bound.add(agent)
        return link

    async def _bind(self, link: _Link, agent: str) -> None:
        """Bind ``agent``'s receipt key to the link's queue, on a channel of its own: a refused
        binding closes that channel, not the one the other agents' receipts arrive on."""
        try:
            with anyio.fail_after(self._timeout):
                channel = await link.connection.channel(publisher_confirms=False)
                try:
                    await channel.queue_bind(
                        link.queue, RECEIPTS_EXCHANGE_NAME, routing_key=reply_key(agent, self._suffix)
                    )
                finally:
                    if not channel.is_closed:
                        await channel.close()
        except aiormq.exceptions.AMQPChannelError as exc:
            raise Undelivered(f"cannot bind {agent}'s receipts: {exc}", published=False) from exc
        except (TimeoutError, aiormq.exceptions.AMQPError, OSError, RuntimeError) as exc:
            # RuntimeError: the connection closed meanwhile
            self._drop(link, exc)
            raise Undelivered(f"cannot bind {agent}'s receipts: {exc}", published=False) from exc

    async def _connect(self) -> _Link:
        """Connect to the first node that answers and is set up (from the one after the last
        lost), check the fleet's exchanges, declare the receipt queue and consume it."""
        failures: list[tuple[str, Exception]] = []
        for _ in self._urls:
            url = self._urls[self._node]
            try:
                with anyio.fail_after(self._timeout):
                    connection = aiormq.Connection(url, client_properties={"connection_name": "reach mcp"})
                    await connection.connect()
            except (TimeoutError, aiormq.exceptions.AMQPError, OSError) as exc:
                failures.append((url, exc))
                self._node = (self._node + 1) % len(self._urls)
                continue
            try:
                link = await self._open(connection)
            except Undelivered as exc:
                await _close(connection)
                failures.append((url, exc))
                self._node = (self._node + 1) % len(self._urls)
                continue
            except BaseException:
                await _close(connection)
                raise
            self._link = link
            return link
        if len(failures) == 1 and isinstance(failures[0][1], Undelivered):
            raise failures[0][1]  # one node, reached but not set up: its own words
        why = "; ".join(f"{_safe(url)}: {str(exc) or type(exc).__name__}" for url, exc in failures)
        raise Undelivered(f"cannot reach the broker: {why}", published=False)

    async def _open(self, connection: aiormq.abc.AbstractConnection) -> _Link:
        try:
            with anyio.fail_after(self._timeout):
                channel = await connection.channel(publisher_confirms=False)
                # passive: needs no permission, and never creates the fleet's exchanges
                for name in (INTENTS_EXCHANGE_NAME, RECEIPTS_EXCHANGE_NAME):
                    await channel.exchange_declare(name, passive=True)
                # exclusive (so classic on every broker: a quorum queue cannot be exclusive)
                declared = await channel.queue_declare("", exclusive=True, auto_delete=True, durable=False)
                link = _Link(connection, channel, str(declared.queue))
                await channel.basic_consume(link.queue, self._on_reply, no_ack=True)
        except aiormq.exceptions.ChannelNotFoundEntity as exc:
            raise Undelivered(
                "the fleet's exchanges do not exist on this broker; run `reach setup` or start `reach router`",
                published=False,
            ) from exc
        except (TimeoutError, aiormq.exceptions.AMQPError, OSError, RuntimeError) as exc:
            raise Undelivered(f"cannot set up with the broker: {exc}", published=False) from exc
        connection.closing.add_done_callback(lambda done: self._lost(link, done))
        return link

    async def _publishing(self, link: _Link) -> aiormq.abc.AbstractChannel:
        """The link's publishing channel (confirm mode, returns raised), opened again if the
        broker closed it. Nothing is sent if this fails."""
        channel = link.publishing
        if channel is None or channel.is_closed:
            async with link.lock:
                channel = link.publishing
                if channel is None or channel.is_closed:
                    try:
                        with anyio.fail_after(self._timeout):
                            channel = link.publishing = await link.connection.channel(
                                publisher_confirms=True, on_return_raises=True
                            )
                    except (TimeoutError, aiormq.exceptions.AMQPError, OSError, RuntimeError) as exc:
                        self._drop(link, exc)
                        raise Undelivered(f"cannot open a publishing channel: {exc}", published=False) from exc
        return channel

    def _drop(self, link: _Link, why: BaseException) -> None:
        """Give up ``link`` (the next call connects again, to the next node)."""
        if self._link is link:
            self._link = None
            self._node = (self._node + 1) % len(self._urls)
            log.warning("lost the broker connection (%s); the next call connects again", why)
        if not link.lost:
            asyncio.get_running_loop().create_task(_close(link.connection))

    def _lost(self, link: _Link, closing: asyncio.Future[Any]) -> None:
        """The connection closed: every call waiting on it learns now, not at its timeout."""
        if self._link is link:
            self._link = None
            self._node = (self._node + 1) % len(self._urls)
        why = None if closing.cancelled() else closing.exception()
        text = (str(why) or type(why).__name__) if why is not None else "closed"
        for waiter in self._waiting.values():
            if waiter.link is link and not waiter.receipt.done():
                waiter.receipt.set_exception(
                    Undelivered(f"lost the broker connection while waiting: {text}", published=True)
                )


async def _close(connection: aiormq.abc.AbstractConnection) -> None:
    """Close ``connection``; what waits on it fails as a lost connection (aiormq's default,
    CancelledError, would cancel the calls' tasks instead of answering them)."""
    try:
        await connection.close(aiormq.exceptions.ConnectionClosed(320, "closed by the facade"))
    except Exception as exc:  # noqa: BLE001 - it is going away either way
        log.debug("closing a broker connection failed: %s", exc)


def _retrieve(future: asyncio.Future[Any]) -> None:
    """Mark a failed future's exception as seen (asyncio logs those nobody read)."""
    if future.done() and not future.cancelled():
        future.exception()


def _safe(url: str) -> str:
    """A broker URL without its password, for messages."""
    head, sep, tail = url.partition("@")
    return f"{head.split(':')[0]}://…@{tail}" if sep else url
