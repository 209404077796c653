#!/usr/bin/env python
"""Workflows (issue 32): what the runner costs against an agent doing the same steps itself.

    .venv/bin/python bench/workflows.py                       # 7 x 40 one at a time, 2 x 1,000 at once: ~4 min
    .venv/bin/python bench/workflows.py --quick               # 2 x 10, 1 x 200: ~1 min
    .venv/bin/python bench/workflows.py --reps 9 --samples 40 --runs 1000 --flight-reps 3 --tree HEAD
    .venv/bin/python bench/workflows.py --queue-type classic  # the same on classic queues (a control)
    .venv/bin/python bench/workflows.py --runner-from DIR     # the runner from another tree (a patch to try)
    .venv/bin/python bench/workflows.py --profile             # then py-spy on the runner (not measured)

One fleet (router, the pool of ``bench_wf``, the runner ``reach workflows``) in a RabbitMQ vhost and a
redis-server of the run's own, in front of the counting downstream (bench/wf_downstream.py: it counts
every call by title, and can hold its answers). The catalog: three write actions ``step_a``,
``step_b``, ``step_c`` (the next one's title carries the previous one's ``item_id``), each undone by
``cancel``, and the workflow ``bench_flow`` of the three; the binding has a generous rate limit,
an always-open window and full audit, as bench/catalogs.py's.

**Latency** (one at a time, from this process with one ``ReachClient``; per repetition, in this order):

- A **workflow**: ``call("bench_flow")``, start intent to final receipt;
- B **sequential**: the same three steps sent by the agent, each waiting for its receipt (the
  next step's title from the previous receipt);
- C **one_step**: ``call("bench_one")``, a workflow of ``step_a`` alone;
- D **single**: one ``step_a`` (a plain intent).

Per repetition p50/p95 of each, A/B, and the runner's overhead per step ``(A p50 - B p50) / 3``
(target <= 3 ms); split into a cost per run F (the start job, the final receipt) and per step s
from A - B = F + 3s and C - D = F + s. The figures are medians over repetitions. CPU ms per run of
every process and Redis commands (and round trips) per run come with each phase.

**In flight** (``--runs`` at once; A then B, ``--flight-reps`` times): the downstream holds its
answers; A publishes N workflow starts, B N first steps (the agent drives each chain itself,
publishing the next step on each receipt); once all N are in Redis and it settles, the gate opens.
Time to drain (open gate to the last final receipt), every run succeeded, each step called
exactly once (calls counted at the downstream, before its own idempotency dedup), the RSS of the
runner and the pool (peak), and Redis bytes per run: ``INFO used_memory`` and the MEMORY USAGE of
every key the phase added, by family, with their TTLs (bench/redis_keys.py), while in flight and
once finished.

The fleet runs from ``git archive`` of ``--tree`` (default HEAD), not the working tree. Prints a table
and one JSON line; writes bench/results/workflows.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

import catalogs  # noqa: E402
import redis_keys  # noqa: E402
from common import (  # noqa: E402
    BENCH,
    PYTHON,
    RESULTS,
    CpuMeter,
    Procs,
    Vhost,
    calibrate,
    ensure_services,
    fmt,
    loadavg,
    log,
    median,
    percentile,
    redis_calls,
    rss_mb,
    start_private_redis,
    table,
    tmpdir,
)
from reachfleet import ReachFleet  # noqa: E402

from workers.state import keys  # noqa: E402
from workers.transport.topology import WORKFLOW_RECEIPTS_QUEUE_NAME, WORKFLOWS_QUEUE_NAME  # noqa: E402

CONNECTOR = "bench_wf"
WORKFLOW = "bench_flow"
WORKFLOW_ONE = "bench_one"
KINDS = ("workflow", "sequential", "one_step", "single")  # the latency phases, in this order
AGENT = "bench_wf_agent"
STEPS = ("step_a", "step_b", "step_c")
TARGET_OVERHEAD_MS = 3.0
# where a backlog waits: intents at the router, steps at the pool, starts and step receipts at the runner
QUEUES = ("reach.intents", f"reach.connector.{CONNECTOR}", WORKFLOWS_QUEUE_NAME, WORKFLOW_RECEIPTS_QUEUE_NAME)
CONFIGS: dict[str, dict[str, Any]] = {
    "full": dict(reps=7, samples=40, runs=1000, flight_reps=2, warmup=20),
    "quick": dict(reps=2, samples=10, runs=200, flight_reps=1, warmup=5),
}


def catalog(endpoint: str) -> str:
    step = """\
    - action: {name}
      description: Benchmark step {name}
      path: POST /tickets
      input: {{ title: {{ type: string, required: true, max_length: 200 }} }}
      output:
        item_id: {{ type: string, required: true }}
        status: {{ type: enum, values: [open, closed] }}
      permission: write
      timeout: 60s
"""
    cancel = """\
    - action: cancel
      description: Undo a benchmark step
      path: POST /tickets/cancel
      input: { title: { type: string, required: true, max_length: 200 } }
      permission: write
      timeout: 10s
"""
    actions = "".join(step.format(name=s) for s in STEPS) + cancel
    workflow = f"""\
workflow:
  name: {WORKFLOW}
  description: Three steps, each reading the previous one's output.
  timeout: 5m
  input: {{ ref: {{ type: string, required: true }} }}
  steps:
    - id: a
      action: {CONNECTOR}.step_a
      params: {{ title: "{{$input.ref}}-a" }}
      compensate: {{ action: {CONNECTOR}.cancel, params: {{ title: "{{$input.ref}}-undo_a {{$steps.a.item_id}}" }} }}
    - id: b
      action: {CONNECTOR}.step_b
      params: {{ title: "{{$input.ref}}-b {{$steps.a.item_id}}" }}
      compensate: {{ action: {CONNECTOR}.cancel, params: {{ title: "{{$input.ref}}-undo_b {{$steps.b.item_id}}" }} }}
    - id: c
      action: {CONNECTOR}.step_c
      params: {{ title: "{{$input.ref}}-c {{$steps.b.item_id}}" }}
  output: {{ item_id: $steps.c.item_id }}
"""
    one_step = f"""\
workflow:
  name: {WORKFLOW_ONE}
  description: The first step alone (the fixed cost of a run, against one plain intent).
  timeout: 5m
  input: {{ ref: {{ type: string, required: true }} }}
  steps:
    - id: a
      action: {CONNECTOR}.step_a
      params: {{ title: "{{$input.ref}}-a" }}
  output: {{ item_id: $steps.a.item_id }}
"""
    agent = f"""\
agent_app:
  name: {AGENT}
  connector_bindings:
    - connector: {CONNECTOR}
      allowed_actions: ["*"]
      rate_limit: {catalogs.GENEROUS_RATE}
      allowed_hours: "00:00-24:00 UTC"
      audit_level: full
  workflows: [{WORKFLOW}, {WORKFLOW_ONE}]
"""
    return "---\n".join([catalogs._connector(CONNECTOR, endpoint, actions), workflow, one_step, agent])


class Downstream:
    """bench/wf_downstream.py, driven over its stdin/stdout."""

    def __init__(self, procs: Procs) -> None:
        self.proc = procs.start("downstream", [PYTHON, str(BENCH / "wf_downstream.py")], stdout_pipe=True)
        line = self._line()
        if not line.startswith("READY"):
            raise RuntimeError(f"downstream did not start: {line!r} {self.proc.log_text()[-2000:]}")
        self.url = f"http://127.0.0.1:{int(line.split()[1])}"

    def _line(self) -> str:
        assert self.proc.popen.stdout is not None
        return self.proc.popen.stdout.readline().decode()

    def ask(self, command: str) -> dict[str, Any]:
        assert self.proc.popen.stdin is not None
        self.proc.popen.stdin.write((command + "\n").encode())
        self.proc.popen.stdin.flush()
        return json.loads(self._line())  # type: ignore[no-any-return]


class Sampler(threading.Thread):
    """Peak RSS (MB) of some processes and peak depth (ready + unacked) of some queues, every 0.2 s."""

    def __init__(self, pids: dict[str, int], broker_url: str, queues: tuple[str, ...]) -> None:
        super().__init__(daemon=True)
        self.pids = pids
        self.broker_url = broker_url
        self.queues = {q: 0 for q in queues}
        self.peak = {name: rss_mb(pid) for name, pid in pids.items()}
        self.start_mb = dict(self.peak)
        self.stopped = threading.Event()

    def run(self) -> None:
        from kombu import Connection

        with Connection(self.broker_url, connect_timeout=5) as conn:
            channel = conn.channel()
            while not self.stopped.wait(0.2):
                for name, pid in self.pids.items():
                    self.peak[name] = max(self.peak[name], rss_mb(pid))
                for queue in self.queues:
                    ready = int(channel.queue_declare(queue, passive=True).message_count)
                    self.queues[queue] = max(self.queues[queue], ready)

    def finish(self) -> dict[str, Any]:
        self.stopped.set()
        self.join(2)
        end = {name: rss_mb(pid) for name, pid in self.pids.items()}
        return {n: {"start": self.start_mb[n], "peak": self.peak[n], "end": end[n]} for n in self.pids}


class Bench:
    def __init__(self, fleet: ReachFleet, downstream: Downstream, redis_url: str, pids: dict[str, int]) -> None:
        import redis

        from producers.client import ReachClient

        self.fleet = fleet
        self.downstream = downstream
        self.redis_url = redis_url
        self.redis = redis.Redis.from_url(redis_url, socket_timeout=30)
        self.pids = pids
        self.meter = CpuMeter({**pids, "agent": os.getpid()}, {"agent": False})
        self.client = ReachClient(AGENT, fleet.broker_url, reply_to=f"{AGENT}.latency")
        self.tag = uuid.uuid4().hex[:6]
        self.problems: list[str] = []

    # -- one run of each kind -----------------------------------------------------------------

    def workflow(self, ref: str) -> None:
        r = self.client.call(WORKFLOW, {"ref": ref}, timeout=60)
        if r.status != "succeeded":
            self.problems.append(f"workflow {ref}: {r.status} {r.error}")

    def sequential(self, ref: str) -> None:
        title = f"{ref}-a"
        for step, suffix in zip(STEPS, ("b", "c", None), strict=True):
            r = self.client.call(f"{CONNECTOR}.{step}", {"title": title}, timeout=60)
            if r.status != "succeeded":
                self.problems.append(f"sequential {ref} {step}: {r.status} {r.error}")
                return
            title = f"{ref}-{suffix} {(r.data or {}).get('item_id')}"

    def one_step(self, ref: str) -> None:
        r = self.client.call(WORKFLOW_ONE, {"ref": ref}, timeout=60)
        if r.status != "succeeded":
            self.problems.append(f"one_step {ref}: {r.status} {r.error}")

    def single(self, ref: str) -> None:
        r = self.client.call(f"{CONNECTOR}.step_a", {"title": f"{ref}-a"}, timeout=60)
        if r.status != "succeeded":
            self.problems.append(f"single {ref}: {r.status} {r.error}")

    # -- latency --------------------------------------------------------------------------------

    def latency_phase(self, kind: str, rep: int, samples: int) -> dict[str, Any]:
        run: Callable[[str], None] = getattr(self, kind)
        prefix = f"L{self.tag}-{kind}-r{rep}-"
        calls_before = redis_calls(self.redis_url)
        self.meter.start()
        took = []
        for i in range(samples):
            t0 = time.perf_counter()
            run(f"{prefix}{i}")
            took.append((time.perf_counter() - t0) * 1000)
        used, wall = self.meter.stop()
        calls_after = redis_calls(self.redis_url)
        commands = sum(v for k, v in calls_after.items() if not k.startswith("(")) - sum(
            v for k, v in calls_before.items() if not k.startswith("(")
        )
        trips = calls_after["(round trips)"] - calls_before["(round trips)"]
        counts = self.downstream.ask(f"counts {prefix}")
        expected = samples * (1 if kind in ("single", "one_step") else 3)
        if counts["calls"] != expected or counts["repeated"]:
            self.problems.append(f"latency {kind} rep {rep}: {counts} (expected {expected} calls, once each)")
        return {
            "p50": percentile(took, 50),
            "p95": percentile(took, 95),
            "max": round(max(took), 3),
            "cpu_ms_per_run": {k: round(v / samples * 1000, 3) for k, v in used.items()},
            "redis_commands_per_run": round(commands / samples, 1),
            "redis_round_trips_per_run": round(trips / samples, 1),
            "wall_s": round(wall, 2),
            "calls": counts["calls"],
        }

    # -- many in flight ------------------------------------------------------------------------

    def flight_phase(self, kind: str, rep: int, n: int) -> dict[str, Any]:
        from producers.client import ReachClient

        prefix = f"F{self.tag}-{kind}-r{rep}-"
        before = redis_keys.snapshot(self.redis)
        runs_before = int(self.redis.zcard(keys.workflow_runs()))
        sampler = Sampler({k: self.pids[k] for k in ("runner", "pool", "router")}, self.fleet.broker_url, QUEUES)
        sampler.start()
        out: dict[str, Any] = {"n": n}
        with ReachClient(AGENT, self.fleet.broker_url, reply_to=f"{AGENT}.f{rep}{kind[0]}") as client:
            self.downstream.ask("hold")
            self.meter.start()
            t0 = time.perf_counter()
            ids: dict[str, int] = {}  # intent id -> run index (B: the chain's current step)
            step_of: dict[str, int] = {}
            for i in range(n):
                if kind == "workflow":
                    ids[client.publish(WORKFLOW, {"ref": f"{prefix}{i}"})] = i
                else:
                    iid = client.publish(f"{CONNECTOR}.step_a", {"title": f"{prefix}{i}-a"})
                    ids[iid], step_of[iid] = i, 0
            out["publish_s"] = round(time.perf_counter() - t0, 3)
            if kind == "workflow":
                deadline = time.time() + 60
                while int(self.redis.zcard(keys.workflow_runs())) - runs_before < n:
                    if time.time() > deadline:
                        raise RuntimeError("the runner did not start every run within 60 s")
                    time.sleep(0.05)
                out["all_started_s"] = round(time.perf_counter() - t0, 3)
            self._settle()
            in_flight = redis_keys.snapshot(self.redis)
            out["held_at_downstream"] = self.downstream.ask(f"counts {prefix}")["held"]
            t_open = time.perf_counter()
            self.downstream.ask("release")
            finals = self._collect(client, kind, ids, step_of, prefix)
            out["drain_s"] = round(time.perf_counter() - t_open, 3)
            out["total_s"] = round(time.perf_counter() - t0, 3)
            used, _ = self.meter.stop()
            out["duplicate_receipts"] = client.duplicate_receipts
        out["rss_mb"] = sampler.finish()
        out["queue_peaks"] = dict(sampler.queues)
        out["cpu_ms_per_run"] = {k: round(v / n * 1000, 3) for k, v in used.items()}
        out["failed"] = sum(1 for s in finals.values() if s != "succeeded")
        out["finished"] = len(finals)
        time.sleep(1.5)  # batched audit lines written, late duplicates counted
        counts = self.downstream.ask(f"counts {prefix}")
        out["calls"] = counts
        if counts["calls"] != 3 * n or counts["repeated"] or counts["executed_twice"] or out["failed"]:
            self.problems.append(f"in flight {kind} rep {rep}: {out['failed']} failed, calls {counts}")
        after = redis_keys.snapshot(self.redis)
        out["redis_in_flight"] = redis_keys.delta(before, in_flight, n)
        out["redis_finished"] = redis_keys.delta(before, after, n)
        out["due_index"] = int(self.redis.zcard(keys.workflow_due()))
        if kind == "workflow" and ids:
            out["run_doc"] = self._run_doc(next(iter(ids)))
        return out

    def _run_doc(self, run_id: str) -> dict[str, Any]:
        """Bytes of one finished run's document, and of its largest top-level fields."""
        raw = self.redis.hget(keys.workflow_run(AGENT, run_id), "doc")
        if raw is None:
            return {}
        doc = json.loads(raw)
        parts = {k: len(json.dumps(v, separators=(",", ":"))) for k, v in doc.items()}
        return {"bytes": len(raw), "fields": dict(sorted(parts.items(), key=lambda kv: -kv[1])[:6])}

    def _settle(self, timeout: float = 20.0) -> None:
        """Until used_memory stops growing (the last starts and first steps written)."""
        last, deadline = -1, time.time() + timeout
        while time.time() < deadline:
            time.sleep(0.5)
            now = int(self.redis.info("memory")["used_memory"])
            if last > 0 and abs(now - last) < 0.002 * last:
                return
            last = now

    def _collect(
        self, client: Any, kind: str, ids: dict[str, int], step_of: dict[str, int], prefix: str
    ) -> dict[int, str]:
        finals: dict[int, str] = {}
        n = len(ids)
        deadline = time.monotonic() + 180
        while len(finals) < n and time.monotonic() < deadline:
            for receipt in client.receipts(timeout=1.0):
                i = ids.get(receipt.intent_id)
                if i is None or i in finals:
                    continue
                if kind == "workflow" or receipt.status != "succeeded" or step_of[receipt.intent_id] == 2:
                    finals[i] = receipt.status
                else:
                    nxt = step_of[receipt.intent_id] + 1
                    title = f"{prefix}{i}-{'bc'[nxt - 1]} {(receipt.data or {}).get('item_id')}"
                    iid = client.publish(f"{CONNECTOR}.{STEPS[nxt]}", {"title": title})
                    ids[iid], step_of[iid] = i, nxt
                if len(finals) >= n or time.monotonic() > deadline:
                    break
        if len(finals) < n:
            self.problems.append(f"in flight {kind}: {n - len(finals)} of {n} runs unfinished after 180 s")
        return finals


# where a transition's wall time goes: the runner's calls, matched by frame name in py-spy's stacks
PARTS = (
    "WorkflowRuns.run_of",
    "WorkflowRuns.load",
    "WorkflowRuns.remember",
    "WorkflowRuns.look_at",
    "WorkflowRuns.write",
    "WorkflowRuns.mark_sent",
    "Publisher.publish",
    "ReceiptSink.send",
    "Audit.events",
    "Run.from_json",
    "Run.to_json",
)
HANDLING = "on_message (workers/ops/workflow_runner.py"


def per_transition(path: Path, transitions: int, hz: int = 100) -> dict[str, float]:
    """Wall ms per transition (a start or a step's receipt handled) inside the runner's handler, and
    in each of its calls, from py-spy --idle raw stacks sampled at ``hz``."""
    spent: dict[str, int] = {}
    for line in path.read_text().splitlines():
        stack, _, count = line.rstrip().rpartition(" ")
        if not count.isdigit() or HANDLING not in stack:
            continue
        for part in ("handling", *PARTS):
            if part == "handling" or f";{part} (" in stack:
                spent[part] = spent.get(part, 0) + int(count)
    return {k: round(v / hz / transitions * 1000, 2) for k, v in spent.items()}


def profile_runner(bench: Bench, n: int, samples: int) -> dict[str, Any]:
    """py-spy on the runner: wall clock (--idle) while ``samples`` workflows run one at a time, then
    on-CPU (--gil) and wall clock while ``n`` runs in flight drain (neither measured). Stacks in
    bench/results/workflows-runner.*.txt."""
    import profiling

    spy = profiling.py_spy()
    if spy is None:
        return {"skipped": "py-spy not installed (.venv/bin/pip install py-spy)"}
    RESULTS.mkdir(parents=True, exist_ok=True)
    runner = bench.pids["runner"]
    out: dict[str, Any] = {}
    one = RESULTS / "workflows-runner.one-at-a-time.wall.txt"
    spies = [profiling._record(spy, runner, one, "raw", mode="--idle")]
    time.sleep(1.0)
    res = bench.latency_phase("workflow", 99, samples)
    profiling._finish(spies, [one])
    out["one_at_a_time"] = {"p50": res["p50"], "ms_per_transition": per_transition(one, 4 * samples)}
    files = {mode: RESULTS / f"workflows-runner.in-flight.{mode}.txt" for mode in ("cpu", "wall")}
    spies = [
        profiling._record(spy, runner, files["cpu"], "raw", mode="--gil"),
        profiling._record(spy, runner, files["wall"], "raw", mode="--idle"),
    ]
    time.sleep(1.0)
    res = bench.flight_phase("workflow", 99, n)
    profiling._finish(spies, list(files.values()))
    out["in_flight"] = {"drain_s": res["drain_s"], "ms_per_transition": per_transition(files["wall"], 4 * n)}
    if files["cpu"].exists() and files["cpu"].stat().st_size:
        out["in_flight"]["cpu"] = profiling.summarize(files["cpu"], top=15)
    log(f"profiled the runner: one at a time {out['one_at_a_time']}; in flight {out['in_flight']['ms_per_transition']}")
    return out


# -- figures --------------------------------------------------------------------------------------


def _med(values: list[Any], digits: int = 3) -> float | None:
    m = median(values)
    return None if m is None else round(m, digits)


def summarize(latency: list[dict[str, Any]], flight: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"latency": {}, "flight": {}}
    for kind in KINDS:
        reps = [r[kind] for r in latency]
        out["latency"][kind] = {
            "p50": _med([r["p50"] for r in reps]),
            "p95": _med([r["p95"] for r in reps]),
            "cpu_ms_per_run": {p: _med([r["cpu_ms_per_run"][p] for r in reps]) for p in reps[0]["cpu_ms_per_run"]},
            "redis_commands_per_run": _med([r["redis_commands_per_run"] for r in reps], 1),
            "redis_round_trips_per_run": _med([r["redis_round_trips_per_run"] for r in reps], 1),
        }
    a = [r["workflow"] for r in latency]
    b = [r["sequential"] for r in latency]
    per_rep_overhead = [(x["p50"] - y["p50"]) / 3 for x, y in zip(a, b, strict=True)]
    out["ratio_p50"] = _med([x["p50"] / y["p50"] for x, y in zip(a, b, strict=True)])
    out["ratio_p95"] = _med([x["p95"] / y["p95"] for x, y in zip(a, b, strict=True)])
    out["overhead_ms_per_step"] = _med(per_rep_overhead)
    out["overhead_per_rep"] = [round(v, 2) for v in per_rep_overhead]
    out["target_met"] = out["overhead_ms_per_step"] is not None and out["overhead_ms_per_step"] <= TARGET_OVERHEAD_MS
    # three steps add F + 3s over three intents, one step F + s over one: s per step, F per run (start, final)
    d3 = [x["p50"] - y["p50"] for x, y in zip(a, b, strict=True)]
    d1 = [r["one_step"]["p50"] - r["single"]["p50"] for r in latency]
    out["added_one_step_ms"] = _med(d1)
    out["per_step_ms"] = _med([(x - y) / 2 for x, y in zip(d3, d1, strict=True)])
    out["per_run_ms"] = _med([y - (x - y) / 2 for x, y in zip(d3, d1, strict=True)])
    for kind in ("workflow", "sequential"):
        reps = [r[kind] for r in flight]
        if not reps:
            continue
        out["flight"][kind] = {
            "n": reps[0]["n"],
            "drain_s": _med([r["drain_s"] for r in reps]),
            "total_s": _med([r["total_s"] for r in reps]),
            "drain_per_rep": [r["drain_s"] for r in reps],
            "finished": sum(r["finished"] for r in reps),
            "failed": sum(r["failed"] for r in reps),
            "calls": sum(r["calls"]["calls"] for r in reps),
            "called_twice": sum(r["calls"]["repeated"] for r in reps),
            "runner_rss_mb": {k: _med([r["rss_mb"]["runner"][k] for r in reps], 1) for k in ("start", "peak", "end")},
            "pool_rss_peak_mb": _med([r["rss_mb"]["pool"]["peak"] for r in reps], 1),
            "cpu_ms_per_run": {p: _med([r["cpu_ms_per_run"][p] for r in reps]) for p in reps[0]["cpu_ms_per_run"]},
            "used_memory_in_flight": _med([r["redis_in_flight"]["used_memory_per_run"] for r in reps], 0),
            "key_bytes_in_flight": _med([r["redis_in_flight"]["key_bytes_per_run"] for r in reps], 0),
            "used_memory_finished": _med([r["redis_finished"]["used_memory_per_run"] for r in reps], 0),
            "key_bytes_finished": _med([r["redis_finished"]["key_bytes_per_run"] for r in reps], 0),
            "keys_finished": _med([r["redis_finished"]["keys_per_run"] for r in reps], 2),
            "queue_peaks": reps[-1]["queue_peaks"],
            "run_doc": reps[-1].get("run_doc"),
            "families_finished": reps[-1]["redis_finished"]["families"],
            "families_in_flight": reps[-1]["redis_in_flight"]["families"],
        }
    return out


def render(results: dict[str, Any]) -> str:
    meta, s = results["meta"], results["summary"]
    lines = [
        f"workflows ({meta['mode']}) — {meta['started']}; code {meta['code']['commit'][:10]}"
        f"{' (driver: producers/ changed)' if meta['code'].get('driver_changes') else ''}; load {meta['load_start']} -> {meta.get('load_end')}; "
        f"calibration {meta['calibration_ms_start']} -> {meta.get('calibration_ms_end')} ms",
        f"latency: {meta['config']['reps']} repetitions x {meta['config']['samples']} runs, one at a time, "
        "order A workflow / B sequential / C one_step / D single (medians of repetitions, ms):",
    ]
    rows = []
    for kind in KINDS:
        k = s["latency"][kind]
        cpu = k["cpu_ms_per_run"]
        rows.append(
            [
                kind,
                fmt(k["p50"], 2),
                fmt(k["p95"], 2),
                " / ".join(fmt(cpu.get(p), 2) or "-" for p in ("router", "pool", "runner", "redis", "agent")),
                f"{fmt(k['redis_commands_per_run'], 1)} / {fmt(k['redis_round_trips_per_run'], 1)}",
            ]
        )
    lines.append(
        table(
            ["", "p50", "p95", "CPU ms/run router/pool/runner/redis/agent", "Redis commands / round trips per run"],
            rows,
        )
    )
    lines.append(
        f"workflow / sequential: p50 {s['ratio_p50']} x, p95 {s['ratio_p95']} x; runner overhead per step "
        f"(A p50 - B p50) / 3 = {fmt(s['overhead_ms_per_step'], 2)} ms (per repetition {s['overhead_per_rep']}); "
        f"target <= {TARGET_OVERHEAD_MS:g} ms: {'MET' if s['target_met'] else 'NOT met'}"
    )
    lines.append(
        f"one-step workflow over one intent: +{fmt(s['added_one_step_ms'], 2)} ms; so per step "
        f"{fmt(s['per_step_ms'], 2)} ms and per run (start job, final receipt) {fmt(s['per_run_ms'], 2)} ms"
    )
    if s["flight"]:
        lines.append(
            f"\nin flight at once (downstream holding its answers), {meta['config']['flight_reps']} x each, medians:"
        )
        rows = []
        for kind, f in s["flight"].items():
            rss = f["runner_rss_mb"]
            rows.append(
                [
                    kind,
                    f["n"],
                    fmt(f["drain_s"], 2),
                    f"{f['finished']} / {f['failed']} of {f['n'] * len(f['drain_per_rep'])}",
                    f"{f['calls']} / {f['called_twice']}",
                    f"{rss['start']} / {rss['peak']} / {rss['end']}" if kind == "workflow" else "-",
                    f"{f['used_memory_in_flight']:.0f} / {f['key_bytes_in_flight']:.0f}",
                    f"{f['used_memory_finished']:.0f} / {f['key_bytes_finished']:.0f}",
                    f["keys_finished"],
                ]
            )
        lines.append(
            table(
                [
                    "",
                    "runs",
                    "drain s",
                    "finished / failed",
                    "step calls / twice",
                    "runner RSS MB start/peak/end",
                    "B/run in flight used/keys",
                    "B/run finished used/keys",
                    "keys/run",
                ],
                rows,
            )
        )
        wf = s["flight"].get("workflow")
        if wf:
            lines.append(f"queue peaks (last repetition): {wf['queue_peaks']}")
            lines.append(f"one finished run's document: {wf['run_doc']}")
            lines.append(
                "workflow runs, Redis by key family once finished (bytes/run, keys/run, TTL h, keys without TTL):"
            )
            for name, fam in wf["families_finished"].items():
                lines.append(
                    f"  {name:28s} {fam['bytes_per_run']:8.1f} {fam['keys_per_run']:6.2f}  {fam['ttl_h']}  {fam['no_ttl']}"
                )
    if results.get("problems"):
        lines.append("PROBLEMS: " + "; ".join(results["problems"][:10]))
    return "\n".join(lines)


def unpack(ref: str, into: Path) -> dict[str, Any]:
    """The fleet runs from ``git archive REF`` unpacked to ``into``, not from the working tree (which
    may hold someone's uncommitted changes): the figures are the commit's. The driver (this process:
    ReachClient) imports the working tree; what differs there under producers/ is recorded."""
    import subprocess

    repo = BENCH.parent

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout

    commit = git("rev-parse", "--verify", f"{ref}^{{commit}}").strip()
    into.mkdir(parents=True)
    archive = subprocess.Popen(["git", "-C", str(repo), "archive", commit], stdout=subprocess.PIPE)
    subprocess.run(["tar", "-x", "-C", str(into)], stdin=archive.stdout, check=True)
    if archive.wait() != 0:
        raise RuntimeError(f"git archive {commit} failed")
    return {"ref": ref, "commit": commit, "driver_changes": git("status", "--porcelain", "--", "producers").split()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--reps", type=int, help="latency repetitions (A, B, C, D each)")
    parser.add_argument("--samples", type=int, help="runs per latency phase")
    parser.add_argument("--runs", type=int, help="runs in flight at once")
    parser.add_argument("--flight-reps", type=int, help="in-flight repetitions (A, B each); 0 skips them")
    parser.add_argument(
        "--profile", action="store_true", help="py-spy on the runner during one more in-flight phase (not measured)"
    )
    parser.add_argument(
        "--queue-type", choices=("quorum", "classic"), help="REACH_QUEUE_TYPE of the fleet (default: the fleet's)"
    )
    parser.add_argument(
        "--runner-from", type=Path, help="a source tree to run the runner from (a patch to try), else the fleet's"
    )
    parser.add_argument("--tree", default="HEAD", help="git ref the fleet runs from (unpacked; default HEAD)")
    parser.add_argument("--keep-logs", action="store_true")
    parser.add_argument("--output", default=str(RESULTS / "workflows.json"))
    args = parser.parse_args()
    mode = "quick" if args.quick else "full"
    cfg = dict(CONFIGS[mode])
    for name in ("reps", "samples", "runs", "flight_reps"):
        if getattr(args, name) is not None:
            cfg[name] = getattr(args, name)
    cfg["runs"] = max(1, min(cfg["runs"], 5000))
    cfg["queue_type"] = args.queue_type or "default"
    cfg["runner_from"] = str(args.runner_from) if args.runner_from else None  # bounded: the gate holds at most 120 s
    work = tmpdir("reach-wf-bench-")
    procs = Procs(work)
    log(f"unpacking {args.tree} for the fleet")
    results: dict[str, Any] = {
        "meta": {
            "mode": mode,
            "command": " ".join(["bench/workflows.py", *sys.argv[1:]]),
            "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
            "load_start": loadavg(),
            "calibration_ms_start": calibrate(),
            "config": cfg,
            "code": unpack(args.tree, work / "tree"),
            "order": "start-up, warm-up; latency: per repetition A workflow, B sequential, C one_step, D single; then "
            "in flight: per repetition A workflow, B sequential",
        }
    }
    problems: list[str] = []
    latency: list[dict[str, Any]] = []
    flight: list[dict[str, Any]] = []
    shared, _ = ensure_services()
    vhost = Vhost(shared, f"reach-wf-bench-{os.getpid()}").create()
    bench: Bench | None = None
    log(f"{mode} run; vhost {vhost.name}; logs in {work}")
    try:
        redis_url, redis_pid = start_private_redis(procs)
        downstream = Downstream(procs)
        catalog_dir = catalogs.write(work / "catalog", catalog(downstream.url))
        fleet = ReachFleet(procs, catalog_dir, vhost.url, redis_url, cwd=work / "tree")
        if args.queue_type:
            fleet.env["REACH_QUEUE_TYPE"] = args.queue_type
        fleet.start_router()
        fleet.start_pool(CONNECTOR)
        runner = fleet
        if args.runner_from is not None:
            runner = ReachFleet(
                procs, catalog_dir, vhost.url, redis_url, prefix="tried", cwd=args.runner_from.resolve()
            )
            runner.env.update({k: v for k, v in fleet.env.items() if k == "REACH_QUEUE_TYPE"})
        runner.start("workflows", ["workflows"])
        for queue in (
            "reach.intents",
            f"reach.connector.{CONNECTOR}",
            WORKFLOWS_QUEUE_NAME,
            WORKFLOW_RECEIPTS_QUEUE_NAME,
        ):
            fleet.wait_consuming(queue, 120)
        pids = {
            "router": fleet.pid("router"),
            "pool": fleet.pid(CONNECTOR),
            "runner": runner.pid("workflows"),
            "redis": redis_pid,
            "downstream": downstream.proc.pid,
        }
        bench = Bench(fleet, downstream, redis_url, pids)
        for i in range(cfg["warmup"]):
            for kind in KINDS:
                getattr(bench, kind)(f"W{bench.tag}-{kind}-{i}")
        log(f"warmed up; load {loadavg()}")
        for rep in range(cfg["reps"]):
            row = {kind: bench.latency_phase(kind, rep, cfg["samples"]) for kind in KINDS}
            row["load"] = loadavg()
            latency.append(row)
            log(
                f"latency rep {rep + 1}/{cfg['reps']}: "
                + ", ".join(f"{k} p50 {row[k]['p50']} p95 {row[k]['p95']}" for k in KINDS)
                + f"; overhead/step {(row['workflow']['p50'] - row['sequential']['p50']) / 3:.2f} ms; load {row['load'][0]}"
            )
        for rep in range(cfg["flight_reps"]):
            row = {}
            for kind in ("workflow", "sequential"):
                time.sleep(1.0)
                row[kind] = bench.flight_phase(kind, rep, cfg["runs"])
                f = row[kind]
                log(
                    f"in flight rep {rep + 1} {kind}: {f['finished']} finished ({f['failed']} failed), drain "
                    f"{f['drain_s']} s, calls {f['calls']['calls']} (twice {f['calls']['repeated']}), "
                    f"Redis B/run in flight {f['redis_in_flight']['used_memory_per_run']}, finished "
                    f"{f['redis_finished']['used_memory_per_run']}; runner RSS {f['rss_mb']['runner']}; CPU ms/run "
                    f"{f['cpu_ms_per_run']}; queue peaks {f['queue_peaks']}"
                )
            row["load"] = loadavg()
            flight.append(row)
        if args.profile:
            results["profile"] = profile_runner(bench, cfg["runs"], 3 * cfg["samples"])
        fleet.check_alive()
        runner.check_alive()
    except BaseException as exc:
        problems.append(f"run aborted: {type(exc).__name__}: {exc}")
        import traceback

        traceback.print_exc()
    finally:
        if bench is not None:
            problems.extend(bench.problems)
            bench.client.close()
        procs.stop_all()
        vhost.delete()
    results["meta"]["load_end"] = loadavg()
    results["meta"]["calibration_ms_end"] = calibrate()
    results["latency"], results["flight"], results["problems"] = latency, flight, problems
    if latency:
        results["summary"] = summarize(latency, flight)
    if problems or args.keep_logs:
        results["logs_kept"] = str(work)
    else:
        shutil.rmtree(work, ignore_errors=True)
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(results, indent=1, default=str) + "\n")
    if "summary" in results:
        print(render(results))
        s = results["summary"]
        line = {
            "bench": "workflows",
            "commit": results["meta"]["code"]["commit"][:10],
            "reps": cfg["reps"],
            **{f"{k}_p50": s["latency"][k]["p50"] for k in KINDS},
            **{f"{k}_p95": s["latency"][k]["p95"] for k in KINDS},
            "per_step_ms": s["per_step_ms"],
            "per_run_ms": s["per_run_ms"],
            "ratio_p50": s["ratio_p50"],
            "ratio_p95": s["ratio_p95"],
            "overhead_ms_per_step": s["overhead_ms_per_step"],
            "target_met": s["target_met"],
            "flight": {
                k: {
                    x: f[x]
                    for x in (
                        "n",
                        "drain_s",
                        "failed",
                        "called_twice",
                        "runner_rss_mb",
                        "used_memory_in_flight",
                        "used_memory_finished",
                    )
                }
                for k, f in s["flight"].items()
            },
            "problems": len(problems),
        }
        print(json.dumps(line))
    else:
        print("PROBLEMS: " + "; ".join(problems))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
