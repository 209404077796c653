"""The processes of a fleet on one machine: ``reach demo``, the test harness and the benchmarks
start, watch and stop the router, pools and beat through here.

Every process runs in a session of its own and is stopped by its process group (what it started
goes with it); nothing here signals a process it did not start.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from kombu import Connection

REPO = Path(__file__).resolve().parents[2]


# A port picked by binding to 0 comes from the kernel's range for outgoing connections, so any
# connect() (to RabbitMQ, Redis) between the pick and the child's bind can take it, and the child
# fails with "Address already in use". Ports are picked below that range, checked bindable on every
# address, and never handed out twice by one process. REACH_LOCAL_PORTS ("lo-hi") narrows the range,
# so parallel test workers pick from ranges of their own.
LOCAL_PORTS = (20000, 32000)
_handed_out: set[int] = set()


def local_port_range() -> tuple[int, int]:
    text = os.environ.get("REACH_LOCAL_PORTS", "")
    low, _, high = text.partition("-")
    if low.isdigit() and high.isdigit() and 1024 <= int(low) < int(high) <= 65535:
        return int(low), int(high)
    return LOCAL_PORTS


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports nothing listens on now and that this process has not handed out."""
    low, high = local_port_range()
    ports: list[int] = []
    for _ in range(20 * (high - low)):
        if len(ports) == count:
            return ports
        port = random.randrange(low, high)
        if port not in _handed_out and _bindable(port):
            _handed_out.add(port)
            ports.append(port)
    raise RuntimeError(f"no {count} free ports between {low} and {high}")


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    argv: list[str] = field(default_factory=list)
    env: dict[str, str] | None = None
    cwd: Path = REPO

    @property
    def pid(self) -> int:
        return self.popen.pid

    def poll(self) -> int | None:
        return self.popen.poll()

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


@dataclass
class ProcessGroup:
    """Every process one run started, by name; each logs to ``log_dir/<name>.log``."""

    log_dir: Path
    items: dict[str, Proc] = field(default_factory=dict)

    def start(
        self,
        name: str,
        argv: list[str],
        env: Mapping[str, str] | None = None,
        *,
        stdout_pipe: bool = False,
        cwd: Path = REPO,
    ) -> Proc:
        """Start ``argv`` in a new session. ``stdout_pipe``: its stdin and stdout are pipes to talk
        to (a driver process), its stderr the log."""
        log_path = self.log_dir / f"{name}.log"
        log_file: IO[bytes] = open(log_path, "ab")
        popen = subprocess.Popen(
            argv,
            env=dict(env) if env is not None else dict(os.environ),
            stdout=subprocess.PIPE if stdout_pipe else log_file,
            stderr=log_file if stdout_pipe else subprocess.STDOUT,
            stdin=subprocess.PIPE if stdout_pipe else subprocess.DEVNULL,
            start_new_session=True,
            cwd=cwd,
        )
        log_file.close()  # the child holds its own copy
        proc = Proc(name, popen, log_path, argv, dict(env) if env is not None else None, cwd)
        self.items[name] = proc
        return proc

    def restart(self, name: str) -> Proc:
        """Start a process that died again, as it was started (what an orchestrator would do)."""
        old = self.items.pop(name)
        return self.start(name, old.argv, env=old.env, cwd=old.cwd)

    def forget(self, name: str) -> Proc | None:
        """Stop tracking ``name`` (a process that was killed and reaped by the caller)."""
        return self.items.pop(name, None)

    def stop(self, name: str, grace: float = 20.0) -> None:
        self.stop_many([name], grace)

    def stop_all(self, grace: float = 20.0) -> None:
        self.stop_many(list(self.items), grace)

    def stop_many(self, names: list[str], grace: float = 20.0) -> None:
        """SIGTERM these process groups at once, then wait for each (SIGKILL after ``grace``
        seconds): they shut down side by side, not one after another."""
        chosen = [self.items.pop(n) for n in names if n in self.items]
        live = [p for p in chosen if p.popen.poll() is None]
        for proc in live:
            _signal_group(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for proc in live:
            try:
                proc.popen.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(proc.pid, signal.SIGKILL)
                try:
                    proc.popen.wait(10)
                except subprocess.TimeoutExpired:
                    pass

    def kill(self, name: str) -> int:
        """kill -9 the process group of ``name`` and reap it; returns its pid. Nothing runs its
        shutdown code: this is a crash, not a stop."""
        proc = self.items.pop(name)
        _signal_group(proc.pid, signal.SIGKILL)
        proc.popen.wait(10)
        return proc.pid

    def check_alive(self, *names: str) -> None:
        """Raise with the end of its log when one of ``names`` (default: all) has exited."""
        for name in names or list(self.items):
            proc = self.items.get(name)
            if proc is not None and not proc.alive():
                raise RuntimeError(f"{name} exited with {proc.popen.returncode}: {proc.log_text()[-3000:]}")


def _signal_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass


class FleetProcesses:
    """The fleet's own processes (``reach router``, ``reach worker NAME``, ``reach beat``) on one
    broker, Redis and catalog, as ``python -m workers.cli`` children of this process. Each
    gets a REACH_METRICS_PORT of its own unless ``metrics=False``."""

    def __init__(
        self,
        group: ProcessGroup,
        catalog_dir: Path | str,
        broker_url: str,
        redis_url: str,
        *,
        env: Mapping[str, str] | None = None,
        prefix: str = "",
        metrics: bool = True,
        cwd: Path = REPO,
    ) -> None:
        """``cwd``: the source tree the processes run (``-m workers.cli`` imports from it)."""
        self.group = group
        self.cwd = cwd
        self.broker_url = broker_url
        self.prefix = prefix
        self.metrics = metrics
        self.env = dict(
            os.environ,
            REACH_CATALOG=str(catalog_dir),
            REACH_BROKER_URL=broker_url,
            REACH_REDIS_URL=redis_url,
            REACH_LOG_LEVEL="INFO",
            PYTHONUNBUFFERED="1",
            **(env or {}),
        )
        self.env.pop("REACH_METRICS_PORT", None)
        self.metrics_ports: dict[str, int] = {}
        self.names: list[str] = []  # short names, as started

    def full(self, name: str) -> str:
        return self.prefix + name

    def start(self, name: str, args: list[str], extra_env: Mapping[str, str] | None = None) -> Proc:
        env = dict(self.env, **(extra_env or {}))
        if self.metrics and "REACH_METRICS_PORT" not in env:
            env["REACH_METRICS_PORT"] = str(free_port())
        if "REACH_METRICS_PORT" in env:
            self.metrics_ports[name] = int(env["REACH_METRICS_PORT"])
        proc = self.group.start(self.full(name), [sys.executable, "-m", "workers.cli", *args], env, cwd=self.cwd)
        if name not in self.names:
            self.names.append(name)
        return proc

    def start_router(self, extra_env: Mapping[str, str] | None = None) -> Proc:
        return self.start("router", ["router"], extra_env)

    def start_pool(self, connector: str, extra_env: Mapping[str, str] | None = None) -> Proc:
        return self.start(connector, ["worker", connector], extra_env)

    def proc(self, name: str) -> Proc:
        return self.group.items[self.full(name)]

    def pid(self, name: str) -> int:
        return self.proc(name).pid

    def check_alive(self) -> None:
        self.group.check_alive(*(self.full(n) for n in self.names if self.full(n) in self.group.items))

    def queue_state(self, queue: str) -> tuple[int, int]:
        """(messages ready, consumers) of a queue on this fleet's broker."""
        with Connection(self.broker_url, connect_timeout=10) as conn:
            channel = conn.channel()
            try:
                result = channel.queue_declare(queue, passive=True)
                return int(result.message_count), int(result.consumer_count)
            finally:
                channel.close()

    def wait_consuming(self, queue: str, timeout: float = 60.0, consumers: int = 1) -> float:
        """Wait until ``queue`` has at least ``consumers`` consumers; returns the seconds waited."""
        started = time.monotonic()
        while True:
            self.check_alive()
            try:
                if self.queue_state(queue)[1] >= consumers:
                    return time.monotonic() - started
            except Exception:  # not declared yet, or the broker is restarting
                pass
            if time.monotonic() - started > timeout:
                raise RuntimeError(f"{queue} has no consumer after {timeout:g} s; see {self.group.log_dir}")
            time.sleep(0.1)

    def stop(self, name: str) -> None:
        self.group.stop(self.full(name))
        if name in self.names:
            self.names.remove(name)

    def kill(self, name: str) -> int:
        pid = self.group.kill(self.full(name))
        if name in self.names:
            self.names.remove(name)
        return pid

    def stop_all(self) -> None:
        """Stop this fleet's processes together."""
        self.group.stop_many([self.full(n) for n in self.names])
        self.names.clear()
