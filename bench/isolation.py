"""Isolation: does a slow system slow anyone else down?

``bench_slow`` is a system of its own (a second downstream process) whose /slow takes 2 s per
call; its pool runs beside ``bench_fast``'s (both 20 threads, one router). The fast connector
gets paced 100/s intents:

    without: bench_slow's pool is up but idle
    with:    ``backlog`` (1,000) intents for bench_slow were published first and have all passed
             the router: 20 are in the slow pool's hands, the rest wait in reach.connector.bench_slow
             (it drains at 10/s, so the backlog lasts the whole phase)

The phases alternate (without, with, without, with, ...). Reported: the fast connector's p50/p99
with and without the backlog over all repetitions' intents pooled (3 x 1,000 each in the full
run: one p99 over 3,000 latencies moves less with a noisy neighbour than the median of three
p99s of 1,000), p99 with / without (target <= 1.2), and each repetition's own p99 beside them.
Run as a section of bench/run.py (``--only isolation``).
"""
from __future__ import annotations

import time
from typing import Any

import catalogs
from common import Agent, BrokerGone, CpuMeter, log, percentile, purge, queue_state
from reachfleet import ReachFleet

SLOW_QUEUE = "reach.connector." + catalogs.SLOW


def _wait_router_drained(ctx: Any, timeout: float = 120.0) -> float:
    """Until the router has passed the whole backlog on: reach.intents has nothing ready and the
    slow queue stopped growing (the router's prefetched intents are through too)."""
    t0 = time.time()
    while time.time() - t0 < timeout:
        if queue_state(ctx.broker_url, "reach.intents")[0] == 0:
            break
        time.sleep(0.1)
    else:
        raise RuntimeError("the router did not pass the backlog on within the timeout")
    last = queue_state(ctx.broker_url, SLOW_QUEUE)[0]
    while time.time() - t0 < timeout:
        time.sleep(0.5)
        depth = queue_state(ctx.broker_url, SLOW_QUEUE)[0]
        if depth <= last:
            return time.time() - t0
        last = depth
    return time.time() - t0


def run(ctx: Any, fleet: ReachFleet) -> dict[str, Any]:
    cfg = ctx.cfg
    fleet.start_pool(catalogs.SLOW)
    fleet.wait_consuming(SLOW_QUEUE)
    ctx.consumer_queues.append(SLOW_QUEUE)
    ctx.no_drain.add(SLOW_QUEUE)
    backlog_agent = Agent(ctx.procs, "agent-backlog")
    # nobody binds the slow receipts' routing key: they are published (and confirmed) and dropped
    backlog_agent.connect_amqp(ctx.broker_url, "reach.intents", "reach.receipts", "nobody.listens")
    n = int(100 * cfg["iso_seconds"])
    out: dict[str, Any] = {"backlog": cfg["backlog"], "rate": 100, "n": n, "without": [], "with": []}
    meter = ctx.meters["fleet"]
    meter.pids["pool_slow"] = fleet.pid(catalogs.SLOW)
    for rep in range(cfg["iso_reps"]):
        # warm the path again after whatever ran before (not measured)
        ctx.phase("fleet", "burst", 50, label="isolation warm-up", meter=CpuMeter({}))
        res = ctx.phase("fleet", "paced", n, rate=100, label=f"isolation without backlog rep {rep + 1}", samples=True)
        out["without"].append(res)
        log(f"isolation rep {rep + 1} without backlog: p50 {res['latency_ms']['p50']} p99 {res['latency_ms']['p99']} ms")
        for attempt in range(3):
            try:
                backlog = backlog_agent.run(None, mode="burst", n=cfg["backlog"], wait_receipts=False, timeout=60,
                                            intent=ctx.intent("slow", [catalogs.SLOW_AGENT],
                                                              action="bench_slow.create_ticket", suffix="sink"))
                break
            except BrokerGone as exc:
                ctx.notes.append(f"isolation backlog: broker connection lost ({exc}); published again")
                if attempt == 2:
                    raise
                backlog_agent.reconnect()
                ctx.wait_consumers()
                purge(ctx.broker_url, SLOW_QUEUE)
        routed_s = _wait_router_drained(ctx)
        depth_before = queue_state(ctx.broker_url, SLOW_QUEUE)[0]
        res = ctx.phase("fleet", "paced", n, rate=100, label=f"isolation with backlog rep {rep + 1}", samples=True)
        depth_after = queue_state(ctx.broker_url, SLOW_QUEUE)[0]
        res.update(slow_depth_before=depth_before, slow_depth_after=depth_after, backlog_published_s=backlog["publish_s"],
                   backlog_routed_s=round(routed_s, 2))
        out["with"].append(res)
        log(f"isolation rep {rep + 1} with backlog ({depth_before} -> {depth_after} waiting): "
            f"p50 {res['latency_ms']['p50']} p99 {res['latency_ms']['p99']} ms")
        if depth_after <= 0:
            ctx.problems.append("isolation: the slow backlog ran out before the 'with' phase ended")
        purge(ctx.broker_url, SLOW_QUEUE)
        time.sleep(2.5)  # the 20 calls in flight finish (2 s each)
    backlog_agent.quit()
    ctx.consumer_queues.remove(SLOW_QUEUE)
    ctx.no_drain.discard(SLOW_QUEUE)
    meter.pids.pop("pool_slow", None)
    fleet.stop(catalogs.SLOW)
    pooled = {phase: [v for r in out[phase] for v in r.pop("samples_ms", [])] for phase in ("without", "with")}
    p99_without, p99_with = percentile(pooled["without"], 99), percentile(pooled["with"], 99)
    out.update(fast_p99_without_ms=p99_without, fast_p99_with_ms=p99_with,
               fast_p50_without_ms=percentile(pooled["without"], 50), fast_p50_with_ms=percentile(pooled["with"], 50),
               samples=(len(pooled["without"]), len(pooled["with"])),
               rep_p99_ms={phase: [r["latency_ms"]["p99"] for r in out[phase]] for phase in ("without", "with")},
               ratio=round(p99_with / p99_without, 3) if p99_with and p99_without else None,
               slow_depth=[(r["slow_depth_before"], r["slow_depth_after"]) for r in out["with"]])
    return out
