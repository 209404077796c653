"""Confirmed, persistent publishing of raw JSON bytes, safe to call from any thread.

Two ways to the same guarantee — ``publish`` returns only once the broker confirmed the message,
and raises if it could not be published:

``Publisher`` (the router): each publishing thread keeps one producer on a connection of its own
(py-amqp connections are not thread-safe) and waits for its own confirm. Taking a producer from a
shared pool, kombu's retry wrapper and re-declaring the exchange cost more CPU than the publish.

``BatchPublisher`` (the pools): one confirm-mode channel, used by one thread at a time. A caller
that finds no batch running publishes its message and everything queued before it, waits for the
broker's confirms of the whole batch (RabbitMQ acks several at once) and wakes each waiting caller
with its own answer; a caller that finds a batch running queues its message and waits, and what
queued during a batch goes to a background thread (``workers.state.combining``). Under load many
receipts share one wait instead of each thread blocking on its own confirm; a lone message is
published by its own thread, with no hand-over.

When the fast path fails (broker restarted, exchange deleted, a nack) the message goes the careful
way — pooled producer, exchange declared, bounded retries — and a fresh connection is opened for
the next one.

On a cluster (``REACH_BROKER_URL`` naming several nodes) a connection lost with its node fails the
messages whose confirms had not come: they go the careful way, whose retries connect to the next
node that answers, and are published again there. A message the lost node had already queued is
then queued twice; the pools' ledger runs an intent once and sends its receipt once (a receipt
published twice is the same receipt, which ``ReachClient`` drops). A queue whose leader moves to
another node holds confirms back until the new leader is elected (seconds), within
``CONFIRM_TIMEOUT``.
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import Any

import amqp
import kombu.exceptions
from kombu import Connection, Exchange, Producer
from kombu.pools import ProducerPool

from workers.state.batcher import WAIT_SECONDS, Batcher, Commands, Write
from workers.state.combining import Combiner

log = logging.getLogger("reach.publisher")

# bounded: a broker that stays away makes the caller fail (and not ack) instead of hanging forever
RETRY_POLICY = {"max_retries": 5, "interval_start": 0.2, "interval_step": 0.5, "interval_max": 2.0}
CONFIRM_TIMEOUT = 30.0
# how long a caller waits for someone else's batch: longer than a batch can take (its "first"
# writes, a confirm wait, then its "then" writes through the batcher), so it never gives up on a
# receipt that batch may still publish — publishing it again on the careful path would send it twice
BATCH_WAIT_SECONDS = CONFIRM_TIMEOUT + 2 * WAIT_SECONDS + 5
MAX_BATCH = 200


class Unroutable(Exception):
    """The broker confirmed a ``mandatory`` message and returned it: no queue was bound for its
    routing key (e.g. a connector's queue deleted while the fleet ran), so nobody will read it."""


class Publisher:
    def __init__(self, producer_pool: ProducerPool, batcher: Batcher | None = None) -> None:
        self._pool = producer_pool
        self._batcher = batcher  # writes the ``then`` of confirmed messages
        self._local = threading.local()
        self._spare: queue.SimpleQueue[tuple[Connection, Producer, list[str]]] = queue.SimpleQueue()

    def prewarm(self, count: int) -> int:
        """Open ``count`` connections now, for the first publishing threads to take.

        Otherwise every thread's first publish does an AMQP handshake mid-intent, all at once. Returns
        how many were opened (fewer if the broker cannot be reached: threads then connect themselves)."""
        for opened in range(count):
            pair = self._connect()
            if pair is None:
                return opened
            self._spare.put(pair)
        return count

    def publish(
        self,
        body: bytes,
        *,
        exchange: Exchange,
        routing_key: str,
        headers: dict[str, Any] | None = None,
        then: Commands | None = None,
        first: Write | None = None,
        mandatory: bool = False,
        **properties: Any,
    ) -> None:
        """Returns once the broker confirmed the message; raises if it could not be published.

        ``first``: Redis writes that must be stored before the message goes out (needs a
        ``batcher``), e.g. a pool's outcome; if they fail, nothing is published and their
        ``redis.RedisError`` is raised. ``then``: Redis commands to write once the message is
        confirmed and before this returns (needs a ``batcher``), e.g. a receipt's "sent" mark; a
        failure to write them is logged.

        Raises:
            Unroutable: ``mandatory`` and no queue took the message (``then`` is not written).
        """
        if (then is not None or first is not None) and self._batcher is None:
            raise ValueError("publish(then=..., first=...) needs a Publisher built with a batcher")
        if first is not None:
            self.store_first(first)
        producer: Producer | None = getattr(self._local, "producer", None)
        if producer is None:
            producer = self._open()
        if producer is not None:
            returned: list[str] = self._local.returned
            returned.clear()
            try:
                producer.publish(
                    body,
                    exchange=exchange.name,
                    routing_key=routing_key,
                    content_type="application/json",
                    content_encoding="utf-8",
                    delivery_mode=2,
                    headers=headers or {},
                    mandatory=mandatory,
                    **properties,
                )
            except amqp.exceptions.MessageNacked:
                raise  # the broker refused this message: the caller decides whether to try again
            except Exception as exc:  # connection or channel trouble: the careful path decides
                log.info(
                    "publisher connection of %s failed (%s); publishing with retries",
                    threading.current_thread().name,
                    exc,
                )
                self._close()
            else:
                _raise_if_returned(returned, exchange, routing_key)  # a return comes before its confirm
                self._write_then([then] if then is not None else [])
                return
        self._careful(body, exchange, routing_key, headers, properties, mandatory)
        self._write_then([then] if then is not None else [])

    def store_first(self, first: Write) -> None:
        """``first`` in one round trip of the batcher's; raises its ``redis.RedisError``."""
        assert self._batcher is not None
        self._batcher.call(first.commands, first.lines, durable=first.durable)

    def _write_then(self, thens: list[Commands]) -> None:
        """What follows confirmed messages, in one round trip (of the batcher's)."""
        if not thens or self._batcher is None:
            return
        try:

            def write(pipe: Any) -> None:
                for then in thens:
                    then(pipe)

            self._batcher.call(write)
        except Exception as exc:  # the messages are out: this must not make anyone publish them again
            log.error(
                "could not write what follows %d confirmed message(s) (receipts' sent marks): %s", len(thens), exc
            )

    def _careful(
        self,
        body: bytes,
        exchange: Exchange,
        routing_key: str,
        headers: dict[str, Any] | None,
        properties: dict[str, Any],
        mandatory: bool = False,
    ) -> None:
        """Pooled producer, exchange declared, bounded retries: when the fast path failed."""
        returned: list[str] = []

        def on_return(exc: Exception, *_: Any) -> None:
            returned.append(str(exc))

        with self._pool.acquire(block=True, timeout=30) as pooled:
            if mandatory:
                # on the channel now, and on the one kombu's retry revives the producer with
                pooled.channel.events["basic_return"].add(on_return)
                pooled.on_return = on_return
            try:
                pooled.publish(
                    body,
                    exchange=exchange,
                    routing_key=routing_key,
                    content_type="application/json",
                    content_encoding="utf-8",
                    delivery_mode=2,
                    headers=headers or {},
                    declare=[exchange] if exchange.name else [],
                    retry=True,
                    retry_policy=RETRY_POLICY,
                    mandatory=mandatory,
                    **properties,
                )
            except kombu.exceptions.OperationalError as exc:
                # py-amqp counts a nack as a recoverable connection error, so kombu's retries
                # republished it and then wrapped it: the caller must see it as the nack it is
                if isinstance(exc.__cause__, amqp.exceptions.MessageNacked):
                    raise exc.__cause__ from None
                raise
            finally:
                if mandatory:
                    pooled.on_return = None
                    pooled.channel.events["basic_return"].discard(on_return)
        _raise_if_returned(returned, exchange, routing_key)

    def _open(self) -> Producer | None:
        """This thread's own producer, or None when the broker cannot be reached right now."""
        try:
            pair: tuple[Connection, Producer, list[str]] | None = self._spare.get_nowait()
        except queue.Empty:
            pair = self._connect()
        if pair is None:
            return None
        self._local.connection, self._local.producer, self._local.returned = pair
        return pair[1]

    def _connect(self) -> tuple[Connection, Producer, list[str]] | None:
        connection = self._pool.connections.connection.clone()
        try:
            connect_any(connection)
            channel = connection.channel()
            returned: list[str] = []  # what the broker returned (mandatory), read by publish
            channel.events["basic_return"].add(lambda exc, *_: returned.append(str(exc)))
            return connection, Producer(channel), returned
        except Exception as exc:
            log.info("could not open a publisher connection (%s); publishing with retries", exc)
            connection.collect()
            return None

    def _close(self) -> None:
        connection = getattr(self._local, "connection", None)
        self._local.connection = self._local.producer = None
        if connection is not None:
            try:
                connection.collect()  # drop sockets and channels without talking to a dead broker
            except Exception:
                pass


def _raise_if_returned(returned: list[str], exchange: Exchange, routing_key: str) -> None:
    if returned:
        raise Unroutable(f"{exchange.name or '(default)'} -> {routing_key}: {returned[0]}")


def connect_any(connection: Connection) -> None:
    """Connect to the first of ``connection``'s nodes (its URL and alternates) that answers, trying
    each once; raises the last error if none does."""
    connection.ensure_connection(max_retries=max(len(connection.alt), 1) - 1, interval_start=0, interval_step=0)


class _Item:
    __slots__ = (
        "body",
        "exchange",
        "routing_key",
        "headers",
        "properties",
        "then",
        "first",
        "stored",
        "done",
        "error",
        "confirmed",
    )

    def __init__(
        self,
        body: bytes,
        exchange: str,
        routing_key: str,
        headers: dict[str, Any],
        properties: dict[str, Any],
        then: Commands | None,
        first: Write | None,
    ) -> None:
        self.body = body
        self.exchange = exchange
        self.routing_key = routing_key
        self.headers = headers
        self.properties = properties
        self.then = then
        self.first = first
        self.stored: bool | None = None if first is not None else True  # False: ``first`` failed
        self.confirmed = False
        self.done = threading.Event()
        self.error: BaseException | None = None


class BatchPublisher(Publisher):
    def __init__(self, producer_pool: ProducerPool, batcher: Batcher | None = None) -> None:
        super().__init__(producer_pool, batcher)
        self._connection: Connection | None = None
        self._channel: Any = None  # used only by the thread running a batch
        self._tag = 0
        self._pending: dict[int, _Item] = {}  # delivery tag -> item awaiting its confirm
        self._combiner: Combiner[_Item] = Combiner(self._run_batch, max_batch=MAX_BATCH, name="reach-publisher")

    def prewarm(self, count: int = 1) -> int:
        """Open the publishing connection now rather than during the first intent (an AMQP handshake).

        Call before anything is published. 0 if the broker cannot be reached (the first batch then connects)."""
        return int(self._channel is not None or self._connect_batch() is not None)

    def publish(
        self,
        body: bytes,
        *,
        exchange: Exchange,
        routing_key: str,
        headers: dict[str, Any] | None = None,
        then: Commands | None = None,
        first: Write | None = None,
        **properties: Any,
    ) -> None:
        """As ``Publisher.publish``. The ``first`` of a whole batch are stored together, by the
        thread that runs the batch, before it publishes (so the caller hands its outcome and its
        receipt over once, not twice); the ``then`` of the batch are written together right
        after its confirms."""
        if (then is not None or first is not None) and self._batcher is None:
            raise ValueError("publish(then=..., first=...) needs a BatchPublisher built with a batcher")
        item = _Item(body, exchange.name, routing_key, headers or {}, properties, then, first)
        if self._combiner.run(item, item.done, BATCH_WAIT_SECONDS) and item.error is None:
            return
        if item.stored is False:
            raise item.error  # type: ignore[misc]  # nothing went out: the caller's writes failed
        if isinstance(item.error, amqp.exceptions.MessageNacked):
            raise item.error  # refused by the broker (a nack), not lost on the way
        log.info("batched publish failed (%s); publishing with retries", item.error or "no answer in time")
        if first is not None and not item.stored:
            self.store_first(first)  # the batch never came to it
        self._careful(body, exchange, routing_key, headers, properties)
        self._write_then([then] if then is not None else [])

    def close(self, timeout: float = 10.0) -> None:
        """Publish what is queued and stop the background thread (later publishes run on their caller)."""
        self._combiner.close(timeout)

    # -- one batch, on whichever thread runs it -----------------------------------------------

    def _run_batch(self, batch: list[_Item]) -> None:
        try:
            self._publish_batch(batch)
        except BaseException as exc:  # noqa: BLE001 - every caller must be woken, whatever happened
            for item in batch:
                if item.error is None and not item.confirmed:  # a confirmed one must not go twice
                    item.error = exc
            self._drop()
        finally:
            for item in batch:
                item.done.set()

    def _publish_batch(self, batch: list[_Item]) -> None:
        self._store_firsts(batch)
        batch = [item for item in batch if item.stored]
        if not batch:
            return
        channel = self._channel or self._connect_batch()
        if channel is None:
            raise ConnectionError("the broker cannot be reached")
        for item in batch:
            message = amqp.Message(
                item.body,
                content_type="application/json",
                content_encoding="utf-8",
                delivery_mode=2,
                application_headers=item.headers,
                **item.properties,
            )
            channel.basic_publish(message, exchange=item.exchange, routing_key=item.routing_key)
            self._tag += 1  # a confirm channel numbers its publishes 1, 2, 3, ...
            self._pending[self._tag] = item
        while self._pending:
            # the listeners below settle items as the broker's confirms come in
            self._connection.connection.drain_events(timeout=CONFIRM_TIMEOUT)  # type: ignore[union-attr]
        self._write_then([item.then for item in batch if item.then is not None and item.error is None])

    def _store_firsts(self, batch: list[_Item]) -> None:
        """Every item's ``first``, in one round trip; an item whose writes failed is not published."""
        waiting = [item for item in batch if item.first is not None and item.stored is None]
        if not waiting:
            return
        assert self._batcher is not None
        outcomes = self._batcher.call_each([item.first for item in waiting])  # type: ignore[misc]
        for item, outcome in zip(waiting, outcomes, strict=True):
            item.stored = not isinstance(outcome, Exception)
            if not item.stored:
                item.error = outcome  # type: ignore[assignment]

    def _settle(self, delivery_tag: int, multiple: bool, nacked: bool) -> None:
        """A confirm came in (callers are woken once the whole batch is settled and its ``then``
        written: see ``_run``)."""
        tags = [t for t in self._pending if t <= delivery_tag] if multiple else [delivery_tag]
        for tag in tags:
            item = self._pending.pop(tag, None)
            if item is not None:
                item.confirmed = not nacked
                if nacked:
                    item.error = amqp.exceptions.MessageNacked()

    def _connect_batch(self) -> Any:
        # a connection of its own, without kombu's confirm-per-publish: this thread waits for
        # the confirms of a whole batch instead
        connection = self._pool.connections.connection.clone(transport_options={})
        try:
            connect_any(connection)
            channel = connection.connection.channel()
            channel.confirm_select()
            # every confirm frame reaches these (one-shot waits can miss frames read together)
            channel.events["basic_ack"].add(lambda tag, multiple: self._settle(tag, multiple, False))
            channel.events["basic_nack"].add(lambda tag, multiple, *_: self._settle(tag, multiple, True))
        except Exception as exc:
            log.info("could not open the publishing connection (%s)", exc)
            connection.collect()
            return None
        self._connection, self._channel, self._tag = connection, channel, 0
        self._pending.clear()
        return channel

    def _drop(self) -> None:
        connection, self._connection, self._channel = self._connection, None, None
        if connection is not None:
            try:
                connection.collect()  # drop sockets and channels without talking to a dead broker
            except Exception:
                pass
