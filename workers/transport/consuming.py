"""A Celery consumer that hands each raw message to a handler on a thread pool, no task machinery.

The router and the pools both use it. Celery still runs the worker — connection and reconnects,
QoS (prefetch), bootsteps (pause watcher, readiness probe), signals, warm shutdown — but a message
is never looked up as a task by name: the handler reads the body as data, so nothing a message
says can make the worker run something else, and Celery's per-task bookkeeping (request objects,
tracer, its own thread pool) is not paid for each intent.

The handler returns what must then happen to the message (ack, or requeue); that goes back to the
consumer's loop through ``call_soon``, because a channel belongs to one thread.

Fair consumption (the router): messages wait in one *lane per sender* (``sender_key``) and the
threads take them round-robin across the lanes that hold any, so an agent that floods the queue
delays its own intents, not everyone's. That only helps if the router reads past a flood, so its
prefetch is large (REACH_ROUTER_PREFETCH); what it holds is bounded in bytes (REACH_ROUTER_HOLD_BYTES):

- at 3/4 of the budget the consumer lowers its prefetch to 1 (``Consumer.qos``, applied by the
  consumer's loop; RabbitMQ's channel-wide qos takes effect at once) and raises it back when the
  threads have drained the lanes to half the budget;
- a message that still arrives over the budget (sent before the broker saw the new prefetch) goes
  straight back to the queue (``requeue`` on the consumer's thread), so the budget is a hard bound;
- the consumer's thread never waits for the threads. Blocking ``on_message`` instead would also stop
  the loop that sends acks and AMQP heartbeats (a long stall, e.g. Redis down, would cost the
  connection and redeliver everything held); with the prefetch lowered nothing waits on anything.

Shutdown: threads finish the message in hand; messages held but not started are, for the router,
simply left unacked (the broker redelivers them when the connection closes), while a pool (prefetch
about its thread count) still finishes all it holds. Acks of finished messages are sent
by the shutting-down consumer itself, on its own thread, before the connection closes.
"""

from __future__ import annotations

import logging
import re
import threading
from collections import deque
from collections.abc import Callable, Hashable
from typing import Any

from celery.worker.consumer import Consumer
from kombu.message import Message

log = logging.getLogger("reach.consuming")

Handler = Callable[[Message], Callable[[], None]]  # message -> settle (message.ack or message.requeue)


def settle_safely(settle: Callable[[], None], message: Message) -> None:
    """Ack or requeue on the consumer's loop. After a broker connection loss the message's old
    channel is gone and the broker redelivers the message anyway: that is not an error to restart
    the consumer over (an exception here would, again and again)."""
    channel = getattr(message, "channel", None)
    if channel is None or getattr(channel, "is_open", True) is False:
        log.debug("message %s came on a closed channel; the broker redelivers it", message.properties.get("message_id"))
        return
    try:
        settle()
    except Exception as exc:
        log.warning(
            "could not settle message %s (%s); the broker redelivers it", message.properties.get("message_id"), exc
        )


# -- lanes ------------------------------------------------------------------------------------------

ANONYMOUS = ""  # the shared lane of messages that name no sender
PEEK_BYTES = 2048  # how much of a body the consumer's thread may look at for the sender
MESSAGE_OVERHEAD = 2048  # bytes charged per held message besides its body (kombu, py-amqp objects)
_MAX_SENDER = 128
_AGENT_ID_BYTES = re.compile(rb'"agent_id"\s*:\s*"([A-Za-z0-9._:@-]{1,128})"')
_AGENT_ID_TEXT = re.compile(r'"agent_id"\s*:\s*"([A-Za-z0-9._:@-]{1,128})"')


def sender_key(message: Message) -> str:
    """The lane of a message, cheaply, on the consumer's thread: the AMQP ``user_id`` (checked by
    RabbitMQ against the login), else a short ``agent_id`` header, else an ``"agent_id":"…"`` in the
    first 2 KiB of the body, else the anonymous lane. Never a parse of the whole body; a scheduling
    hint only (the router still decides identity from the full intent). Prefixes keep a claimed
    name from sharing the lane of the authenticated login of the same name."""
    properties = message.properties or {}
    user_id = properties.get("user_id")
    if user_id:
        text = user_id.decode("utf-8", "replace") if isinstance(user_id, bytes) else str(user_id)
        return "u:" + text[:_MAX_SENDER]
    headers = message.headers
    agent = headers.get("agent_id") if isinstance(headers, dict) else None
    if isinstance(agent, bytes):
        agent = agent.decode("utf-8", "replace")
    if isinstance(agent, str) and 0 < len(agent) <= _MAX_SENDER:
        return "a:" + agent
    body = message.body
    if isinstance(body, (bytes, bytearray, memoryview)):
        found = _AGENT_ID_BYTES.search(bytes(body[:PEEK_BYTES]))
        if found:
            return "a:" + found.group(1).decode("ascii")
    elif isinstance(body, str):
        found_text = _AGENT_ID_TEXT.search(body[:PEEK_BYTES])
        if found_text:
            return "a:" + found_text.group(1)
    return ANONYMOUS


def held_size(message: Message) -> int:
    body = message.body
    return (len(body) if isinstance(body, (bytes, bytearray, memoryview, str)) else 0) + MESSAGE_OVERHEAD


class FairLanes:
    """Messages held by a consumer, one FIFO lane per key, taken round-robin across non-empty lanes.

    ``budget`` bounds the bytes held (waiting *and* being handled, released by ``release``): ``offer``
    refuses what would go past it (one message is always let in, however large, so nothing is stuck).
    ``paused`` is the back-pressure signal: set when the held bytes reach ``high`` (3/4 of the
    budget), cleared by the ``release`` that brings them down to ``low`` (1/2) — that release
    returns True so its caller can tell the consumer to read again. Thread-safe; ``take`` blocks."""

    def __init__(self, budget: int | None = None) -> None:
        self.budget = budget
        self.high = None if budget is None else max(1, budget * 3 // 4)
        self.low = None if budget is None else budget // 2
        self._lanes: dict[Hashable, deque[tuple[Any, int]]] = {}
        self._ready: deque[Hashable] = deque()  # keys of non-empty lanes, in serving order
        self._cond = threading.Condition()
        self.held_bytes = 0
        self.waiting = 0
        self.paused = False
        self.closed = False

    def offer(self, key: Hashable, item: Any, size: int) -> bool:
        with self._cond:
            if self.closed:
                return False
            if self.budget is not None and self.held_bytes > 0 and self.held_bytes + size > self.budget:
                self.paused = True
                return False
            lane = self._lanes.get(key)
            if lane is None:
                lane = self._lanes[key] = deque()
                self._ready.append(key)
            lane.append((item, size))
            self.held_bytes += size
            self.waiting += 1
            if self.high is not None and self.held_bytes >= self.high:
                self.paused = True
            self._cond.notify()
            return True

    def take(self, timeout: float | None = None) -> tuple[Any, int] | None:
        """The next message (round-robin over senders), or None once closed and (for a draining
        close) empty; also None after ``timeout`` seconds with nothing to take."""
        with self._cond:
            while not self._ready:
                if self.closed or not self._cond.wait(timeout):
                    return None
            key = self._ready.popleft()
            lane = self._lanes[key]
            item = lane.popleft()
            if lane:
                self._ready.append(key)  # back of the line: every other sender goes first
            else:
                del self._lanes[key]
            self.waiting -= 1
            return item

    def release(self, size: int) -> bool:
        """A taken message is finished; True if this ends a pause (time to read again)."""
        with self._cond:
            self.held_bytes -= size
            if self.paused and self.low is not None and self.held_bytes <= self.low:
                self.paused = False
                return True
            return False

    def close(self, drain: bool) -> list[Any]:
        """No more offers. ``drain``: takers still get what is held, then None; otherwise what has
        not been started is dropped and returned (left unacked, the broker redelivers it)."""
        with self._cond:
            self.closed = True
            dropped: list[Any] = []
            if not drain:
                for lane in self._lanes.values():
                    for item, size in lane:
                        dropped.append(item)
                        self.held_bytes -= size
                self._lanes.clear()
                self._ready.clear()
                self.waiting = 0
            self._cond.notify_all()
            return dropped

    def lane_count(self) -> int:
        with self._cond:
            return len(self._lanes)


# -- the consumer ---------------------------------------------------------------------------------


def threaded_consumer(
    handle: Handler,
    threads: int,
    thread_name_prefix: str,
    *,
    lane_of: Callable[[Message], Hashable] | None = None,
    hold_bytes: int | None = None,
    drain_on_shutdown: bool = True,
) -> type[Consumer]:
    """A consumer class (``app.conf.worker_consumer``) running ``handle`` on ``threads`` threads.
    Run the worker with ``-P solo`` and a prefetch of ``threads`` (or more) messages.

    ``lane_of``: the lane of a message (``sender_key`` for fair consumption); None: one FIFO lane.
    ``hold_bytes``: the budget of held bytes (see the module docstring); None: unbounded, and the
    prefetch is never touched (a pool's prefetch is its bound). ``drain_on_shutdown``: finish every
    held message on warm shutdown, or only those started."""
    lanes = FairLanes(hold_bytes)
    settles: deque[tuple[Callable[[], None], Message]] = deque()
    workers: list[threading.Thread] = []
    start_lock = threading.Lock()

    def flush_settles() -> None:
        while True:
            try:
                settle, message = settles.popleft()
            except IndexError:
                return
            settle_safely(settle, message)

    class ThreadedConsumer(Consumer):
        def _start_threads(self) -> None:
            with start_lock:
                if workers:
                    return
                for n in range(threads):
                    thread = threading.Thread(target=self._work, name=f"{thread_name_prefix}_{n}", daemon=True)
                    thread.start()
                    workers.append(thread)

        def _work(self) -> None:
            while True:
                got = lanes.take()
                if got is None:
                    return
                message, size = got
                settle: Callable[[], None] | None = None
                try:
                    channel = getattr(message, "channel", None)
                    if channel is not None and getattr(channel, "is_open", True) is False:
                        # held across a lost connection: the broker redelivers it on the new one
                        log.debug(
                            "dropping message %s held from a closed channel", message.properties.get("message_id")
                        )
                    else:
                        try:
                            settle = handle(message)
                        except BaseException:  # handlers never raise for a message; this is a last resort
                            log.exception("handling a message crashed; it will be redelivered")
                            settle = message.requeue
                finally:
                    resume = lanes.release(size)
                if settle is not None:
                    settles.append((settle, message))
                    self.call_soon(flush_settles)
                if resume:
                    self.call_soon(self._sync_prefetch, True)

        def _sync_prefetch(self, apply_now: bool = False) -> None:
            """On the consumer's thread: prefetch 1 while the lanes are paused, the configured
            prefetch otherwise. The loop sends a changed value before it reads again; ``apply_now``
            sends it at once (a resume must not wait for the loop's next wake-up)."""
            qos = getattr(self, "qos", None)
            if qos is None or hold_bytes is None or not self.initial_prefetch_count:
                return
            target = 1 if lanes.paused else self.initial_prefetch_count
            if qos.value > target:
                qos.decrement_eventually(qos.value - target)
            elif qos.value < target:
                qos.increment_eventually(target - qos.value)
            if apply_now and qos.prev != qos.value:
                try:
                    qos.update()
                except Exception as exc:  # the connection went away: its restart sets the prefetch again
                    log.warning("could not change the prefetch (%s)", exc)

        def create_task_handler(self, promise: Any = None) -> Callable[[Message], None]:
            self._start_threads()
            self._sync_prefetch()  # after a reconnect, while still paused: hold off again
            key_of = lane_of or (lambda message: ANONYMOUS)

            def on_message(message: Message) -> None:
                was_paused = lanes.paused
                if not lanes.offer(key_of(message), message, held_size(message)):
                    # over the budget (sent before the broker saw the lower prefetch), or shutting
                    # down: back to the queue at once; we are on the consumer's thread
                    settle_safely(message.requeue, message)
                if lanes.paused != was_paused:
                    self._sync_prefetch()

            return on_message

        def shutdown(self) -> None:
            dropped = lanes.close(drain=drain_on_shutdown)
            if dropped:
                log.info("warm shutdown: %d message(s) not started are left to the broker", len(dropped))
            for thread in workers:
                thread.join()  # warm shutdown: what is in hand finishes first
            flush_settles()  # their acks, before the connection closes
            super().shutdown()

    return ThreadedConsumer
