"""Steering pools without touching them: pause/resume flags and per-worker status in Redis.

``reach pause CONNECTOR`` only sets ``reach:paused:<connector>``; every pool of that connector
checks the flag on its own event loop each second and stops (or restarts) consuming its queue.
A pool started while paused stays paused, so scaling up or restarting cannot undo a pause.
Intents meanwhile wait in the queue: nothing is rejected or lost.
"""
from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any

import redis
from celery import Celery, bootsteps

from workers import keys

log = logging.getLogger("reach.control")
CHECK_EVERY = 1.0


def set_paused(client: redis.Redis, connector: str, paused: bool) -> None:
    if paused:
        client.set(keys.paused(connector), str(time.time()))
    else:
        client.delete(keys.paused(connector))


def is_paused(client: redis.Redis, connector: str) -> bool:
    return bool(client.exists(keys.paused(connector)))


class PoolStatus:
    """What a pool process tells `reach status`: in-flight count, paused or not, refreshed every
    second into a hash field that disappears a few seconds after the process does."""

    def __init__(self, client: redis.Redis, connector: str, worker_id: str) -> None:
        self._client = client
        self._connector = connector
        self._worker_id = worker_id
        self._lock = threading.Lock()
        self.in_flight = 0
        self.consuming = True

    def enter(self) -> None:
        with self._lock:
            self.in_flight += 1

    def leave(self) -> None:
        with self._lock:
            self.in_flight -= 1

    def publish(self) -> None:
        doc = json.dumps({"in_flight": self.in_flight, "consuming": self.consuming, "seen": time.time()})
        pipe = self._client.pipeline(transaction=False)
        pipe.hset(keys.workers(self._connector), self._worker_id, doc)
        pipe.expire(keys.workers(self._connector), 30)
        pipe.execute()

    def record_error(self, code: str, message: str) -> None:
        try:
            self._client.set(keys.last_error(self._connector),
                             json.dumps({"at": time.time(), "code": code, "message": message[:300]}), ex=7 * 24 * 3600)
        except redis.RedisError:
            pass


def live_workers(client: redis.Redis, connector: str, stale_after: float = 5.0) -> list[dict[str, Any]]:
    now = time.time()
    found = []
    for worker_id, raw in client.hgetall(keys.workers(connector)).items():
        doc = json.loads(raw)
        if now - doc.get("seen", 0) < stale_after:
            found.append({"worker": worker_id.decode(), **doc})
    return found


def install_pause_watcher(app: Celery, client: redis.Redis, connector: str, queue: str, status: PoolStatus) -> None:
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
            consuming = consumer.task_consumer is not None and any(q.name == queue for q in consumer.task_consumer.queues)
            if paused and consuming:
                log.info("paused: stop consuming %s", queue)
                consumer.cancel_task_queue(queue)
            elif not paused and not consuming:
                log.info("resumed: consuming %s again", queue)
                consumer.add_task_queue(queue)
            status.consuming = not paused
            from workers.probes import PROBE

            PROBE.detail = "paused (idle on purpose)" if paused else "consuming"
            try:
                status.publish()
            except redis.RedisError:
                pass

    app.steps["consumer"].add(PauseWatcher)
