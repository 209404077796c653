"""The pool's pause watcher: a consumer bootstep that follows the pause flag in Redis
(``reach pause``/``resume``), cancelling and re-adding the queue on the consumer's own loop."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import redis
from celery import Celery, bootsteps

from workers.state.control import PoolStatus, is_paused

log = logging.getLogger("reach.control")
CHECK_EVERY = 1.0


def install_pause_watcher(
    app: Celery,
    client: redis.Redis,
    connector: str,
    queue: str,
    status: PoolStatus,
    on_change: Callable[[bool], None] = lambda paused: None,
) -> None:
    """``on_change(paused)`` is told the state after every check (the readiness probe's detail)."""

    class PauseWatcher(bootsteps.StartStopStep):
        """Reconciles consuming with the pause flag on the consumer's own loop."""

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
            try:
                paused = is_paused(client, connector)
            except redis.RedisError as exc:
                log.warning("cannot read the pause flag: %s", exc)
                return
            # the queue is in the consumer's list before it actually consumes: checking the list
            # lets a pool started while paused cancel before it takes a single message
            consuming = consumer.task_consumer is not None and any(
                q.name == queue for q in consumer.task_consumer.queues
            )
            if paused and consuming:
                log.info("paused: stop consuming %s", queue)
                consumer.cancel_task_queue(queue)
            elif not paused and not consuming:
                log.info("resumed: consuming %s again", queue)
                consumer.add_task_queue(queue)
            status.consuming = not paused
            on_change(paused)
            try:
                status.publish()
            except redis.RedisError:
                pass

    app.steps["consumer"].add(PauseWatcher)
