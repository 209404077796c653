"""A Celery consumer that hands each raw message to a handler on a thread pool, no task machinery.

The router and the pools both use it. Celery still runs the worker — connection and reconnects,
QoS (prefetch), bootsteps (pause watcher, readiness probe), signals, warm shutdown — but a message
is never looked up as a task by name: the handler reads the body as data, so nothing a message
says can make the worker run something else, and Celery's per-task bookkeeping (request objects,
tracer, its own thread pool) is not paid for each intent.

The handler returns what must then happen to the message (ack, or requeue); that goes back to the
consumer's loop through ``call_soon``, because a channel belongs to one thread.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
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
        log.warning("could not settle message %s (%s); the broker redelivers it", message.properties.get("message_id"),
                    exc)


def threaded_consumer(handle: Handler, threads: int, thread_name_prefix: str) -> type[Consumer]:
    """A consumer class (``app.conf.worker_consumer``) running ``handle`` on ``threads`` threads.
    Run the worker with ``-P solo`` and a prefetch of ``threads`` (or more) messages."""
    executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix=thread_name_prefix)

    class ThreadedConsumer(Consumer):
        def create_task_handler(self, promise: Any = None) -> Callable[[Message], None]:  # type: ignore[override]
            call_soon = self.call_soon

            def run(message: Message) -> None:
                try:
                    settle = handle(message)
                except BaseException:  # handlers never raise for a message; this is a last resort
                    log.exception("handling a message crashed; it will be redelivered")
                    settle = message.requeue
                call_soon(settle_safely, settle, message)

            def on_message(message: Message) -> None:
                executor.submit(run, message)

            return on_message

        def shutdown(self) -> None:
            executor.shutdown(wait=True)  # warm shutdown: what is in flight finishes first
            super().shutdown()

    return ThreadedConsumer
