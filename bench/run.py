#!/usr/bin/env python
"""agent-reach benchmarks, side by side in one run (issue 7):

    .venv/bin/python bench/run.py            # full run, ~10 minutes
    .venv/bin/python bench/run.py --quick    # small counts, under a minute: re-run after each change

a. direct — the same HTTP call made directly with httpx (one client, keep-alive): the floor;
b. bare   — a minimal Celery two-hop pipeline without guardrails (bench/bare.py);
c. fleet  — the real fleet with every guardrail (bench/catalogs.py), started like tests/fleet.py.

Figures: max sustained intents/s; p50/p99 publish->receipt latency at paced 100/s and 200/s;
CPU ms per intent per process; c/b and c-a; isolation (bench/isolation.py) and scale
(bench/scale.py); py-spy profiles of the router and the pool (bench/profiling.py).
Results: a table on stdout, bench/results/latest.json. Everything on 127.0.0.1, in a RabbitMQ vhost
and a redis-server of the run's own; only processes this run started are stopped (by process group).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

import catalogs  # noqa: E402
from common import (
    RESULTS,
    Agent,
    BrokerGone,
    CpuMeter,
    Procs,
    Vhost,
    calibrate,
    downstream_stats,
    ensure_services,  # noqa: E402
    find_listener_pid,
    find_pids,
    fmt,
    loadavg,
    log,
    median,
    queue_state,
    redis_calls,
    rss_mb,
    scan_log,
    start_downstream,
    start_private_redis,
    table,
    tmpdir,
)
from reachfleet import ReachFleet  # noqa: E402

CONFIGS: dict[str, dict[str, Any]] = {
    "full": dict(
        reps=3,
        burst_n=2000,
        warmup=200,
        paced=[(100, 10.0), (200, 6.0)],
        idle_s=1.0,
        iso_reps=5,
        iso_seconds=10.0,
        backlog=1000,
        big_backlog=10000,
        scale_grid=[(10, 10), (1000, 10), (10000, 10), (10, 500), (10000, 500)],
        scale_n=1500,
        profile=True,
        profile_n=2000,
    ),
    "quick": dict(
        reps=1,
        burst_n=500,
        warmup=50,
        paced=[(100, 3.0), (200, 2.0)],
        idle_s=0.5,
        iso_reps=1,
        iso_seconds=3.0,
        backlog=500,
        big_backlog=0,
        scale_grid=[(10, 10), (1000, 500)],
        scale_n=300,
        profile=False,
        profile_n=1500,
    ),
}
VARIANTS = ("direct", "bare", "fleet")
# --plain-agent: the same two pipelines driven by bench/plain_agent.py (pika, one confirm per
# publish, written from docs/contract.md alone), beside the project's own agent (issue 36)
PLAIN_VARIANTS = ("bare_plain", "fleet_plain")
SHARED = {"rabbitmq"}  # processes other tenants use too: their idle rate is subtracted ("net")
PROC_ORDER = ("agent", "router", "pool", "rabbitmq", "redis", "downstream")
TARGETS = {
    "throughput_ratio_min": 0.9,
    "added_p99_ms_max": 15.0,
    "isolation_ratio_max": 1.2,
    "isolation_relative_to_bare_max": 1.15,
    "backlog_independence_max": 1.1,
    "scale_flat_max_ratio": 1.25,
}


@dataclass
class Ctx:
    args: argparse.Namespace
    cfg: dict[str, Any]
    run_id: str
    procs: Procs
    work: Path
    broker_url: str = ""
    redis_url: str = ""
    redis_pid: int | None = None
    beam_pid: int | None = None
    downstream_url: str = ""
    downstream_pid: int = 0
    agents: dict[str, Agent] = field(default_factory=dict)
    meters: dict[str, CpuMeter] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    expected_calls: int = 0
    consumer_queues: list[str] = field(default_factory=list)
    restarted: list[str] = field(default_factory=list)
    no_drain: set[str] = field(default_factory=set)  # queues whose backlog is part of the experiment
    succeeded: dict[str, int] = field(default_factory=dict)
    redis_mem0: int = 0
    slow_url: str = ""  # bench_slow's own downstream
    bare_env: dict[str, str] = field(default_factory=dict)
    variants: tuple[str, ...] = VARIANTS

    def start_bare_slow(self) -> int:
        """The bare pipeline's connector for the slow system (the isolation section's baseline)."""
        env = dict(self.bare_env, BARE_CONNECTOR="slow", BARE_DOWNSTREAM_URL=self.slow_url + "/slow/tickets")
        proc = self.procs.start(
            "bare-connector-slow",
            [sys.executable, str(Path(__file__).resolve().parent / "bare.py"), "connector"],
            env=env,
        )
        t0 = time.time()
        while queue_state(self.broker_url, "bare.connector.slow")[1] <= 0:
            self.procs.check_alive("bare-connector-slow")
            if time.time() - t0 > 120:
                raise RuntimeError(f"bare.connector.slow has no consumer; see {self.procs.log_dir}")
            time.sleep(0.2)
        return proc.pid

    def wait_consumers(self, timeout: float = 180.0) -> None:
        """Every queue this run consumes has its consumer (again); a worker that died is reported
        as a problem and started again, as an orchestrator would."""
        import re

        deadline = time.time() + timeout
        for name, proc in list(self.procs.items.items()):
            if not proc.alive() and not name.startswith("agent-"):
                crit = [
                    line[:300]
                    for line in proc.log_text().splitlines()
                    if re.search(r"CRITICAL|Unrecoverable|Error:", line)
                ][:3]
                msg = f"{name} exited with {proc.popen.returncode} after the broker connection was lost: {crit}"
                if name.startswith("bare-"):
                    # the baseline has no guardrails by design; restarting it is all there is to do
                    log("note: " + msg)
                    self.notes.append(msg + " (baseline; restarted)")
                else:
                    log("PROBLEM " + msg)
                    self.problems.append(msg + " (restarted)")
                CpuMeter.replace_pid(proc.pid, self.procs.restart(name).pid)
                self.restarted.append(name)
        for q in self.consumer_queues:
            while queue_state(self.broker_url, q)[1] <= 0:
                if time.time() > deadline:
                    raise RuntimeError(f"{q} has no consumer after the broker came back")
                time.sleep(0.5)
        # leftovers of the interrupted phase drain before the phase is run again
        drain = [q for q in self.consumer_queues if q not in self.no_drain]
        while time.time() < deadline and any(queue_state(self.broker_url, q)[0] > 0 for q in drain):
            time.sleep(0.5)
        time.sleep(1.0)

    def intent(
        self, variant: str, agents: list[str] | None = None, action: str = "create_ticket", suffix: str | None = None
    ) -> dict[str, Any]:
        return {
            "action": action,
            "params": catalogs.PARAMS,
            "agents": agents or [catalogs.AGENT],
            "id_prefix": f"{self.run_id}-{variant}-{uuid.uuid4().hex[:8]}",
            "reply_suffix": suffix
            or {"bare": "rb", "fleet": "rf", "bare_plain": "rbp", "fleet_plain": "rfp"}.get(variant, "x"),
        }

    def phase(
        self,
        variant: str,
        mode: str,
        n: int,
        rate: float | None = None,
        label: str = "",
        agents: list[str] | None = None,
        meter: CpuMeter | None = None,
        check: bool = True,
        samples: bool = False,
        timeline: bool = False,
    ) -> dict[str, Any]:
        """One phase of ``variant``'s agent; ``samples``: its result carries every latency (samples_ms);
        ``timeline``: (s into the phase sent, latency ms) per intent (bench/recovery.py)."""
        timeout = 30 + (n / rate if rate else n / 80)
        interrupted = False
        for attempt in range(3):
            try:
                res = self.agents[variant].run(
                    meter if meter is not None else self.meters.get(variant),
                    mode=mode,
                    n=n,
                    rate=rate,
                    timeout=timeout,
                    intent=self.intent(variant, agents),
                    samples=samples,
                    timeline=timeline,
                )
                break
            except BrokerGone as exc:
                # another tenant restarted RabbitMQ (the crash-safety tests do): reconnect, let the
                # workers reconnect too, and run the phase again
                note = f"{variant} {label or mode}: broker connection lost ({exc}); phase repeated"
                log(note)
                self.notes.append(note)
                if attempt == 2:
                    raise
                interrupted = True
                self.agents[variant].reconnect()
                self.wait_consumers()
        else:  # pragma: no cover
            raise RuntimeError("unreachable")
        succeeded = res.get("statuses", {}).get("succeeded", 0)
        self.expected_calls += succeeded
        self.succeeded[variant] = self.succeeded.get(variant, 0) + succeeded
        if check:
            self.check(res, f"{variant} {label or mode}", interrupted)
        return res

    def check(self, res: dict[str, Any], what: str, interrupted: bool = False) -> None:
        bad = []
        if res.get("missing"):
            bad.append(f"{res['missing']} receipts missing")
        if res.get("duplicates"):
            bad.append(f"{res['duplicates']} duplicate receipts")
        if res.get("unconfirmed") or res.get("nacked"):
            bad.append(f"{res.get('unconfirmed')} unconfirmed / {res.get('nacked')} nacked publishes")
        others = {k: v for k, v in res.get("statuses", {}).items() if k != "succeeded"}
        if others:
            bad.append(f"statuses {others} codes {res.get('codes')}")
        if res.get("stray") and not interrupted:
            bad.append(f"{res['stray']} receipts for intents this phase did not send")
        elif res.get("stray"):
            self.notes.append(f"{what}: {res['stray']} late receipts of the interrupted attempt arrived")
        if bad:
            msg = f"{what}: " + "; ".join(bad)
            log("PROBLEM " + msg)
            self.problems.append(msg)


def per_intent_cpu(res: dict[str, Any], idle: dict[str, float] | None = None) -> dict[str, float]:
    n = res.get("receipts") or res.get("n") or 1
    out = {"agent": round(res["agent_cpu_ms"] / n, 4)}
    for name, seconds in (res.get("cpu_s") or {}).items():
        out[name] = round(seconds * 1000 / n, 4)
        if name in SHARED and idle is not None:
            net = max(0.0, seconds - idle.get(name, 0.0) * res.get("wall_s", 0.0))
            out[name + "_net"] = round(net * 1000 / n, 4)
    return out


def cpu_total(cpu: dict[str, float]) -> float:
    return round(sum(cpu.get(p + "_net", cpu.get(p, 0.0)) for p in PROC_ORDER), 3)


# -- setup ---------------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    model = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    mem_kb = next(
        int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines() if line.startswith("MemTotal")
    )
    return {
        "nproc": os.cpu_count(),
        "cpu_model": model,
        "ram_gb": round(mem_kb / 1024 / 1024, 1),
        "kernel": platform.release(),
    }


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for pkg in ("celery", "kombu", "amqp", "redis", "httpx", "pydantic", "prometheus-client", "py-spy"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            pass
    try:
        out["rabbitmq"] = subprocess.run(
            ["rabbitmqctl", "version"], capture_output=True, text=True, timeout=30
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        raw = subprocess.run(["redis-server", "--version"], capture_output=True, text=True, timeout=10).stdout
        out["redis-server"] = next((w[2:] for w in raw.split() if w.startswith("v=")), raw.strip())
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        beam = Path("/usr/lib/erlang/releases").glob("*/OTP_VERSION")
        out["erlang_otp"] = next(beam).read_text().strip()
    except (StopIteration, OSError):
        pass
    return out


def code_state() -> dict[str, Any]:
    """Which fleet code was measured: the commit and whether workers/, connectors/ or producers/
    had uncommitted changes (a short hash of the diff)."""
    import hashlib

    def git(*args: str) -> str:
        try:
            return subprocess.run(
                ["git", *args], capture_output=True, text=True, cwd=Path(__file__).resolve().parent.parent, timeout=30
            ).stdout
        except (OSError, subprocess.SubprocessError):
            return ""

    diff = git("diff", "HEAD", "--", "workers", "connectors", "producers")
    return {
        "commit": git("rev-parse", "--short", "HEAD").strip(),
        "uncommitted_fleet_changes": git("diff", "HEAD", "--stat", "--", "workers", "connectors", "producers")
        .strip()
        .splitlines()[-1:]
        or None,
        "diff_sha1": hashlib.sha1(diff.encode()).hexdigest()[:10] if diff else None,
    }


def start_stack(ctx: Ctx) -> tuple[ReachFleet, dict[str, int]]:
    """Services, vhost, redis, downstream, the fleet (router + bench_fast pool), bare, agents."""
    shared_broker, shared_redis = ensure_services()
    vhost = Vhost(shared_broker, f"reach-bench-{os.getpid()}").create()
    ctx.procs_vhost = vhost  # type: ignore[attr-defined]
    ctx.broker_url = vhost.url
    if ctx.args.redis_url:
        ctx.redis_url = ctx.args.redis_url
        from urllib.parse import urlsplit

        ctx.redis_pid = find_listener_pid(urlsplit(ctx.redis_url).port or 6379, "redis-server")
        SHARED.add("redis")
    else:
        ctx.redis_url, ctx.redis_pid = start_private_redis(ctx.procs)
    from urllib.parse import urlsplit

    ctx.beam_pid = find_listener_pid(urlsplit(shared_broker).port or 5672, "beam.smp") or next(
        iter(find_pids("beam.smp")), None
    )
    if not ctx.args.redis_url:
        import redis

        client = redis.Redis.from_url(ctx.redis_url, socket_timeout=5)
        ctx.redis_mem0 = int(client.info("memory")["used_memory"])
        client.close()
    ctx.downstream_url, ctx.downstream_pid = start_downstream(ctx.procs)
    # bench_slow is another system: its own process, so its 2 s calls do not queue behind (or
    # ahead of) the fast system's requests in one shared event loop
    ctx.slow_url, _ = start_downstream(ctx.procs, name="downstream-slow")
    slow_url = ctx.slow_url
    log(
        f"vhost {vhost.name}, redis {ctx.redis_url}, downstream {ctx.downstream_url} (slow: {slow_url}), "
        f"beam.smp pid {ctx.beam_pid}"
    )

    catalog_dir = catalogs.write(
        ctx.work / "catalog-main", catalogs.main_catalog(ctx.downstream_url, slow_endpoint=slow_url)
    )
    fleet = ReachFleet(ctx.procs, catalog_dir, ctx.broker_url, ctx.redis_url)
    fleet.start_router()
    fleet.start_pool(catalogs.FAST)
    ctx.bare_env = bare_env = dict(
        os.environ,
        BARE_BROKER_URL=ctx.broker_url,
        BARE_DOWNSTREAM_URL=ctx.downstream_url + "/tickets",
        BARE_CONCURRENCY="20",
        PYTHONUNBUFFERED="1",
    )
    py = sys.executable
    bench = Path(__file__).resolve().parent
    ctx.procs.start("bare-router", [py, str(bench / "bare.py"), "router"], env=bare_env)
    ctx.procs.start("bare-connector", [py, str(bench / "bare.py"), "connector"], env=bare_env)
    t0 = time.time()
    fleet.wait_consuming("reach.intents")
    fleet.wait_consuming("reach.connector." + catalogs.FAST)
    for q in ("bare.intents", "bare.connector.fast"):
        while queue_state(ctx.broker_url, q)[1] <= 0:
            ctx.procs.check_alive("bare-router", "bare-connector")
            if time.time() - t0 > 120:
                raise RuntimeError(f"{q} has no consumer; see {ctx.procs.log_dir}")
            time.sleep(0.2)
    log(f"fleet and bare pipeline consuming after {time.time() - t0:.1f} s")
    ctx.consumer_queues = ["reach.intents", "reach.connector." + catalogs.FAST, "bare.intents", "bare.connector.fast"]

    pids = {
        "fleet_router": fleet.pid("router"),
        "fleet_pool": fleet.pid(catalogs.FAST),
        "bare_router": ctx.procs.items["bare-router"].pid,
        "bare_pool": ctx.procs.items["bare-connector"].pid,
    }
    for variant in ctx.variants:
        script = "plain_agent.py" if variant in PLAIN_VARIANTS else "agent.py"
        ctx.agents[variant] = Agent(ctx.procs, f"agent-{variant}", script)
    ctx.agents["direct"].connect_http(ctx.downstream_url + "/tickets")
    ctx.agents["bare"].connect_amqp(ctx.broker_url, "bare.intents", "bare.receipts", "*.rb")
    ctx.agents["fleet"].connect_amqp(ctx.broker_url, "reach.intents", "reach.receipts", "*.rf")
    if "bare_plain" in ctx.agents:
        ctx.agents["bare_plain"].connect_amqp(ctx.broker_url, "bare.intents", "bare.receipts", "*.rbp")
        ctx.agents["fleet_plain"].connect_amqp(ctx.broker_url, "reach.intents", "reach.receipts", "*.rfp")
    common = {"downstream": ctx.downstream_pid}
    if ctx.beam_pid:
        common["rabbitmq"] = ctx.beam_pid
    trees = {"rabbitmq": False}
    ctx.meters["direct"] = CpuMeter({"downstream": ctx.downstream_pid}, trees)
    ctx.meters["bare"] = CpuMeter({"router": pids["bare_router"], "pool": pids["bare_pool"], **common}, trees)
    fleet_pids = {"router": pids["fleet_router"], "pool": pids["fleet_pool"], **common}
    if ctx.redis_pid:
        fleet_pids["redis"] = ctx.redis_pid
    ctx.meters["fleet"] = CpuMeter(fleet_pids, trees)
    if "bare_plain" in ctx.agents:
        ctx.meters["bare_plain"] = ctx.meters["bare"]
        ctx.meters["fleet_plain"] = ctx.meters["fleet"]
    return fleet, pids


# -- the side-by-side sections -------------------------------------------------------------------


def throughput(ctx: Ctx, variants: Sequence[str] | None = None) -> dict[str, Any]:
    """Bursts of ``burst_n`` per variant, interleaved, ``reps`` times."""
    cfg = ctx.cfg
    variants = ctx.variants if variants is None else variants
    out: dict[str, Any] = {v: {"reps": []} for v in variants}
    for rep in range(cfg["reps"]):
        for variant in variants:
            idle = ctx.meters[variant].idle_rates(cfg["idle_s"])
            fleet = variant.startswith("fleet")
            before = redis_calls(ctx.redis_url) if fleet and not ctx.args.redis_url else None
            res = ctx.phase(variant, "burst", cfg["burst_n"], label=f"burst rep {rep + 1}")
            if before is not None:
                after = redis_calls(ctx.redis_url)
                n_done = res.get("receipts") or 1
                res["redis_calls_per_intent"] = {
                    k: round((after[k] - before.get(k, 0)) / n_done, 2)
                    for k in sorted(after)
                    if after[k] - before.get(k, 0) > 0
                }
            res["cpu_ms_per_intent"] = per_intent_cpu(res, idle)
            res["idle_cpu_rate"] = {k: round(v, 4) for k, v in idle.items()}
            out[variant]["reps"].append(res)
            log(
                f"throughput rep {rep + 1} {variant:6s}: steady {res.get('steady_rate')}/s, overall "
                f"{res.get('overall_rate')}/s, receipts {res.get('receipts')}/{res['n']}, "
                f"load {loadavg()[0]}"
            )
    for variant in variants:
        reps = out[variant]["reps"]
        out[variant]["steady_rate"] = median([r.get("steady_rate") for r in reps])
        out[variant]["overall_rate"] = median([r.get("overall_rate") for r in reps])
        names = sorted({k for r in reps for k in r["cpu_ms_per_intent"]})
        out[variant]["cpu_ms_per_intent"] = {
            k: round(median([r["cpu_ms_per_intent"].get(k) for r in reps]) or 0, 4) for k in names
        }
        if reps and "redis_calls_per_intent" in reps[-1]:
            out[variant]["redis_calls_per_intent"] = reps[-1]["redis_calls_per_intent"]
    return out


def latency(ctx: Ctx) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for rate, seconds in ctx.cfg["paced"]:
        n = int(rate * seconds)
        block: dict[str, Any] = {v: {"reps": []} for v in ctx.variants}
        for rep in range(ctx.cfg["reps"]):
            for variant in ctx.variants:
                res = ctx.phase(variant, "paced", n, rate=rate, label=f"paced {rate}/s rep {rep + 1}")
                res["cpu_ms_per_intent"] = per_intent_cpu(res)
                block[variant]["reps"].append(res)
                lat = res["latency_ms"]
                log(
                    f"paced {rate}/s rep {rep + 1} {variant:6s}: p50 {lat['p50']} ms, p99 {lat['p99']} ms, "
                    f"receipts {res.get('receipts')}/{n}"
                )
        for variant in ctx.variants:
            reps = block[variant]["reps"]
            block[variant]["p50_ms"] = median([r["latency_ms"]["p50"] for r in reps])
            block[variant]["p99_ms"] = median([r["latency_ms"]["p99"] for r in reps])
            block[variant]["max_ms"] = max((r["latency_ms"]["max"] or 0) for r in reps)
        out[str(rate)] = block
    return out


def memory(ctx: Ctx, pids: dict[str, int]) -> dict[str, float]:
    names = {
        "fleet_router": "fleet-router",
        "fleet_pool": f"fleet-{catalogs.FAST}",
        "bare_router": "bare-router",
        "bare_pool": "bare-connector",
    }
    out = {k: rss_mb(ctx.procs.items[n].pid if n in ctx.procs.items else pids[k]) for k, n in names.items()}
    for variant, agent in ctx.agents.items():
        out[f"agent_{variant}"] = rss_mb(agent.proc.pid)
    out["downstream"] = rss_mb(ctx.downstream_pid)
    if ctx.redis_pid:
        out["redis"] = rss_mb(ctx.redis_pid)
    if ctx.beam_pid:
        out["rabbitmq (whole broker)"] = rss_mb(ctx.beam_pid)
    return out


def redis_footprint(ctx: Ctx) -> dict[str, Any]:
    """What the fleet leaves in Redis per intent (receipt copy, sent mark, idempotency record,
    trace, delivery counter...), all with 24 h TTLs by default: the private Redis holds only the
    fleet's keys."""
    import redis

    client = redis.Redis.from_url(ctx.redis_url, socket_timeout=5)
    try:
        info = client.info("memory")
        keys = client.dbsize()
        sample: dict[str, int] = {}
        for key in client.scan_iter(count=1000):
            prefix = key.decode().split(":")[1] if key.count(b":") else key.decode()
            sample[prefix] = sample.get(prefix, 0) + 1
    finally:
        client.close()
    n = ctx.succeeded.get("fleet", 0) or 1
    return {
        "intents": n,
        "keys": keys,
        "keys_per_intent": round(keys / n, 2),
        "used_memory_mb": round(info["used_memory"] / 1e6, 1),
        "bytes_per_intent": round((info["used_memory"] - ctx.redis_mem0) / n),
        "keys_by_prefix": dict(sorted(sample.items(), key=lambda kv: -kv[1])),
    }


# -- report ------------------------------------------------------------------------------------


def render(results: dict[str, Any]) -> str:
    lines = []
    meta = results["meta"]
    lines.append(f"agent-reach benchmarks ({meta['mode']}) — {meta['started']}")
    m = meta["machine"]
    lines.append(
        f"machine: {m['nproc']} cores, {m['cpu_model']}, {m['ram_gb']} GB RAM; "
        f"load average {meta['load_start']} at start, {meta['load_end']} at end; "
        f"calibration {meta['calibration_ms_start']} ms at start, {meta['calibration_ms_end']} ms at end "
        "(fixed pure-Python work: higher = slower/busier machine)"
    )
    v = meta.get("versions", {})
    lines.append("versions: " + ", ".join(f"{k} {val}" for k, val in v.items()))
    code = meta.get("code") or {}
    lines.append(
        f"code: commit {code.get('commit')}"
        + (
            f", uncommitted fleet changes {code['uncommitted_fleet_changes']} (diff {code['diff_sha1']})"
            if code.get("uncommitted_fleet_changes")
            else ""
        )
    )
    tp = results.get("throughput")
    if tp:
        lines.append("")
        lines.append(
            f"max sustained throughput (burst of {meta['config']['burst_n']} intents, pipelined confirms; "
            f"receipts/s between the 10th and 90th percentile arrival; median of {meta['config']['reps']})"
        )
        rows = []
        for variant in [v for v in (*VARIANTS, *PLAIN_VARIANTS) if v in tp]:
            t = tp[variant]
            cpu = t["cpu_ms_per_intent"]
            rows.append(
                [
                    variant,
                    fmt(t["steady_rate"], 0),
                    " ".join(fmt(r.get("steady_rate"), 0) or "-" for r in t["reps"]),
                    *[
                        fmt(cpu.get(p + "_net", cpu.get(p)), 3) if (p + "_net" in cpu or p in cpu) else None
                        for p in PROC_ORDER
                    ],
                    fmt(cpu_total(cpu), 3),
                ]
            )
        lines.append(
            table(
                [
                    "variant",
                    "intents/s",
                    "reps",
                    "agent",
                    "router",
                    "pool",
                    "rabbitmq*",
                    "redis",
                    "downstream",
                    "CPU ms/intent total",
                ],
                rows,
            )
        )
        lines.append(
            "  CPU columns: ms of CPU per intent during the burst (/proc utime+stime); rabbitmq* is net of its "
            "idle rate measured just before (other tenants share the broker)"
        )
        calls = tp["fleet"].get("redis_calls_per_intent")
        if calls:
            trips = calls.get("(round trips)")
            lines.append(
                f"  fleet: Redis round trips per intent ~{trips} (socket reads Redis processed); commands per intent "
                f"{round(sum(v for k, v in calls.items() if k not in ('info', 'hello', 'ping', '(round trips)')), 1)}"
                " (Lua-internal ones included): "
                + ", ".join(f"{k} {v}" for k, v in calls.items() if k != "(round trips)")
            )
    lat = results.get("latency")
    if lat:
        lines.append("")
        lines.append(
            f"end-to-end latency, publish -> receipt at the agent (ms; median over {meta['config']['reps']} reps)"
        )
        rows = []
        rates = list(lat)
        for variant in [v for v in (*VARIANTS, *PLAIN_VARIANTS) if rates and v in lat[rates[0]]]:
            row: list[Any] = [variant]
            for rate in rates:
                b = lat[rate][variant]
                row += [fmt(b["p50_ms"], 2), fmt(b["p99_ms"], 2), fmt(b["max_ms"], 1)]
            rows.append(row)
        header = ["variant"]
        for rate in rates:
            header += [f"{rate}/s p50", f"{rate}/s p99", f"{rate}/s max"]
        lines.append(table(header, rows))
    if lat and "100" in lat:
        reps = lat["100"]["fleet"]["reps"]
        stages = [r.get("stages_ms") for r in reps if r.get("stages_ms")]
        if stages:
            names = {
                "to_router": "agent publish -> router reads it",
                "in_fleet": "router reads -> receipt built",
                "queue": "  of which: waiting in the connector queue",
                "downstream": "  of which: the HTTP call",
                "to_agent": "receipt built -> agent has it",
            }
            rows = [
                [
                    label,
                    fmt(median([s[k]["p50"] for s in stages if k in s]), 2),
                    fmt(median([s[k]["p99"] for s in stages if k in s]), 2),
                ]
                for k, label in names.items()
                if any(k in s for s in stages)
            ]
            lines.append("  fleet at 100/s, where the time goes (from the receipts' execution fields; ms):")
            lines.append("  " + table(["stage", "p50", "p99"], rows).replace("\n", "\n  "))
    r = results.get("ratios")
    if r:
        lines.append("")
        lines.append(
            f"c/b throughput: {fmt(r.get('throughput_c_over_b'), 3)} (target >= {TARGETS['throughput_ratio_min']})"
            f";  c-a at 100/s: p50 +{fmt(r.get('added_p50_ms_100'), 2)} ms, p99 +{fmt(r.get('added_p99_ms_100'), 2)} ms"
            f" (target p99 <= {TARGETS['added_p99_ms_max']} ms);  c-b at 100/s: p50 +{fmt(r.get('fleet_minus_bare_p50_ms_100'), 2)}"
            f" ms, p99 +{fmt(r.get('fleet_minus_bare_p99_ms_100'), 2)} ms"
        )
        if "plain_throughput_c_over_b" in r:
            lines.append(
                f"plain agent (bench/plain_agent.py): fleet/bare throughput {fmt(r.get('plain_throughput_c_over_b'), 3)}"
                f", p99 at 100/s fleet/bare {fmt(r.get('plain_p99_c_over_b_100'), 3)}"
            )
    iso = results.get("isolation")
    if iso and "fast_p99_without_ms" in iso:
        lines.append("")
        lines.append(
            f"isolation: fast connector at paced 100/s beside bench_slow (2 s per call, backlog {iso['backlog']}): "
            f"p99 {fmt(iso['fast_p99_without_ms'], 2)} ms without, {fmt(iso['fast_p99_with_ms'], 2)} ms with the backlog"
            f" -> ratio {fmt(iso['ratio'], 2)} (target <= {TARGETS['isolation_ratio_max']}); p50 "
            f"{fmt(iso['fast_p50_without_ms'], 2)} / {fmt(iso['fast_p50_with_ms'], 2)} ms; intents pooled over "
            f"{len(iso['without'])} repetitions {iso.get('samples')}; each repetition's p99 {iso.get('rep_p99_ms')}; "
            f"slow queue depth during 'with': {iso.get('slow_depth')}"
        )
        if iso.get("big_over_with") is not None:
            lines.append(
                f"  beside a {meta['config'].get('big_backlog')} backlog: p99 {fmt(iso['fast_p99_with_big_ms'], 2)} ms -> "
                f"{fmt(iso['big_over_with'], 2)} x the {iso['backlog']}-backlog p99 (each repetition's {iso.get('rep_p99_big_ms')}; "
                f"slow queue depth {iso.get('slow_depth_big')})"
            )
        bare_iso = iso.get("bare")
        if bare_iso and bare_iso.get("ratio") is not None:
            lines.append(
                f"  baseline, the bare pipeline in the same repetitions: p99 {fmt(bare_iso['fast_p99_without_ms'], 2)} ms "
                f"without, {fmt(bare_iso['fast_p99_with_ms'], 2)} ms with -> ratio {fmt(bare_iso['ratio'], 2)}; "
                f"p50 {fmt(bare_iso['fast_p50_without_ms'], 2)} / {fmt(bare_iso['fast_p50_with_ms'], 2)} ms; "
                f"each repetition's p99 {bare_iso.get('rep_p99_ms')}"
            )
        if iso.get("relative_to_bare") is not None:
            lines.append(
                f"  fleet ratio over bare ratio (the figure of record): {fmt(iso['relative_to_bare'], 3)} "
                f"(target <= {TARGETS['isolation_relative_to_bare_max']})"
            )
    sc = results.get("scale")
    if sc and sc.get("rows"):
        lines.append("")
        lines.append(f"scale: router CPU per intent vs catalog size (burst of {sc['n']} intents, agents round-robin)")
        rows = [
            [
                s["actions"],
                s["agents"],
                fmt(s["router_cpu_ms"], 3),
                fmt(s["pool_cpu_ms"], 3),
                fmt(s["steady_rate"], 0),
                s["rss_mb"]["router"],
                s["rss_mb"]["pool"],
                fmt(s["startup_s"], 1),
                fmt(s.get("catalog_mb"), 1),
            ]
            for s in sc["rows"]
        ]
        lines.append(
            table(
                [
                    "actions",
                    "agents",
                    "router ms/intent",
                    "pool ms/intent",
                    "intents/s",
                    "router RSS MB",
                    "pool RSS MB",
                    "start-up s",
                    "catalog MB",
                ],
                rows,
            )
        )
        lines.append(
            f"  router CPU per intent, largest / smallest catalog: {fmt(sc.get('flat_ratio'), 2)} "
            f"(flat if <= {TARGETS['scale_flat_max_ratio']})"
        )
    rf = results.get("redis_footprint")
    if rf:
        lines.append("")
        lines.append(
            f"Redis footprint of the fleet: {rf['keys_per_intent']} keys and ~{rf['bytes_per_intent']} bytes per intent "
            f"({rf['keys']} keys, {rf['used_memory_mb']} MB after {rf['intents']} intents; TTL 24 h by default); "
            "keys by prefix: " + ", ".join(f"{k} {v}" for k, v in rf["keys_by_prefix"].items())
        )
    mem = results.get("memory")
    if mem:
        lines.append("")
        lines.append("resident memory (MB) after the main runs: " + ", ".join(f"{k} {v}" for k, v in mem.items()))
    prof = results.get("profile")
    if prof:
        import profiling

        lines.append("")
        lines.append("py-spy (fleet at max throughput; files in bench/results/):")
        lines.append(profiling.render(prof))
    t = results.get("targets")
    if t:
        lines.append("")
        lines.append("targets (issue 7):")
        for name, d in t.items():
            lines.append(f"  {'MET ' if d['met'] else ('n/a ' if d['met'] is None else 'MISS')} {name}: {d['text']}")
    checks = results.get("checks", {})
    lines.append("")
    if checks.get("problems"):
        lines.append("PROBLEMS:")
        lines.extend(f"  - {p}" for p in checks["problems"])
    else:
        lines.append("checks: every intent got exactly one receipt, all succeeded; logs and queues clean")
    if checks.get("notes"):
        lines.append("notes:")
        lines.extend(f"  - {n}" for n in checks["notes"])
    if checks.get("logs_kept"):
        lines.append(f"logs: {checks['logs_kept']}")
    return "\n".join(lines)


def targets(results: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    r = results.get("ratios") or {}
    if r.get("throughput_c_over_b") is not None:
        v = r["throughput_c_over_b"]
        out["c throughput >= 0.9 x b"] = {"met": v >= TARGETS["throughput_ratio_min"], "value": v, "text": f"{v:.3f} x"}
    if r.get("added_p99_ms_100") is not None:
        v = r["added_p99_ms_100"]
        out["c - a p99 at 100/s <= 15 ms"] = {
            "met": v <= TARGETS["added_p99_ms_max"],
            "value": v,
            "text": f"+{v:.2f} ms",
        }
    iso = results.get("isolation") or {}
    if iso.get("ratio") is not None:
        out["fast p99 with slow backlog <= 1.2 x without"] = {
            "met": iso["ratio"] <= TARGETS["isolation_ratio_max"],
            "value": iso["ratio"],
            "text": f"{iso['ratio']:.2f} x",
        }
    if iso.get("relative_to_bare") is not None:
        v = iso["relative_to_bare"]
        out["isolation ratio, fleet over bare in the same repetitions, <= 1.15"] = {
            "met": v <= TARGETS["isolation_relative_to_bare_max"],
            "value": v,
            "text": f"{v:.2f} x ({iso['ratio']:.2f} / {iso['bare']['ratio']:.2f}, {len(iso['with'])} repetitions pooled)",
        }
    if iso.get("big_over_with") is not None:
        v = iso["big_over_with"]
        out["fast p99 beside a 10x longer slow backlog <= 1.1 x"] = {
            "met": v <= TARGETS["backlog_independence_max"],
            "value": v,
            "text": f"{v:.2f} x ({iso['fast_p99_with_big_ms']} / {iso['fast_p99_with_ms']} ms)",
        }
    sc = results.get("scale") or {}
    if sc.get("flat_ratio") is not None:
        out["router cost flat across catalog sizes"] = {
            "met": sc["flat_ratio"] <= TARGETS["scale_flat_max_ratio"],
            "value": sc["flat_ratio"],
            "text": f"largest/smallest {sc['flat_ratio']:.2f} x",
        }
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small counts, under a minute")
    parser.add_argument(
        "--only",
        default="main,isolation,scale,profile",
        help="comma-separated sections: main (throughput + latency), isolation, scale, profile",
    )
    parser.add_argument("--no-profile", action="store_true", help="skip py-spy")
    parser.add_argument(
        "--redis-url",
        help="use this Redis (a database of the run's own) instead of a private "
        "redis-server; its CPU is then measured net of its idle rate",
    )
    parser.add_argument("--keep-logs", action="store_true", help="keep the processes' logs even when clean")
    parser.add_argument(
        "--plain-agent",
        action="store_true",
        help="also drive bare and fleet with bench/plain_agent.py (pika, one confirm per publish), side by side",
    )
    parser.add_argument("--output", default=str(RESULTS / "latest.json"))
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one setting of the run's config for a focused look, e.g. "
        "--set iso_reps=3 --set iso_seconds=10 (a number; see CONFIGS)",
    )
    args = parser.parse_args()
    mode = "quick" if args.quick else "full"
    cfg = dict(CONFIGS[mode])
    for item in args.set:
        key, _, value = item.partition("=")
        if key not in cfg or not isinstance(cfg[key], (int, float)) or isinstance(cfg[key], bool):
            parser.error(
                f"--set {item}: {key!r} is not a numeric setting ({', '.join(k for k, v in cfg.items() if isinstance(v, (int, float)) and not isinstance(v, bool))})"
            )
        try:
            cfg[key] = type(cfg[key])(value)
        except ValueError:
            parser.error(f"--set {item}: {value!r} is not a {type(cfg[key]).__name__}")
    sections = set(args.only.split(","))
    # --quick skips py-spy unless it was asked for by name (--only ...,profile)
    if args.no_profile or (not cfg["profile"] and args.only == parser.get_default("only")):
        sections.discard("profile")
    run_id = f"b{int(time.time())}-{uuid.uuid4().hex[:4]}"
    work = tmpdir("reach-bench-")
    procs = Procs(work)
    ctx = Ctx(args, cfg, run_id, procs, work, variants=(*VARIANTS, *PLAIN_VARIANTS) if args.plain_agent else VARIANTS)
    started = time.time()
    results: dict[str, Any] = {
        "meta": {
            "mode": mode,
            "command": "bench/run.py"
            + (" --quick" if args.quick else "")
            + (f" --only {args.only}" if args.only != parser.get_default("only") else "")
            + "".join(f" --set {item}" for item in args.set),
            "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "machine": machine(),
            "load_start": loadavg(),
            "calibration_ms_start": calibrate(),
            "config": {k: v for k, v in cfg.items()},
        }
    }
    log(f"{mode} run {run_id}; load average {results['meta']['load_start']}; logs in {work}")
    fleet = None
    try:
        results["meta"]["versions"] = versions()
        results["meta"]["code"] = code_state()
        fleet, pids = start_stack(ctx)
        # warm-up: connections, Lua scripts, httpx pools, code paths (not measured)
        for variant in ctx.variants:
            ctx.phase(variant, "burst", cfg["warmup"], label="warm-up", meter=CpuMeter({}))
        if "main" in sections:
            results["throughput"] = throughput(ctx)
            if "profile" in sections:
                import profiling

                results["profile"] = profiling.run(
                    pids["fleet_router"],
                    pids["fleet_pool"],
                    lambda: ctx.phase("fleet", "burst", cfg["profile_n"], label="profile burst", meter=CpuMeter({})),
                )
            results["latency"] = latency(ctx)
            tp, lat = results["throughput"], results["latency"]
            b, c = tp["bare"]["steady_rate"], tp["fleet"]["steady_rate"]
            l100 = lat.get("100", {})
            ratios: dict[str, Any] = {"throughput_c_over_b": round(c / b, 3) if b and c else None}
            if l100:
                ratios["added_p50_ms_100"] = round(l100["fleet"]["p50_ms"] - l100["direct"]["p50_ms"], 3)
                ratios["added_p99_ms_100"] = round(l100["fleet"]["p99_ms"] - l100["direct"]["p99_ms"], 3)
                ratios["fleet_minus_bare_p50_ms_100"] = round(l100["fleet"]["p50_ms"] - l100["bare"]["p50_ms"], 3)
                ratios["fleet_minus_bare_p99_ms_100"] = round(l100["fleet"]["p99_ms"] - l100["bare"]["p99_ms"], 3)
            if "fleet_plain" in tp:  # the same two pipelines with the agent written from the contract alone
                bp, cp = tp["bare_plain"]["steady_rate"], tp["fleet_plain"]["steady_rate"]
                ratios["plain_throughput_c_over_b"] = round(cp / bp, 3) if bp and cp else None
                if l100 and l100["bare_plain"]["p99_ms"]:
                    ratios["plain_p99_c_over_b_100"] = round(
                        l100["fleet_plain"]["p99_ms"] / l100["bare_plain"]["p99_ms"], 3
                    )
            results["ratios"] = ratios
            results["memory"] = memory(ctx, pids)
            if not ctx.args.redis_url:
                results["redis_footprint"] = redis_footprint(ctx)
            results["fleet_metrics"] = {"router": fleet.counters("router"), "pool": fleet.counters(catalogs.FAST)}
        elif "profile" in sections:
            import profiling

            results["profile"] = profiling.run(
                pids["fleet_router"],
                pids["fleet_pool"],
                lambda: ctx.phase("fleet", "burst", cfg["profile_n"], label="profile burst", meter=CpuMeter({})),
            )
        # the direct agent is done, and the bare pipeline once isolation (its baseline) has run:
        # free their CPU for what follows
        ctx.agents.pop("direct").quit()
        procs.stop_many(["agent-direct"])
        if "isolation" in sections:
            import isolation

            results["isolation"] = isolation.run(ctx, fleet)
        ctx.agents.pop("bare").quit()
        if "bare_plain" in ctx.agents:
            ctx.agents.pop("bare_plain").quit()
        procs.stop_many(["bare-router", "bare-connector", "agent-bare", "agent-bare_plain"])
        ctx.consumer_queues = ["reach.intents", "reach.connector." + catalogs.FAST]
        fleet_logs = {
            fleet.full(n): scan_log(procs.items[fleet.full(n)].log_text())
            for n in fleet.names
            if fleet.full(n) in procs.items
        }
        if "scale" in sections:
            fleet.stop_all()
            import scale

            results["scale"] = scale.run(ctx)
        # cross-checks: queues drained, nothing dead-lettered, the system saw exactly one call per receipt
        queues = {
            q: queue_state(ctx.broker_url, q)[0]
            for q in (
                "reach.intents",
                "reach.connector.bench_fast",
                "reach.dlq",
                "bare.intents",
                "bare.connector.fast",
                "bare.connector.slow",
            )
        }
        stats = downstream_stats(ctx.downstream_url)
        checks: dict[str, Any] = {
            "queues_ready_at_end": queues,
            "downstream": stats,
            "receipts_succeeded": ctx.expected_calls,
            "fleet_logs": fleet_logs,
        }
        for q, depth in queues.items():
            if depth > 0:
                ctx.problems.append(f"{q} still holds {depth} message(s) at the end")
        fast_calls = stats.get("requests", 0) - stats.get("slow", 0)
        if fast_calls != ctx.expected_calls and ctx.notes:
            ctx.notes.append(
                f"the downstream answered {fast_calls} fast calls for {ctx.expected_calls} succeeded "
                "receipts; phases cut short by a broker restart are not counted"
            )
        elif fast_calls != ctx.expected_calls:
            ctx.problems.append(
                f"the downstream answered {fast_calls} fast calls for {ctx.expected_calls} succeeded "
                "receipts (direct calls included)"
            )
        for name, scan in fleet_logs.items():
            if scan["errors"]:
                ctx.problems.append(f"{name} logged {scan['errors']} error line(s), e.g. {scan['first_errors'][:2]}")
            if scan.get("broker_errors"):
                ctx.notes.append(
                    f"{name} logged {scan['broker_errors']} broker-connection error line(s) while the broker "
                    "was restarted by another tenant (reconnected)"
                )
        checks["problems"] = ctx.problems
        checks["notes"] = ctx.notes
        results["checks"] = checks
    except BaseException as exc:
        ctx.problems.append(f"run aborted: {type(exc).__name__}: {exc}")
        results.setdefault("checks", {})["problems"] = ctx.problems
        results["checks"]["notes"] = ctx.notes
        log(f"aborted: {exc}")
        if isinstance(exc, KeyboardInterrupt):
            pass
        else:
            import traceback

            traceback.print_exc()
    finally:
        for agent in ctx.agents.values():
            agent.quit()
        procs.stop_all()
        vhost = getattr(ctx, "procs_vhost", None)
        if vhost is not None:
            vhost.delete()
    results["meta"]["load_end"] = loadavg()
    results["meta"]["calibration_ms_end"] = calibrate()
    results["meta"]["duration_s"] = round(time.time() - started, 1)
    results["targets"] = targets(results)
    if ctx.problems or args.keep_logs:
        results.setdefault("checks", {})["logs_kept"] = str(work)
    else:
        shutil.rmtree(work, ignore_errors=True)
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(results, indent=1, default=str) + "\n")
    print(render(results))
    print(f"\n{results['meta']['duration_s']} s; JSON: {args.output}")
    return 1 if any("aborted" in p for p in ctx.problems) else 0


if __name__ == "__main__":
    sys.exit(main())
