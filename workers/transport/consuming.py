"""A Celery consumer that hands each raw message to a handler on a thread pool, no task machinery.

The router runs one set of threads over ``reach.intents`` (``threaded_consumer``); a pool process
runs a *bulkhead* per connector queue (``bulkhead_consumer``): each queue with its own FIFO,
threads and prefetch, so that what waits in one queue never holds another's threads or prefetch,
however many connectors share the process (``reach worker A B C``). Celery still runs the worker
— connection and reconnects, QoS (prefetch), bootsteps (pause watcher, readiness probe), signals,
warm shutdown — but a message is never looked up as a task by name: the handler reads the body as
data, so nothing a message says can make the worker run something else, and Celery's per-task
bookkeeping (request objects, tracer, its own thread pool) is not paid for each intent.

The handler returns what must then happen to the message (ack, or requeue); that goes back to the
consumer's loop through ``call_soon``, because a channel belongs to one thread.

Fair consumption (the router): messages wait in one *lane per sender* (``sender_key``) and the
threads take them round-robin across the lanes that hold any, so an agent that floods the queue
delays its own intents, not everyone's. That only helps if the router reads past a flood, so its
prefetch is large (REACH_ROUTER_PREFETCH); what it holds is bounded in bytes (REACH_ROUTER_HOLD_BYTES):

- at 3/4 of the budget the consumer lowers its prefetch to 1 (``Consumer.qos``, applied by the
  consumer's loop; RabbitMQ's channel-wide qos takes effect at once) and raises it back when the
  threads have drained the lanes to half the budget (on quorum queues, whose prefetch is per
  consumer, it stops consuming instead: ``workers.transport.base_consumer``);
- a message that still arrives over the budget (sent before the broker saw the new prefetch) goes
  straight back to the queue (``requeue`` on the consumer's thread), so the budget is a hard bound;
- the consumer's thread never waits for the threads. Blocking ``on_message`` instead would also stop
  the loop that sends acks and AMQP heartbeats (a long stall, e.g. Redis down, would cost the
  connection and redeliver everything held); with the prefetch lowered nothing waits on anything.

Shutdown: threads finish the message in hand; messages held but not started are, for the router,
simply left unacked (the broker redelivers them when the connection closes), while a pool (prefetch
a small multiple of its threads) still finishes all it holds. Acks of finished messages are sent
by the shutting-down consumer itself, on its own thread, before the connection closes.
"""

from __future__ import annotations

import logging
import re
import threading
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from celery.worker.consumer import Consumer
from kombu.message import Message

from workers.transport.base_consumer import ReachConsumer

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
    name from sharing the lane of the authenticated login of the same name.

    With REACH_REQUIRE_USER_ID=0 a claim is the identity, so it names the lane: a sender may share
    another's lane by claiming its name, or take a lane per name it claims (``lanes_for``)."""
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


def authenticated_sender_key(message: Message) -> str:
    """The lane of a message when only the broker's word counts (REACH_REQUIRE_USER_ID=1): its
    AMQP ``user_id``, else the anonymous lane. The router refuses a message without ``user_id``
    anyway; claimed names must not give a flood of such messages a lane per name, ahead of the
    agents that authenticate."""
    user_id = (message.properties or {}).get("user_id")
    if user_id:
        text = user_id.decode("utf-8", "replace") if isinstance(user_id, bytes) else str(user_id)
        return "u:" + text[:_MAX_SENDER]
    return ANONYMOUS


def lanes_for(require_user_id: bool) -> Callable[[Message], str]:
    """The router's lane function: claims name lanes only where claims are the identity."""
    return authenticated_sender_key if require_user_id else sender_key


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


# -- the threads ----------------------------------------------------------------------------------


class _Threads:
    """``threads`` threads taking messages from ``lanes`` and handing each to ``handle``; what to
    do with the message then goes back to the consumer's loop (``call_soon``). Started once per
    process: a consumer restarted after a broker reconnect keeps them."""

    def __init__(self, handle: Handler, threads: int, name: str, lanes: FairLanes) -> None:
        self.handle = handle
        self.count = threads
        self.name = name
        self.lanes = lanes
        self._workers: list[threading.Thread] = []
        self._lock = threading.Lock()

    def start(self, settled: Callable[[Callable[[], None], Message], None], resumed: Callable[[], None]) -> None:
        """``settled(settle, message)`` after each message; ``resumed()`` when the lanes' pause ends."""
        with self._lock:
            if self._workers:
                return
            for n in range(self.count):
                thread = threading.Thread(
                    target=self._work, args=(settled, resumed), name=f"{self.name}_{n}", daemon=True
                )
                thread.start()
                self._workers.append(thread)

    def _work(self, settled: Callable[[Callable[[], None], Message], None], resumed: Callable[[], None]) -> None:
        while True:
            got = self.lanes.take()
            if got is None:
                return
            message, size = got
            settle: Callable[[], None] | None = None
            try:
                channel = getattr(message, "channel", None)
                if channel is not None and getattr(channel, "is_open", True) is False:
                    # held across a lost connection: the broker redelivers it on the new one
                    log.debug("dropping message %s held from a closed channel", message.properties.get("message_id"))
                else:
                    try:
                        settle = self.handle(message)
                    except BaseException:  # handlers never raise for a message; this is a last resort
                        log.exception("handling a message crashed; it will be redelivered")
                        settle = message.requeue
            finally:
                resume = self.lanes.release(size)
            if settle is not None:
                settled(settle, message)
            if resume:
                resumed()

    def close(self, drain: bool) -> list[Any]:
        return self.lanes.close(drain)

    def join(self) -> None:
        for thread in self._workers:
            thread.join()  # warm shutdown: what is in hand finishes first


class _Settles:
    """Acks and requeues decided on the threads, sent by the consumer's loop (a channel belongs to
    one thread)."""

    def __init__(self) -> None:
        self._queue: deque[tuple[Callable[[], None], Message]] = deque()

    def add(self, settle: Callable[[], None], message: Message, call_soon: Callable[..., Any]) -> None:
        self._queue.append((settle, message))
        call_soon(self.flush)

    def flush(self) -> None:
        while True:
            try:
                settle, message = self._queue.popleft()
            except IndexError:
                return
            settle_safely(settle, message)


# -- the router's consumer ------------------------------------------------------------------------


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
    pool = _Threads(handle, threads, thread_name_prefix, lanes)
    settles = _Settles()

    class ThreadedConsumer(ReachConsumer):
        def _start_threads(self) -> None:
            pool.start(
                lambda settle, message: settles.add(settle, message, self.call_soon),
                lambda: self.call_soon(self._sync_prefetch, True),
            )

        def _sync_prefetch(self, apply_now: bool = False) -> None:
            """On the consumer's thread: prefetch 1 while the lanes are paused, the configured
            prefetch otherwise. The loop sends a changed value before it reads again; ``apply_now``
            sends it at once (a resume must not wait for the loop's next wake-up)."""
            qos = getattr(self, "qos", None)
            if qos is None or hold_bytes is None or not self.initial_prefetch_count:
                return
            if self.hold_off(lanes.paused):  # per-consumer prefetch (quorum queues): stop instead
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
            if self.per_consumer_prefetch:
                self.call_soon(self._sync_prefetch)  # the loop consumes after this returns: then
            else:
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
            dropped = pool.close(drain=drain_on_shutdown)
            if dropped:
                log.info("warm shutdown: %d message(s) not started are left to the broker", len(dropped))
            pool.join()
            settles.flush()  # their acks, before the connection closes
            super().shutdown()

    return ThreadedConsumer


# -- the pools' consumer: a bulkhead per queue ----------------------------------------------------


@dataclass(frozen=True)
class Bulkhead:
    """One queue's share of a pool process: its handler, and ``threads`` threads of its own. The
    broker hands its consumer at most ``prefetch`` unacked messages (its own, by default its
    threads' worth), so what waits in this queue can never hold another queue's threads or prefetch.
    A prefetch above the threads keeps jobs ready beside those in hand (REACH_POOL_PREFETCH_PER_THREAD):
    a thread that finishes one takes the next at once, instead of sleeping until the broker has
    seen the ack and sent another."""

    queue: str
    handle: Handler
    threads: int
    thread_name: str = "reach-pool"
    prefetch: int | None = None  # None: ``threads``


def queue_of(message: Message) -> str:
    """The queue a delivery came from. A connector queue is bound by its own name only (on
    reach.dispatch; the default exchange routes by queue name too), so it is the routing key."""
    info = getattr(message, "delivery_info", None) or {}
    key = info.get("routing_key")
    return key.decode("utf-8", "replace") if isinstance(key, bytes) else str(key or "")


def bulkhead_consumer(bulkheads: Sequence[Bulkhead]) -> type[Consumer]:
    """A consumer class (``app.conf.worker_consumer``) for a pool process serving one queue per
    bulkhead. Run the worker with ``-P solo``, ``-Q`` every bulkhead's queue and a prefetch
    (``worker_prefetch_multiplier``) of at least the sum of their prefetches: that channel-wide limit
    then never binds, each queue's own does.

    Every queue's messages go to its own FIFO and its own threads. The queues share one channel,
    and each gets its own prefetch: RabbitMQ applies a ``basic.qos`` with ``global=false`` to each
    consumer created after it, so the consumer sets it right before consuming each queue (at
    start, after a reconnect, and when a paused queue is consumed again). Warm shutdown finishes
    every message held, in every bulkhead."""
    if not bulkheads:
        raise ValueError("a pool consumes at least one queue")
    pools = {b.queue: _Threads(b.handle, b.threads, b.thread_name, FairLanes()) for b in bulkheads}
    if len(pools) != len(bulkheads):
        raise ValueError("one bulkhead per queue")
    prefetch = {b.queue: b.prefetch or b.threads for b in bulkheads}
    settles = _Settles()

    class BulkheadConsumer(ReachConsumer):
        def _prefetch_for(self, queue: str) -> None:
            """The next consumer on the channel (this queue's) holds at most its prefetch."""
            self.task_consumer.channel.basic_qos(0, prefetch[queue], False)

        def create_task_handler(self, promise: Any = None) -> Callable[[Message], None]:
            for pool in pools.values():
                pool.start(lambda settle, message: settles.add(settle, message, self.call_soon), lambda: None)

            def on_message(message: Message) -> None:
                pool = pools.get(queue_of(message))
                if pool is None:
                    # only a binding the fleet never makes routes here under another key: it would
                    # come back on every delivery, so it is refused for good (logged, not run)
                    log.error(
                        "refusing message %s: it came with routing key %r, which names none of %s",
                        message.properties.get("message_id"),
                        queue_of(message)[:255],
                        sorted(pools),
                    )
                    settle_safely(lambda: message.reject(requeue=False), message)
                elif not pool.lanes.offer(ANONYMOUS, message, held_size(message)):
                    settle_safely(message.requeue, message)  # shutting down: back to the queue

            # Celery consumes every selected queue in one go (one prefetch for all); instead each
            # queue is consumed on its own, after its own prefetch. The loop's consume() that
            # follows finds them all consumed already.
            consumer = self.task_consumer
            consumer.on_message = on_message
            selected = consumer.queues
            consumer.queues = []
            for queue in selected:
                self._prefetch_for(queue.name)
                consumer.add_queue(queue)
                consumer.consume()
            return on_message

        def add_task_queue(self, queue: str, *args: Any, **kwargs: Any) -> None:
            """Consume ``queue`` again (the pause watcher's resume), with its own prefetch."""
            if queue in pools and not self.task_consumer.consuming_from(queue):
                self._prefetch_for(queue)
            super().add_task_queue(queue, *args, **kwargs)

        def shutdown(self) -> None:
            for pool in pools.values():
                pool.close(drain=True)
            for pool in pools.values():
                pool.join()
            settles.flush()  # their acks, before the connection closes
            super().shutdown()

    return BulkheadConsumer
