"""Fair consumption (workers/transport/consuming.py): lanes per sender served round-robin, the bytes held
bounded, back-pressure through the prefetch, and shutdown."""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any
from unittest import mock

from kombu.common import QoS

from workers.transport.consuming import (
    ANONYMOUS,
    MESSAGE_OVERHEAD,
    PEEK_BYTES,
    FairLanes,
    sender_key,
    threaded_consumer,
)


class FakeChannel:
    is_open = True


class FakeMessage:
    def __init__(
        self,
        body: bytes | str = b"{}",
        *,
        user_id: str | None = None,
        headers: dict[str, Any] | None = None,
        name: str = "",
    ) -> None:
        self.body = body
        self.properties = {"user_id": user_id, "message_id": name} if user_id else {"message_id": name}
        self.headers = headers or {}
        self.channel = FakeChannel()
        self.name = name
        self.acked = 0
        self.requeued = 0

    def ack(self) -> None:
        self.acked += 1

    def requeue(self) -> None:
        self.requeued += 1


# -- sender_key ---------------------------------------------------------------------------------


def test_sender_is_user_id_then_header_then_body_peek_then_anonymous() -> None:
    body = b'{"action": "x", "agent_id": "from-body"}'
    assert sender_key(FakeMessage(body, user_id="login", headers={"agent_id": "hdr"})) == "u:login"
    assert sender_key(FakeMessage(body, headers={"agent_id": "hdr"})) == "a:hdr"
    assert sender_key(FakeMessage(body)) == "a:from-body"
    assert sender_key(FakeMessage(body.decode())) == "a:from-body"  # py-amqp may hand over decoded text
    assert sender_key(FakeMessage(b"not json at all")) == ANONYMOUS
    # a claimed name never shares the lane of the authenticated login of the same name
    assert sender_key(FakeMessage(body, user_id="from-body")) != sender_key(FakeMessage(body))


def test_sender_key_is_bounded_and_never_reads_the_whole_body() -> None:
    late = b'{"params": {"pad": "' + b"x" * PEEK_BYTES + b'"}, "agent_id": "late"}'
    assert sender_key(FakeMessage(late)) == ANONYMOUS  # past the 2 KiB peek: not looked at
    long_header = {"agent_id": "y" * 500}
    assert sender_key(FakeMessage(b"{}", headers=long_header)) == ANONYMOUS
    assert sender_key(FakeMessage(b"{}", headers={"agent_id": 42})) == ANONYMOUS
    escaped = b'{"agent_id": "a\\u0062"}'  # not worth decoding JSON escapes for a scheduling hint
    assert sender_key(FakeMessage(escaped)) == ANONYMOUS


# -- FairLanes ----------------------------------------------------------------------------------


def test_round_robin_across_senders_fifo_within_one() -> None:
    lanes = FairLanes()
    for i in range(5):
        lanes.offer("flood", f"f{i}", 10)
    lanes.offer("b", "b0", 10)
    lanes.offer("c", "c0", 10)
    lanes.offer("b", "b1", 10)
    order = [lanes.take(timeout=0)[0] for _ in range(8)]  # type: ignore[index]
    assert order == ["f0", "b0", "c0", "f1", "b1", "f2", "f3", "f4"]
    assert lanes.take(timeout=0) is None
    assert lanes.lane_count() == 0 and lanes.waiting == 0


def test_a_newcomer_waits_for_at_most_one_message_of_each_other_sender() -> None:
    lanes = FairLanes()
    for i in range(1000):
        lanes.offer("flood", i, 1)
    for _ in range(10):
        lanes.take(timeout=0)
    lanes.offer("b", "mine", 1)
    assert lanes.take(timeout=0)[0] == 10  # type: ignore[index]  # the flood's turn came first
    assert lanes.take(timeout=0)[0] == "mine"  # type: ignore[index]


def test_bytes_held_are_bounded_and_pause_resumes_at_half() -> None:
    lanes = FairLanes(budget=1000)  # high water 750, low water 500
    assert lanes.offer("a", 1, 400) and not lanes.paused
    assert lanes.offer("a", 2, 400) and lanes.paused  # 800 >= 750: deliveries should stop
    assert not lanes.offer("b", 3, 300)  # 1100 > budget: refused (goes back to the broker)
    assert lanes.held_bytes == 800
    taken = lanes.take(timeout=0)
    assert taken == (1, 400)
    assert lanes.held_bytes == 800  # still held while it is being handled
    assert lanes.release(400) is True  # 400 <= 500: the pause ends, once
    assert not lanes.paused and lanes.release(0) is False


def test_one_message_larger_than_the_budget_still_gets_through() -> None:
    lanes = FairLanes(budget=100)
    assert lanes.offer("a", "big", 5000)
    assert not lanes.offer("b", "small", 1)
    lanes.take(timeout=0)
    assert lanes.release(5000) is True
    assert lanes.offer("b", "small", 1)


def test_close_without_drain_drops_what_was_not_started() -> None:
    lanes = FairLanes(budget=10_000)
    for i in range(4):
        lanes.offer("a" if i % 2 else "b", i, 100)
    started = lanes.take(timeout=0)
    dropped = lanes.close(drain=False)
    assert started is not None and sorted(dropped) == sorted({0, 1, 2, 3} - {started[0]})
    assert lanes.take(timeout=0) is None and lanes.held_bytes == 100  # the one in hand
    assert not lanes.offer("a", 9, 1)


def test_close_with_drain_hands_out_the_rest_then_none_and_wakes_takers() -> None:
    lanes = FairLanes()
    got: list[Any] = []

    def taker() -> None:
        while (item := lanes.take()) is not None:
            got.append(item[0])

    thread = threading.Thread(target=taker)
    thread.start()
    lanes.offer("a", 1, 1)
    lanes.offer("b", 2, 1)
    assert lanes.close(drain=True) == []
    thread.join(5)
    assert not thread.is_alive() and sorted(got) == [1, 2]


# -- the consumer ------------------------------------------------------------------------------


def _consumer(
    handle: Any,
    *,
    threads: int = 2,
    hold_bytes: int | None = None,
    lanes: bool = True,
    drain: bool = False,
    prefetch: int = 100,
) -> Any:
    cls = threaded_consumer(
        handle,
        threads,
        "test-fair",
        lane_of=sender_key if lanes else None,
        hold_bytes=hold_bytes,
        drain_on_shutdown=drain,
    )
    consumer = cls.__new__(cls)  # no Celery app: only what the class uses
    consumer.hub = None
    consumer._pending_operations = deque()
    consumer.initial_prefetch_count = prefetch
    consumer.qos_calls = []
    consumer.qos = QoS(lambda prefetch_count: consumer.qos_calls.append(prefetch_count), prefetch)
    consumer.qos.update()
    consumer.blueprint = mock.Mock()
    return consumer


def _wait(predicate: Any, timeout: float = 5.0) -> None:
    deadline = time.time() + timeout
    while not predicate():
        assert time.time() < deadline, "timed out"
        time.sleep(0.005)


def test_consumer_serves_a_bystander_before_the_rest_of_a_flood() -> None:
    gate = threading.Event()
    order: list[str] = []

    def handle(message: FakeMessage) -> Any:
        gate.wait(5)
        order.append(message.name)
        return message.ack

    consumer = _consumer(handle, threads=1)
    on_message = consumer.create_task_handler()
    flood = [FakeMessage(b'{"agent_id":"flood"}', name=f"f{i}") for i in range(50)]
    for m in flood:
        on_message(m)
    bystander = FakeMessage(b"{}", headers={"agent_id": "b"}, name="b")
    on_message(bystander)
    gate.set()
    _wait(lambda: len(order) == 51)
    assert order.index("b") <= 2  # the one in hand, maybe the next flood one, then the bystander
    consumer.perform_pending_operations()  # the acks, on the "consumer's thread"
    assert bystander.acked == 1 and all(m.acked == 1 for m in flood)
    consumer.shutdown()


def test_fifo_when_lanes_are_off() -> None:
    order: list[str] = []
    gate = threading.Event()

    def handle(message: FakeMessage) -> Any:
        gate.wait(5)
        order.append(message.name)
        return message.ack

    consumer = _consumer(handle, threads=1, lanes=False)
    on_message = consumer.create_task_handler()
    for i in range(10):
        on_message(FakeMessage(b'{"agent_id":"flood"}', name=f"f{i}"))
    on_message(FakeMessage(b"{}", headers={"agent_id": "b"}, name="b"))
    gate.set()
    _wait(lambda: len(order) == 11)
    assert order[-1] == "b"
    consumer.shutdown()


def test_over_budget_the_prefetch_drops_to_one_then_comes_back() -> None:
    gate = threading.Event()

    def handle(message: FakeMessage) -> Any:
        gate.wait(5)
        return message.ack

    body = b'{"agent_id":"flood","pad":"' + b"x" * 3000 + b'"}'
    size = len(body) + MESSAGE_OVERHEAD
    consumer = _consumer(handle, threads=2, hold_bytes=10 * size, prefetch=100)
    on_message = consumer.create_task_handler()
    messages = [FakeMessage(body, name=str(i)) for i in range(14)]
    for m in messages:
        on_message(m)
    # 8 of 10 budget units reach the high water mark: the loop is told to send prefetch 1
    assert consumer.qos.value == 1
    consumer.qos.update()
    assert consumer.qos_calls[-1] == 1
    refused = [m for m in messages if m.requeued]
    assert len(refused) == 4  # past the budget: back to the broker at once, never held
    gate.set()
    _wait(lambda: _drain(consumer) or consumer.qos.prev == 100)
    assert consumer.qos_calls[-1] == 100  # resumed: sent at once, from the consumer's thread
    _wait(lambda: _drain(consumer) or sum(m.acked for m in messages) == 10)
    consumer.shutdown()


def _drain(consumer: Any) -> bool:
    consumer.perform_pending_operations()
    return False


def test_shutdown_finishes_what_is_in_hand_acks_it_and_leaves_the_rest() -> None:
    started = threading.Event()
    release = threading.Event()

    def handle(message: FakeMessage) -> Any:
        started.set()
        release.wait(5)
        return message.ack

    consumer = _consumer(handle, threads=1)
    on_message = consumer.create_task_handler()
    messages = [FakeMessage(b"{}", headers={"agent_id": f"a{i % 3}"}, name=str(i)) for i in range(6)]
    for m in messages:
        on_message(m)
    assert started.wait(5)
    threading.Timer(0.2, release.set).start()
    consumer.shutdown()  # waits for the one in hand, then sends its ack itself
    assert sum(m.acked for m in messages) == 1
    assert sum(m.requeued for m in messages) == 0  # the rest: unacked, redelivered by the broker
    consumer.blueprint.shutdown.assert_called_once()


def test_pool_style_shutdown_drains_everything_held() -> None:
    consumer = _consumer(lambda m: m.ack, threads=2, lanes=False, drain=True)
    on_message = consumer.create_task_handler()
    messages = [FakeMessage(b"{}", name=str(i)) for i in range(20)]
    for m in messages:
        on_message(m)
    consumer.shutdown()
    assert all(m.acked == 1 for m in messages)


def test_messages_held_from_a_lost_connection_are_not_handled() -> None:
    handled: list[str] = []
    gate = threading.Event()

    def handle(message: FakeMessage) -> Any:
        gate.wait(5)
        handled.append(message.name)
        return message.ack

    consumer = _consumer(handle, threads=1)
    on_message = consumer.create_task_handler()
    first, stale = FakeMessage(b"{}", name="first"), FakeMessage(b"{}", name="stale")
    on_message(first)
    on_message(stale)
    stale.channel = FakeChannel()
    stale.channel.is_open = False
    gate.set()
    consumer.shutdown()
    assert "stale" not in handled and stale.acked == 0


def test_a_crashing_handler_requeues() -> None:
    def handle(message: FakeMessage) -> Any:
        raise RuntimeError("bug")

    consumer = _consumer(handle, threads=1, drain=True)
    on_message = consumer.create_task_handler()
    message = FakeMessage(b"{}")
    on_message(message)
    consumer.shutdown()
    assert message.requeued == 1
