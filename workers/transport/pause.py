"""The pool's pause watcher: a consumer bootstep that follows the pause flags in Redis
(``reach pause``/``resume``), cancelling and re-adding each connector's queue on the consumer's own
loop. A pool group (``reach worker A B C``) has one watcher for all its connectors: one round trip
reads every flag, one writes every connector's status; pausing one connector leaves the others
consuming."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import redis
from celery import Celery, bootsteps

from workers.state.control import PoolStatus, paused_flags

log = logging.getLogger("reach.control")
CHECK_EVERY = 1.0


@dataclass(frozen=True)
class Watched:
    """One connector of a pool process: its queue, and the status it reports to `reach status`."""

    connector: str
    queue: str
    status: PoolStatus


def install_pause_watcher(
    app: Celery,
    client: redis.Redis,
    watched: Sequence[Watched],
    on_change: Callable[[list[str]], None] = lambda paused: None,
) -> None:
    """``on_change(paused)`` is told the paused connectors after every check (the readiness probe's detail)."""
    connectors = [w.connector for w in watched]

    class PauseWatcher(bootsteps.StartStopStep):
        """Reconciles consuming with the pause flags on the consumer's own loop."""

        requires = {"celery.worker.consumer.tasks:Tasks"}

        def __init__(self, consumer: Any, **kwargs: Any) -> None:
            super().__init__(consumer, **kwargs)
            self.tref: Any = None

        def start(self, consumer: Any) -> None:
            self._check(consumer)
            self.tref = consumer.timer.call_repeatedly(CHECK_EVERY, self._check, (consumer,))

        def stop(self, consumer: Any) -> None:
            if self.tref is not None:
                self.tref.cancel()
                self.tref = None

        def _check(self, consumer: Any) -> None:
            if consumer.task_consumer is None:
                return
            try:
                flags = paused_flags(client, connectors)
            except redis.RedisError as exc:
                log.warning("cannot read the pause flags: %s", exc)
                return
            # a queue is in the consumer's list before it actually consumes: checking the list
            # lets a pool started while paused cancel before it takes a single message
            listed = {q.name for q in consumer.task_consumer.queues}
            for one, paused in zip(watched, flags):
                consuming = one.queue in listed
                if paused and consuming:
                    log.info("paused: stop consuming %s", one.queue)
                    consumer.cancel_task_queue(one.queue)
                elif not paused and not consuming:
                    log.info("resumed: consuming %s again", one.queue)
                    consumer.add_task_queue(one.queue)
                one.status.consuming = not paused
            on_change([c for c, paused in zip(connectors, flags) if paused])
            try:
                pipe = client.pipeline(transaction=False)
                for one in watched:
                    one.status.publish_into(pipe)
                pipe.execute()
            except redis.RedisError:
                pass

    app.steps["consumer"].add(PauseWatcher)
