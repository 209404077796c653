"""Variant c: the real fleet, started exactly as tests/fleet.py starts it — ``python -m
workers.ops.cli router`` and ``python -m workers.ops.cli worker NAME`` subprocesses, each in its own
session, with REACH_CATALOG, REACH_BROKER_URL, REACH_REDIS_URL, REACH_LOG_LEVEL=INFO and a
REACH_METRICS_PORT of its own."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

from common import PYTHON, REPO, Procs, free_port, queue_state


class ReachFleet:
    def __init__(self, procs: Procs, catalog_dir: Path, broker_url: str, redis_url: str, prefix: str = "fleet") -> None:
        self.procs = procs
        self.catalog_dir = catalog_dir
        self.broker_url = broker_url
        self.env = dict(
            os.environ,
            REACH_CATALOG=str(catalog_dir),
            REACH_BROKER_URL=broker_url,
            REACH_REDIS_URL=redis_url,
            REACH_LOG_LEVEL="INFO",
            PYTHONUNBUFFERED="1",
        )
        self.prefix = prefix
        self.metrics_ports: dict[str, int] = {}
        self.names: list[str] = []

    def _start(self, name: str, args: list[str]) -> None:
        port = free_port()
        self.metrics_ports[name] = port
        proc_name = f"{self.prefix}-{name}"
        self.procs.start(
            proc_name,
            [PYTHON, "-m", "workers.ops.cli", *args],
            env=dict(self.env, REACH_METRICS_PORT=str(port)),
            cwd=REPO,
        )
        self.names.append(proc_name)

    def start_router(self) -> None:
        self._start("router", ["router"])

    def start_pool(self, connector: str) -> None:
        self._start(connector, ["worker", connector])

    def pid(self, name: str) -> int:
        return self.procs.items[f"{self.prefix}-{name}"].pid

    def wait_consuming(self, queue: str, timeout: float = 120.0) -> float:
        t0 = time.time()
        while True:
            self.procs.check_alive(*self.names)
            try:
                if queue_state(self.broker_url, queue)[1] > 0:
                    return time.time() - t0
            except Exception:
                pass
            if time.time() - t0 > timeout:
                raise RuntimeError(f"{queue} has no consumer after {timeout:g} s; see {self.procs.log_dir}")
            time.sleep(0.2)

    def stop(self, name: str) -> None:
        full = f"{self.prefix}-{name}"
        self.procs.stop(full)
        if full in self.names:
            self.names.remove(full)

    def stop_all(self) -> None:
        """Stop this fleet's processes together (SIGTERM to each process group, then wait)."""
        self.procs.stop_many(list(self.names))
        self.names.clear()

    def metrics(self, name: str) -> dict[str, float]:
        """The process's reach_* counters (labels folded into the key)."""
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
