"""The Python client an agent uses to publish intents and read their receipts.

Errors::

    ReachError            the broker refused or lost something, or a receipt reports a failure
                          (then ``.receipt`` holds it)
    ReceiptTimeout        no receipt arrived in time (a TimeoutError; the intent may still run)

Any language can do the same with a plain AMQP client; this module is just the shortest correct
way to do it from Python (docs/contract.md sections 1-3).

It needs no configure permission: the fleet declares the exchanges, the client only checks them
with passive declares, so an agent's broker user can be confined to publishing intents and
reading its own receipts (``reach agent-user create``).
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from datetime import datetime
from types import TracebackType
from typing import Any

from amqp.exceptions import MessageNacked, NotFound
from kombu import Connection, Consumer, Exchange, Producer, Queue
from kombu.exceptions import OperationalError
from kombu.message import Message
from pydantic import ValidationError

from producers.settings import DEFAULT_BROKER_URL, ClientSettings, broker_urls
from producers.tools import EXPORT_FORMATS, ToolSpec, export
from producers.wire import (
    AGENT_ID_PATTERN,
    APPROVAL_PENDING,
    INTENT_ROUTING_KEY,
    INTENTS_EXCHANGE_NAME,
    LIST_TOOLS_ACTION,
    NACK_PAUSES_SECONDS,
    NAME_RULE,
    RECEIPTS_EXCHANGE_NAME,
    ApprovalNotice,
    Intent,
    Receipt,
)

__all__ = [
    "DEFAULT_BROKER_URL",
    "INTENTS_EXCHANGE",
    "INTENT_ROUTING_KEY",
    "RECEIPTS_EXCHANGE",
    "ApprovalPending",
    "ReachClient",
    "ReachError",
    "ReceiptTimeout",
]

log = logging.getLogger(__name__)

SEEN_RECEIPTS = 100_000  # receipts a client remembers, to drop a repeat of one
KEPT_NOTICES = 10_000  # approval notices a client keeps (the newest), for ``notice()``
# the fleet's arguments (durable, not auto-delete, no x-arguments); the client declares them
# passively only, which needs no permission and leaves them as the fleet made them
INTENTS_EXCHANGE = Exchange(INTENTS_EXCHANGE_NAME, type="direct", durable=True, auto_delete=False)
RECEIPTS_EXCHANGE = Exchange(RECEIPTS_EXCHANGE_NAME, type="topic", durable=True, auto_delete=False)


def intent_body(
    agent_id: str,
    action: str,
    params: dict[str, Any] | None,
    *,
    intent_id: str,
    idempotency_key: str | None = None,
    reply_to: str | None = None,
    deadline: datetime | str | None = None,
    context: dict[str, Any] | None = None,
    traceparent: str | None = None,
) -> bytes:
    """A native intent's JSON body, checked against the contract first.

    Raises:
        ValueError: The intent is malformed (the router would reject it anyway).
    """
    doc: dict[str, Any] = {
        "intent_id": intent_id,
        "agent_id": agent_id,
        "action": action,
        "params": {} if params is None else params,
    }
    if isinstance(deadline, datetime):
        if deadline.tzinfo is None:
            raise ValueError("deadline must be timezone-aware (e.g. datetime.now(timezone.utc))")
        deadline = deadline.isoformat()
    optional = {
        "idempotency_key": idempotency_key,
        "reply_to": reply_to,
        "deadline": deadline,
        "context": context,
        "traceparent": traceparent,
    }
    doc.update((k, v) for k, v in optional.items() if v is not None)
    # fail here rather than with an INVALID_INTENT receipt later
    try:
        Intent.model_validate(doc)
    except ValidationError as exc:
        raise ValueError(f"invalid intent: {exc}") from exc
    return json.dumps(doc, ensure_ascii=False, allow_nan=False).encode("utf-8")


def read_reply(body: bytes, content_type: str | None, message_type: str | None) -> Receipt | ApprovalNotice:
    """What arrived on a receipt queue: a receipt, or an approval notice (AMQP ``type``
    ``approval_pending``: the intent waits for a person, its receipt comes later).

    Raises:
        ValueError: Not JSON, or not a receipt or notice (to be ignored, not taken for one).
    """
    kind = (content_type or "application/json").split(";")[0].strip().lower()
    if kind != "application/json":
        raise ValueError(f"content type {kind!r}: only JSON is accepted")
    try:
        if message_type == APPROVAL_PENDING:
            return ApprovalNotice.model_validate_json(body)
        return Receipt.model_validate_json(body)
    except ValidationError as exc:
        what = "approval notice" if message_type == APPROVAL_PENDING else "receipt"
        raise ValueError(f"a malformed {what}: {exc}") from exc


class ReachError(Exception):
    """The broker refused or lost something, or a receipt reports that an intent did not succeed.

    Attributes:
        receipt: The receipt, when the error is about one; otherwise None.
    """

    def __init__(self, message: str, receipt: Receipt | None = None) -> None:
        super().__init__(message)
        self.receipt = receipt

    @classmethod
    def from_receipt(cls, receipt: Receipt) -> ReachError:
        """Build the error for a receipt whose status is not ``succeeded``."""
        error = receipt.error
        if error is None:
            text = f"intent {receipt.intent_id} {receipt.status}"
        else:
            text = f"intent {receipt.intent_id} {receipt.status}: {error.code}: {error.message}"
            if error.suggestion:
                text += f" ({error.suggestion})"
        return cls(text, receipt)


class ReceiptTimeout(TimeoutError):
    """No receipt arrived in time; the intent may still be queued or running."""


class ApprovalPending(ReceiptTimeout):
    """No receipt arrived in time because the intent waits for a person (an ``approval_pending``
    notice came for it). Do not send it again under a new id: that would ask for a second
    approval. Call :meth:`ReachClient.wait` with its ``intent_id`` again (its receipt comes once
    it is decided, or by ``expires_at``), or tell your user it waits.

    Attributes:
        notice: The notice (``intent_id``, ``approval_id``, ``expires_at``, ``summary``).
    """

    def __init__(self, message: str, notice: ApprovalNotice) -> None:
        super().__init__(message)
        self.notice = notice


class ReachClient:
    """Publishes intents on ``reach.intents`` and collects receipts from ``reach.receipts``.

    The receipt queue is exclusive to this client and bound before the first publish, so no
    receipt for an intent published through this client is missed; it is deleted by the broker
    when the client closes. Receipts that arrive while waiting for another one are buffered and
    returned by later :meth:`wait` or :meth:`receipts` calls.

    Not thread-safe: one connection and channel carry publishes and deliveries, so use one
    client per thread (or guard it with a lock).

    With ``user_id`` (or ``authenticated=True``) every message carries the AMQP ``user_id``
    property; RabbitMQ refuses it unless it equals the connection's login, so the router can
    trust it as the agent's identity (and with ``REACH_REQUIRE_USER_ID=1`` requires it).

    On a cluster, give every node's URL, split by ``;``. When the connection is lost (its node
    stopped), the client connects to the next node that answers, declares a new receipt queue
    and goes on: a publish that was not confirmed is published again there (the fleet runs an
    intent id once, so a copy that did get through changes nothing). Receipts sent while the
    client had no queue (between the loss and the new binding, usually well under a second) are
    lost; ``reconnects`` counts the losses. Resending such an intent with a new intent_id and the
    same ``idempotency_key`` returns its stored outcome (``deduplicated``) without running it again.

    Example::

        with ReachClient("ticket_qa_bot") as reach:
            receipt = reach.call("query_ticket", {"tid": "TK-0001"})

        url = "amqp://ticket_qa_bot:<password>@broker:5672//"
        with ReachClient("ticket_qa_bot", url, authenticated=True) as reach:
            ...
    """

    def __init__(
        self,
        agent_id: str,
        broker_url: str | None = None,
        *,
        reply_to: str | None = None,
        connect_timeout: float = 10.0,
        user_id: str | None = None,
        authenticated: bool = False,
        drop_duplicates: bool = True,
        on_notice: Callable[[ApprovalNotice], None] | None = None,
    ) -> None:
        """Connect, check the exchanges exist and bind this client's receipt queue.

        Args:
            agent_id: The calling agent app (``^[a-z][a-z0-9_]{0,62}$``).
            broker_url: AMQP URL, or a cluster's nodes' URLs split by ``;``; default
                ``$REACH_BROKER_URL``, else ``amqp://guest:guest@localhost:5672//``.
            reply_to: Routing key for this client's receipts (default: ``agent_id``). Give
                each concurrent client of one agent its own, or they share receipts.
            connect_timeout: Seconds to wait for the broker to accept the connection, and for
                it to confirm each publish.
            user_id: Set the AMQP ``user_id`` property to this on every publish. It must be
                the broker login (the broker refuses anything else) and equal ``agent_id``
                (the router refuses anything else).
            authenticated: Shorthand for ``user_id`` = the broker URL's login.
            drop_duplicates: Drop a receipt that repeats one this client already took in (of
                the last ``SEEN_RECEIPTS``): same agent, intent, status, code, trace and finish
                time. The fleet sends one, except when a pool dies right after the broker
                confirmed a receipt and before it recorded that, or loses its broker node while
                the confirm is under way: the same stored receipt is published again. A different receipt for the same intent id (a
                dead letter replayed, an id reused a day later) is kept. Dropped ones are counted
                in ``duplicate_receipts``. False shows every receipt as it arrives (tests of the
                fleet itself).
            on_notice: Called (on the thread that waits) with each :class:`ApprovalNotice`: an
                intent of this client waits for a person. A notice is not a receipt: ``wait``
                goes on waiting for the receipt, which comes once the intent was approved and
                ran, was denied (APPROVAL_DENIED) or expired (APPROVAL_EXPIRED). The newest
                notices are also kept: see :meth:`notice`.

        Raises:
            ValueError: ``agent_id`` or ``reply_to`` is malformed, or ``user_id`` is not
                ``agent_id``.
            ReachError: The broker cannot be reached, the fleet's exchanges do not exist, or
                the broker refused the receipt queue or its binding.
        """
        if not isinstance(agent_id, str) or not AGENT_ID_PATTERN.match(agent_id):
            raise ValueError(f"agent_id must be {NAME_RULE}")
        if reply_to is not None and (not 1 <= len(reply_to) <= 255 or any(c in reply_to for c in "*#")):
            raise ValueError("reply_to must be 1-255 characters without the wildcards * or #")
        if user_id is not None and authenticated:
            raise ValueError("give user_id or authenticated=True, not both")
        self.agent_id = agent_id
        self.reply_to = reply_to
        self._timeout = connect_timeout
        self._buffer: deque[Receipt] = deque()
        # fingerprints of the receipts already taken in, newest last: a repeat of one of them is
        # dropped (see _on_message)
        self._seen: OrderedDict[tuple[Any, ...], None] = OrderedDict()
        self._drop_duplicates = drop_duplicates
        self.duplicate_receipts = 0  # repeated receipts dropped (see drop_duplicates)
        self.on_notice = on_notice
        self._notices: OrderedDict[str, ApprovalNotice] = OrderedDict()
        self._returned: list[str] = []
        self._closed = False
        # set when a publish was left unconfirmed: py-amqp takes the next ack on the channel
        # as the confirm of the next publish, so a late ack would confirm the wrong message
        self._publish_broken = False
        self.reconnects = 0  # connections lost and made again (see the class docstring)
        self._urls = broker_urls(broker_url or ClientSettings.from_env().broker_url)
        if not self._urls:
            raise ValueError("broker_url names no broker")
        self._node = 0  # the URL tried first
        self._conn = self._connection()
        if authenticated:
            # a URL without a login connects as the transport's default user (guest)
            user_id = self._conn.userid or self._conn.transport.default_connection_params["userid"]
        if user_id is not None and user_id != agent_id:
            self._conn.release()
            self._closed = True
            raise ValueError(
                f"user_id {user_id!r} must equal agent_id {agent_id!r}: the router refuses an "
                "intent whose agent_id is not the authenticated user"
            )
        self.user_id: str | None = user_id
        try:
            self._open()
        except BaseException:
            self._closed = True
            raise

    def _connection(self) -> Connection:
        """A connection to the cluster's nodes, from ``self._node`` on (kombu tries the others in turn)."""
        return Connection(
            ";".join(self._urls[self._node :] + self._urls[: self._node]),
            transport="pyamqp",
            connect_timeout=self._timeout,
            transport_options={"confirm_publish": True},
        )

    def _open(self) -> None:
        """Connect to the first node that answers, check the exchanges, declare and bind this
        client's receipt queue and consume it. Releases the connection if any of it fails."""
        try:
            # each node once: a stopped one refuses at once, and the next one is tried
            self._conn.ensure_connection(max_retries=len(self._urls) - 1, interval_start=0, interval_step=0)
            channel = self._conn.default_channel
            # py-amqp would turn bodies with a content_encoding into str; receipts are parsed
            # from the bytes as they arrived
            channel.auto_decode = False
            # passive: needs no permission, and never creates the fleet's exchanges with
            # arguments of its own
            INTENTS_EXCHANGE(channel).declare(passive=True)
            RECEIPTS_EXCHANGE(channel).declare(passive=True)
            # exclusive (so classic on every broker: a quorum queue cannot be exclusive)
            self._queue = Queue(
                name="",
                exchange=RECEIPTS_EXCHANGE,
                routing_key=self.reply_to or self.agent_id,
                exclusive=True,
                auto_delete=True,
                durable=False,
            )(channel)
            # queue and binding only: Queue.declare() would also declare the exchange actively
            self._queue.queue_declare()
            self._queue.queue_bind()
            # on_message gets the raw message: the body is never handed to a kombu deserializer.
            # auto_declare off: re-declaring by the server-given amq.gen-* name is refused (403)
            self._consumer = Consumer(
                channel,
                queues=[self._queue],
                on_message=self._on_message,
                accept=["json"],
                no_ack=True,
                auto_declare=False,
            )
            self._consumer.consume()
            self._producer = Producer(
                channel,
                exchange=INTENTS_EXCHANGE,
                routing_key=INTENT_ROUTING_KEY,
                auto_declare=False,
                on_return=self._on_return,
            )
        except NotFound as exc:
            self._conn.release()
            raise ReachError(
                "the fleet's exchanges do not exist on this broker; run `reach setup` or start `reach router`"
            ) from exc
        except (OperationalError, *self._broker_errors()) as exc:
            self._conn.release()
            raise ReachError(f"cannot set up with the broker at {self._conn.as_uri()}: {exc}") from exc
        except BaseException:
            self._conn.release()
            raise

    def _reconnect(self, why: BaseException) -> None:
        """The connection was lost: connect to the next node that answers, with a new receipt
        queue (a publish is then retried once). Raises ReachError if no node answers."""
        self.reconnects += 1
        log.warning(
            "lost the broker connection at %s (%s); connecting to the next node "
            "(receipts sent until its receipt queue is bound do not reach this client)",
            self._conn.as_uri(),
            why,
        )
        try:
            self._conn.collect()  # drop the socket without talking to a node that is gone
        except Exception:  # noqa: BLE001 - nothing is left to clean up on our side
            log.debug("dropping the lost connection failed", exc_info=True)
        self._node = (self._node + 1) % len(self._urls)
        self._conn = self._connection()
        self._publish_broken = False  # a new channel numbers its confirms afresh
        self._open()

    @property
    def queue_name(self) -> str:
        """The broker-generated name of this client's receipt queue."""
        return str(self._queue.name)

    def publish(
        self,
        action: str,
        params: dict[str, Any] | None = None,
        *,
        intent_id: str | None = None,
        idempotency_key: str | None = None,
        deadline: datetime | str | None = None,
        context: dict[str, Any] | None = None,
        traceparent: str | None = None,
    ) -> str:
        """Publish a native intent and return as soon as the broker has confirmed it.

        Args:
            action: ``create_ticket``, ``connector.create_ticket`` or ``connector__create_ticket``.
            params: The action's inputs (JSON-serialisable, finite numbers).
            intent_id: Default: a new uuid4 hex.
            idempotency_key: Default (on the router): the intent_id.
            deadline: Time after which the action must not start; an aware datetime or
                RFC 3339 text.
            context: ``{"description", "domain"}`` to choose between connectors.
            traceparent: W3C trace context.

        Returns:
            The intent_id; pass it to :meth:`wait`.

        Raises:
            ValueError: The intent is malformed (it would be rejected anyway).
            ReachError: The broker did not accept the intent; it was not delivered.
        """
        intent_id = intent_id if intent_id is not None else uuid.uuid4().hex
        body = intent_body(
            self.agent_id,
            action,
            params,
            intent_id=intent_id,
            idempotency_key=idempotency_key,
            reply_to=self.reply_to,
            deadline=deadline,
            context=context,
            traceparent=traceparent,
        )
        self._publish(body, headers={"agent_id": self.agent_id}, message_id=intent_id)
        return intent_id

    def publish_raw(self, body: bytes, *, headers: dict[str, Any] | None = None, message_id: str | None = None) -> None:
        """Publish a body as it is, e.g. a foreign tool call or a deliberately broken intent.

        Args:
            body: The message body, sent with ``content_type: application/json``.
            headers: AMQP headers; default ``{"agent_id": <this client's agent_id>}``, which is
                how the router learns who sent a foreign-format intent. Pass ``{}`` for none.
            message_id: AMQP ``message_id`` (the router's default intent_id).

        Raises:
            ReachError: The broker did not accept the message.
        """
        self._publish(
            bytes(body),
            headers={"agent_id": self.agent_id} if headers is None else dict(headers),
            message_id=message_id,
        )

    def call(self, action: str, params: dict[str, Any] | None = None, *, timeout: float = 30.0, **kw: Any) -> Receipt:
        """Publish an intent and wait for its receipt.

        Args:
            action: As for :meth:`publish`.
            params: As for :meth:`publish`.
            timeout: Seconds to wait for the receipt.
            **kw: The keyword arguments of :meth:`publish`.

        Returns:
            The receipt, whatever its status.

        Raises:
            ApprovalPending: No receipt in time, and the intent waits for a person: wait again
                with ``wait(exc.notice.intent_id, timeout=...)`` rather than resend it.
            ReceiptTimeout: No receipt in time.
            ReachError: The broker did not accept the intent.
        """
        return self.wait(self.publish(action, params, **kw), timeout=timeout)

    def wait(self, intent_id: str, timeout: float = 30.0) -> Receipt:
        """Return the receipt for ``intent_id``, buffering any others that arrive meanwhile.

        Args:
            intent_id: As returned by :meth:`publish`.
            timeout: Seconds to wait.

        Returns:
            The receipt.

        Raises:
            ApprovalPending: None arrived in time, and an approval notice came for the intent:
                it waits for a person (until ``exc.notice.expires_at`` at most); call ``wait``
                again later rather than resend it.
            ReceiptTimeout: None arrived in time.
            ReachError: The connection to the broker was lost.
        """
        deadline = time.monotonic() + timeout
        while True:
            receipt = self._take(intent_id)
            if receipt is not None:
                return receipt
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                notice = self._notices.get(intent_id)
                if notice is not None:
                    raise ApprovalPending(
                        f"no receipt for intent {intent_id} within {timeout:g} s: it waits for approval "
                        f"{notice.approval_id} until {notice.expires_at}",
                        notice,
                    )
                raise ReceiptTimeout(f"no receipt for intent {intent_id} within {timeout:g} s")
            self._drain(remaining)

    def receipts(self, timeout: float | None = None) -> Iterator[Receipt]:
        """Yield receipts as they arrive, buffered ones first.

        Args:
            timeout: Stop after this many seconds without a receipt; None waits forever.

        Yields:
            Receipts in arrival order.

        Raises:
            ReachError: The connection to the broker was lost.
        """
        while True:
            deadline = None if timeout is None else time.monotonic() + timeout
            while not self._buffer:
                if deadline is None:
                    self._drain(None)
                    continue
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return
                self._drain(remaining)
            yield self._buffer.popleft()

    def tools(self, fmt: str = "openai", timeout: float = 10.0) -> list[dict[str, Any]]:
        """Ask the router which actions this agent may call, as tool schemas.

        Args:
            fmt: ``"openai"``, ``"anthropic"``, ``"mcp"`` or ``"json"``.
            timeout: Seconds to wait for the router's answer.

        Returns:
            The tools, rendered by :func:`producers.tools.export`.

        Raises:
            ValueError: ``fmt`` is unknown.
            ReachError: The receipt is not ``succeeded`` or does not hold a tool list.
            ReceiptTimeout: No answer in time (is the router running?).
        """
        if fmt not in EXPORT_FORMATS:
            raise ValueError(f"unknown tool format {fmt!r}: expected one of {', '.join(EXPORT_FORMATS)}")
        receipt = self.call(LIST_TOOLS_ACTION, {}, timeout=timeout)
        if receipt.status != "succeeded":
            raise ReachError.from_receipt(receipt)
        data = receipt.data
        if not isinstance(data, dict) or not isinstance(data.get("tools"), list):
            raise ReachError(f"intent {receipt.intent_id}: the tool list receipt has no 'tools' list", receipt)
        try:
            specs = [ToolSpec.from_dict(d) for d in data["tools"]]
        except ValueError as exc:
            raise ReachError(f"intent {receipt.intent_id}: malformed tool list: {exc}", receipt) from exc
        return export(specs, fmt)

    def notice(self, intent_id: str) -> ApprovalNotice | None:
        """The approval notice that came for ``intent_id``, if one did (the intent waits for a
        person: its receipt comes later)."""
        return self._notices.get(intent_id)

    def close(self) -> None:
        """Close the connection; the broker deletes the receipt queue. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        try:
            self._conn.release()
        except self._broker_errors() as exc:
            # the connection may already be gone; nothing is left to clean up on our side
            log.debug("closing the broker connection failed: %s", exc)

    def __enter__(self) -> ReachClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- internals -------------------------------------------------------------------------

    def _broker_errors(self) -> tuple[type[BaseException], ...]:
        return tuple(self._conn.connection_errors) + tuple(self._conn.channel_errors)

    def _publish(self, body: bytes, *, headers: dict[str, Any], message_id: str | None) -> None:
        if self._closed:
            raise ReachError("the client is closed")
        if self._publish_broken:
            raise ReachError(
                "an earlier publish of this client was never confirmed, so confirms can no "
                "longer be matched to messages; create a new ReachClient to publish"
            )
        label = f"intent {message_id}" if message_id else "the message"
        properties: dict[str, Any] = {}
        if message_id is not None:
            properties["message_id"] = message_id
        if self.user_id is not None:
            properties["user_id"] = self.user_id
        nack_pauses = iter(NACK_PAUSES_SECONDS)
        reconnected = False  # once per publish, on another node
        while True:
            self._returned.clear()
            try:
                # confirm mode makes this wait for the broker's ack; a basic.return for an
                # unroutable message always comes before that ack, so _returned is current after it
                self._producer.publish(
                    body,
                    content_type="application/json",
                    content_encoding="utf-8",
                    delivery_mode=2,
                    headers=headers,
                    mandatory=True,
                    timeout=self._timeout,
                    confirm_timeout=self._timeout,
                    **properties,
                )
                break
            except MessageNacked as exc:
                # reach.intents has no length bound: a nack is the broker's passing trouble
                pause = next(nack_pauses, None)
                if pause is None:
                    raise ReachError(
                        f"the broker refused {label} (nack) on {len(NACK_PAUSES_SECONDS) + 1} tries; it was not queued"
                    ) from exc
                log.info("the broker nacked %s; publishing it again in %g s", label, pause)
                time.sleep(pause)
            except TimeoutError as exc:
                if not reconnected and len(self._urls) > 1:
                    reconnected = True
                    self._reconnect(exc)  # another node may confirm it
                    continue
                self._publish_broken = True
                raise ReachError(
                    f"the broker did not confirm {label} within {self._timeout:g} s; it may or may "
                    "not be queued: resend it from a new client with the same intent_id or "
                    "idempotency_key (receipts still arrive at this one)"
                ) from exc
            except tuple(self._conn.connection_errors) as exc:
                if not reconnected:
                    reconnected = True
                    self._reconnect(exc)  # unconfirmed: published again on the new connection
                    continue
                raise ReachError(f"publishing {label} failed: {exc}") from exc
            except self._broker_errors() as exc:
                raise ReachError(f"publishing {label} failed: {exc}") from exc
        if self._returned:
            raise ReachError(
                f"{label} was not routed ({self._returned[0]}): no queue is bound to "
                f"exchange {INTENTS_EXCHANGE.name!r} with key {INTENT_ROUTING_KEY!r}; "
                "is the fleet set up (reach setup, reach router)?"
            )

    def _on_return(self, exc: Exception, exchange: str, routing_key: str, message: Any) -> None:
        self._returned.append(str(exc))

    def _on_message(self, message: Message) -> None:
        try:
            reply = read_reply(message.body, message.content_type, message.properties.get("type"))
        except ValueError as exc:
            log.warning("ignoring a message on %s: %s", self.queue_name, exc)
            return
        if isinstance(reply, ApprovalNotice):
            self._on_notice(reply)
            return
        receipt = reply
        if self._drop_duplicates:
            # the fleet publishes a stored receipt again when a pool died after the broker
            # confirmed it and before recording that it had: the very same receipt
            error = receipt.error
            fingerprint = (
                receipt.agent_id,
                receipt.intent_id,
                receipt.status,
                error.code if error else None,
                receipt.execution.trace_id,
                receipt.execution.finished_at,
            )
            if fingerprint in self._seen:
                self.duplicate_receipts += 1
                log.info("dropping a repeated receipt for intent %s", receipt.intent_id)
                return
            self._seen[fingerprint] = None
            if len(self._seen) > SEEN_RECEIPTS:
                self._seen.popitem(last=False)
        self._buffer.append(receipt)

    def _on_notice(self, notice: ApprovalNotice) -> None:
        """An approval notice: kept and handed to ``on_notice``, never taken for the receipt."""
        self._notices[notice.intent_id] = notice
        if len(self._notices) > KEPT_NOTICES:
            self._notices.popitem(last=False)
        if self.on_notice is not None:
            self.on_notice(notice)

    def _take(self, intent_id: str) -> Receipt | None:
        for i, receipt in enumerate(self._buffer):
            if receipt.intent_id == intent_id:
                del self._buffer[i]
                return receipt
        return None

    def _drain(self, timeout: float | None) -> None:
        if self._closed:
            raise ReachError("the client is closed")
        try:
            self._conn.drain_events(timeout=timeout)
        except TimeoutError:
            return
        except tuple(self._conn.connection_errors) as exc:
            self._reconnect(exc)  # ReachError if no node answers
        except self._broker_errors() as exc:
            raise ReachError(f"lost the broker connection; receipts may be missed: {exc}") from exc
