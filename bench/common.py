"""Shared plumbing for the benchmarks: services, an isolated vhost and Redis, processes we start
(and only those), CPU and memory from /proc, the agent driver, percentiles and tables."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

from workers.ops.local_fleet import Proc, ProcessGroup, free_port  # noqa: E402, F401  (Proc, free_port: re-exported for the scripts)

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "bench"
RESULTS = BENCH / "results"
PYTHON = sys.executable
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


# -- /proc ------------------------------------------------------------------------------------


def _stat(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # comm may hold spaces and parentheses: split after the last ')'
    rest = raw[raw.rindex(")") + 2 :].split()
    return [raw[: raw.index(" ")], raw[raw.index("(") + 1 : raw.rindex(")")], *rest]


def _children_map() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = _stat(int(entry))
            if st is not None:
                kids.setdefault(int(st[3]), []).append(int(entry))
    return kids


def tree_pids(pid: int) -> list[int]:
    kids = _children_map()
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, []))
    return out


def cpu_seconds(pid: int, tree: bool = True) -> float:
    """utime+stime of ``pid`` (all threads), plus its live descendants and reaped children."""
    total = 0.0
    for i, p in enumerate(tree_pids(pid) if tree else [pid]):
        st = _stat(p)
        if st is None:
            continue
        # fields (1-based in proc(5)): 14 utime, 15 stime, 16 cutime, 17 cstime
        ticks = int(st[13]) + int(st[14])
        if i == 0:
            ticks += int(st[15]) + int(st[16])
        total += ticks / CLK_TCK
    return total


def rss_mb(pid: int, tree: bool = False) -> float:
    total = 0
    for p in tree_pids(pid) if tree else [pid]:
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except FileNotFoundError:
            pass
    return round(total / 1024, 1)


def find_pids(comm: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = _stat(int(entry))
            if st is not None and st[1] == comm:
                found.append(int(entry))
    return found


def find_listener_pid(port: int, comm: str) -> int | None:
    """The pid of process ``comm`` holding a listening socket on ``port`` (via /proc/net/tcp inodes)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            for line in Path(table).read_text().splitlines()[1:]:
                cols = line.split()
                if cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
                    inodes.add(cols[9])
        except FileNotFoundError:
            pass
    for pid in find_pids(comm):
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:[") and link[8:-1] in inodes:
                    return pid
        except (FileNotFoundError, PermissionError):
            continue
    pids = find_pids(comm)
    return pids[0] if len(pids) == 1 else None


class CpuMeter:
    """CPU seconds of named processes between two snapshots."""

    instances: list[CpuMeter] = []

    def __init__(self, pids: dict[str, int], trees: dict[str, bool] | None = None) -> None:
        CpuMeter.instances.append(self)
        self.pids = dict(pids)
        self.trees = trees or {}
        self._start: dict[str, float] = {}
        self._t0 = 0.0

    @classmethod
    def replace_pid(cls, old: int, new: int) -> None:
        for meter in cls.instances:
            for name, pid in meter.pids.items():
                if pid == old:
                    meter.pids[name] = new

    def snapshot(self) -> dict[str, float]:
        return {name: cpu_seconds(pid, self.trees.get(name, True)) for name, pid in self.pids.items()}

    def start(self) -> None:
        self._t0 = time.perf_counter()
        self._start = self.snapshot()

    def stop(self) -> tuple[dict[str, float], float]:
        end = self.snapshot()
        return {k: end[k] - self._start.get(k, end[k]) for k in end}, time.perf_counter() - self._t0

    def idle_rates(self, seconds: float) -> dict[str, float]:
        """CPU seconds per second of each process while the benchmark sends nothing (other tenants,
        heartbeats, timers): the baseline subtracted from shared processes."""
        self.start()
        time.sleep(seconds)
        used, elapsed = self.stop()
        return {k: v / elapsed for k, v in used.items()}


# -- services ---------------------------------------------------------------------------------


def ensure_services() -> tuple[str, str]:
    """RabbitMQ and Redis up (bash .ci/services.sh, which reuses REACH_* URLs that answer)."""
    out = subprocess.run(["bash", str(REPO / ".ci" / "services.sh")], capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise SystemExit(f".ci/services.sh failed:\n{out.stderr[-3000:]}")
    urls = dict(re.findall(r"export (REACH_\w+)='([^']*)'", out.stdout))
    return urls["REACH_BROKER_URL"], urls["REACH_REDIS_URL"]


class Vhost:
    """A RabbitMQ vhost of this run's own (like tests/fleet.py), deleted at the end."""

    def __init__(self, shared_url: str, name: str) -> None:
        self.shared_url = shared_url
        self.name = name
        parts = urlsplit(shared_url)
        self.user = parts.username or "guest"
        self.url = urlunsplit(parts._replace(path="/" + quote(name, safe="")))
        self.created = False

    def create(self) -> Vhost:
        if shutil.which("rabbitmqctl") is None:
            raise SystemExit("rabbitmqctl is needed to create the benchmark's own vhost")
        subprocess.run(["rabbitmqctl", "add_vhost", self.name], check=True, capture_output=True, timeout=60)
        self.created = True
        subprocess.run(
            ["rabbitmqctl", "set_permissions", "-p", self.name, self.user, ".*", ".*", ".*"],
            check=True,
            capture_output=True,
            timeout=60,
        )
        return self

    def delete(self) -> None:
        if self.created:
            subprocess.run(["rabbitmqctl", "delete_vhost", self.name], capture_output=True, timeout=60)
            self.created = False


def queue_state(broker_url: str, name: str) -> tuple[int, int]:
    """(messages ready, consumers); (-1, -1) when the queue does not exist."""
    from kombu import Connection

    with Connection(broker_url, connect_timeout=5) as conn:
        channel = conn.channel()
        try:
            ok = channel.queue_declare(name, passive=True)
            return int(ok.message_count), int(ok.consumer_count)
        except Exception:
            return -1, -1
        finally:
            try:
                channel.close()
            except Exception:
                pass


def purge(broker_url: str, *names: str) -> None:
    from kombu import Connection

    with Connection(broker_url, connect_timeout=5) as conn:
        for name in names:
            channel = conn.channel()
            try:
                channel.queue_purge(name)
            except Exception:
                pass
            finally:
                try:
                    channel.close()
                except Exception:
                    pass


# -- processes we start -----------------------------------------------------------------------


# the processes a run starts: the same registry as reach demo's and the tests' (one harness)
Procs = ProcessGroup


def start_private_redis(procs: Procs) -> tuple[str, int]:
    """A redis-server of this run's own on a free loopback port (same settings as .ci/services.sh):
    no other tenant's keys, and its CPU is the benchmark's alone. It works in the run's log
    directory, so a dump.rdb left in the current directory is never loaded."""
    port = free_port()
    proc = procs.start(
        "redis",
        [
            "redis-server",
            "--bind",
            "127.0.0.1",
            "--port",
            str(port),
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
            "--databases",
            "3",  # the fleet's, and one each for the controls fleet_classic and fleet_base
            "--dir",
            str(procs.log_dir),
        ],
    )
    deadline = time.time() + 20
    while time.time() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return f"redis://127.0.0.1:{port}/0", proc.pid
        except OSError:
            procs.check_alive("redis")
            time.sleep(0.1)
    raise RuntimeError("private redis-server did not start")


def start_downstream(
    procs: Procs, name: str = "downstream", slow_seconds: float = 2.0, slow_jitter: float = 0.0
) -> tuple[str, int]:
    argv = [PYTHON, str(BENCH / "downstream.py"), "0", "--slow", str(slow_seconds), "--slow-jitter", str(slow_jitter)]
    proc = procs.start(name, argv, stdout_pipe=True)
    line = proc.popen.stdout.readline().decode()  # type: ignore[union-attr]
    if not line.startswith("READY"):
        raise RuntimeError(f"downstream did not start: {line!r} {proc.log_text()[-2000:]}")
    return f"http://127.0.0.1:{int(line.split()[1])}", proc.pid


def downstream_stats(url: str) -> dict[str, int]:
    import httpx

    return httpx.get(url + "/_stats", timeout=5, trust_env=False).json()


def redis_calls(url: str) -> dict[str, int]:
    """Commands Redis has executed so far, by name (INFO commandstats; commands run inside Lua
    scripts are counted under their own names as well as the script's evalsha)."""
    import redis

    client = redis.Redis.from_url(url, socket_timeout=5)
    try:
        calls = {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in client.info("commandstats").items()}
        # socket reads Redis processed: about one per client round trip (a pipeline is one)
        calls["(round trips)"] = int(client.info("stats").get("total_reads_processed", 0))
        return calls
    finally:
        client.close()


# -- the agent process --------------------------------------------------------------------------


class BrokerGone(RuntimeError):
    """The broker closed the agent's connection mid-phase (another tenant restarted it, say)."""


class Agent:
    """Drives bench/agent.py (or ``script``: bench/plain_agent.py, the agent written from the
    contract alone) over its stdin/stdout (JSON lines)."""

    def __init__(self, procs: Procs, name: str, script: str = "agent.py") -> None:
        self.proc = procs.start(name, [PYTHON, str(BENCH / script)], stdout_pipe=True)
        self.name = name
        self._connect_cmd: dict[str, Any] | None = None

    def _send(self, doc: dict[str, Any]) -> None:
        assert self.proc.popen.stdin is not None
        self.proc.popen.stdin.write((json.dumps(doc) + "\n").encode())
        self.proc.popen.stdin.flush()

    def _read(self) -> dict[str, Any]:
        assert self.proc.popen.stdout is not None
        line = self.proc.popen.stdout.readline()
        if not line:
            raise RuntimeError(f"agent {self.name} exited: {self.proc.log_text()[-2000:]}")
        doc = json.loads(line)
        if doc.get("event") == "error":
            if doc.get("connection"):
                raise BrokerGone(f"agent {self.name}: {doc['error']}")
            raise RuntimeError(f"agent {self.name}: {doc['error']}")
        return doc

    def connect_amqp(
        self, broker_url: str, exchange: str, receipts_exchange: str, bind_key: str, routing_key: str = "intent"
    ) -> None:
        self._connect_cmd = {
            "cmd": "amqp",
            "broker_url": broker_url,
            "exchange": exchange,
            "routing_key": routing_key,
            "receipts_exchange": receipts_exchange,
            "bind_key": bind_key,
        }
        self._send(self._connect_cmd)
        self._read()

    def reconnect(self, timeout: float = 180.0) -> None:
        """Connect again after the broker went away (retrying while it comes back)."""
        deadline = time.time() + timeout
        while True:
            try:
                assert self._connect_cmd is not None
                self._send(self._connect_cmd)
                self._read()
                return
            except (BrokerGone, RuntimeError):
                if time.time() > deadline:
                    raise
                time.sleep(2)

    def connect_http(self, url: str) -> None:
        self._send({"cmd": "http", "url": url})
        self._read()

    def run(self, meter: CpuMeter | None = None, **cmd: Any) -> dict[str, Any]:
        """One phase; ``meter`` (the other processes' CPU) is started when the agent starts publishing."""
        self._send({"cmd": "run", **cmd})
        started = self._read()
        assert started.get("event") == "started", started
        if meter is not None:
            meter.start()
        done = self._read()
        if meter is not None:
            used, elapsed = meter.stop()
            done["cpu_s"] = {k: round(v, 3) for k, v in used.items()}
            done["wall_s"] = round(elapsed, 3)
        return done

    def quit(self) -> None:
        try:
            self._send({"cmd": "quit"})
            self.proc.popen.wait(10)
        except Exception:
            pass


# -- figures ------------------------------------------------------------------------------------


def median(values: list[float | None]) -> float | None:
    vals = sorted(v for v in values if v is not None)
    if not vals:
        return None
    mid = len(vals) // 2
    return vals[mid] if len(vals) % 2 else (vals[mid - 1] + vals[mid]) / 2


def percentile(values: list[float], p: float) -> float | None:
    """Nearest-rank percentile, as the agent computes its own (bench/agent.py)."""
    if not values:
        return None
    s = sorted(values)
    return round(s[max(0, min(len(s) - 1, int(round(p / 100 * len(s) + 0.5)) - 1))], 3)


def calibrate() -> float:
    """Milliseconds for a fixed piece of pure-Python work (json round trips): how fast this machine
    is right now. Printed at start and end; compare runs by it."""
    doc = {
        "intent_id": "x" * 32,
        "agent_id": "bench",
        "action": "create_ticket",
        "params": {"title": "t", "description": "d", "priority": "high", "n": 3},
    }
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(20000):
            json.loads(json.dumps(doc))
        best = min(best, time.perf_counter() - t0)
    return round(best * 1000, 1)


def table(header: list[str], rows: list[list[Any]]) -> str:
    cells = [[str(c) for c in header]] + [["-" if c is None else str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = []
    for j, row in enumerate(cells):
        lines.append("  ".join(c.ljust(widths[i]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(row)))
        if j == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def fmt(value: float | None, digits: int = 1) -> str | None:
    return None if value is None else f"{value:.{digits}f}"


def tmpdir(prefix: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=prefix))


_BROKER_LOSS = (
    "Cannot connect to amqp",
    "Couldn't ack",
    "could not complete a routing decision",
    "Error cleaning up after event loop",
    "RestartFreqExceeded",
    "Connection to broker lost",
    "connection already closed",
)


def scan_log(text: str) -> dict[str, Any]:
    """Problems a process logged: ERROR/CRITICAL records, with those that a lost broker connection
    explains (reconnecting, acks that could not be sent, intents left for redelivery) counted apart."""
    records = [line for line in text.splitlines() if re.match(r"^\d{4}-\d\d-\d\d ", line)]
    errors = [line for line in records if re.search(r"\b(ERROR|CRITICAL)\b", line)]
    broker = [e for e in errors if any(marker in e for marker in _BROKER_LOSS)]
    errors = [e for e in errors if e not in broker]
    warnings = [line for line in records if re.search(r"\bWARNING\b", line)]
    return {
        "errors": len(errors),
        "broker_errors": len(broker),
        "warnings": len(warnings),
        "first_errors": [e[:300] for e in errors[:5]],
        "first_broker_errors": [e[:300] for e in broker[:3]],
        "first_warnings": [w[:300] for w in warnings[:3]],
    }
