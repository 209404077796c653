"""A real Prometheus server for tests: the Debian package's binary, our own process, config and
TSDB in a temporary directory, on a free loopback port, scraping given targets every second.

The Debian package's own service is never used (it may or may not have been started by apt).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from tests.fleet import free_port

SCRAPE_INTERVAL = 1.0


def ensure_installed() -> None:
    """Install the Debian package when prometheus or promtool is missing (root, apt; as .ci/test does)."""
    if shutil.which("prometheus") and shutil.which("promtool"):
        return
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    install = ["apt-get", "install", "-y", "--no-install-recommends", "prometheus"]
    if subprocess.run(install, env=env, capture_output=True, timeout=600).returncode != 0:
        subprocess.run(["apt-get", "update", "-qq"], env=env, capture_output=True, timeout=600, check=True)
        subprocess.run(install, env=env, capture_output=True, timeout=600, check=True)
    if not (shutil.which("prometheus") and shutil.which("promtool")):
        raise RuntimeError("the prometheus package did not provide prometheus and promtool")


def promtool_check_metrics(exposition: bytes) -> subprocess.CompletedProcess[bytes]:
    """`promtool check metrics` on one scrape (exit 0 and no output when it is clean)."""
    return subprocess.run(["promtool", "check", "metrics"], input=exposition, capture_output=True, timeout=30)


class PrometheusServer:
    def __init__(self, jobs: dict[str, list[int]]) -> None:
        """``jobs``: job name -> metrics ports on 127.0.0.1."""
        self.dir = Path(tempfile.mkdtemp(prefix="reach-test-prometheus-"))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.jobs = dict(jobs)
        self.proc: subprocess.Popen[bytes] | None = None

    def _write_config(self) -> Path:
        lines = [
            "global:",
            f"  scrape_interval: {SCRAPE_INTERVAL:g}s",
            f"  scrape_timeout: {SCRAPE_INTERVAL:g}s",
            f"  evaluation_interval: {SCRAPE_INTERVAL:g}s",
            "scrape_configs:",
        ]
        for job, ports in self.jobs.items():
            targets = ", ".join(f'"127.0.0.1:{p}"' for p in ports)
            lines += [f"  - job_name: {job}", "    static_configs:", f"      - targets: [{targets}]"]
        path = self.dir / "prometheus.yml"
        path.write_text("\n".join(lines) + "\n")
        return path

    def start(self, timeout: float = 30.0) -> PrometheusServer:
        config = self._write_config()
        check = subprocess.run(["promtool", "check", "config", str(config)], capture_output=True, timeout=30)
        if check.returncode != 0:
            raise RuntimeError(f"bad prometheus config: {check.stdout!r} {check.stderr!r}")
        log = open(self.dir / "prometheus.log", "ab")
        self.proc = subprocess.Popen(
            [
                "prometheus",
                f"--config.file={config}",
                f"--storage.tsdb.path={self.dir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--storage.tsdb.retention.time=1h",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=self.dir,
        )
        deadline = time.time() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited with {self.proc.returncode}: {self.log()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as response:
                    if response.status == 200:
                        break
            except (OSError, urllib.error.URLError):
                pass
            if time.time() > deadline:
                raise RuntimeError(f"prometheus not ready after {timeout:g} s: {self.log()[-2000:]}")
            time.sleep(0.1)
        self.wait_targets_up(timeout=deadline - time.time())
        return self

    def log(self) -> str:
        path = self.dir / "prometheus.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def set_targets(self, job: str, ports: list[int]) -> None:
        """Point ``job`` at other ports (a process was restarted) and reload the configuration."""
        assert self.proc is not None
        self.jobs[job] = list(ports)
        self._write_config()
        os.kill(self.proc.pid, signal.SIGHUP)
        self.wait_targets_up()

    def wait_targets_up(self, timeout: float = 20.0) -> None:
        wanted = {f"127.0.0.1:{p}" for ports in self.jobs.values() for p in ports}
        deadline = time.time() + timeout
        while True:
            try:
                active = self.api("targets")["activeTargets"]
                up = {t["labels"]["instance"] for t in active if t["health"] == "up"}
                known = {t["labels"]["instance"] for t in active}
                if wanted <= up and known <= wanted:
                    return
            except (OSError, urllib.error.URLError, KeyError):
                pass
            if time.time() > deadline:
                raise RuntimeError(f"scrape targets not all up: wanted {wanted}; {self.log()[-2000:]}")
            time.sleep(0.2)

    def api(self, endpoint: str, **params: str) -> Any:
        """GET /api/v1/<endpoint>; returns ``data``, raises with Prometheus's error otherwise."""
        query = urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/{endpoint}?{query}", timeout=10) as response:
                doc = json.load(response)
        except urllib.error.HTTPError as exc:
            doc = json.load(exc)
        if doc.get("status") != "success":
            raise PromQLError(f"{endpoint} {params}: {doc.get('errorType')}: {doc.get('error')}")
        return doc["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """Instant query; the result vector (``[{"metric": {...}, "value": [t, "v"]}, ...]``)."""
        data = self.api("query", query=expr)
        if data["resultType"] != "vector":
            raise PromQLError(f"{expr}: a {data['resultType']}, not a vector")
        return list(data["result"])

    def values(self, expr: str, label: str) -> dict[str, float]:
        """``{label value: sample value}`` of an instant query aggregated by one label."""
        return {row["metric"].get(label, ""): float(row["value"][1]) for row in self.query(expr)}

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)
        shutil.rmtree(self.dir, ignore_errors=True)


class PromQLError(RuntimeError):
    pass
