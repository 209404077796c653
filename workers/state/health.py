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
from dataclasses import dataclass

import httpx
import redis

from connectors.auth import build_auth
from connectors.spec import ConnectorSpec, split_path
from workers.state import keys

log = logging.getLogger("reach.beat")
DEFAULT_INTERVAL = 10.0
FAILURES_BEFORE_DOWN = 2  # one lost probe is not an outage


@dataclass(frozen=True)
class ProbeResult:
    healthy: bool
    detail: str


def probe(connector: ConnectorSpec, client: httpx.Client) -> ProbeResult:
    """One health probe: the declared ``health.path`` must answer 2xx; without one, a GET of the
    endpoint counts any answer below 500 (a 404 on / still proves the system is up)."""
    method, path = split_path(connector.health.path) if connector.health else ("GET", "/")
    url = connector.endpoint + (path if path != "/" or connector.health else "")
    interval = connector.health.interval if connector.health else DEFAULT_INTERVAL
    try:
        response = client.request(method, url, timeout=min(5.0, interval))
    except httpx.HTTPError as exc:
        return ProbeResult(False, f"{type(exc).__name__}")
    ok = 200 <= response.status_code < 300 if connector.health else response.status_code < 500
    return ProbeResult(ok, f"HTTP {response.status_code}")


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
        self, connectors: list[ConnectorSpec], board: HealthBoard, heartbeat: Callable[[], None] = lambda: None
    ) -> None:
        """``heartbeat`` is called from beat's own loop every half second (its liveness probe)."""
        self._connectors = connectors
        self._board = board
        self._heartbeat = heartbeat
        self._stop = threading.Event()

    def run(self) -> None:
        threads = [
            threading.Thread(target=self._loop, args=(c,), name=f"beat-{c.name}", daemon=True) for c in self._connectors
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

    def stop(self) -> None:
        self._stop.set()

    def _loop(self, connector: ConnectorSpec) -> None:
        interval = connector.health.interval if connector.health else DEFAULT_INTERVAL
        failures = 0
        with httpx.Client(
            auth=build_auth(connector.auth, connector.name), follow_redirects=False, trust_env=False
        ) as client:
            while not self._stop.is_set():
                started = time.monotonic()
                result = probe(connector, client)
                failures = 0 if result.healthy else failures + 1
                healthy = failures < FAILURES_BEFORE_DOWN
                try:
                    self._board.mark(connector.name, healthy, interval)
                except redis.RedisError as exc:
                    log.error("cannot record health of %s: %s", connector.name, exc)
                if not result.healthy:
                    log.warning(
                        "health %s: %s (%s)", connector.name, result.detail, "down" if not healthy else "suspect"
                    )
                self._stop.wait(max(0.0, interval - (time.monotonic() - started)))
