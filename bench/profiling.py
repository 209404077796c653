"""py-spy on the router and the pool while the fleet runs flat out, and a text summary of where
the time goes (the SVG flame graphs are for people, the summary for the report).

Two recordings, each during a burst of its own (not one of the measured repetitions):
  1. on-CPU (``--gil``: only the thread holding the GIL is sampled, so blocking socket reads and
     idle threads drop out): ``raw`` stacks for the summary and flame graphs
     (bench/results/router.svg, bench/results/pool.svg);
  2. wall clock (``--idle``, all threads): of the time threads spend inside the project's code
     (handling an intent), where it goes, waits included — synchronous Redis round trips and
     publisher confirms show up here, not in the on-CPU view.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common import REPO, RESULTS, log

_FRAME = re.compile(r"^(?P<func>.*?) \((?P<path>[^()]*?)(?::(?P<line>\d+))?\)$")
_PROJECT_ROOTS = ("workers", "connectors", "producers")


def _project_files() -> dict[str, str]:
    """basename -> repo path; py-spy names the project's own files by basename only."""
    out: dict[str, str] = {}
    for root in _PROJECT_ROOTS:
        for path in sorted((REPO / root).rglob("*.py")):
            rel = str(path.relative_to(REPO))
            out.setdefault(path.name, rel)  # first wins; __init__.py / base.py are ambiguous anyway
    return out


_PROJECT = _project_files()


def _is_project(key: str) -> bool:
    return any(f"({root}/" in key for root in _PROJECT_ROOTS)


# frames that are on every stack of a process (entry points) or belong to background threads
# that mostly sleep: they do not mean "handling an intent"
_NOT_HANDLING = ("(workers/cli/", "(workers/ops/startup.py", "Heartbeat._run", "_ProbeServer", "PauseWatcher")


def _handling(key: str) -> bool:
    return _is_project(key) and not any(marker in key for marker in _NOT_HANDLING)


def py_spy() -> str | None:
    found = shutil.which("py-spy")
    if found:
        return found
    candidate = Path(sys.executable).parent / "py-spy"
    return str(candidate) if candidate.exists() else None


def _short(path: str) -> str:
    if "/" not in path and path in _PROJECT:
        return _PROJECT[path]
    for marker in ("site-packages/", "/lib/python3."):
        if marker in path:
            tail = path.split(marker, 1)[1]
            return tail.split("/", 1)[1] if marker.startswith("/lib") and "/" in tail else tail
    for root in ("workers/", "connectors/", "producers/", "bench/"):
        if root in path:
            return root + path.split(root, 1)[1]
    return path


def _key(frame: str, with_line: bool = False) -> str:
    m = _FRAME.match(frame)
    if not m:
        return frame
    where = _short(m.group("path"))
    if with_line and m.group("line"):
        where += f":{m.group('line')}"
    return f"{m.group('func')} ({where})"


_BUCKETS = (
    ("redis/", "redis-py (Redis round trips)"),
    ("httpx/", "httpx/httpcore/h11 (HTTP call)"),
    ("httpcore/", "httpx/httpcore/h11 (HTTP call)"),
    ("h11/", "httpx/httpcore/h11 (HTTP call)"),
    ("kombu/", "kombu/py-amqp (AMQP)"),
    ("amqp/", "kombu/py-amqp (AMQP)"),
    ("celery/", "celery"),
    ("pydantic", "pydantic"),
    ("prometheus_client/", "prometheus_client"),
    ("opentelemetry/", "opentelemetry"),
    ("logging/", "logging"),
    ("json/", "json"),
)


def _bucket(frames: list[str]) -> str:
    """The package a sample's time belongs to: the deepest frame in a known package (stdlib
    frames count for whoever called them, except logging and json)."""
    for frame in reversed(frames):
        k = _key(frame)
        where = k[k.rfind("(") + 1 :]
        for prefix, name in _BUCKETS:
            if where.startswith(prefix):
                return name
        if _is_project(k):
            return "the project's own code"
    return "other (threads, stdlib)"


def summarize(path: Path, main_thread_only: bool = False, top: int = 20, project_only: bool = False) -> dict[str, Any]:
    """Self, inclusive and hand-over tables; ``project_only`` keeps only samples inside the
    project's code (for wall-clock recordings: idle threads waiting for work drop out)."""
    stacks: list[tuple[str, list[str], int]] = []
    per_thread: Counter[str] = Counter()
    for line in path.read_text().splitlines():
        stack, _, count = line.rstrip().rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        thread = ""
        if frames[0].startswith("thread ("):
            thread, frames = frames[0], frames[1:]
        stacks.append((thread, frames, int(count)))
        per_thread[thread] += int(count)
    if main_thread_only:
        mains = [t for t in per_thread if t.endswith("MainThread")]
        keep = mains[0] if mains else (per_thread.most_common(1)[0][0] if per_thread else "")
        stacks = [s for s in stacks if s[0] == keep]
    if project_only:
        stacks = [s for s in stacks if any(_handling(_key(f)) for f in s[1])]
    total = sum(c for _, _, c in stacks) or 1
    self_time: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    packages: Counter[str] = Counter()
    for _, frames, count in stacks:
        if not frames:
            continue
        packages[_bucket(frames)] += count
        self_time[_key(frames[-1], with_line=True)] += count
        keys = {_key(f) for f in frames}
        for k in keys:
            inclusive[k] += count
        # the deepest frame of the project's own code: where our code hands over to a library
        for f in reversed(frames):
            k = _key(f, with_line=True)
            if _handling(k):
                own[k] += count
                break

    def pct(counter: Counter[str]) -> list[tuple[str, float]]:
        return [(k, round(100 * v / total, 1)) for k, v in counter.most_common(top)]

    project_inclusive = Counter({k: v for k, v in inclusive.items() if _is_project(k)})
    return {
        "samples": total,
        "self": pct(self_time),
        "inclusive": pct(inclusive),
        "project_inclusive": pct(project_inclusive),
        "project_leaf": pct(own),
        "by_package": pct(packages),
    }


def _record(spy: str, pid: int, out: Path, fmt: str, mode: str) -> subprocess.Popen[bytes]:
    argv = [spy, "record", "--nonblocking", "-r", "100", "-f", fmt, "-o", str(out), "--pid", str(pid), mode]
    return subprocess.Popen(
        argv, stdout=subprocess.DEVNULL, stderr=open(str(out) + ".log", "wb"), start_new_session=True
    )


def _finish(procs: list[subprocess.Popen[bytes]], outputs: list[Path] | None = None) -> None:
    for p in procs:
        if p.poll() is None:
            os.kill(p.pid, signal.SIGINT)
    for p in procs:
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            os.kill(p.pid, signal.SIGKILL)
            p.wait(5)
    for out in outputs or []:
        log_path = Path(str(out) + ".log")
        if log_path.exists() and log_path.stat().st_size == 0:
            log_path.unlink()


def run(router_pid: int, pool_pid: int, burst: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    spy = py_spy()
    if spy is None:
        log("py-spy not found: `.venv/bin/pip install py-spy` to profile; skipping")
        return {"skipped": "py-spy not installed"}
    RESULTS.mkdir(parents=True, exist_ok=True)
    out: dict[str, Any] = {}
    files = {
        "router_cpu": RESULTS / "router.cpu.txt",
        "pool_cpu": RESULTS / "pool.cpu.txt",
        "router_wall": RESULTS / "router.wall.txt",
        "pool_wall": RESULTS / "pool.wall.txt",
    }
    log("profiling 1/2: on-CPU (--gil): raw stacks and flame graphs of the router and the pool")
    procs = [
        _record(spy, router_pid, files["router_cpu"], "raw", mode="--gil"),
        _record(spy, pool_pid, files["pool_cpu"], "raw", mode="--gil"),
        _record(spy, router_pid, RESULTS / "router.svg", "flamegraph", mode="--gil"),
        _record(spy, pool_pid, RESULTS / "pool.svg", "flamegraph", mode="--gil"),
    ]
    time.sleep(1.0)
    out["burst_cpu"] = _brief(burst())
    _finish(procs, [files["router_cpu"], files["pool_cpu"], RESULTS / "router.svg", RESULTS / "pool.svg"])
    log("profiling 2/2: wall clock (--idle, all threads)")
    procs = [
        _record(spy, router_pid, files["router_wall"], "raw", mode="--idle"),
        _record(spy, pool_pid, files["pool_wall"], "raw", mode="--idle"),
    ]
    time.sleep(1.0)
    out["burst_wall"] = _brief(burst())
    _finish(procs, [files["router_wall"], files["pool_wall"]])
    for name, path in files.items():
        if path.exists() and path.stat().st_size:
            out[name] = summarize(path, project_only=name.endswith("_wall"))
        else:
            log_path = Path(str(path) + ".log")
            out[name] = {"error": log_path.read_text(errors="replace")[-500:] if log_path.exists() else "no output"}
    out["files"] = [
        str(p.relative_to(REPO)) for p in (RESULTS / "router.svg", RESULTS / "pool.svg", *files.values()) if p.exists()
    ]
    return out


def _brief(res: dict[str, Any]) -> dict[str, Any]:
    return {k: res.get(k) for k in ("n", "receipts", "steady_rate", "missing", "duplicates")}


def render(prof: dict[str, Any], top: int = 12) -> str:
    if "skipped" in prof:
        return f"profiling skipped: {prof['skipped']}"
    lines = []
    titles = {
        "router_cpu": "router, on-CPU (py-spy --gil)",
        "pool_cpu": "pool, on-CPU (py-spy --gil)",
        "router_wall": "router, wall clock inside the project's code, waits included (py-spy --idle)",
        "pool_wall": "pool, wall clock inside the project's code, waits included (py-spy --idle)",
    }
    for name, title in titles.items():
        s = prof.get(name) or {}
        if "samples" not in s:
            lines.append(f"{title}: {s.get('error', 'no data')}")
            continue
        lines.append(f"{title} — {s['samples']} samples")
        if s.get("by_package"):
            lines.append("  by package: " + ", ".join(f"{k} {p}%" for k, p in s["by_package"]))
        lines.append("  self (leaf) time:")
        lines.extend(f"    {p:5.1f}%  {k}" for k, p in s["self"][:top])
        lines.append("  inclusive, the project's own code:")
        lines.extend(f"    {p:5.1f}%  {k}" for k, p in s["project_inclusive"][:top])
        lines.append("  where the project's code hands over (deepest own frame):")
        lines.extend(f"    {p:5.1f}%  {k}" for k, p in s["project_leaf"][:top])
    return "\n".join(lines)
