#!/usr/bin/env python
"""Pool groups (issue 19, "many connectors, few processes"): what a connector costs in a group, and
whether a slow neighbour in the same process slows a fast connector down.

    .venv/bin/python bench/pool_groups.py             # memory + 5 repetitions of the isolation pair, ~8 minutes
    .venv/bin/python bench/pool_groups.py --quick     # 1 repetition, smaller groups, ~2 minutes
    .venv/bin/python bench/pool_groups.py --backlog-independence   # also 1,000 vs 10,000 backlog (+~4 minutes)

1. Memory: ``reach worker`` with 1 connector, then groups of 2, 5, 10 and 20 (``mem_000`` ...,
   20 threads each, the benchmark catalog's HTTP connector), one process at a time; each connector
   first runs a burst of intents (every thread and HTTP connection it opens is open), then the
   process's resident memory (VmRSS) is read. Per additional connector: (RSS(N) - RSS(1)) / (N - 1).

2. Isolation in a group: the same fast connector (paced 100/s, the benchmark's create_ticket) in
   two arrangements, alive side by side, their phases interleaved in every repetition:

       own     ``solo_fast`` in a process of its own; ``solo_slow`` (2 s per call) in another
       group   ``grp_fast`` and ``grp_slow`` (2 s per call) in one process: ``reach worker grp_fast grp_slow``

   each without and with a 1,000-intent backlog on its slow connector (published first, passed on by
   the router: 20 in the slow connector's hands, the rest waiting in its queue). The figure is the
   fast connector's p99 in the group with the backlog over its p99 in its own process with the
   backlog beside it (target <= 1.2), latencies pooled over every repetition; each repetition's
   ratio too. Both slow connectors call one slow system (a process of its own, as in bench/run.py).

3. ``--backlog-independence``: ``solo_fast`` beside a 10,000-intent backlog on ``solo_slow`` against
   beside a 1,000-intent one, in the same repetitions (target <= 1.1).

Everything on 127.0.0.1 in a RabbitMQ vhost and a redis-server of the run's own (bench/common.py);
only processes this run started are stopped. Results: bench/results/pool_groups.json, a summary on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

import catalogs  # noqa: E402
from common import (  # noqa: E402
    RESULTS,
    Agent,
    Procs,
    Vhost,
    calibrate,
    ensure_services,
    fmt,
    loadavg,
    log,
    median,
    percentile,
    purge,
    queue_state,
    rss_mb,
    scan_log,
    start_downstream,
    start_private_redis,
    table,
    tmpdir,
)
from reachfleet import ReachFleet  # noqa: E402

AGENT = "group_agent"
THREADS = 20
TARGET_MEMORY_MB = 10.0
TARGET_GROUP_RATIO = 1.2
TARGET_BACKLOG_RATIO = 1.1
CONFIGS: dict[str, dict[str, Any]] = {
    "full": {
        "sizes": [1, 2, 5, 10, 20],
        "warm": 60,
        "reps": 5,
        "seconds": 10.0,
        "backlog": 1000,
        "big": 10_000,
        "paired_rate": 50,
    },
    "quick": {
        "sizes": [1, 2, 5],
        "warm": 40,
        "reps": 1,
        "seconds": 4.0,
        "backlog": 1000,
        "big": 5000,
        "paired_rate": 50,
    },
}


# -- the catalog ------------------------------------------------------------------------------------


def connector(name: str, endpoint: str, timeout: str = "5s") -> str:
    return (
        f"connector:\n  name: {name}\n  description: Benchmark downstream {name}\n  endpoint: {endpoint}\n"
        f"  auth: {{ type: none }}\n  idempotency_header: Idempotency-Key\n  pool: {{ concurrency: {THREADS} }}\n"
        f"  breaker: {{ fail_max: 5, reset_timeout: 30s }}\n"
        f"  retry: {{ max_attempts: 3, initial_backoff: 100ms, max_backoff: 5s }}\n  actions:\n"
        + catalogs.CREATE_TICKET.format(timeout=timeout)
    )


def group_catalog(fast_url: str, slow_url: str, members: int) -> tuple[str, list[str]]:
    """solo_fast/solo_slow, grp_fast/grp_slow and ``members`` mem_NNN connectors, one agent bound to all."""
    fast = ["solo_fast", "grp_fast"]
    slow = ["solo_slow", "grp_slow"]
    mem = [f"mem_{i:03d}" for i in range(members)]
    docs = [connector(n, fast_url) for n in fast + mem] + [connector(n, slow_url + "/slow", "10s") for n in slow]
    bindings = "".join(
        f"    - connector: {n}\n      allowed_actions: [create_ticket]\n      rate_limit: {catalogs.GENEROUS_RATE}\n"
        f'      allowed_hours: "00:00-24:00 UTC"\n      audit_level: full\n'
        for n in fast + slow + mem
    )
    docs.append(f"agent_app:\n  name: {AGENT}\n  connector_bindings:\n{bindings}")
    return "---\n".join(docs), mem


def intent(action: str, suffix: str) -> dict[str, Any]:
    return {
        "action": action,
        "params": catalogs.PARAMS,
        "agents": [AGENT],
        "id_prefix": f"pg-{uuid.uuid4().hex[:10]}",
        "reply_suffix": suffix,
    }


class Run:
    """What one run holds: its processes, broker, agents, and what went wrong."""

    def __init__(self, cfg: dict[str, Any], work: Path) -> None:
        self.cfg = cfg
        self.work = work
        self.procs = Procs(work)
        self.problems: list[str] = []
        self.broker_url = ""
        self.fleet: ReachFleet | None = None
        self.agent: Agent | None = None  # times the measured intents
        self.twin: Agent | None = None  # the second one, for the paired measurement
        self.sink: Agent | None = None  # publishes backlogs; nobody reads their receipts

    def check(self, res: dict[str, Any], what: str) -> None:
        bad = {k: res.get(k) for k in ("missing", "duplicates", "unconfirmed", "nacked") if res.get(k)}
        others = {k: v for k, v in res.get("statuses", {}).items() if k != "succeeded"}
        if bad or others:
            self.problems.append(f"{what}: {bad} statuses {others} codes {res.get('codes')}")
            log(f"PROBLEM {what}: {bad} {others}")

    def burst(self, action: str, n: int, what: str) -> dict[str, Any]:
        assert self.agent is not None
        res = self.agent.run(None, mode="burst", n=n, timeout=120, intent=intent(action, "rg"))
        self.check(res, what)
        return res

    def paced(self, action: str, n: int, what: str) -> dict[str, Any]:
        assert self.agent is not None
        res = self.agent.run(None, mode="paced", n=n, rate=100, timeout=60, intent=intent(action, "rg"), samples=True)
        self.check(res, what)
        return res

    def wait_consuming(self, *queues: str, timeout: float = 120.0) -> None:
        deadline = time.time() + timeout
        for queue in queues:
            while queue_state(self.broker_url, queue)[1] <= 0:
                if time.time() > deadline:
                    raise RuntimeError(f"{queue} has no consumer; see {self.work}")
                time.sleep(0.1)


# -- 1. memory --------------------------------------------------------------------------------------


def memory(run: Run, members: list[str]) -> dict[str, Any]:
    """RSS of one pool process serving 1, 2, 5, ... connectors, each warmed by a burst."""
    assert run.fleet is not None
    rows = []
    for size in run.cfg["sizes"]:
        names = members[:size]
        proc_name = f"mem{size}"
        run.fleet.start(proc_name, ["worker", *names] + (["--group", f"mem{size}"] if size > 1 else []))
        run.wait_consuming(*(f"reach.connector.{n}" for n in names))
        started = time.time()
        for name in names:
            run.burst(f"{name}.create_ticket", run.cfg["warm"], f"memory warm-up {name} (group of {size})")
        time.sleep(1.0)
        pid = run.fleet.pid(proc_name)
        rss = rss_mb(pid)
        threads = len(os.listdir(f"/proc/{pid}/task"))
        rows.append({"connectors": size, "rss_mb": rss, "threads": threads, "warm_s": round(time.time() - started, 1)})
        log(f"memory: {size} connector(s) in one process: RSS {rss} MB, {threads} threads")
        run.fleet.stop(proc_name)
    base = rows[0]["rss_mb"]
    for row in rows[1:]:
        row["per_additional_mb"] = round((row["rss_mb"] - base) / (row["connectors"] - 1), 2)
        row["separate_processes_mb"] = round(base * row["connectors"], 1)
    per = [r["per_additional_mb"] for r in rows[1:]]
    return {"rows": rows, "one_connector_mb": base, "per_additional_mb_max": max(per) if per else None}


# -- 2. and 3. isolation ----------------------------------------------------------------------------


def publish_backlog(run: Run, slow: str, n: int) -> dict[str, Any]:
    """``n`` intents for ``slow``, published and passed on by the router into its queue."""
    assert run.sink is not None
    res = run.sink.run(
        None, mode="burst", n=n, wait_receipts=False, timeout=300, intent=intent(f"{slow}.create_ticket", "sink")
    )
    t0 = time.time()
    while queue_state(run.broker_url, "reach.intents")[0] > 0:
        if time.time() - t0 > 300:
            raise RuntimeError("the router did not pass the backlog on")
        time.sleep(0.2)
    last, still = queue_state(run.broker_url, f"reach.connector.{slow}")[0], 0
    while still < 3:  # the router's prefetched intents are through once the queue stops growing (1.5 s)
        time.sleep(0.5)
        depth = queue_state(run.broker_url, f"reach.connector.{slow}")[0]
        still = still + 1 if depth <= last else 0
        last = depth
    res["routed_s"] = round(time.time() - t0, 1)
    return res


def phase(run: Run, fast: str, slow: str, backlog: int, label: str) -> dict[str, Any]:
    n = int(100 * run.cfg["seconds"])
    run.burst(f"{fast}.create_ticket", 50, f"{label} warm-up")
    depth_before = depth_after = None
    if backlog:
        publish_backlog(run, slow, backlog)
        depth_before = queue_state(run.broker_url, f"reach.connector.{slow}")[0]
    res = run.paced(f"{fast}.create_ticket", n, label)
    if backlog:
        depth_after = queue_state(run.broker_url, f"reach.connector.{slow}")[0]
        if depth_after <= 0:
            run.problems.append(f"{label}: the slow backlog ran out before the phase ended")
        purge(run.broker_url, f"reach.connector.{slow}")
        time.sleep(2.5)  # the 20 slow calls in hand finish (2 s each)
    out = {
        "p50": res["latency_ms"]["p50"],
        "p99": res["latency_ms"]["p99"],
        "samples": res.get("samples_ms", []),
        "slow_depth": (depth_before, depth_after),
        "load": loadavg()[0],
    }
    log(
        f"{label}: p50 {out['p50']} p99 {out['p99']} ms (slow queue {depth_before} -> {depth_after}, load {out['load']})"
    )
    return out


def paired(run: Run) -> dict[str, Any]:
    """Both arrangements measured at the same time: each repetition publishes both slow backlogs
    (or none), then paces the two fast connectors at 100/s each from two agents at once, so both
    see the same machine (a busy shared box hits them alike). Each arm also carries the other's
    load, so its absolute figures are higher than alone; the ratio is what this is for."""
    import threading

    assert run.agent is not None and run.twin is not None
    cfg = run.cfg
    rate = cfg["paired_rate"]
    n = int(rate * cfg["seconds"])
    phases: dict[str, list[dict[str, Any]]] = {
        k: [] for k in ("own_without", "group_without", "own_with", "group_with")
    }
    for rep in range(cfg["reps"]):
        for backlog in (0, cfg["backlog"]) if rep % 2 == 0 else (cfg["backlog"], 0):
            which = "with" if backlog else "without"
            run.burst("solo_fast.create_ticket", 50, "paired warm-up")
            run.burst("grp_fast.create_ticket", 50, "paired warm-up")
            if backlog:
                for slow in ("solo_slow", "grp_slow"):
                    publish_backlog(run, slow, backlog)
            results: dict[str, dict[str, Any]] = {}

            def pace(arm: str, agent: Agent, fast: str, suffix: str) -> None:
                results[arm] = agent.run(
                    None,
                    mode="paced",
                    n=n,
                    rate=rate,
                    timeout=90,
                    intent=intent(f"{fast}.create_ticket", suffix),
                    samples=True,
                )

            threads = [
                threading.Thread(target=pace, args=("own", run.agent, "solo_fast", "rg")),
                threading.Thread(target=pace, args=("group", run.twin, "grp_fast", "rt")),
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            depths = {s: queue_state(run.broker_url, f"reach.connector.{s}")[0] for s in ("solo_slow", "grp_slow")}
            load = loadavg()[0]
            for arm, res in results.items():
                run.check(res, f"paired rep {rep + 1} {arm} {which}")
                phases[f"{arm}_{which}"].append(
                    {
                        "p50": res["latency_ms"]["p50"],
                        "p99": res["latency_ms"]["p99"],
                        "samples": res.get("samples_ms", []),
                        "load": load,
                    }
                )
            log(
                f"paired rep {rep + 1} {which}: own p50 {results['own']['latency_ms']['p50']} p99 "
                f"{results['own']['latency_ms']['p99']} | group p50 {results['group']['latency_ms']['p50']} p99 "
                f"{results['group']['latency_ms']['p99']} ms (slow queues {depths}, load {load})"
            )
            if backlog:
                if min(depths.values()) <= 0:
                    run.problems.append(f"paired rep {rep + 1}: a slow backlog ran out before the phase ended")
                purge(run.broker_url, "reach.connector.solo_slow", "reach.connector.grp_slow")
                time.sleep(2.5)
    out = summarise(
        phases,
        cfg,
        {
            "group_with_over_own_with": ("group_with", "own_with"),
            "group_without_over_own_without": ("group_without", "own_without"),
        },
    )
    out.update(rate=rate, n=n)
    return out


def summarise(
    phases: dict[str, list[dict[str, Any]]], cfg: dict[str, Any], ratios: dict[str, tuple[str, str]]
) -> dict[str, Any]:
    """Pooled p50/p99 per arm and the asked ratios: pooled, by repetition and their median."""
    out: dict[str, Any] = {"reps": cfg["reps"], "backlog": cfg["backlog"], "rate": 100, "n": int(100 * cfg["seconds"])}
    pooled = {arm: [v for p in ps for v in p.pop("samples")] for arm, ps in phases.items()}
    out["arms"] = {
        arm: {
            "p50_ms": percentile(pooled[arm], 50),
            "p99_ms": percentile(pooled[arm], 99),
            "samples": len(pooled[arm]),
            "rep_p99_ms": [p["p99"] for p in ps],
            "rep_p50_ms": [p["p50"] for p in ps],
            "slow_depth": [p.get("slow_depth") for p in ps],
            "load": [p.get("load") for p in ps],
        }
        for arm, ps in phases.items()
    }
    out["ratios"] = {}
    for name, (a, b) in ratios.items():
        pa, pb = out["arms"][a]["p99_ms"], out["arms"][b]["p99_ms"]
        per_rep = [round(x["p99"] / y["p99"], 3) for x, y in zip(phases[a], phases[b]) if x["p99"] and y["p99"]]
        out["ratios"][name] = {
            "pooled": round(pa / pb, 3) if pa and pb else None,
            "by_rep": per_rep,
            "median_of_reps": None if not per_rep else round(median(per_rep) or 0, 3),
        }
    return out


def isolation(run: Run, independence: bool) -> dict[str, Any]:
    cfg = run.cfg
    arms: dict[str, tuple[str, str, int]] = {
        "own_without": ("solo_fast", "solo_slow", 0),
        "own_with": ("solo_fast", "solo_slow", cfg["backlog"]),
        "group_without": ("grp_fast", "grp_slow", 0),
        "group_with": ("grp_fast", "grp_slow", cfg["backlog"]),
    }
    if independence:
        arms["own_with_big"] = ("solo_fast", "solo_slow", cfg["big"])
    phases: dict[str, list[dict[str, Any]]] = {arm: [] for arm in arms}
    order = list(arms)
    for rep in range(cfg["reps"]):
        # rotate the order each repetition, so no arm always follows the same one
        for arm in order[rep % len(order) :] + order[: rep % len(order)]:
            fast, slow, backlog = arms[arm]
            phases[arm].append(phase(run, fast, slow, backlog, f"rep {rep + 1} {arm}"))
    ratios = {
        "group_with_over_own_with": ("group_with", "own_with"),
        "group_without_over_own_without": ("group_without", "own_without"),
        "own_with_over_own_without": ("own_with", "own_without"),
        "group_with_over_group_without": ("group_with", "group_without"),
    }
    if independence:
        ratios["own_big_over_own_with"] = ("own_with_big", "own_with")
    out = summarise(phases, cfg, ratios)
    if independence:
        out["big_backlog"] = cfg["big"]
    return out


# -- the run ----------------------------------------------------------------------------------------


def render(results: dict[str, Any]) -> str:
    meta = results["meta"]
    lines = [
        f"pool groups ({meta['mode']}) — {meta['started']}; {meta['nproc']} cores; load {meta['load_start']} at start, "
        f"{meta.get('load_end')} at end; calibration {meta['calibration_ms_start']} -> {meta.get('calibration_ms_end')} ms"
    ]
    mem = results.get("memory")
    if mem:
        lines.append("")
        lines.append(
            f"memory of one pool process (RSS after a warm-up burst of {meta['config']['warm']} per connector)"
        )
        rows = [
            [r["connectors"], r["rss_mb"], r.get("per_additional_mb"), r.get("separate_processes_mb"), r["threads"]]
            for r in mem["rows"]
        ]
        lines.append(table(["connectors", "RSS MB", "MB per additional", "as separate processes MB", "threads"], rows))
        lines.append(
            f"  per additional connector, worst group: {mem['per_additional_mb_max']} MB (target <= {TARGET_MEMORY_MB})"
        )
    jitter = f" +- {meta['config']['slow_jitter']:g} s" if meta["config"].get("slow_jitter") else ""
    for key, title in (("paired", "at the same time, from two agents"), ("isolation", "phases interleaved")):
        iso = results.get(key)
        if not iso:
            continue
        lines.append("")
        lines.append(
            f"{key}: fast connector at paced {iso['rate']}/s, {title} ({iso['n']} intents a phase, {iso['reps']} repetitions "
            f"pooled); slow neighbour 2 s per call{jitter}, backlog {iso['backlog']}"
        )
        rows = [
            [arm, fmt(a["p50_ms"], 2), fmt(a["p99_ms"], 2), " / ".join(str(v) for v in a["rep_p99_ms"])]
            for arm, a in iso["arms"].items()
        ]
        lines.append(table(["arm", "p50 ms", "p99 ms", "each repetition's p99"], rows))
        for name, r in iso["ratios"].items():
            lines.append(f"  {name}: {r['pooled']} pooled (median of repetitions {r['median_of_reps']}; {r['by_rep']})")
    if results.get("problems"):
        lines.append("")
        lines.append("PROBLEMS:")
        lines.extend(f"  - {p}" for p in results["problems"])
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", default="memory,isolation,paired", help="memory, isolation, paired (comma-separated)")
    parser.add_argument("--reps", type=int, help="repetitions of the isolation phases")
    parser.add_argument("--backlog-independence", action="store_true", help="also a 10,000-intent backlog")
    parser.add_argument(
        "--slow-jitter",
        type=float,
        default=0.0,
        metavar="S",
        help="a control: each slow call takes 2 s +- up to S (uniform), so the slow connector's calls do not end together",
    )
    parser.add_argument("--keep-logs", action="store_true")
    parser.add_argument("--output", default=str(RESULTS / "pool_groups.json"))
    args = parser.parse_args()
    mode = "quick" if args.quick else "full"
    cfg = dict(CONFIGS[mode], slow_jitter=args.slow_jitter)
    if args.reps:
        cfg["reps"] = args.reps
    sections = set(args.only.split(","))
    work = tmpdir("reach-groups-")
    run = Run(cfg, work)
    results: dict[str, Any] = {
        "meta": {
            "mode": mode,
            "command": "bench/pool_groups.py " + " ".join(sys.argv[1:]),
            "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "nproc": os.cpu_count(),
            "load_start": loadavg(),
            "calibration_ms_start": calibrate(),
            "config": cfg,
        }
    }
    vhost = None
    try:
        shared_broker, _ = ensure_services()
        vhost = Vhost(shared_broker, f"reach-groups-{os.getpid()}").create()
        run.broker_url = vhost.url
        redis_url, _ = start_private_redis(run.procs)
        fast_url, _ = start_downstream(run.procs)
        slow_url, _ = start_downstream(run.procs, name="downstream-slow", slow_jitter=args.slow_jitter)
        text, members = group_catalog(fast_url, slow_url, max(cfg["sizes"]))
        catalog_dir = catalogs.write(work / "catalog", text)
        run.fleet = fleet = ReachFleet(run.procs, catalog_dir, vhost.url, redis_url)
        fleet.start_router()
        fleet.start_pool("solo_fast")
        fleet.start_pool("solo_slow")
        fleet.start("group", ["worker", "grp_fast", "grp_slow", "--group", "iso"])
        run.wait_consuming(
            "reach.intents", *(f"reach.connector.{n}" for n in ("solo_fast", "solo_slow", "grp_fast", "grp_slow"))
        )
        run.agent = Agent(run.procs, "agent")
        run.agent.connect_amqp(vhost.url, "reach.intents", "reach.receipts", "*.rg")
        run.sink = Agent(run.procs, "agent-backlog")
        run.sink.connect_amqp(vhost.url, "reach.intents", "reach.receipts", "nobody.listens")
        for name in ("solo_fast", "grp_fast"):
            run.burst(f"{name}.create_ticket", 200, f"warm-up {name}")
        if "memory" in sections:
            results["memory"] = memory(run, members)
        if "paired" in sections:
            run.twin = Agent(run.procs, "agent-twin")
            run.twin.connect_amqp(vhost.url, "reach.intents", "reach.receipts", "*.rt")
            results["paired"] = paired(run)
        if "isolation" in sections:
            results["isolation"] = isolation(run, args.backlog_independence)
            results["rss_mb"] = {"own_fast": rss_mb(fleet.pid("solo_fast")), "group": rss_mb(fleet.pid("group"))}
        results["logs"] = {
            n: scan_log(run.procs.items[fleet.full(n)].log_text())
            for n in fleet.names
            if fleet.full(n) in run.procs.items
        }
        for name, scan in results["logs"].items():
            if scan["errors"]:
                run.problems.append(f"{name} logged {scan['errors']} error line(s), e.g. {scan['first_errors'][:2]}")
    except BaseException as exc:
        run.problems.append(f"run aborted: {type(exc).__name__}: {exc}")
        import traceback

        traceback.print_exc()
    finally:
        for driver in (run.agent, run.sink, run.twin):
            if driver is not None:
                driver.quit()
        run.procs.stop_all()
        if vhost is not None:
            vhost.delete()
    results["meta"]["load_end"] = loadavg()
    results["meta"]["calibration_ms_end"] = calibrate()
    results["problems"] = run.problems
    if run.problems or args.keep_logs:
        results["logs_kept"] = str(work)
    else:
        shutil.rmtree(work, ignore_errors=True)
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(results, indent=1, default=str) + "\n")
    print(render(results))
    print(f"JSON: {args.output}")
    return 1 if any("aborted" in p for p in run.problems) else 0


if __name__ == "__main__":
    sys.exit(main())
