#!/usr/bin/env python
"""Recovery after a burst (issue 20): how fast is the fleet at an ordinary rate right after a burst?

    .venv/bin/python bench/recovery.py            # bursts of 200, 2,000 and 10,000; 3 repetitions, 15-30 min
    .venv/bin/python bench/recovery.py --quick    # bursts of 200 and 2,000, one repetition of 5 s phases
    .venv/bin/python bench/recovery.py --quick --variants fleet,bare,fleet_classic,bare_quorum
    .venv/bin/python bench/recovery.py --quick --aftermath 5000            # CPU each second after a burst
    .venv/bin/python bench/recovery.py --quick --profile --profile-only    # py-spy, steady vs after a burst

The stack is bench/run.py's (own vhost, private Redis, the counting HTTP system; direct, bare and
fleet side by side). One repetition, in this order, every phase waiting for all its receipts
before the next starts:

  1. direct: paced 100/s for ``paced_s`` seconds (the floor: the HTTP call alone);
  2. steady state, fleet and bare (order alternating by repetition): paced 100/s for ``paced_s``,
     no burst before it (only the previous variant's paced phase);
  3. for each burst size N (ascending), fleet and bare (order alternating): a burst of N intents
     (pipelined confirms), and as soon as its last receipt arrived (and the agent's 0.3 s grace
     for duplicates), paced 100/s for ``paced_s``.

Figures per N, medians over the repetitions: p50/p99 of the paced phase after the burst (fleet,
bare, direct), fleet/bare and fleet-direct (per repetition, then the median); recovery: 1-second
windows of the paced phase by send time (step 0.1 s), and the time until their p99 is within
1.5 x of the variant's steady-state p99 of the same repetition: ``first_back_s`` (start of the
first window within) and ``settled_s`` (end of the last window over, 0 when none was); CPU ms per
intent per process of the paced phase. ``--throughput`` (default in the full run) adds
bench/run.py's max-throughput section (bursts of 2,000, interleaved) after the repetitions.
``--gcwatch``: collections per phase and process (bench/gcwatch). Results:
bench/results/recovery.json (with every paced phase's timeline).
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

import run as bench_run  # noqa: E402
from common import RESULTS, CpuMeter, Procs, calibrate, fmt, loadavg, log, median, table, tmpdir  # noqa: E402

CONFIGS: dict[str, dict[str, Any]] = {
    "full": dict(reps=3, bursts=[200, 2000, 10000], rate=100, paced_s=10.0, warmup=200, idle_s=1.0),
    "quick": dict(reps=1, bursts=[200, 2000], rate=100, paced_s=5.0, warmup=100, idle_s=0.5),
}
RECOVERY_FACTOR = 1.5
WINDOW_S = 1.0
STEP_S = 0.1
TARGETS = {"p99_over_bare_max": 1.5, "added_p99_ms_max": 10.0, "recovery_s_max": 2.0, "throughput_ratio_min": 1.0}


def p99(values: list[float]) -> float | None:
    """Nearest rank, ceil(0.99 n): of a window's 100 intents the 99th, so one outlier alone is not a tail."""
    if not values:
        return None
    s = sorted(values)
    return round(s[max(0, math.ceil(0.99 * len(s)) - 1)], 3)


def windows(timeline: list[list[float]], paced_s: float) -> list[tuple[float, float | None]]:
    """(start s, p99 ms) of every 1-second window of the phase by send time, step 0.1 s."""
    out = []
    for k in range(int(round((paced_s - WINDOW_S) / STEP_S)) + 1):
        start = round(k * STEP_S, 2)
        lat = [ms for t, ms in timeline if start <= t < start + WINDOW_S]
        out.append((start, p99(lat)))
    return out


def recovery(timeline: list[list[float]], paced_s: float, steady_p99: float) -> dict[str, Any]:
    limit = RECOVERY_FACTOR * steady_p99
    wins = windows(timeline, paced_s)
    over = [s for s, p in wins if p is not None and p > limit]
    first_back = next((s for s, p in wins if p is not None and p <= limit), None)
    return {
        "limit_ms": round(limit, 3),
        "first_back_s": first_back,
        "settled_s": round(over[-1] + WINDOW_S, 2) if over else 0.0,
        "windows_over": len(over),
        "first_windows_p99_ms": [p for _, p in wins[:: int(round(1 / STEP_S))]],  # one per second
    }


# controls, each on a vhost (and Redis database) of its own, started on request (--variants):
# the fleet on classic queues, and the bare pipeline on quorum queues (the fleet's default type)
CONTROLS = ("fleet_classic", "bare_quorum", "fleet_base")
BASE: dict[str, Any] = {}  # --base REF: {"ref": REF, "dir": the tree it was unpacked to}


def start_control(ctx: bench_run.Ctx, variant: str, pids: dict[str, int]) -> None:
    from common import Agent, Vhost, queue_state
    from reachfleet import ReachFleet

    vhost = Vhost(ctx.procs_vhost.shared_url, f"reach-bench-{variant}-{ctx.run_id}").create()  # type: ignore[attr-defined]
    ctx.extra_vhosts.append(vhost)  # type: ignore[attr-defined]
    common_pids = {"downstream": ctx.downstream_pid}
    if ctx.beam_pid:
        common_pids["rabbitmq"] = ctx.beam_pid
    if variant in ("fleet_classic", "fleet_base"):
        fleet = ReachFleet(
            ctx.procs,
            ctx.work / "catalog-main",
            vhost.url,
            ctx.redis_url.rsplit("/", 1)[0] + ("/1" if variant == "fleet_classic" else "/2"),
            prefix=variant,
            cwd=BASE["dir"] if variant == "fleet_base" else None,
        )
        if variant == "fleet_classic":
            fleet.env["REACH_QUEUE_TYPE"] = "classic"
        fleet.start_router()
        fleet.start_pool(bench_run.catalogs.FAST)
        fleet.wait_consuming("reach.intents")
        fleet.wait_consuming("reach.connector." + bench_run.catalogs.FAST)
        router, pool = fleet.pid("router"), fleet.pid(bench_run.catalogs.FAST)
        exchange, receipts = "reach.intents", "reach.receipts"
    else:
        env = dict(ctx.bare_env, BARE_BROKER_URL=vhost.url, BARE_QUEUE_TYPE="quorum")
        py, here = sys.executable, str(Path(__file__).resolve().parent / "bare.py")
        router = ctx.procs.start(f"{variant}-router", [py, here, "router"], env=env).pid
        pool = ctx.procs.start(f"{variant}-connector", [py, here, "connector"], env=env).pid
        t0 = time.time()
        for q in ("bare.intents", "bare.connector.fast"):
            while queue_state(vhost.url, q)[1] <= 0:
                ctx.procs.check_alive(f"{variant}-router", f"{variant}-connector")
                if time.time() - t0 > 120:
                    raise RuntimeError(f"{variant}: {q} has no consumer")
                time.sleep(0.2)
        exchange, receipts = "bare.intents", "bare.receipts"
    pids[f"{variant}_router"], pids[f"{variant}_pool"] = router, pool
    agent = Agent(ctx.procs, f"agent-{variant}")
    agent.connect_amqp(vhost.url, exchange, receipts, "*.x")
    ctx.agents[variant] = agent
    meter = {"router": router, "pool": pool, **common_pids}
    if variant in ("fleet_classic", "fleet_base") and ctx.redis_pid:
        meter["redis"] = ctx.redis_pid
    ctx.meters[variant] = CpuMeter(meter, {"rabbitmq": False})
    log(f"control {variant} consuming on vhost {vhost.name}")


def unpack(ref: str, into: Path) -> Path:
    """The repository's tree at ``ref``, written to ``into`` (``git archive``: no worktree to clean up)."""
    import subprocess

    repo = Path(__file__).resolve().parent.parent
    commit = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "--verify", f"{ref}^{{commit}}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    into.mkdir(parents=True)
    archive = subprocess.Popen(["git", "-C", str(repo), "archive", commit], stdout=subprocess.PIPE)
    subprocess.run(["tar", "-x", "-C", str(into)], stdin=archive.stdout, check=True)
    if archive.wait() != 0:
        raise RuntimeError(f"git archive {commit} failed")
    BASE["commit"] = commit
    log(f"fleet_base: {ref} = {commit[:10]}, unpacked to {into}")
    return into


GC_WATCH: dict[str, Any] = {}  # --gcwatch: {"dir": Path, "pids": {variant: {role: pid}}}


def gc_totals(pid: int) -> dict[str, Any] | None:
    """The last line bench/gcwatch/sitecustomize.py wrote for ``pid``: collections and seconds by generation."""
    path = GC_WATCH["dir"] / f"gc.{pid}"
    try:
        with path.open("rb") as f:
            f.seek(max(0, path.stat().st_size - 4096))
            last = f.read().splitlines()[-1]
        return json.loads(last)  # type: ignore[no-any-return]
    except (OSError, IndexError, ValueError):
        return None


def gc_during(variant: str, run: Any) -> tuple[Any, dict[str, Any]]:
    """Run ``run()``; the collections each of ``variant``'s processes made meanwhile (--gcwatch)."""
    pids = GC_WATCH.get("pids", {}).get(variant)
    if not pids:
        return run(), {}
    # the watcher writes every 0.2 s: no waiting for it here (the paced phase must start right
    # after the burst), so a collection up to 0.2 s before or after may be counted in the phase
    before = {role: gc_totals(pid) for role, pid in pids.items()}
    res = run()
    out: dict[str, Any] = {}
    for role, pid in pids.items():
        after, b = gc_totals(pid), before[role]
        if after and b:
            out[role] = {
                "collections": [a - c for a, c in zip(after["counts"], b["counts"], strict=True)],
                "gc_ms": [round((a - c) * 1000, 2) for a, c in zip(after["seconds"], b["seconds"], strict=True)],
                "gen2_objects": after["gen2_objects"],
                "max_pause_ms_so_far": after["max_ms"],
            }
    return res, out


def paced(ctx: bench_run.Ctx, variant: str, label: str) -> dict[str, Any]:
    cfg = ctx.cfg
    n = int(cfg["rate"] * cfg["paced_s"])
    res, gc_used = gc_during(
        variant, lambda: ctx.phase(variant, "paced", n, rate=cfg["rate"], label=label, timeline=variant != "direct")
    )
    res["cpu_ms_per_intent"] = bench_run.per_intent_cpu(res)
    if gc_used:
        res["gc"] = gc_used
    return res


def brief(res: dict[str, Any]) -> dict[str, Any]:
    """What a phase keeps in the JSON (the timeline too: the windows can be computed again)."""
    keep = (
        "timeline",
        "n",
        "receipts",
        "latency_ms",
        "cpu_ms_per_intent",
        "steady_rate",
        "elapsed_s",
        "slowest",
        "stages_ms",
        "gc",
    )
    return {k: res[k] for k in keep if k in res}


def one_rep(ctx: bench_run.Ctx, rep: int) -> dict[str, Any]:
    cfg = ctx.cfg
    variants = list(cfg["variants"])
    order = tuple(variants if rep % 2 == 0 else variants[::-1])
    out: dict[str, Any] = {"order": list(order), "load": loadavg(), "after": {}}
    res = paced(ctx, "direct", f"direct paced rep {rep + 1}")
    out["direct"] = brief(res)
    log(f"rep {rep + 1} direct paced: p50 {res['latency_ms']['p50']} p99 {res['latency_ms']['p99']} ms")
    out["steady"] = {}
    for variant in order:
        time.sleep(cfg["idle_s"])
        res = paced(ctx, variant, f"steady paced rep {rep + 1}")
        out["steady"][variant] = brief(res)
        log(f"rep {rep + 1} {variant:5s} steady: p50 {res['latency_ms']['p50']} p99 {res['latency_ms']['p99']} ms")
    for n in cfg["bursts"]:
        block: dict[str, Any] = {}
        for variant in order:
            time.sleep(cfg["idle_s"])
            burst, burst_gc = gc_during(
                variant, lambda: ctx.phase(variant, "burst", n, label=f"burst {n} rep {rep + 1}")
            )
            burst["cpu_ms_per_intent"] = bench_run.per_intent_cpu(burst)
            res = paced(ctx, variant, f"paced after {n} rep {rep + 1}")
            entry = brief(res)
            entry["burst"] = {k: burst.get(k) for k in ("steady_rate", "elapsed_s", "cpu_ms_per_intent")}
            if burst_gc:
                entry["burst"]["gc"] = burst_gc
            # each variant against its own steady state of this repetition
            entry["recovery"] = recovery(res["timeline"], cfg["paced_s"], out["steady"][variant]["latency_ms"]["p99"])
            block[variant] = entry
            rec = entry["recovery"]
            if entry.get("gc"):
                log(f"  gc during the burst {burst_gc}; during the paced phase {entry['gc']}")
            log(
                f"rep {rep + 1} {variant:5s} after {n:5d}: burst {burst.get('steady_rate')}/s; paced p50 "
                f"{res['latency_ms']['p50']} p99 {res['latency_ms']['p99']} ms; back {rec['first_back_s']} s, "
                f"settled {rec['settled_s']} s; per-second p99 {rec['first_windows_p99_ms']}; load {loadavg()[0]}"
            )
        out["after"][str(n)] = block
    return out


def summarize(reps: list[dict[str, Any]], bursts: list[int], variants: list[str]) -> dict[str, Any]:
    def med(path: list[Any]) -> float | None:
        vals = []
        for r in reps:
            node: Any = r
            for p in path:
                node = node.get(p) if isinstance(node, dict) else None
                if node is None:
                    break
            vals.append(node)
        m = median(vals)
        return None if m is None else round(m, 3)

    out: dict[str, Any] = {
        "direct": {"p50_ms": med(["direct", "latency_ms", "p50"]), "p99_ms": med(["direct", "latency_ms", "p99"])},
        "steady": {
            v: {"p50_ms": med(["steady", v, "latency_ms", "p50"]), "p99_ms": med(["steady", v, "latency_ms", "p99"])}
            for v in variants
        },
        "after": {},
    }
    for n in bursts:
        row: dict[str, Any] = {}
        for v in variants:
            base = ["after", str(n), v]
            row[v] = {
                "p50_ms": med([*base, "latency_ms", "p50"]),
                "p99_ms": med([*base, "latency_ms", "p99"]),
                "burst_rate": med([*base, "burst", "steady_rate"]),
                "first_back_s": med([*base, "recovery", "first_back_s"]),
                "settled_s": med([*base, "recovery", "settled_s"]),
                "cpu_ms_per_intent": {
                    p: med([*base, "cpu_ms_per_intent", p])
                    for p in ("agent", "router", "pool", "rabbitmq", "redis", "downstream")
                },
            }
        f99, b99, d99 = row["fleet"]["p99_ms"], row["bare"]["p99_ms"], out["direct"]["p99_ms"]
        # ratios per repetition, then their median (same-run pairs), besides the ratio of medians
        per_rep = []
        added = []
        for r in reps:
            a = r["after"][str(n)]
            per_rep.append(a["fleet"]["latency_ms"]["p99"] / a["bare"]["latency_ms"]["p99"])
            added.append(a["fleet"]["latency_ms"]["p99"] - r["direct"]["latency_ms"]["p99"])
        row["fleet_over_bare_p99"] = round(median(per_rep) or 0, 3)
        row["fleet_minus_direct_p99_ms"] = round(median(added) or 0, 3)
        row["ratio_of_medians"] = round(f99 / b99, 3) if f99 and b99 else None
        row["added_of_medians_ms"] = round(f99 - d99, 3) if f99 is not None and d99 is not None else None
        for v in variants:
            if v not in ("fleet", "bare"):
                row[f"{v}_over_bare_p99"] = round(
                    median(
                        [
                            r["after"][str(n)][v]["latency_ms"]["p99"] / r["after"][str(n)]["bare"]["latency_ms"]["p99"]
                            for r in reps
                        ]
                    )
                    or 0,
                    3,
                )
        out["after"][str(n)] = row
    return out


def targets(summary: dict[str, Any], throughput: dict[str, Any] | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    a2 = summary["after"].get("2000")
    if a2:
        v = a2["fleet_over_bare_p99"]
        out["after a 2,000 burst: fleet p99 at 100/s <= 1.5 x bare's"] = {
            "met": v <= TARGETS["p99_over_bare_max"],
            "text": f"{v:.2f} x ({a2['fleet']['p99_ms']} / {a2['bare']['p99_ms']} ms)",
        }
        v = a2["fleet_minus_direct_p99_ms"]
        out["after a 2,000 burst: fleet p99 at 100/s <= +10 ms over direct"] = {
            "met": v <= TARGETS["added_p99_ms_max"],
            "text": f"+{v:.2f} ms ({a2['fleet']['p99_ms']} vs {summary['direct']['p99_ms']} ms)",
        }
    a10 = summary["after"].get("10000")
    if a10:
        v = a10["fleet"]["settled_s"]
        out["after a 10,000 burst: fleet back within 1.5 x of its steady p99 within 2 s"] = {
            "met": v is not None and v <= TARGETS["recovery_s_max"],
            "text": f"settled after {v} s (first window back at {a10['fleet']['first_back_s']} s)",
        }
    if throughput:
        b, c = throughput["bare"]["steady_rate"], throughput["fleet"]["steady_rate"]
        if b and c:
            out["max throughput >= 1.0 x bare"] = {
                "met": c / b >= TARGETS["throughput_ratio_min"],
                "text": f"{c / b:.3f} x ({c} vs {b} intents/s)",
            }
    return out


# same-run throughput pairs: the target's, then the controls' (same queue type on both sides; the
# fleet as of another commit)
RATIO_PAIRS = (
    ("fleet", "bare", "fleet as shipped (quorum queues) / bare (classic queues)"),
    ("fleet_classic", "bare", "both on classic queues"),
    ("fleet", "bare_quorum", "both on quorum queues"),
    ("fleet", "fleet_base", "this tree / the fleet as of --base"),
)


def throughput_ratios(throughput: dict[str, Any]) -> dict[str, Any]:
    """Each pair's ratio of median rates, and the median of its per-repetition ratios (the two
    ran back to back in each repetition: the machine's changing load hits both alike)."""
    out: dict[str, Any] = {}
    for a, b, label in RATIO_PAIRS:
        if a not in throughput or b not in throughput:
            continue
        per_rep = [
            x["steady_rate"] / y["steady_rate"]
            for x, y in zip(throughput[a]["reps"], throughput[b]["reps"], strict=False)
            if x.get("steady_rate") and y.get("steady_rate")
        ]
        ra, rb = throughput[a]["steady_rate"], throughput[b]["steady_rate"]
        out[f"{a}/{b}"] = {
            "label": label,
            "ratio_of_medians": round(ra / rb, 3) if ra and rb else None,
            "median_of_ratios": round(median(per_rep) or 0, 3) if per_rep else None,
            "per_rep": [round(r, 3) for r in per_rep],
        }
    return out


def _throughput_lines(results: dict[str, Any]) -> list[str]:
    tp = results.get("throughput")
    if not tp:
        return []
    lines = [
        f"max throughput (burst of {results['meta']['config'].get('burst_n')}, median of {len(tp['fleet']['reps'])}): "
        + ", ".join(f"{v} {round(tp[v]['steady_rate'], 1)}/s" for v in tp)
        + f"; CPU ms per intent fleet {tp['fleet']['cpu_ms_per_intent']}, bare {tp['bare']['cpu_ms_per_intent']}"
    ]
    for pair, r in results.get("throughput_ratios", {}).items():
        lines.append(
            f"  {pair} ({r['label']}): {r['ratio_of_medians']} x; median of per-repetition ratios "
            f"{r['median_of_ratios']} ({', '.join(str(x) for x in r['per_rep'])})"
        )
    return lines


def render(results: dict[str, Any]) -> str:
    meta, s = results["meta"], results.get("summary")
    lines = [
        f"recovery after a burst ({meta['mode']}) — {meta['started']}; load {meta['load_start']} -> "
        f"{meta.get('load_end')}; calibration {meta['calibration_ms_start']} -> {meta.get('calibration_ms_end')} ms; "
        f"code {meta.get('code')}"
    ]
    if not s:
        lines.extend(_throughput_lines(results))
        return "\n".join(lines + [f"problems: {results.get('problems')}"])
    lines.append(
        f"steady state (paced {meta['config']['rate']}/s, no burst before): fleet p50/p99 "
        f"{s['steady']['fleet']['p50_ms']}/{s['steady']['fleet']['p99_ms']} ms, bare "
        f"{s['steady']['bare']['p50_ms']}/{s['steady']['bare']['p99_ms']} ms, direct "
        f"{s['direct']['p50_ms']}/{s['direct']['p99_ms']} ms"
    )
    rows = []
    for n, row in s["after"].items():
        f, b = row["fleet"], row["bare"]
        rows.append(
            [
                n,
                f"{fmt(f['p50_ms'], 2)} / {fmt(f['p99_ms'], 2)}",
                f"{fmt(b['p50_ms'], 2)} / {fmt(b['p99_ms'], 2)}",
                fmt(row["fleet_over_bare_p99"], 2),
                fmt(row["fleet_minus_direct_p99_ms"], 2),
                f"{f['first_back_s']} / {f['settled_s']}",
                f"{b['first_back_s']} / {b['settled_s']}",
                f"{fmt(f['cpu_ms_per_intent']['router'], 2)} / {fmt(f['cpu_ms_per_intent']['pool'], 2)}",
                f"{fmt(b['cpu_ms_per_intent']['router'], 2)} / {fmt(b['cpu_ms_per_intent']['pool'], 2)}",
                f"{fmt(f['burst_rate'], 0)} / {fmt(b['burst_rate'], 0)}",
            ]
        )
    lines.append(
        table(
            [
                "burst",
                "fleet p50/p99 ms",
                "bare p50/p99 ms",
                "p99 fleet/bare",
                "p99 fleet-direct ms",
                "fleet back/settled s",
                "bare back/settled s",
                "fleet CPU ms router/pool",
                "bare CPU ms router/pool",
                "burst intents/s fleet/bare",
            ],
            rows,
        )
    )
    for n, row in s["after"].items():
        for v in meta["config"]["variants"]:
            if v in CONTROLS:
                c = row[v]
                lines.append(
                    f"  control {v} after {n}: p50/p99 {fmt(c['p50_ms'], 2)} / {fmt(c['p99_ms'], 2)} ms "
                    f"(steady {s['steady'][v]['p99_ms']}), over bare {row[f'{v}_over_bare_p99']} x, back/settled "
                    f"{c['first_back_s']} / {c['settled_s']} s, CPU ms router/pool {c['cpu_ms_per_intent']['router']} / "
                    f"{c['cpu_ms_per_intent']['pool']}, burst {c['burst_rate']}/s"
                )
    lines.extend(_throughput_lines(results))
    for name, t in results.get("targets", {}).items():
        lines.append(f"  {'MET ' if t['met'] else 'MISS'} {name}: {t['text']}")
    if results.get("problems"):
        lines.append("PROBLEMS: " + "; ".join(results["problems"]))
    if results.get("notes"):
        lines.append("notes: " + "; ".join(results["notes"]))
    return "\n".join(lines)


def profile(ctx: bench_run.Ctx, pids: dict[str, int], n: int, seconds: float) -> dict[str, Any]:
    """py-spy on the router and the pool of the fleet and of bare during a paced phase with no burst
    before it (steady), and during the paced phase right after a burst of ``n``: on-CPU (--gil) and
    wall clock (--idle, all threads; summarised inside the project's code, waits included) at once.
    Raw stacks in bench/results/recovery-<variant>_<proc>-<steady|after>.<cpu|wall>.txt."""
    import profiling

    spy = profiling.py_spy()
    if spy is None:
        return {"skipped": "py-spy not installed"}
    RESULTS.mkdir(parents=True, exist_ok=True)
    out: dict[str, Any] = {}
    rate = ctx.cfg["rate"]
    for when in ("steady", "after"):
        for variant in ("fleet", "bare"):
            if when == "after":
                ctx.phase(variant, "burst", n, label=f"profile burst {n}")
            files, spies = {}, []
            for role in ("router", "pool"):
                for mode, flag in (("cpu", "--gil"), ("wall", "--idle")):
                    path = RESULTS / f"recovery-{variant}_{role}-{when}.{mode}.txt"
                    files[f"{role}_{mode}"] = path
                    spies.append(profiling._record(spy, pids[f"{variant}_{role}"], path, "raw", mode=flag))
            time.sleep(0.5)  # py-spy attached
            res = ctx.phase(variant, "paced", int(rate * seconds), rate=rate, label=f"profile paced {when}")
            profiling._finish(spies, list(files.values()))
            entry: dict[str, Any] = {"latency_ms": res["latency_ms"], "stages_ms": res.get("stages_ms")}
            for name, path in files.items():
                if path.exists() and path.stat().st_size:
                    entry[name] = profiling.summarize(path, top=15, project_only=name.endswith("_wall"))
            out[f"{variant}_{when}"] = entry
            log(f"profiled {variant} {when}: p50 {res['latency_ms']['p50']} p99 {res['latency_ms']['p99']} ms")
    return out


def aftermath(ctx: bench_run.Ctx, n: int, seconds: int = 4) -> dict[str, Any]:
    """CPU (ms per second) of each process while nothing is sent: 2 s before a burst of ``n``, then
    each second after its last receipt. Work the burst left behind (batched writes, collections,
    expiries, the broker's queue housekeeping) shows here without any latency noise."""
    out: dict[str, Any] = {}
    for variant in [v for v in ctx.cfg["variants"] if v in ctx.meters]:
        meter = ctx.meters[variant]
        before = meter.idle_rates(2.0)
        ctx.phase(variant, "burst", n, label=f"aftermath burst {n}")
        after = [meter.idle_rates(1.0) for _ in range(seconds)]
        out[variant] = {
            name: {
                "before": round(before[name] * 1000, 1),
                "after": [round(a[name] * 1000, 1) for a in after],
            }
            for name in before
        }
        log(
            f"aftermath {variant} after {n}: "
            + "; ".join(f"{k} {v['before']} -> {v['after']}" for k, v in out[variant].items())
        )
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--reps", type=int)
    parser.add_argument("--bursts", help="comma-separated burst sizes, e.g. 2000,10000")
    parser.add_argument("--paced-s", type=float)
    parser.add_argument(
        "--variants",
        default="fleet,bare",
        help=f"queued variants besides direct: fleet, bare, and the controls {', '.join(CONTROLS)}",
    )
    parser.add_argument("--throughput", action=argparse.BooleanOptionalAction, default=None)
    parser.add_argument("--profile", action="store_true", help="py-spy on each process during paced phases")
    parser.add_argument("--profile-burst", type=int, default=10000, help="the burst before the profiled paced phase")
    parser.add_argument(
        "--aftermath", type=int, default=0, metavar="N", help="CPU of every process each second after a burst of N"
    )
    parser.add_argument("--profile-only", action="store_true", help="the profiles alone, no measured repetitions")
    parser.add_argument(
        "--throughput-only", action="store_true", help="max throughput alone (3 repetitions), no paced phases"
    )
    parser.add_argument("--keep-logs", action="store_true")
    parser.add_argument(
        "--gcwatch", action="store_true", help="count every process's garbage collections per phase (bench/gcwatch)"
    )
    parser.add_argument(
        "--base",
        metavar="REF",
        help="add the control fleet_base: the fleet as of git REF (e.g. HEAD, main~3), run beside this tree's",
    )
    parser.add_argument("--output", default=str(RESULTS / "recovery.json"))
    args = parser.parse_args()
    mode = "quick" if args.quick else "full"
    cfg = dict(CONFIGS[mode])
    if args.reps:
        cfg["reps"] = args.reps
    if args.bursts:
        cfg["bursts"] = [int(x) for x in args.bursts.split(",")]
    if args.paced_s:
        cfg["paced_s"] = args.paced_s
    cfg["variants"] = args.variants.split(",")
    if args.base and "fleet_base" not in cfg["variants"]:
        cfg["variants"].append("fleet_base")
    if "fleet_base" in cfg["variants"] and not args.base:
        parser.error("fleet_base needs --base REF")
    if not {"fleet", "bare"} <= set(cfg["variants"]) or not set(cfg["variants"]) <= {"fleet", "bare", *CONTROLS}:
        parser.error("--variants: fleet and bare, and any of " + ", ".join(CONTROLS))
    do_throughput = args.throughput_only or (
        args.throughput
        if args.throughput is not None
        else (mode == "full" and not args.profile_only and not args.aftermath)
    )
    cfg.update(burst_n=2000 if mode == "full" else 1000)
    # bench/run.py's Ctx and stack; its options the stack reads
    ns = argparse.Namespace(redis_url=None, keep_logs=args.keep_logs)
    run_id = f"r{int(time.time())}-{uuid.uuid4().hex[:4]}"
    work = tmpdir("reach-recovery-")
    procs = Procs(work)
    ctx = bench_run.Ctx(ns, cfg, run_id, procs, work)
    ctx.extra_vhosts = []  # type: ignore[attr-defined]
    results: dict[str, Any] = {
        "meta": {
            "mode": mode,
            "command": " ".join(["bench/recovery.py", *sys.argv[1:]]),
            "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "load_start": loadavg(),
            "calibration_ms_start": calibrate(),
            "config": cfg,
            "code": bench_run.code_state(),
            "order": "per repetition: direct paced; fleet and bare steady paced (alternating order); for each "
            "burst size ascending, fleet and bare (alternating): burst N, wait for every receipt, paced "
            f"{cfg['rate']}/s for {cfg['paced_s']} s"
            + ("; then max throughput (bench/run.py)" if do_throughput else ""),
        }
    }
    log(f"{mode} recovery run {run_id}; load {results['meta']['load_start']}; logs in {work}")
    started = time.time()
    try:
        if args.gcwatch:
            # the fleet's and bare's processes inherit this (bench/gcwatch/sitecustomize.py)
            import os

            GC_WATCH["dir"] = work
            os.environ["BENCH_GCWATCH"] = str(work / "gc")
            os.environ["PYTHONPATH"] = os.pathsep.join(
                p for p in (str(Path(__file__).resolve().parent / "gcwatch"), os.environ.get("PYTHONPATH")) if p
            )
        if args.base:
            BASE.update(ref=args.base, dir=unpack(args.base, work / "base"))
            results["meta"]["base"] = {"ref": args.base, "commit": BASE["commit"]}
        fleet, pids = bench_run.start_stack(ctx)
        for variant in cfg["variants"]:
            if variant in CONTROLS:
                start_control(ctx, variant, pids)
        GC_WATCH["pids"] = {
            v: {"router": pids[f"{v}_router"], "pool": pids[f"{v}_pool"]}
            for v in cfg["variants"]
            if args.gcwatch and f"{v}_router" in pids
        }
        for variant in ctx.agents:
            ctx.phase(variant, "burst", cfg["warmup"], label="warm-up", meter=CpuMeter({}))
        if args.aftermath:
            results["aftermath"] = aftermath(ctx, args.aftermath)
        if args.profile:
            results["profile"] = profile(ctx, pids, args.profile_burst, 8.0)
        reps = (
            []
            if args.profile_only or args.aftermath or args.throughput_only
            else [one_rep(ctx, rep) for rep in range(cfg["reps"])]
        )
        results["reps"] = reps
        if reps:
            results["summary"] = summarize(reps, cfg["bursts"], cfg["variants"])
        if do_throughput:
            cfg["reps"] = max(3, cfg["reps"]) if mode == "full" or args.throughput_only else 1
            extra = [v for v in cfg["variants"] if v in CONTROLS]
            results["throughput"] = bench_run.throughput(ctx, (*bench_run.VARIANTS, *extra))
    except BaseException as exc:
        ctx.problems.append(f"run aborted: {type(exc).__name__}: {exc}")
        import traceback

        traceback.print_exc()
    finally:
        for agent in ctx.agents.values():
            agent.quit()
        procs.stop_all()
        for vhost in [getattr(ctx, "procs_vhost", None), *getattr(ctx, "extra_vhosts", [])]:
            if vhost is not None:
                vhost.delete()
    results["meta"]["load_end"] = loadavg()
    results["meta"]["calibration_ms_end"] = calibrate()
    results["meta"]["duration_s"] = round(time.time() - started, 1)
    results["problems"], results["notes"] = ctx.problems, ctx.notes
    if "summary" in results:
        results["targets"] = targets(results["summary"], results.get("throughput"))
    if results.get("throughput"):
        results["throughput_ratios"] = throughput_ratios(results["throughput"])
    if ctx.problems or args.keep_logs:
        results["logs_kept"] = str(work)
    else:
        shutil.rmtree(work, ignore_errors=True)
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(results, indent=1, default=str) + "\n")
    print(render(results))
    print(f"\n{results['meta']['duration_s']} s; JSON: {args.output}")
    return 1 if ctx.problems else 0


if __name__ == "__main__":
    sys.exit(main())
