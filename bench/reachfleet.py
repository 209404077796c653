"""Variant c: the real fleet, started exactly as the tests start it — ``python -m workers.cli
router`` and ``python -m workers.cli worker NAME`` subprocesses from ``workers.ops.local_fleet``
(the harness reach demo and tests/fleet.py use), each in its own session, with REACH_CATALOG,
REACH_BROKER_URL, REACH_REDIS_URL, REACH_LOG_LEVEL=INFO and a REACH_METRICS_PORT of its own."""

from __future__ import annotations

import re
from pathlib import Path

from common import Procs

from workers.ops.local_fleet import FleetProcesses


class ReachFleet(FleetProcesses):
    """Processes are named ``<prefix>-router``, ``<prefix>-<connector>`` in the run's registry."""

    def __init__(
        self,
        procs: Procs,
        catalog_dir: Path,
        broker_url: str,
        redis_url: str,
        prefix: str = "fleet",
        cwd: Path | None = None,
    ) -> None:
        """``cwd``: another source tree to run (bench/recovery.py's ``--base``), else this one."""
        if cwd is None:
            super().__init__(procs, catalog_dir, broker_url, redis_url, prefix=f"{prefix}-")
        else:
            super().__init__(procs, catalog_dir, broker_url, redis_url, prefix=f"{prefix}-", cwd=cwd)
        self.procs = procs
        self.catalog_dir = catalog_dir

    def counters(self, name: str) -> dict[str, float]:
        """The process's reach_* counters (labels folded into the key); not ``metrics``, which
        FleetProcesses keeps for whether the processes serve them."""
        import httpx

        try:
            text = httpx.get(f"http://127.0.0.1:{self.metrics_ports[name]}/metrics", timeout=10, trust_env=False).text
        except Exception as exc:
            return {"error": str(exc)}  # type: ignore[dict-item]
        out: dict[str, float] = {}
        for line in text.splitlines():
            m = re.match(r"^(reach_[a-z_]+_total)(\{[^}]*\})?\s+([0-9.e+-]+)$", line)
            if m:
                out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
        return out
