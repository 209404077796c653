"""Steering pools without touching them: pause/resume flags and per-worker status in Redis.

``reach pause CONNECTOR`` only sets ``reach:paused:<connector>``; every pool of that connector
checks the flag on its own event loop each second (``workers.transport.pause``) and stops (or
restarts) consuming its queue. A pool started while paused stays paused, so scaling up or
restarting cannot undo a pause. Intents meanwhile wait in the queue: nothing is rejected or lost.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any

import redis

from workers.state import keys

log = logging.getLogger("reach.control")


def set_paused(client: redis.Redis, connector: str, paused: bool) -> None:
    if paused:
        client.set(keys.paused(connector), str(time.time()))
    else:
        client.delete(keys.paused(connector))


def is_paused(client: redis.Redis, connector: str) -> bool:
    return bool(client.exists(keys.paused(connector)))


def paused_flags(client: redis.Redis, connectors: list[str]) -> list[bool]:
    """``is_paused`` of each connector, in one round trip (a pool group checks them every second)."""
    pipe = client.pipeline(transaction=False)
    for connector in connectors:
        pipe.exists(keys.paused(connector))
    return [bool(found) for found in pipe.execute()]


class PoolStatus:
    """What a pool process tells `reach status`: in-flight count, paused or not, refreshed every
    second into a hash field that disappears a few seconds after the process does."""

    def __init__(self, client: redis.Redis, connector: str, worker_id: str, group: str | None = None) -> None:
        self._client = client
        self._connector = connector
        self._worker_id = worker_id
        self._group = group  # the pool group (`reach worker A B C`) this connector runs in, if any
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
        pipe = self._client.pipeline(transaction=False)
        self.publish_into(pipe)
        pipe.execute()

    def publish_into(self, pipe: Any) -> None:
        """The status, as commands on a pipeline (a group's connectors publish in one round trip)."""
        status: dict[str, Any] = {"in_flight": self.in_flight, "consuming": self.consuming, "seen": time.time()}
        if self._group is not None:
            status["group"] = self._group
        pipe.hset(keys.workers(self._connector), self._worker_id, json.dumps(status))
        pipe.expire(keys.workers(self._connector), 30)

    def record_error(self, code: str, message: str) -> None:
        try:
            self._client.set(
                keys.last_error(self._connector),
                json.dumps({"at": time.time(), "code": code, "message": message[:300]}),
                ex=7 * 24 * 3600,
            )
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
