"""Test harness: a real fleet (``reach router`` + ``reach worker`` processes) on the real broker."""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from kombu import Connection

from producers.client import ReachClient, ReachError
from workers.transport.topology import INTENTS_QUEUE, connector_queue

REPO = Path(__file__).resolve().parent.parent
SHARED_BROKER_URL = os.environ.get("REACH_BROKER_URL", "amqp://guest:guest@127.0.0.1:5672//")
SHARED_REDIS_URL = os.environ.get("REACH_REDIS_URL", "redis://127.0.0.1:6379/0")


def _isolated() -> tuple[str, str]:
    """A vhost and a Redis database of this test run's own, so two runs on one machine (a developer
    and CI, or parallel sessions) never consume each other's intents or share breaker state.

    Needs rabbitmqctl next to the broker (as `bash .ci/test` sets up); REACH_TEST_ISOLATE=0, or a
    remote broker, uses the given URLs as they are.
    """
    from urllib.parse import quote, urlunsplit

    parts = urlsplit(SHARED_BROKER_URL)
    local = parts.hostname in ("localhost", "127.0.0.1", "::1")
    if os.environ.get("REACH_TEST_ISOLATE", "1") == "0" or not local or shutil.which("rabbitmqctl") is None:
        return SHARED_BROKER_URL, SHARED_REDIS_URL
    vhost = f"reach-test-{os.getpid()}"
    user = parts.username or "guest"
    try:
        subprocess.run(["rabbitmqctl", "add_vhost", vhost], check=True, capture_output=True, timeout=60)
        subprocess.run(
            ["rabbitmqctl", "set_permissions", "-p", vhost, user, ".*", ".*", ".*"],
            check=True,
            capture_output=True,
            timeout=60,
        )
    except (subprocess.SubprocessError, OSError):
        return SHARED_BROKER_URL, SHARED_REDIS_URL  # not ours to manage: share (and run alone)
    atexit.register(lambda: subprocess.run(["rabbitmqctl", "delete_vhost", vhost], capture_output=True, timeout=60))
    broker = urlunsplit(parts._replace(path="/" + quote(vhost, safe="")))
    redis_parts = urlsplit(SHARED_REDIS_URL)
    # parallel workers of one run (pytest-xdist: gw0, gw1, ...) get databases of their own
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    database = 1 + (int(worker[2:]) if worker[2:].isdigit() else os.getpid()) % 15
    redis_url = urlunsplit(redis_parts._replace(path=f"/{database}"))
    return broker, redis_url


BROKER_URL, REDIS_URL = _isolated()


def reachable(url: str, default_port: int) -> bool:
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or default_port), timeout=2):
            return True
    except OSError:
        return False


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def queue_depth(name: str) -> tuple[int, int]:
    """(messages ready, consumers) of a queue."""
    with Connection(BROKER_URL) as conn:
        channel = conn.channel()
        try:
            result = channel.queue_declare(name, passive=True)
            return int(result.message_count), int(result.consumer_count)
        finally:
            channel.close()


def purge(*names: str) -> None:
    with Connection(BROKER_URL) as conn:
        channel = conn.channel()
        for name in names:
            try:
                channel.queue_purge(name)
            except Exception:  # not declared yet: nothing to purge
                channel = conn.channel()
        channel.close()


class Fleet:
    """Starts the router and one pool per named connector against a catalog text."""

    def __init__(
        self, catalog_yaml: str, pools: list[str], *, env: dict[str, str] | None = None, log_dir: Path | None = None
    ) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="reach-test-catalog-"))
        (self.dir / "catalog.yaml").write_text(catalog_yaml)
        self.pools = pools
        self.log_dir = log_dir or self.dir
        self.env = dict(
            os.environ,
            REACH_CATALOG=str(self.dir),
            REACH_BROKER_URL=BROKER_URL,
            REACH_REDIS_URL=REDIS_URL,
            REACH_LOG_LEVEL="INFO",
            **(env or {}),
        )
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, timeout: float = 60.0) -> Fleet:
        purge(INTENTS_QUEUE.name, *(connector_queue(p).name for p in self.pools))
        self.start_process("router", ["router"])
        for pool in self.pools:
            self.start_process(pool, ["worker", pool])
        deadline = time.time() + timeout
        for pool in self.pools:
            while True:
                self.check_alive()
                try:
                    if queue_depth(connector_queue(pool).name)[1] > 0:
                        break
                except Exception:
                    pass
                if time.time() > deadline:
                    raise RuntimeError(f"pool {pool} did not start consuming; see {self.log_dir}")
                time.sleep(0.2)
        # the router is ready when it answers
        # the probe sends as the broker login with user_id set, so it is answered in every identity mode
        login = urlsplit(BROKER_URL).username or "guest"
        while True:  # on a fresh vhost the exchanges exist once the router (or a pool) has declared them
            self.check_alive()
            try:
                probe = ReachClient(login, BROKER_URL, authenticated=True)
                break
            except ReachError:
                if time.time() > deadline:
                    raise RuntimeError(f"the fleet's exchanges were never declared; see {self.log_dir}") from None
                time.sleep(0.2)
        with probe:
            while True:
                self.check_alive()
                try:
                    probe.call("reach.list_tools", {}, timeout=2)
                    break
                except TimeoutError:
                    if time.time() > deadline:
                        raise RuntimeError(f"router did not answer; see {self.log_dir}") from None
        return self

    def start_process(
        self, name: str, args: list[str], extra_env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        log = open(self.log_dir / f"{name}.log", "ab")
        env = dict(self.env, REACH_METRICS_PORT=str(free_port()), **(extra_env or {}))
        proc = subprocess.Popen(
            [sys.executable, "-m", "workers.ops.cli", *args],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=REPO,
        )
        self.procs[name] = proc
        return proc

    def metrics_port(self, name: str) -> int:
        """The REACH_METRICS_PORT the running process ``name`` serves /metrics, /healthz and /readyz on
        (read from the process's own environment, so nothing above has to remember it; Linux only)."""
        proc = self.procs[name]
        deadline = time.time() + 5
        # right after Popen the child's environ can still read empty (exec not finished)
        while not (environ := Path(f"/proc/{proc.pid}/environ").read_bytes()) and time.time() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode}: {self.log(name)[-3000:]}")
            time.sleep(0.02)
        for entry in environ.split(b"\0"):
            if entry.startswith(b"REACH_METRICS_PORT="):
                return int(entry.split(b"=", 1)[1])
        raise KeyError(f"{name} was started without REACH_METRICS_PORT")

    def check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode}: {self.log(name)[-3000:]}")

    def log(self, name: str) -> str:
        path = self.log_dir / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop_process(self, name: str) -> None:
        proc = self.procs.pop(name, None)
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(20)
        except (subprocess.TimeoutExpired, ProcessLookupError):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(10)

    def kill_process(self, name: str) -> int:
        """kill -9 the process group of ``name`` (the process and anything it started), reap it,
        and return its pid. Nothing runs its shutdown code: this is a crash, not a stop."""
        proc = self.procs.pop(name)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(10)
        return proc.pid

    def wait_consuming(self, queue: str, timeout: float = 60.0, consumers: int = 1) -> None:
        """Wait until ``queue`` has at least ``consumers`` consumers (a process started or reconnected)."""
        deadline = time.time() + timeout
        while True:
            try:
                if queue_depth(queue)[1] >= consumers:
                    return
            except Exception:  # broker not back yet
                pass
            if time.time() > deadline:
                raise RuntimeError(f"{queue} has no consumer after {timeout:g} s; see {self.log_dir}")
            time.sleep(0.1)

    def stop(self) -> None:
        """SIGTERM every process group at once, then wait for each (SIGKILL after 20 s): the
        processes shut down side by side, not one after another."""
        procs, self.procs = self.procs, {}
        for proc in procs.values():
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 20
        for proc in procs.values():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait(10)

    def __enter__(self) -> Fleet:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def agent(agent_id: str) -> ReachClient:
    return ReachClient(agent_id, BROKER_URL, drop_duplicates=False)  # tests see the wire as it is
