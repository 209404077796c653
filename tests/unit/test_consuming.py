"""Where the threaded consumer handles a message: on a pool thread, or (router, quiet moments)
on the consumer's own loop — and that every message is settled exactly once either way."""
from __future__ import annotations

import threading
import time
from typing import Any, Callable

from workers.consuming import threaded_consumer


class Channel:
    is_open = True


class Msg:
    def __init__(self, n: int) -> None:
        self.n = n
        self.channel = Channel()
        self.properties = {"message_id": str(n)}
        self.settled: list[str] = []

    def ack(self) -> None:
        self.settled.append("ack")

    def requeue(self) -> None:
        self.settled.append("requeue")


class Loop:
    """Stands for the consumer (only ``call_soon`` is used): runs callbacks on its own thread."""

    def __init__(self) -> None:
        self.thread = threading.get_ident()
        self.callbacks: list[tuple[Callable[..., None], tuple[Any, ...]]] = []
        self.lock = threading.Lock()

    def call_soon(self, fn: Callable[..., None], *args: Any) -> None:
        with self.lock:
            self.callbacks.append((fn, args))

    def run_ready(self) -> None:
        with self.lock:
            ready, self.callbacks = self.callbacks, []
        for fn, args in ready:
            fn(*args)


def handler_on(loop: Loop, handle: Callable[[Msg], Callable[[], None]], inline_after: float | None) -> Callable[[Msg], None]:
    consumer_class = threaded_consumer(handle, 4, "t", inline_after=inline_after)  # type: ignore[arg-type]
    return consumer_class.create_task_handler(loop)  # type: ignore[arg-type]


def settle_all(loop: Loop, messages: list[Msg], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while any(not m.settled for m in messages) and time.monotonic() < deadline:
        loop.run_ready()
        time.sleep(0.005)


def test_without_inline_every_message_goes_to_a_pool_thread_and_is_acked_on_the_loop() -> None:
    loop, ran_on = Loop(), {}

    def handle(message: Msg) -> Callable[[], None]:
        ran_on[message.n] = threading.get_ident()
        return message.ack

    on_message = handler_on(loop, handle, inline_after=None)
    messages = [Msg(n) for n in range(3)]
    for message in messages:
        on_message(message)
        time.sleep(0.01)
    settle_all(loop, messages)
    assert all(m.settled == ["ack"] for m in messages)
    assert loop.thread not in ran_on.values()


def test_a_quiet_message_is_handled_and_settled_on_the_loop_itself() -> None:
    loop, ran_on = Loop(), {}

    def handle(message: Msg) -> Callable[[], None]:
        ran_on[message.n] = threading.get_ident()
        return message.ack

    on_message = handler_on(loop, handle, inline_after=0.002)
    message = Msg(1)
    on_message(message)
    assert ran_on[1] == loop.thread and message.settled == ["ack"]  # no hand-over, no call_soon
    assert loop.callbacks == []


def test_back_to_back_messages_go_to_the_threads_so_slow_ones_overlap() -> None:
    loop, ran_on = Loop(), {}
    release = threading.Event()

    def handle(message: Msg) -> Callable[[], None]:
        ran_on[message.n] = threading.get_ident()
        if message.n > 0:
            release.wait(5)  # all of them in flight at once: only possible on the threads
        return message.ack

    on_message = handler_on(loop, handle, inline_after=0.05)
    first = Msg(0)
    on_message(first)  # quiet: inline
    messages = [Msg(n) for n in range(1, 5)]
    for message in messages:
        on_message(message)  # within 50 ms of the one before: threads
    assert first.settled == ["ack"]
    time.sleep(0.1)
    assert len(ran_on) == 5  # the four slow ones run at the same time
    release.set()
    settle_all(loop, messages)
    assert all(m.settled == ["ack"] for m in messages)
    assert all(ran_on[m.n] != loop.thread for m in messages)


def test_a_handler_that_raises_gets_its_message_requeued_inline_or_not() -> None:
    loop = Loop()

    def handle(message: Msg) -> Callable[[], None]:
        raise RuntimeError("boom")

    on_message = handler_on(loop, handle, inline_after=0.002)
    quiet, busy = Msg(1), Msg(2)
    on_message(quiet)
    on_message(busy)
    settle_all(loop, [quiet, busy])
    assert quiet.settled == ["requeue"] and busy.settled == ["requeue"]
