"""The client's broker connection: a cluster's nodes tried in turn, the fleet's exchanges checked,
this client's own receipt queue bound and consumed, and the move to the next node when the
connection is lost.

It needs no configure permission: the fleet declares the exchanges, the client only checks them
with passive declares, so an agent's broker user can be confined to publishing intents and
reading its own receipts (``reach agent-user create``).
"""

from __future__ import annotations

import logging
from typing import Any

from amqp.exceptions import NotFound
from kombu import Connection, Consumer, Exchange, Producer, Queue
from kombu.exceptions import OperationalError
from kombu.message import Message

from producers.client.errors import ReachError
from producers.client_settings import ClientSettings, broker_urls
from producers.wire import INTENT_ROUTING_KEY, INTENTS_EXCHANGE_NAME, RECEIPTS_EXCHANGE_NAME

log = logging.getLogger(__name__)

# the fleet's arguments (durable, not auto-delete, no x-arguments); the client declares them
# passively only, which needs no permission and leaves them as the fleet made them
INTENTS_EXCHANGE = Exchange(INTENTS_EXCHANGE_NAME, type="direct", durable=True, auto_delete=False)
RECEIPTS_EXCHANGE = Exchange(RECEIPTS_EXCHANGE_NAME, type="topic", durable=True, auto_delete=False)


class BrokerSession:
    """The connection, channel, receipt queue, consumer and producer under a :class:`ReachClient`.

    What arrives on the receipt queue goes to ``_on_message`` and what the broker returns
    unroutable to ``_on_return``: the receiving and publishing parts of the client define them.
    """

    agent_id: str
    reply_to: str | None
    user_id: str | None
    reconnects: int  # connections lost and made again (see ReachClient)
    _timeout: float
    _closed: bool
    # set when a publish was left unconfirmed: py-amqp takes the next ack on the channel
    # as the confirm of the next publish, so a late ack would confirm the wrong message
    _publish_broken: bool
    _urls: list[str]
    _node: int  # the URL tried first
    _conn: Connection
    _queue: Queue
    _consumer: Consumer
    _producer: Producer

    def _connect(self, broker_url: str | None, user_id: str | None, authenticated: bool) -> None:
        """Connect as ``agent_id`` (checking ``user_id`` against it) and open the receipt queue.

        Raises:
            ValueError: No broker URL, or ``user_id`` is not ``agent_id``.
            ReachError: As for :meth:`_open`.
        """
        self._publish_broken = False
        self.reconnects = 0
        self._urls = broker_urls(broker_url or ClientSettings.from_env().broker_url)
        if not self._urls:
            raise ValueError("broker_url names no broker")
        self._node = 0
        self._conn = self._connection()
        if authenticated:
            # a URL without a login connects as the transport's default user (guest)
            user_id = self._conn.userid or self._conn.transport.default_connection_params["userid"]
        if user_id is not None and user_id != self.agent_id:
            self._conn.release()
            self._closed = True
            raise ValueError(
                f"user_id {user_id!r} must equal agent_id {self.agent_id!r}: the router refuses an "
                "intent whose agent_id is not the authenticated user"
            )
        self.user_id = user_id
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

    def _broker_errors(self) -> tuple[type[BaseException], ...]:
        return tuple(self._conn.connection_errors) + tuple(self._conn.channel_errors)

    def _on_message(self, message: Message) -> None:
        raise NotImplementedError  # the receiving part of the client

    def _on_return(self, exc: Exception, exchange: str, routing_key: str, message: Any) -> None:
        raise NotImplementedError  # the publishing part of the client
