"""Long-lived ReachClients, a few per agent, each used by one ``tools/call`` at a time.

A :class:`~producers.client.ReachClient` is not thread-safe (one connection carries its
publishes and its receipts) and its calls block, so the facade keeps up to
REACH_MCP_CLIENTS_PER_AGENT of them per agent, made when first needed and kept for the next
call, and runs each call (publish, then wait for the receipt) in one worker thread
(``anyio.to_thread``) while the event loop serves other requests. A call waits for a free client
of its agent; one agent's slow calls never take another agent's clients.

Each client binds its own receipt key ``<agent>.mcp.<32 hex digits>`` as ``reply_to``, so it
receives only the receipts of the intents it published itself, never those of the agent's other
clients. A client that fails (a broker error, no receipt in time) is closed, not reused: a late
receipt would otherwise wait in its buffer for ever. An idle client whose connection died is
noticed at the next publish, which is sent once more from a new client with the same intent id
and idempotency key (the fleet answers a repeat of a key from its ledger, so nothing runs twice).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.from_thread
import anyio.to_thread

from producers.client import ReachClient, ReachError, ReceiptTimeout
from producers.wire import Receipt

log = logging.getLogger("reach.mcp")

REPLY_KEY_INFIX = ".mcp."
# the receipt keys the facade's clients bind: the facade's broker user may read exactly these
REPLY_KEY_PATTERN = r"[a-z][a-z0-9_]{0,62}\.mcp\.[0-9a-f]{32}"


def reply_key(agent: str) -> str:
    """A receipt routing key of ``agent``'s own that no other client binds."""
    return f"{agent}{REPLY_KEY_INFIX}{uuid.uuid4().hex}"


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


class AgentClients:
    """The clients of every agent the facade acts for."""

    def __init__(
        self, broker_url: str, *, per_agent: int, set_user_id: bool, threads: int, connect_timeout: float = 10.0
    ) -> None:
        """
        Args:
            broker_url: The facade's broker login.
            per_agent: Clients (connections, so calls at once) per agent.
            set_user_id: Publish with AMQP ``user_id`` = the agent: the broker then vouches for the
                identity (the facade's login needs the ``impersonator`` tag, unless it is the agent).
            threads: Worker threads for the blocking calls, over all agents.
            connect_timeout: Seconds to connect, and to wait for each publish's confirm.
        """
        self._url = broker_url
        self._per_agent = per_agent
        self._set_user_id = set_user_id
        self._connect_timeout = connect_timeout
        self._limiter = anyio.CapacityLimiter(threads)
        self._slots: dict[str, anyio.Semaphore] = {}
        self._idle: dict[str, list[ReachClient]] = {}

    async def call(self, call: Call, on_published: Callable[[], Coroutine[Any, Any, None]] | None = None) -> Receipt:
        """Publish the intent and return its receipt; ``on_published`` runs once the broker has it.

        Raises:
            ValueError: The intent is malformed; nothing was sent.
            Undelivered: No receipt: not published, or none within ``call.wait`` seconds.
        """
        slot = self._slots.setdefault(call.agent, anyio.Semaphore(self._per_agent))
        async with slot:
            idle = self._idle.setdefault(call.agent, [])
            client = idle.pop() if idle else None
            # one thread hop for the whole call; it never raises, so the client always comes back here,
            # even when the request is cancelled meanwhile (the thread cannot be; the call ends within call.wait)
            with anyio.CancelScope(shield=True):
                result, keep = await anyio.to_thread.run_sync(
                    self._run, call, client, on_published, limiter=self._limiter
                )
            if keep is not None:
                idle.append(keep)
        if isinstance(result, BaseException):
            raise result
        return result

    async def aclose(self) -> None:
        """Close every idle client (at shutdown)."""
        idle, self._idle = self._idle, {}
        for clients in idle.values():
            for client in clients:
                await anyio.to_thread.run_sync(client.close, limiter=self._limiter)

    # -- in the worker thread ---------------------------------------------------------------------

    def _run(
        self, call: Call, client: ReachClient | None, on_published: Callable[[], Coroutine[Any, Any, None]] | None
    ) -> tuple[Receipt | Exception, ReachClient | None]:
        """(the receipt or the error to raise, the client to keep for the next call)."""
        reused = client is not None
        try:
            if client is None:
                client = self._connect(call.agent)
            try:
                self._publish(client, call)
            except ReachError as exc:
                if not reused:
                    raise Undelivered(self._why(exc), published=None) from exc
                log.info("an idle broker connection of %s failed (%s); sending from a new one", call.agent, exc)
                client.close()
                client = None
                client = self._connect(call.agent)
                try:
                    self._publish(client, call)
                except ReachError as again:
                    raise Undelivered(self._why(again), published=None) from again
            if on_published is not None:
                anyio.from_thread.run(on_published)
            try:
                return client.wait(call.intent_id, timeout=call.wait), client
            except ReceiptTimeout as exc:
                # an approval notice is not a receipt: the intent waits for a person, say so
                notice = client.notice(call.intent_id)
                waiting = (
                    f"; it waits for a person's approval {notice.approval_id} until {notice.expires_at}"
                    if notice is not None
                    else ""
                )
                raise Undelivered(f"no receipt within {call.wait:g} s{waiting}", published=True) from exc
            except ReachError as exc:
                raise Undelivered(f"lost the broker connection while waiting: {exc}", published=True) from exc
        except ValueError as exc:
            return exc, client  # the intent was wrong, not the client
        except Exception as exc:
            if client is not None:
                client.close()
            return exc, None

    def _connect(self, agent: str) -> ReachClient:
        try:
            return ReachClient(
                agent,
                self._url,
                reply_to=reply_key(agent),
                connect_timeout=self._connect_timeout,
                user_id=agent if self._set_user_id else None,
            )
        except (ReachError, OSError) as exc:
            raise Undelivered(f"cannot reach the broker: {exc}", published=False) from exc

    @staticmethod
    def _publish(client: ReachClient, call: Call) -> None:
        client.publish(
            call.action,
            call.params,
            intent_id=call.intent_id,
            idempotency_key=call.idempotency_key,
            traceparent=call.traceparent,
        )

    def _why(self, exc: ReachError) -> str:
        text = str(exc)
        if "user_id" in text and self._set_user_id:
            log.error(
                "the broker refused to let the facade publish as an agent: its login needs the "
                "impersonator tag (reach mcp-user create): %s",
                text,
            )
        return f"the broker did not take the intent: {text}"
