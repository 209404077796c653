"""Cheap liveness and readiness, served beside /metrics on REACH_METRICS_PORT.

- ``/healthz`` (liveness): the process's own loop touched its heartbeat recently. For Celery
  workers that is a timer on the worker's event loop, so a stalled loop fails the probe; a
  busy pool thread does not (it is not the loop).
- ``/readyz`` (readiness): the worker is consuming from its queue (set when Celery's task
  consumer starts, cleared when it stops, e.g. while the broker connection is being restored).

Never ``celery inspect ping``: that is a broadcast through the broker for every probe.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from celery import Celery, bootsteps
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from workers.observability.http_guard import GuardedHandler, GuardedHTTPServer, HttpLimits

log = logging.getLogger("reach.probes")
STALE_AFTER = 30.0  # seconds without a loop heartbeat before liveness fails
# a thread per connection: a few scrapers and the kubelet need far fewer than the fleet's other servers
MAX_CONNECTIONS, MAX_PER_CLIENT = 32, 8


class ProbeState:
    def __init__(self) -> None:
        self.last_beat = time.monotonic()
        self.ready = False
        self.detail = "starting"

    def beat(self) -> None:
        self.last_beat = time.monotonic()

    def alive(self) -> bool:
        return time.monotonic() - self.last_beat < STALE_AFTER


PROBE = ProbeState()


class _Handler(GuardedHandler):
    server: _ProbeServer

    def log_message(self, *args: Any) -> None:
        pass

    def _send(self, status: int, body: bytes, content_type: str = "text/plain; charset=utf-8") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802
        path = self.path.split("?", 1)[0]
        state = self.server.state
        if path == "/metrics":
            return self._send(200, generate_latest(REGISTRY), CONTENT_TYPE_LATEST)
        if path == "/healthz":
            age = time.monotonic() - state.last_beat
            ok = state.alive()
            return self._send(
                200 if ok else 503, f"{'ok' if ok else 'stalled'}: loop heartbeat {age:.1f}s ago\n".encode()
            )
        if path == "/readyz":
            return self._send(
                200 if state.ready else 503, f"{'ready' if state.ready else 'not ready'}: {state.detail}\n".encode()
            )
        self._send(404, b"try /metrics, /healthz or /readyz\n")


class _ProbeServer(GuardedHTTPServer):
    def __init__(self, port: int, state: ProbeState, limits: HttpLimits) -> None:
        super().__init__(("0.0.0.0", port), _Handler, limits.at_most(MAX_CONNECTIONS, MAX_PER_CLIENT), "probes")
        self.state = state


def serve(port: int | None, state: ProbeState = PROBE, limits: HttpLimits | None = None) -> None:
    """Serve /metrics, /healthz and /readyz on ``port`` (REACH_METRICS_PORT); nothing when unset.

    ``limits``: the REACH_HTTP_* settings (``HttpLimits.from_settings``), capped at
    MAX_CONNECTIONS and MAX_PER_CLIENT; their defaults when not given.
    """
    if port is None:
        return
    server = _ProbeServer(port, state, limits or HttpLimits())
    threading.Thread(target=server.serve_forever, name="reach-metrics", daemon=True).start()
    log.info("metrics and probes on :%d (/metrics /healthz /readyz)", port)


class LoopHeartbeat(bootsteps.StartStopStep):
    """Beats on the worker's own timer: if the event loop stalls, liveness fails."""

    requires = {"celery.worker.components:Timer"}

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        self.tref: Any = None

    def start(self, worker: Any) -> None:
        PROBE.beat()
        self.tref = worker.timer.call_repeatedly(1.0, PROBE.beat)

    def stop(self, worker: Any) -> None:
        if self.tref is not None:
            self.tref.cancel()


class ConsumingReadiness(bootsteps.StartStopStep):
    """Ready while Celery's task consumer runs (it is restarted after a broker reconnect)."""

    requires = {"celery.worker.consumer.tasks:Tasks"}

    def start(self, consumer: Any) -> None:
        PROBE.ready = True
        PROBE.detail = "consuming"

    def stop(self, consumer: Any) -> None:
        PROBE.ready = False
        PROBE.detail = "not consuming (broker connection lost or shutting down)"

    def shutdown(self, consumer: Any) -> None:
        self.stop(consumer)


def install(app: Celery) -> None:
    app.steps["worker"].add(LoopHeartbeat)
    app.steps["consumer"].add(ConsumingReadiness)
