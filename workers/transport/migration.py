"""Re-creating the fleet's queues with another type or other arguments, messages kept
(``reach setup --migrate-queues``).

RabbitMQ cannot change a queue's type or x-arguments in place (a declaration that differs is
refused with PRECONDITION_FAILED) and has no conversion. For each fleet queue it refuses to
declare as the fleet wants it, with the routers and pools stopped (agents may go on publishing):

1. the queue must have no consumer (a router, pool or answering agent still reading it);
2. a holding queue ``reach.migrating.<name>`` of the wanted type gets the queue's binding, then
   the queue loses it: what agents publish from then on waits in the holding queue;
3. every message moves to the holding queue: published there (persistent, properties kept,
   confirmed) before it is acked in the old queue, so a crash leaves it in both, never in neither;
4. the old queue is deleted (only if empty and unused), declared as wanted and bound, and the
   holding queue loses its binding;
5. the messages move back, in their order, and the holding queue is deleted.

While two queues are bound (steps 2 and 4, a few milliseconds), an intent published then is in
both and reaches the router twice; the fleet runs an intent id once. A migration stopped halfway
is finished by running it again: a holding queue found then is emptied into its queue.

A moved message is a new message to the broker: its delivery count starts again and it is not
marked redelivered. An intent published by an authenticated agent carries the AMQP ``user_id``,
which RabbitMQ accepts on a publish only from that user or from one with the ``impersonator``
tag: the user running the migration needs that tag when reach.intents holds such intents.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import amqp
from amqp.exceptions import NotFound, PreconditionFailed
from kombu import Connection, Queue

from workers.transport.topology import declare_queue

log = logging.getLogger("reach.migration")

HOLDING_PREFIX = "reach.migrating."
BATCH = 500  # messages moved per confirm round trip
CONFIRM_TIMEOUT = 30.0
SETTLE_SECONDS = 30.0  # for the broker to forget the readers of a queue about to be deleted
# headers the broker sets on a delivery; a moved message starts afresh
BROKER_HEADERS = ("x-delivery-count",)


class MigrationError(RuntimeError):
    """A queue could not be migrated; what was done so far is safe, and running again finishes it."""


@dataclass(frozen=True)
class Migrated:
    queue: str
    moved: int  # messages carried over into the re-created queue
    resumed: bool = False  # an earlier, interrupted migration was finished


def holding_queue(queue: Queue) -> Queue:
    """Where ``queue``'s messages wait while it is re-created: same binding, the wanted type."""
    wanted = (queue.queue_arguments or {}).get("x-queue-type")
    return Queue(
        HOLDING_PREFIX + queue.name,
        queue.exchange,
        routing_key=queue.routing_key,
        durable=True,
        queue_arguments={"x-queue-type": wanted} if wanted else {},
    )


def migrate_queues(
    connection: Connection, queues: list[Queue], report: Callable[[str], None] = log.info
) -> list[Migrated]:
    """Migrate every queue of ``queues`` (as the fleet declares them) that exists otherwise; the
    ones that already are as wanted are left alone (and missing ones are declared).

    Raises:
        MigrationError: a queue has consumers, a message was refused, or the broker refused a step.
    """
    done = []
    for queue in queues:
        migrated = migrate_queue(connection, queue, report)
        if migrated is not None:
            done.append(migrated)
    return done


def migrate_queue(connection: Connection, want: Queue, report: Callable[[str], None] = log.info) -> Migrated | None:
    """Re-create ``want`` as declared, its messages kept; None if it already was (or did not exist)."""
    holding = holding_queue(want)
    refused = declare_queue(connection, want)  # (declares it, bound, if it is missing)
    if refused is None:
        if not _exists(connection, holding.name):
            return None
        report(f"{want.name}: finishing an interrupted migration ({holding.name} exists)")
        return Migrated(want.name, _move_back(connection, want, holding), resumed=True)
    report(f"{want.name}: exists with another type or arguments ({refused}); re-creating it")
    consumers = _declared(connection, want.name).consumer_count
    if consumers:
        raise MigrationError(
            f"{want.name} has {consumers} consumer(s): stop the routers and pools (and any agent answering "
            "connectors on it) first; nothing was changed"
        )
    refused = declare_queue(connection, holding)
    if refused is not None:
        raise MigrationError(f"cannot declare {holding.name}: {refused}")
    _unbind(connection, want)
    moved = move_messages(connection, want.name, holding.name)
    report(f"{want.name}: {moved} message(s) moved to {holding.name}")
    _delete(connection, want.name)
    refused = declare_queue(connection, want)
    if refused is not None:
        raise MigrationError(f"cannot declare {want.name} as wanted after deleting it: {refused}")
    back = _move_back(connection, want, holding)
    if back != moved:
        report(f"{want.name}: {back - moved} message(s) more were published during the migration")
    return Migrated(want.name, back)


def _move_back(connection: Connection, want: Queue, holding: Queue) -> int:
    """``want`` exists as wanted and is bound: unbind the holding queue, empty it into ``want``, delete it."""
    _unbind(connection, holding)
    moved = move_messages(connection, holding.name, want.name)
    _delete(connection, holding.name)
    return moved


def move_messages(connection: Connection, source: str, target: str, batch: int = BATCH) -> int:
    """Move every message of queue ``source`` to queue ``target``, in order: each batch published
    (confirmed) before it is acked. Returns how many moved.

    Raises:
        MigrationError: ``target`` refused or could not route a message (those stay in ``source``),
            or the broker refused a publish (e.g. a ``user_id`` this user may not set).
    """
    # a connection of its own, without kombu's confirm-per-publish: a whole batch is confirmed at once
    own = connection.clone(transport_options={})
    own.connect()
    raw: Any = own.connection  # the py-amqp connection
    getter = raw.channel()
    getter.auto_decode = False  # bodies as they are, bytes
    sender = raw.channel()
    sender.confirm_select()
    settled: dict[int, bool] = {}  # delivery tag of a publish -> acked (False: nacked)
    returned: list[str] = []
    published = 0

    def settle(tag: int, multiple: bool, acked: bool) -> None:
        for each in range(1, tag + 1) if multiple else (tag,):
            settled.setdefault(each, acked)

    sender.events["basic_ack"].add(lambda tag, multiple: settle(tag, multiple, True))
    sender.events["basic_nack"].add(lambda tag, multiple, *_: settle(tag, multiple, False))
    sender.events["basic_return"].add(lambda exc, *_: returned.append(str(exc)))
    moved = 0
    try:
        while True:
            taken: list[amqp.Message] = []
            while len(taken) < batch:
                message = getter.basic_get(source, no_ack=False)
                if message is None:
                    break
                taken.append(message)
            if not taken:
                return moved
            first = published + 1
            for message in taken:
                sender.basic_publish(_copy(message), exchange="", routing_key=target, mandatory=True)
                published += 1
            while any(tag not in settled for tag in range(first, published + 1)):
                try:
                    raw.drain_events(timeout=CONFIRM_TIMEOUT)
                except TimeoutError as exc:
                    raise MigrationError(
                        f"{target}: no confirm in {CONFIRM_TIMEOUT:g} s; unmoved messages stay in {source}"
                    ) from exc
            refused = [m for tag, m in zip(range(first, published + 1), taken) if not settled[tag]]
            if refused or returned:
                for tag, message in zip(range(first, published + 1), taken):
                    if settled[tag] and not returned:
                        getter.basic_ack(message.delivery_tag)
                    else:
                        getter.basic_reject(message.delivery_tag, requeue=True)
                why = f"not routed ({returned[0]})" if returned else "refused (a full queue?)"
                raise MigrationError(f"{target}: {len(refused) or len(taken)} message(s) {why}; they stay in {source}")
            getter.basic_ack(taken[-1].delivery_tag, multiple=True)
            moved += len(taken)
    except PreconditionFailed as exc:
        hint = (
            " (a message carries an AMQP user_id: the migrating user needs the impersonator tag, "
            "e.g. rabbitmqctl set_user_tags USER administrator impersonator)"
            if "user_id" in str(exc)
            else ""
        )
        raise MigrationError(f"moving {source} to {target}: {exc}{hint}; unmoved messages stay in {source}") from exc
    finally:
        for channel in (sender, getter):
            try:
                channel.close()  # unacked messages go back to their queue
            except Exception:  # noqa: BLE001 - closed by the broker already
                pass
        own.release()


def _copy(message: amqp.Message) -> amqp.Message:
    properties = dict(message.properties)
    headers = properties.get("application_headers")
    if headers:
        properties["application_headers"] = {k: v for k, v in headers.items() if k not in BROKER_HEADERS}
    properties["delivery_mode"] = 2
    return amqp.Message(message.body, **properties)


def _declared(connection: Connection, name: str) -> Any:
    channel = connection.channel()
    try:
        return channel.queue_declare(name, passive=True)
    finally:
        channel.close()


def _exists(connection: Connection, name: str) -> bool:
    try:
        _declared(connection, name)
    except NotFound:
        return False
    return True


def _unbind(connection: Connection, queue: Queue) -> None:
    if not queue.exchange or not queue.exchange.name:
        return  # the default exchange routes by queue name; it has no binding to remove
    channel = connection.channel()
    try:
        channel.queue_unbind(queue.name, queue.exchange.name, queue.routing_key)
    finally:
        channel.close()


def _delete(connection: Connection, name: str) -> None:
    """Delete a queue that must be empty and unused by now. Quorum queues refuse the if-empty and
    if-unused flags (with a connection error), so it is checked first; the queue is unbound by then,
    so only a publish by name through the default exchange could still reach it."""
    # a quorum queue counts the basic.get of a closed channel as a consumer until it has cleaned up
    deadline = time.monotonic() + SETTLE_SECONDS
    declared = _declared(connection, name)
    while declared.consumer_count and not declared.message_count and time.monotonic() < deadline:
        time.sleep(0.1)
        declared = _declared(connection, name)
    if declared.message_count or declared.consumer_count:
        raise MigrationError(
            f"{name} was not deleted: it has {declared.message_count} message(s) and "
            f"{declared.consumer_count} consumer(s) again; run again"
        )
    channel = connection.channel()
    try:
        channel.queue_delete(name)
    finally:
        channel.close()
