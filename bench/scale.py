"""Scale: the router's CPU per intent must not grow with the catalog (no per-intent scans or model
rebuilds), and what each process keeps resident.

For each (actions, agents) in the grid a catalog is generated (bench/catalogs.py: 100 actions per
connector, every agent bound to bench_fast and to one generated connector), the router and the
bench_fast pool are started on it like tests/fleet.py does, warmed up, and a burst of intents for
bench_fast.create_ticket is sent with the agent ids taken round-robin from all agents. Reported per
configuration: router and pool CPU ms per intent, intents/s, RSS, start-up time (catalog load).
Run as a section of bench/run.py (``--only scale``).
"""

from __future__ import annotations

import time
from typing import Any

import catalogs
from common import CpuMeter, log, rss_mb
from reachfleet import ReachFleet


def run(ctx: Any) -> dict[str, Any]:
    cfg = ctx.cfg
    rows = []
    for actions, agents in cfg["scale_grid"]:
        text, names = catalogs.scale_catalog(ctx.downstream_url, actions, agents)
        directory = catalogs.write(ctx.work / f"catalog-scale-{actions}-{agents}", text)
        fleet = ReachFleet(ctx.procs, directory, ctx.broker_url, ctx.redis_url, prefix=f"scale-{actions}x{agents}")
        t0 = time.time()
        fleet.start_router()
        fleet.start_pool(catalogs.FAST)
        try:
            fleet.wait_consuming("reach.intents", timeout=300)
            fleet.wait_consuming("reach.connector." + catalogs.FAST, timeout=300)
            startup = time.time() - t0
            ctx.phase(
                "fleet",
                "burst",
                min(100, cfg["warmup"]),
                label=f"scale {actions}x{agents} warm-up",
                agents=names,
                meter=CpuMeter({}),
            )
            meter = CpuMeter(
                {"router": fleet.pid("router"), "pool": fleet.pid(catalogs.FAST), "redis": ctx.redis_pid}
                if ctx.redis_pid
                else {"router": fleet.pid("router"), "pool": fleet.pid(catalogs.FAST)}
            )
            res = ctx.phase(
                "fleet",
                "burst",
                cfg["scale_n"],
                label=f"scale {actions} actions x {agents} agents",
                agents=names,
                meter=meter,
            )
            n = res.get("receipts") or 1
            row = {
                "actions": actions,
                "agents": agents,
                "n": res["n"],
                "receipts": res.get("receipts"),
                "router_cpu_ms": round(res["cpu_s"]["router"] * 1000 / n, 4),
                "pool_cpu_ms": round(res["cpu_s"]["pool"] * 1000 / n, 4),
                "redis_cpu_ms": round(res["cpu_s"].get("redis", 0) * 1000 / n, 4),
                "steady_rate": res.get("steady_rate"),
                "p50_ms": res["latency_ms"]["p50"],
                "rss_mb": {"router": rss_mb(fleet.pid("router")), "pool": rss_mb(fleet.pid(catalogs.FAST))},
                "startup_s": round(startup, 2),
                "catalog_mb": round(len(text) / 1e6, 2),
            }
            rows.append(row)
            log(
                f"scale {actions:>5} actions x {agents:>3} agents: router {row['router_cpu_ms']:.3f} ms/intent, "
                f"pool {row['pool_cpu_ms']:.3f}, {row['steady_rate']}/s, RSS router {row['rss_mb']['router']} MB "
                f"pool {row['rss_mb']['pool']} MB, start-up {startup:.1f} s"
            )
        finally:
            fleet.stop_all()
    out: dict[str, Any] = {"n": cfg["scale_n"], "rows": rows}
    if len(rows) >= 2:
        smallest = min(rows, key=lambda r: (r["actions"], r["agents"]))
        largest = max(rows, key=lambda r: (r["actions"], r["agents"]))
        out["flat_ratio"] = round(largest["router_cpu_ms"] / smallest["router_cpu_ms"], 3)
        out["max_over_min"] = round(max(r["router_cpu_ms"] for r in rows) / min(r["router_cpu_ms"] for r in rows), 3)
    return out
