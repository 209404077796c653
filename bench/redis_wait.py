#!/usr/bin/env python
"""What a Redis failover can cost the fleet, with and without REACH_REDIS_WAIT_REPLICAS.

    .venv/bin/python bench/redis_wait.py [--writes 300] [--reps 3] [--delays 0,50] [--latency-intents 200]

Two pools side by side in one fleet, on a Sentinel-watched Redis (one master, one replica, one
sentinel: tests/integration/redis_topologies.py): ``wait_on`` (REACH_REDIS_WAIT_REPLICAS=1, the
default) and ``wait_off`` (0), each its own connector to one counting downstream
(tests/integration/counting_system.py), so both see the same Redis, the same load and the same
failover.

1. Cost: ``--latency-intents`` writes to each, one at a time, alternating between the two
   connectors; the agent's round trip per intent (publish to receipt), median and p90.
2. Loss: per repetition and replica delay, a fresh Sentinel set-up and fleet; a burst of
   ``--writes`` writes (half to each connector, interleaved); once a third of them reached the
   downstream, kill -9 of the master; the sentinel promotes the replica. Then every receipt is
   gathered and counted: lost intents, duplicate receipts, writes executed twice (a duplicated
   effect), answers "unknown". A replica delay (ms) holds everything the master sends to the
   replica that long (a replica in another zone), so the failover loses the writes of that
   last stretch.

Results: printed, and written to bench/results/redis_wait.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from producers.client import ReachClient  # noqa: E402
from tests.fleet import Fleet  # noqa: E402
from tests.integration.counting_system import CountingSystem  # noqa: E402
from tests.integration.redis_topologies import LocalSentinel, gather  # noqa: E402
from tests.waiting import wait_for  # noqa: E402

MODES = {"wait_on": "1", "wait_off": "0"}
AGENT = "bench_wait"
RESULTS = Path(__file__).resolve().parent / "results" / "redis_wait.json"


def catalog(url: str) -> str:
    text = ""
    for name in MODES:
        text += f"""
connector:
  name: {name}
  endpoint: {url}
  pool: {{ concurrency: 8 }}
  retry: {{ max_attempts: 1 }}
  actions:
    - action: create_item
      path: POST /items
      input:
        title: {{ type: string, required: true }}
      permission: write
      timeout: 10s
      idempotent: false
---"""
    bindings = "".join(f'    - connector: {name}\n      allowed_actions: ["*"]\n' for name in MODES)
    return text + f"\nagent_app:\n  name: {AGENT}\n  connector_bindings:\n{bindings}"


def start_fleet(sentinel: LocalSentinel, system: CountingSystem, redis_url: str = "") -> Fleet:
    fleet = Fleet(catalog(system.url), [], redis_url=redis_url or sentinel.url)
    fleet.start()  # the router
    for name, replicas in MODES.items():
        fleet.start_process(name, ["worker", name], extra_env={"REACH_REDIS_WAIT_REPLICAS": replicas})
        fleet.wait_consuming(f"reach.connector.{name}")
    return fleet


def latency(n: int, link_ms: float = 0.0) -> dict[str, Any]:
    """Without ``link_ms`` on the Sentinel set-up; with it, on the master alone (a sentinel would
    point the replica past the link: redis_topologies.LocalSentinel), its replica that far away."""
    system = CountingSystem().start()
    with LocalSentinel(replica_delay=link_ms / 1000, sentinel=not link_ms) as sentinel:
        fleet = start_fleet(sentinel, system, sentinel.master_url if link_ms else sentinel.url)
        try:
            times: dict[str, list[float]] = {name: [] for name in MODES}
            with ReachClient(AGENT, fleet.broker_url, drop_duplicates=False) as client:
                for i in range(n + 20):  # the first 20 of each warm up
                    for name in MODES if i % 2 else reversed(list(MODES)):
                        started = time.perf_counter()
                        receipt = client.call(f"{name}.create_item", {"title": f"lat-{name}-{i}"}, timeout=30)
                        if not receipt.success:
                            raise RuntimeError(f"{name}: {receipt.error}")
                        if i >= 20:
                            times[name].append((time.perf_counter() - started) * 1000)
        finally:
            fleet.stop()
    system.stop()
    out: dict[str, Any] = {}
    for name, values in times.items():
        values.sort()
        out[name] = {
            "median_ms": round(statistics.median(values), 3),
            "p90_ms": round(values[int(0.9 * (len(values) - 1))], 3),
            "n": len(values),
        }
    out["added_median_ms"] = round(out["wait_on"]["median_ms"] - out["wait_off"]["median_ms"], 3)
    return out


def failover(writes: int, delay_ms: int, down_after_ms: int) -> dict[str, Any]:
    system = CountingSystem().start()
    system.state.keep_requests = True
    system.state.delay = 0.05  # writes stay in flight while the master dies
    run = uuid.uuid4().hex[:6]
    with LocalSentinel(replica_delay=delay_ms / 1000, down_after_ms=down_after_ms) as sentinel:
        fleet = start_fleet(sentinel, system)
        try:
            with ReachClient(AGENT, fleet.broker_url, drop_duplicates=False) as client:
                sent: dict[str, tuple[str, str]] = {}
                for i in range(writes):
                    name = list(MODES)[i % 2]
                    title = f"{run}-{name}-{i}"
                    sent[client.publish(f"{name}.create_item", {"title": title})] = (name, title)
                wait_for(lambda: len(system.requests("POST")) >= writes // 3, 60, "a third of the burst")
                sentinel.kill_master()
                took = sentinel.wait_failover(90)
                receipts = [r for r in gather(client, set(sent), timeout=180, grace=3) if r.intent_id in sent]
        finally:
            fleet.stop()
    executions = system.executions()
    system.stop()
    out: dict[str, Any] = {"failover_s": round(took, 2), "replica_delay_ms": delay_ms, "down_after_ms": down_after_ms}
    for name in MODES:
        mine = {i: title for i, (mode, title) in sent.items() if mode == name}
        got = Counter(r.intent_id for r in receipts if r.intent_id in mine)
        out[name] = {
            "writes": len(mine),
            "lost": len(set(mine) - set(got)),
            "duplicate_receipts": sum(1 for n in got.values() if n > 1),
            "duplicated_effects": sum(1 for title in mine.values() if executions[title] > 1),
            "unknown": sum(1 for r in receipts if r.intent_id in mine and r.status == "unknown"),
            "outcomes": dict(Counter(r.error.code if r.error else r.status for r in receipts if r.intent_id in mine)),
        }
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writes", type=int, default=300)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--delays", default="0", help="replica delays to try in the failover, in ms")
    parser.add_argument(
        "--replica-links", default="2", help="latency again with the replica this far (ms), no sentinel"
    )
    parser.add_argument("--latency-intents", type=int, default=200)
    parser.add_argument(
        "--down-after-ms",
        default="1000,5000",
        help="how long the sentinel waits before it fails over (Redis's default: 30000)",
    )
    args = parser.parse_args()
    results: dict[str, Any] = {"started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    if args.latency_intents:
        results["latency"] = latency(args.latency_intents)
        print(json.dumps({"latency": results["latency"]}), flush=True)
        for link in [float(x) for x in args.replica_links.split(",") if x]:
            results[f"latency_replica_{link:g}ms"] = one = latency(args.latency_intents, link)
            print(json.dumps({f"latency_replica_{link:g}ms": one}), flush=True)
    results["failover"] = []
    for down_after in [int(d) for d in args.down_after_ms.split(",") if d]:
        for delay in [int(d) for d in args.delays.split(",") if d]:
            for rep in range(args.reps):
                one = failover(args.writes, delay, down_after)
                one["rep"] = rep + 1
                results["failover"].append(one)
                print(json.dumps(one), flush=True)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2))
    print(f"written to {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
