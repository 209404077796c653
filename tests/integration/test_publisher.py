"""The fleet's publisher against the real broker: every message confirmed and delivered exactly
once from many threads at once, and a lost connection costs no message."""

from __future__ import annotations

import socket
import threading
import uuid
from collections.abc import Callable
from typing import Any

import amqp
import pytest
import redis
from kombu import Connection, Exchange, Queue
from kombu.pools import ProducerPool

from tests.fleet import BROKER_URL, REDIS_URL
from workers.state.batcher import Batcher, Write
from workers.transport.publisher import BatchPublisher, Publisher

EXCHANGE = Exchange("", "direct")


@pytest.fixture(params=[Publisher, BatchPublisher])
def kind(request: pytest.FixtureRequest) -> type[Publisher]:
    return request.param


def make(kind: type[Publisher], client: redis.Redis | None = None) -> Publisher:
    """A publisher of ``kind``; with ``client``, one that writes its ``first`` and ``then`` there."""
    connection = Connection(BROKER_URL, transport_options={"confirm_publish": True})
    batcher = Batcher(client, write_lines=lambda lines: None) if client is not None else None
    return kind(ProducerPool(connection.Pool(4), limit=4), batcher)


def in_threads(send: Callable[[int], None], count: int) -> None:
    """``send(0)`` … ``send(count - 1)``, each on a thread of its own, all at once; returns when all did."""
    threads = [threading.Thread(target=send, args=(t,)) for t in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def declared_queue() -> tuple[Connection, Queue]:
    conn = Connection(BROKER_URL)
    queue = Queue(f"test.publisher.{uuid.uuid4().hex[:8]}", EXCHANGE, durable=False, auto_delete=False)
    queue(conn.default_channel).declare()
    return conn, queue


def drain(conn: Connection, queue: Queue) -> list[bytes]:
    bodies = []
    channel = conn.default_channel
    while (message := channel.basic_get(queue.name, no_ack=True)) is not None:
        body = message.body  # (decoded to str by its content_encoding)
        bodies.append(body.encode() if isinstance(body, str) else body)
    channel.queue_delete(queue.name)
    conn.release()
    return bodies


def test_twenty_threads_publishing_at_once_get_every_message_confirmed_once(kind: type[Publisher]) -> None:
    pub = make(kind)
    conn, queue = declared_queue()
    errors: list[BaseException] = []

    def send(thread: int) -> None:
        try:
            for i in range(50):
                pub.publish(
                    f"{thread}-{i}".encode(),
                    exchange=EXCHANGE,
                    routing_key=queue.name,
                    headers={"n": i},
                    message_id=f"{thread}-{i}",
                    correlation_id="c",
                )
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    in_threads(send, 20)
    bodies = drain(conn, queue)
    assert not errors
    assert sorted(bodies) == sorted(f"{t}-{i}".encode() for t in range(20) for i in range(50))


def test_a_connection_lost_between_publishes_loses_no_message(kind: type[Publisher]) -> None:
    pub = make(kind)
    assert pub.prewarm(1) == 1
    conn, queue = declared_queue()
    pub.publish(b"before", exchange=EXCHANGE, routing_key=queue.name)
    # the broker connection goes away under the publisher (as in a broker restart)
    held = pub._connection if isinstance(pub, BatchPublisher) else pub._local.connection  # type: ignore[attr-defined]
    held.connection.sock.shutdown(socket.SHUT_RDWR)
    pub.publish(b"during", exchange=EXCHANGE, routing_key=queue.name)  # the careful path takes it
    pub.publish(b"after", exchange=EXCHANGE, routing_key=queue.name)  # and a new connection the next
    assert sorted(drain(conn, queue)) == [b"after", b"before", b"during"]


def test_a_message_to_a_missing_exchange_is_declared_and_delivered_by_the_careful_path(kind: type[Publisher]) -> None:
    pub = make(kind)
    conn, queue = declared_queue()
    exchange = Exchange(f"test.publisher.x.{uuid.uuid4().hex[:8]}", "direct", durable=False, auto_delete=True)
    try:
        pub.publish(b"first", exchange=exchange, routing_key="k")  # 404 on the batch channel, then declared
        queue_bound = Queue(queue.name, exchange, routing_key="k", durable=False)
        queue_bound(conn.default_channel).declare()
        pub.publish(b"second", exchange=exchange, routing_key="k")
        assert drain(conn, queue) == [b"second"]  # the first went to an exchange nobody had bound yet
    finally:
        with Connection(BROKER_URL) as c:
            c.default_channel.exchange_delete(exchange.name)


def test_what_follows_a_confirm_is_in_redis_before_publish_returns(kind: type[Publisher]) -> None:
    """Receipts' sent marks ride with the publish: written once the broker confirmed the message,
    batched with other messages', and always before the publishing thread goes on (and acks)."""
    client = redis.Redis.from_url(REDIS_URL)
    pub = make(kind, client)
    conn, queue = declared_queue()
    prefix = f"test:publisher:then:{uuid.uuid4().hex[:8]}"
    missing: list[str] = []

    def send(thread: int) -> None:
        for i in range(20):
            key = f"{prefix}:{thread}:{i}"
            pub.publish(b"m", exchange=EXCHANGE, routing_key=queue.name, then=lambda pipe, k=key: pipe.set(k, 1, ex=60))
            if not client.exists(key):
                missing.append(key)

    in_threads(send, 10)
    assert missing == [] and len(drain(conn, queue)) == 200
    with pytest.raises(ValueError):
        make(kind).publish(b"m", exchange=EXCHANGE, routing_key=queue.name, then=lambda pipe: None)


def test_what_must_be_stored_first_is_in_redis_before_the_message_and_a_failed_write_publishes_nothing(
    kind: type[Publisher],
) -> None:
    """A pool's outcome rides with its receipt (``first``): stored before the message goes out, in
    one round trip for a whole batch; a caller whose writes fail gets the Redis error and its
    message is not published, while the callers beside it in the batch are published."""
    client = redis.Redis.from_url(REDIS_URL)
    pub = make(kind, client)
    conn, queue = declared_queue()
    prefix = f"test:publisher:first:{uuid.uuid4().hex[:8]}"
    stored_before: list[bool] = []
    refused: list[str] = []

    def send(thread: int) -> None:
        for i in range(20):
            key = f"{prefix}:{thread}:{i}"
            failing = i % 5 == 0  # a command Redis refuses: the whole write counts as failed

            def commands(pipe: Any, k: str = key, bad: bool = failing) -> None:
                pipe.set(k, "stored", ex=60)
                if bad:
                    pipe.execute_command("NO-SUCH-COMMAND")

            try:
                pub.publish(
                    key.encode(), exchange=EXCHANGE, routing_key=queue.name, first=Write(commands, durable=[key])
                )
            except redis.RedisError:
                refused.append(key)
            else:
                stored_before.append(client.get(key) == b"stored")

    in_threads(send, 10)
    published = {body.decode() for body in drain(conn, queue)}
    assert len(refused) == 40 and all(key.rsplit(":", 1)[1] in ("0", "5", "10", "15") for key in refused)
    assert published.isdisjoint(refused) and len(published) == 160
    assert len(stored_before) == 160 and all(stored_before)
    with pytest.raises(ValueError):
        make(kind).publish(b"m", exchange=EXCHANGE, routing_key=queue.name, first=Write(lambda pipe: None))


def test_a_nack_on_the_careful_path_reaches_the_caller_as_the_nack(kind: type[Publisher]) -> None:
    """After its connection was lost, a message goes the careful way; py-amqp counts a nack as a
    recoverable connection error, so kombu retries it and wraps it. The caller must still see the
    broker's refusal (its caller then decides whether to try again), not a lost connection."""
    pub = make(kind)
    assert pub.prewarm(1) == 1
    conn, queue = declared_queue()
    refusing = Queue(
        f"test.publisher.refusing.{uuid.uuid4().hex[:8]}",
        EXCHANGE,
        durable=False,
        auto_delete=False,
        queue_arguments={"x-max-length": 0, "x-overflow": "reject-publish"},
    )
    refusing(conn.default_channel).declare()
    try:
        pub.publish(b"before", exchange=EXCHANGE, routing_key=queue.name)
        held = pub._connection if isinstance(pub, BatchPublisher) else pub._local.connection  # type: ignore[attr-defined]
        held.connection.sock.shutdown(socket.SHUT_RDWR)
        with pytest.raises(amqp.exceptions.MessageNacked):
            pub.publish(b"refused", exchange=EXCHANGE, routing_key=refusing.name)
        pub.publish(b"after", exchange=EXCHANGE, routing_key=queue.name)  # and the publisher goes on
    finally:
        conn.default_channel.queue_delete(refusing.name)
    assert sorted(drain(conn, queue)) == [b"after", b"before"]
