"""A pool process's bulkheads (workers/transport/consuming.py ``bulkhead_consumer``) and the
arguments of ``reach worker A B C`` (workers/ops/startup.py), without a broker: each queue gets its
own prefetch before it is consumed, its own threads, and a blocked connector does not hold another's."""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any
from unittest import mock

import pytest

from workers.ops.startup import Member, group_name, parse_members
from workers.transport.consuming import Bulkhead, bulkhead_consumer, queue_of

A, B = "reach.connector.a", "reach.connector.b"


class FakeChannel:
    is_open = True

    def __init__(self, calls: list[tuple[str, Any]]) -> None:
        self.calls = calls

    def basic_qos(self, size: int, count: int, global_: bool) -> None:
        assert size == 0 and global_ is False  # per consumer, never the whole channel
        self.calls.append(("prefetch", count))


class FakeQueue:
    def __init__(self, name: str) -> None:
        self.name = name


class FakeTaskConsumer:
    """The parts of kombu's Consumer the bulkhead consumer uses, recording their order."""

    def __init__(self, names: list[str]) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.channel = FakeChannel(self.calls)
        self._queues = {n: FakeQueue(n) for n in names}
        self.active: set[str] = set()
        self.on_message: Any = None

    @property
    def queues(self) -> list[FakeQueue]:
        return list(self._queues.values())

    @queues.setter
    def queues(self, queues: list[FakeQueue]) -> None:
        self._queues = {q.name: q for q in queues}

    def add_queue(self, queue: Any) -> Any:
        name = queue if isinstance(queue, str) else queue.name
        self._queues[name] = FakeQueue(name)
        return self._queues[name]

    def consume(self) -> None:
        for name in self._queues:
            if name not in self.active:
                self.active.add(name)
                self.calls.append(("consume", name))

    def consuming_from(self, name: str) -> bool:
        return name in self.active

    def cancel_by_queue(self, name: str) -> None:
        self.active.discard(name)
        self._queues.pop(name, None)


class FakeMessage:
    def __init__(self, queue: str, name: str = "") -> None:
        self.body = b"{}"
        self.properties = {"message_id": name}
        self.headers: dict[str, Any] = {}
        self.delivery_info = {"routing_key": queue}
        self.channel = FakeChannel([])
        self.name = name
        self.acked = self.rejected = self.requeued = 0

    def ack(self) -> None:
        self.acked += 1

    def reject(self, requeue: bool = False) -> None:
        assert requeue is False
        self.rejected += 1

    def requeue(self) -> None:
        self.requeued += 1


def consumer_for(bulkheads: list[Bulkhead]) -> Any:
    cls = bulkhead_consumer(bulkheads)
    consumer = cls.__new__(cls)  # no Celery app: only what the class uses
    consumer.hub = None
    consumer._pending_operations = deque()
    consumer.task_consumer = FakeTaskConsumer([b.queue for b in bulkheads])
    consumer.blueprint = mock.Mock()
    return consumer


def wait(predicate: Any, timeout: float = 5.0) -> None:
    deadline = time.time() + timeout
    while not predicate():
        assert time.time() < deadline, "timed out"
        time.sleep(0.005)


def test_each_queue_is_consumed_right_after_its_own_prefetch_is_set() -> None:
    consumer = consumer_for([Bulkhead(A, lambda m: m.ack, 3), Bulkhead(B, lambda m: m.ack, 20)])
    on_message = consumer.create_task_handler()
    assert consumer.task_consumer.calls == [("prefetch", 3), ("consume", A), ("prefetch", 20), ("consume", B)]
    assert consumer.task_consumer.on_message is on_message  # set before the first basic.consume
    consumer.shutdown()


def test_a_blocked_connector_does_not_hold_another_connectors_messages() -> None:
    gate = threading.Event()
    handled: list[str] = []

    def slow(message: FakeMessage) -> Any:
        gate.wait(5)
        handled.append(message.name)
        return message.ack

    def fast(message: FakeMessage) -> Any:
        handled.append(message.name)
        return message.ack

    consumer = consumer_for([Bulkhead(A, slow, 2, "test-a"), Bulkhead(B, fast, 1, "test-b")])
    on_message = consumer.create_task_handler()
    slow_messages = [FakeMessage(A, f"a{i}") for i in range(5)]
    fast_messages = [FakeMessage(B, f"b{i}") for i in range(5)]
    for message in slow_messages + fast_messages:
        on_message(message)
    wait(lambda: len(handled) == 5)  # every fast one, while both slow threads are blocked
    assert handled == [f"b{i}" for i in range(5)]
    consumer.perform_pending_operations()  # the acks, on the "consumer's thread"
    assert [m.acked for m in fast_messages] == [1] * 5 and sum(m.acked for m in slow_messages) == 0
    assert {t.name for t in threading.enumerate()} >= {"test-a_0", "test-a_1", "test-b_0"}
    gate.set()
    consumer.shutdown()  # warm shutdown: every held message of every bulkhead is finished and acked
    assert [m.acked for m in slow_messages] == [1] * 5


def test_a_message_under_a_routing_key_of_no_bulkhead_is_refused_not_run() -> None:
    handled: list[str] = []
    consumer = consumer_for([Bulkhead(A, lambda m: handled.append(m.name) or m.ack, 1)])
    on_message = consumer.create_task_handler()
    stray = FakeMessage("reach.connector.other", "stray")
    on_message(stray)
    consumer.shutdown()
    assert (stray.rejected, stray.requeued, handled) == (1, 0, [])


def test_a_resumed_queue_gets_its_own_prefetch_again() -> None:
    consumer = consumer_for([Bulkhead(A, lambda m: m.ack, 3), Bulkhead(B, lambda m: m.ack, 7)])
    consumer.create_task_handler()
    consumer.app = mock.MagicMock()  # Celery's own add_task_queue looks the queue up in app.amqp.queues
    consumer.app.amqp.queues.__contains__.return_value = False
    consumer.app.amqp.queues.select_add.side_effect = lambda name, **_: FakeQueue(name)
    tasks = consumer.task_consumer
    tasks.cancel_by_queue(B)  # what a pause does
    tasks.calls.clear()
    consumer.add_task_queue(B)
    assert tasks.calls == [("prefetch", 7), ("consume", B)]
    consumer.shutdown()


def test_queue_of_reads_the_routing_key() -> None:
    assert queue_of(FakeMessage(A)) == A
    message = FakeMessage(A)
    message.delivery_info = {"routing_key": A.encode()}
    assert queue_of(message) == A
    message.delivery_info = {}
    assert queue_of(message) == ""


def test_a_consumer_needs_one_bulkhead_per_queue() -> None:
    with pytest.raises(ValueError):
        bulkhead_consumer([])
    with pytest.raises(ValueError):
        bulkhead_consumer([Bulkhead(A, lambda m: m.ack, 1), Bulkhead(A, lambda m: m.ack, 2)])


# -- reach worker A B C -----------------------------------------------------------------------------


def test_worker_arguments_name_connectors_and_their_threads() -> None:
    assert parse_members(["crm", "billing:4"], 8) == [Member("crm", 8), Member("billing", 4)]
    assert parse_members(["crm"]) == [Member("crm", None)]
    for bad in (["crm:0"], ["crm:1001"], ["crm:x"], ["crm:"], ["crm", "crm:2"]):
        with pytest.raises(ValueError):
            parse_members(bad)


def test_a_group_is_named_by_its_connectors_unless_named() -> None:
    assert group_name([Member("crm")]) == "crm"
    assert group_name([Member("crm"), Member("billing")]) == "crm+billing"
    assert group_name([Member("crm"), Member("billing")], "backoffice") == "backoffice"
    many = [Member(f"connector_{i:03d}_with_a_long_name") for i in range(10)]
    assert group_name(many) == "connector_000_with_a_long_name+9"
