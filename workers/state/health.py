"""Health checks: ``reach beat`` probes every connector and marks it up or down in Redis.

A connector marked down is treated by the router like an open breaker (CONNECTOR_UNAVAILABLE)
until a probe succeeds again. The mark expires after three intervals, so a stopped beat never
leaves a connector blocked: no news reads as "unknown", which the router lets through.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import redis

from connectors.adapters.base import Adapter, ProbeResult
from connectors.spec import ConnectorSpec
from workers.state import keys

log = logging.getLogger("reach.beat")
DEFAULT_INTERVAL = 10.0
FAILURES_BEFORE_DOWN = 2  # one lost probe is not an outage


class HealthBoard:
    """The up/down marks in Redis."""

    def __init__(self, client: redis.Redis) -> None:
        self._client = client

    def mark(self, connector: str, healthy: bool, interval: float) -> None:
        self._client.set(keys.health(connector), "up" if healthy else "down", px=int(interval * 3000))

    def status(self, connector: str) -> str:
        raw = self._client.get(keys.health(connector))
        return "unknown" if raw is None else raw.decode()


class Beat:
    """Probes each connector on its own interval, in its own thread."""

    def __init__(
        self,
        targets: list[tuple[ConnectorSpec, Adapter]],
        board: HealthBoard,
        heartbeat: Callable[[], None] = lambda: None,
    ) -> None:
        """Each connector is probed through its own adapter (``Adapter.probe``); ``heartbeat`` is
        called from beat's own loop every half second (its liveness probe)."""
        self._targets = targets
        self._board = board
        self._heartbeat = heartbeat
        self._stop = threading.Event()

    def run(self) -> None:
        threads = [
            threading.Thread(target=self._loop, args=(c, a), name=f"beat-{c.name}", daemon=True)
            for c, a in self._targets
        ]
        for thread in threads:
            thread.start()
        try:
            while not self._stop.wait(0.5):
                self._heartbeat()  # beat's own loop: liveness fails if it stalls
        finally:
            self._stop.set()
            for thread in threads:
                thread.join(timeout=6)
            for _, adapter in self._targets:
                adapter.close()

    def stop(self) -> None:
        self._stop.set()

    def _loop(self, connector: ConnectorSpec, adapter: Adapter) -> None:
        interval = connector.health.interval if connector.health else DEFAULT_INTERVAL
        failures = 0
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                result = adapter.probe(min(5.0, interval))
            except Exception as exc:  # an adapter's bug must not stop the other probes
                result = ProbeResult(False, f"probe failed: {type(exc).__name__}")
            failures = 0 if result.healthy else failures + 1
            healthy = failures < FAILURES_BEFORE_DOWN
            try:
                self._board.mark(connector.name, healthy, interval)
            except redis.RedisError as exc:
                log.error("cannot record health of %s: %s", connector.name, exc)
            if not result.healthy:
                log.warning("health %s: %s (%s)", connector.name, result.detail, "down" if not healthy else "suspect")
            self._stop.wait(max(0.0, interval - (time.monotonic() - started)))
