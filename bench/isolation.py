"""Isolation: does a slow system slow anyone else down?

``bench_slow`` is a system of its own (a second downstream process) whose /slow takes 2 s per
call; its pool runs beside ``bench_fast``'s (both 20 threads, one router). The fast connector
gets paced 100/s intents:

    without: bench_slow's pool is up but idle
    with:    ``backlog`` (1,000) intents for bench_slow were published first and have all passed
             the router: 20 are in the slow pool's hands, the rest wait in reach.connector.bench_slow
             (it drains at 10/s, so the backlog lasts the whole phase)

The same experiment runs on the bare pipeline (bench/bare.py with a second connector,
bare.connector.slow, on the same slow system) in the same repetitions, as the baseline: how much
of the effect is two shared cores and Celery-with-threads, and how much is the fleet's.

The phases alternate (fleet without, fleet with, bare without, bare with, ...). Reported for each
pipeline: the fast connector's p50/p99 with and without the backlog over all repetitions' intents
pooled (5 x 1,000 each in the full run: one p99 over 5,000 latencies moves less with a noisy
neighbour than the median of five p99s of 1,000), p99 with / without (target <= 1.2 for the
fleet), and each repetition's own p99 beside them. The fleet's figures are at the top level of the
result, the baseline's under "bare"; ``relative_to_bare`` is the fleet's ratio over the bare
pipeline's (the figure of record, target <= 1.15). With ``big_backlog`` set (10,000 in the full run),
each repetition also runs the fleet's fast connector beside that much backlog: ``big_over_with`` is
its p99 over the 1,000-backlog one (backlog independence, target <= 1.1). Run as a section of
bench/run.py (``--only isolation``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import catalogs
from common import Agent, BrokerGone, CpuMeter, loadavg, log, percentile, purge, queue_state
from reachfleet import ReachFleet

SLOW_QUEUE = "reach.connector." + catalogs.SLOW
BARE_SLOW_QUEUE = "bare.connector.slow"


@dataclass
class Pipeline:
    """What differs between the fleet and the bare pipeline in this experiment."""

    variant: str  # ctx.agents / ctx.meters key
    intents_exchange: str
    intents_queue: str
    receipts_exchange: str
    slow_queue: str
    start_slow: Callable[[], int]  # starts the slow connector's worker; returns its pid
    stop_slow: Callable[[], None]


def _wait_router_drained(ctx: Any, pipe: Pipeline, timeout: float = 120.0) -> float:
    """Until the router has passed the whole backlog on: its intents queue has nothing ready and
    the slow queue stopped growing (the router's prefetched intents are through too)."""
    t0 = time.time()
    while time.time() - t0 < timeout:
        if queue_state(ctx.broker_url, pipe.intents_queue)[0] == 0:
            break
        time.sleep(0.1)
    else:
        raise RuntimeError(f"the {pipe.variant} router did not pass the backlog on within the timeout")
    # three still samples in a row: on a busy box the router can stall for half a second with
    # intents still in hand, and one still sample would start the phase mid-backlog
    last, still = queue_state(ctx.broker_url, pipe.slow_queue)[0], 0
    while time.time() - t0 < timeout:
        time.sleep(0.5)
        depth = queue_state(ctx.broker_url, pipe.slow_queue)[0]
        still = still + 1 if depth <= last else 0
        if still == 3:
            return time.time() - t0
        last = depth
    return time.time() - t0


def _publish_backlog(ctx: Any, pipe: Pipeline, agent: Agent, n: int | None = None) -> dict[str, Any]:
    cfg = ctx.cfg
    for attempt in range(3):
        try:
            return agent.run(
                None,
                mode="burst",
                n=n or cfg["backlog"],
                wait_receipts=False,
                timeout=60 + (n or 0) / 100,
                intent=ctx.intent(
                    pipe.variant, [catalogs.SLOW_AGENT], action=f"{catalogs.SLOW}.create_ticket", suffix="sink"
                ),
            )
        except BrokerGone as exc:
            ctx.notes.append(f"isolation backlog ({pipe.variant}): broker connection lost ({exc}); published again")
            if attempt == 2:
                raise
            agent.reconnect()
            ctx.wait_consumers()
            purge(ctx.broker_url, pipe.slow_queue)
    raise RuntimeError("unreachable")


def _one_rep(ctx: Any, pipe: Pipeline, agent: Agent, rep: int, n: int, out: dict[str, Any]) -> None:
    v = pipe.variant
    # warm the path again after whatever ran before (not measured)
    ctx.phase(v, "burst", 50, label="isolation warm-up", meter=CpuMeter({}))
    res = ctx.phase(v, "paced", n, rate=100, label=f"isolation without backlog rep {rep + 1}", samples=True)
    res["load"] = loadavg()[0]  # the 1-minute load average as the phase ends (a shared box: judge the run by it)
    out["without"].append(res)
    log(
        f"isolation {v} rep {rep + 1} without backlog: p50 {res['latency_ms']['p50']} p99 {res['latency_ms']['p99']} ms"
    )
    backlog = _publish_backlog(ctx, pipe, agent)
    routed_s = _wait_router_drained(ctx, pipe)
    depth_before = queue_state(ctx.broker_url, pipe.slow_queue)[0]
    res = ctx.phase(v, "paced", n, rate=100, label=f"isolation with backlog rep {rep + 1}", samples=True)
    depth_after = queue_state(ctx.broker_url, pipe.slow_queue)[0]
    res.update(
        slow_depth_before=depth_before,
        slow_depth_after=depth_after,
        backlog_published_s=backlog["publish_s"],
        backlog_routed_s=round(routed_s, 2),
        load=loadavg()[0],
    )
    out["with"].append(res)
    log(
        f"isolation {v} rep {rep + 1} with backlog ({depth_before} -> {depth_after} waiting): "
        f"p50 {res['latency_ms']['p50']} p99 {res['latency_ms']['p99']} ms"
    )
    if depth_after <= 0:
        ctx.problems.append(f"isolation ({v}): the slow backlog ran out before the 'with' phase ended")
    purge(ctx.broker_url, pipe.slow_queue)
    time.sleep(2.5)  # the 20 calls in flight finish (2 s each)
    big = int(ctx.cfg.get("big_backlog") or 0)
    if big and v == "fleet":
        # backlog independence: the same phase beside a backlog ten times as long
        _publish_backlog(ctx, pipe, agent, big)
        _wait_router_drained(ctx, pipe, timeout=600)
        depth_before = queue_state(ctx.broker_url, pipe.slow_queue)[0]
        res = ctx.phase(v, "paced", n, rate=100, label=f"isolation with {big} backlog rep {rep + 1}", samples=True)
        res.update(slow_depth_before=depth_before, slow_depth_after=queue_state(ctx.broker_url, pipe.slow_queue)[0])
        out.setdefault("with_big", []).append(res)
        log(
            f"isolation {v} rep {rep + 1} with {big} backlog ({depth_before} waiting): p99 {res['latency_ms']['p99']} ms"
        )
        purge(ctx.broker_url, pipe.slow_queue)
        time.sleep(2.5)


def _summary(out: dict[str, Any]) -> dict[str, Any]:
    if out.get("with_big"):
        big = [v for r in out["with_big"] for v in r.pop("samples_ms", [])]
        with_ = [v for r in out["with"] for v in r.get("samples_ms", [])]
        p99_big, p99_with = percentile(big, 99), percentile(with_, 99)
        out.update(
            fast_p99_with_big_ms=p99_big,
            big_over_with=round(p99_big / p99_with, 3) if p99_big and p99_with else None,
            rep_p99_big_ms=[r["latency_ms"]["p99"] for r in out["with_big"]],
            slow_depth_big=[(r["slow_depth_before"], r["slow_depth_after"]) for r in out["with_big"]],
        )
    pooled = {phase: [v for r in out[phase] for v in r.pop("samples_ms", [])] for phase in ("without", "with")}
    p99_without, p99_with = percentile(pooled["without"], 99), percentile(pooled["with"], 99)
    out.update(
        fast_p99_without_ms=p99_without,
        fast_p99_with_ms=p99_with,
        fast_p50_without_ms=percentile(pooled["without"], 50),
        fast_p50_with_ms=percentile(pooled["with"], 50),
        samples=(len(pooled["without"]), len(pooled["with"])),
        rep_p99_ms={phase: [r["latency_ms"]["p99"] for r in out[phase]] for phase in ("without", "with")},
        ratio=round(p99_with / p99_without, 3) if p99_with and p99_without else None,
        slow_depth=[(r["slow_depth_before"], r["slow_depth_after"]) for r in out["with"]],
        load={phase: [r.get("load") for r in out[phase]] for phase in ("without", "with")},
    )
    return out


def run(ctx: Any, fleet: ReachFleet, bare: bool = True) -> dict[str, Any]:
    """``bare``: run the baseline too (its router and fast connector must be up)."""
    cfg = ctx.cfg

    def start_fleet_slow() -> int:
        fleet.start_pool(catalogs.SLOW)
        fleet.wait_consuming(SLOW_QUEUE)
        return fleet.pid(catalogs.SLOW)

    pipes = [
        Pipeline(
            "fleet",
            "reach.intents",
            "reach.intents",
            "reach.receipts",
            SLOW_QUEUE,
            start_fleet_slow,
            lambda: fleet.stop(catalogs.SLOW),
        )
    ]
    if bare:
        pipes.append(
            Pipeline(
                "bare",
                "bare.intents",
                "bare.intents",
                "bare.receipts",
                BARE_SLOW_QUEUE,
                lambda: ctx.start_bare_slow(),
                lambda: ctx.procs.stop_many(["bare-connector-slow"]),
            )
        )
    agents: dict[str, Agent] = {}
    for pipe in pipes:
        meter = ctx.meters[pipe.variant]
        meter.pids["pool_slow"] = pipe.start_slow()
        ctx.consumer_queues.append(pipe.slow_queue)
        ctx.no_drain.add(pipe.slow_queue)
        agents[pipe.variant] = Agent(ctx.procs, f"agent-backlog-{pipe.variant}")
        # nobody binds the slow receipts' routing key: they are published (and confirmed) and dropped
        agents[pipe.variant].connect_amqp(
            ctx.broker_url, pipe.intents_exchange, pipe.receipts_exchange, "nobody.listens"
        )
    n = int(100 * cfg["iso_seconds"])
    outs = {p.variant: {"backlog": cfg["backlog"], "rate": 100, "n": n, "without": [], "with": []} for p in pipes}
    for rep in range(cfg["iso_reps"]):
        for pipe in pipes:
            _one_rep(ctx, pipe, agents[pipe.variant], rep, n, outs[pipe.variant])
    for pipe in pipes:
        agents[pipe.variant].quit()
        ctx.consumer_queues.remove(pipe.slow_queue)
        ctx.no_drain.discard(pipe.slow_queue)
        ctx.meters[pipe.variant].pids.pop("pool_slow", None)
        pipe.stop_slow()
    result = _summary(outs["fleet"])
    if bare:
        result["bare"] = _summary(outs["bare"])
        # the figure of record: the fleet's sensitivity to the backlog over the bare pipeline's,
        # measured in the same repetitions (what the machine does to both cancels out)
        if result.get("ratio") and result["bare"].get("ratio"):
            result["relative_to_bare"] = round(result["ratio"] / result["bare"]["ratio"], 3)
    return result
