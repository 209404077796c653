"""``reach beat`` removes agents' exchange-to-exchange bindings every REACH_BINDING_SWEEP_SECONDS.

Permissions cannot forbid them (see :mod:`workers.ops.broker_policy`), and such a binding of an
agent's own lives on after the agent is gone; the fleet itself makes none. So the bound on them is
time: a binding lasts until the next sweep, at most one interval (300 s by default). The sweep
runs rabbitmqctl (REACH_RABBITMQCTL); where it cannot (a container without it, a broker on
another host) each sweep fails with a logged warning and ``reach_binding_sweeps{outcome="failed"}``,
and the beat goes on probing: then the bound is an operator's ``reach agent-user sweep-bindings``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from workers.observability.metrics import BINDING_SWEEPS
from workers.ops.agents import AgentUserError, sweep_agent_bindings, vhost_of
from workers.settings import Settings

log = logging.getLogger("reach.beat")


class BindingSweep:
    """Sweeps once per ``interval`` seconds in a thread of its own, the first after one interval."""

    def __init__(self, interval: float, sweep: Callable[[], int]) -> None:
        self._interval = interval
        self._sweep = sweep
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def from_settings(cls, settings: Settings) -> BindingSweep | None:
        """The beat's sweep of the broker's vhost; None when REACH_BINDING_SWEEP_SECONDS is 0."""
        if settings.binding_sweep_seconds <= 0:
            return None
        vhost = vhost_of(settings.broker_url)
        return cls(settings.binding_sweep_seconds, lambda: sweep_agent_bindings(vhost, settings.rabbitmqctl))

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="beat-binding-sweep", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def join(self, timeout: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def sweep_once(self) -> int | None:
        """One sweep; the number of bindings removed, or None when it failed (logged and counted)."""
        try:
            removed = self._sweep()
        except AgentUserError as exc:
            BINDING_SWEEPS.labels(outcome="failed").inc()
            log.warning("agents' exchange bindings not swept (they stay until a sweep works): %s", exc)
            return None
        BINDING_SWEEPS.labels(outcome="swept").inc()
        if removed:
            log.warning("removed %d exchange-to-exchange binding(s) an agent made from reach.receipts", removed)
        return removed

    def _loop(self) -> None:
        while not self._stop.wait(self._interval):
            self.sweep_once()
