#!/usr/bin/env python
"""History (issue 33): what remembering every receipt costs.

    .venv/bin/python bench/history.py                    # 1,000,000 records per store, 3 x 2,000 intents: ~15 min
    .venv/bin/python bench/history.py --quick            # 100,000 records, 2 x 500 intents: ~3 min
    .venv/bin/python bench/history.py --records 300000 --burst 2000 --reps 5
    .venv/bin/python bench/history.py --skip-postgres --skip-fleet

**Bytes.** A redis-server of the run's own gets 100,000 records of a typical write (create_order: five
params, one sensitive, two entities, a declared output), written as the pools write them (one Lua
script a record, pipelined): ``INFO used_memory`` before and after, per record and per 100,000
receipts, with the record's own JSON size beside it.

**Queries at scale.** Each store is filled to ``--records`` (orders of about three records each,
over ten actions), then asked 1,000 times by a random order (``entity``) and 200 times by an action
(``limit`` 20, the index capped at 1,000): p50 and p99 in ms, from this process, one at a time.
PostgreSQL is a server of the run's own from the Debian binaries (tests/integration/postgres.py).

**Fleet throughput, history on vs off.** One fleet (router and one pool, tests/fleet.py) in front of
the counting downstream; two actions alike but for ``history: off`` on one. Bursts of ``--burst``
intents to each, alternating, ``--reps`` times: receipts per second from the first publish to the last
receipt, the median per variant and on/off (target: history costs at most 5 %).

Prints a table and one JSON line; writes bench/results/history.json.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

import redis  # noqa: E402
from common import RESULTS, Procs, log, median, percentile, start_downstream, start_private_redis  # noqa: E402

from connectors import history  # noqa: E402
from connectors.spec import ActionSpec, FieldSpec  # noqa: E402
from workers.state.history import HistoryStore, Query, RedisHistory  # noqa: E402

DAY = 86400
ACTIONS = [
    ActionSpec(
        action=f"act_{i}",
        input={
            "order_id": FieldSpec(type="string", entity="order"),
            "customer": FieldSpec(type="integer", entity="customer"),
            "title": FieldSpec(type="string"),
            "card": FieldSpec(type="string", sensitive=True),
            "quantity": FieldSpec(type="integer"),
        },
        output={"item_id": FieldSpec(type="string"), "status": FieldSpec(type="string")},
    )
    for i in range(10)
]


def typical(agent: str, n: int, orders: int, at_ms: int) -> history.Record:
    action = ACTIONS[n % len(ACTIONS)]
    order = random.randrange(orders)
    return history.record(
        agent=agent,
        intent_id=uuid.uuid4().hex,
        connector="shop",
        action=action,
        status="succeeded",
        code=None,
        at="2026-12-06T03:00:00.000Z",
        at_ms=at_ms,
        trace_id=uuid.uuid4().hex,
        params={"order_id": f"O-{order:08d}", "customer": order % 5000, "title": "lamp", "card": "4111", "quantity": 2},
        data={"item_id": f"IT-{n:08d}", "status": "open"},
        retain_seconds=30 * DAY,
        version=history.action_version(action),
    )


def fill(store: HistoryStore, agent: str, count: int, orders: int) -> float:
    started = time.perf_counter()
    now = int(time.time() * 1000)
    batch: list[history.Record] = []
    for n in range(count):
        batch.append(typical(agent, n, orders, now - (count - n)))
        if len(batch) == 1000:
            store.write(batch)
            batch = []
    if batch:
        store.write(batch)
    return time.perf_counter() - started


def bytes_per_record(url: str, count: int) -> dict[str, Any]:
    client = redis.Redis.from_url(url, socket_timeout=300)
    client.flushdb(asynchronous=True)
    before = int(client.info("memory")["used_memory"])
    store = RedisHistory(client, 30 * DAY)
    fill(store, "bench_bytes", count, max(1, count // 3))
    after = int(client.info("memory")["used_memory"])
    sample = [len(typical("bench_bytes", n, 1000, 0).body) for n in range(200)]
    per = (after - before) / count
    client.flushdb(asynchronous=True)
    return {
        "records": count,
        "bytes_per_record": round(per, 1),
        "bytes_per_100k_receipts": int(per * 100_000),
        "record_json_bytes": median([float(s) for s in sample]),
    }


def query_latency(
    store: HistoryStore, agent: str, orders: int, entity_n: int = 1000, action_n: int = 200
) -> dict[str, Any]:
    def visible(connector: str, action: str) -> bool:
        return True

    out: dict[str, Any] = {}
    for kind, n in (("entity", entity_n), ("action", action_n)):
        times: list[float] = []
        found = 0
        for _ in range(n):
            if kind == "entity":
                query = Query(entity=("order", f"O-{random.randrange(orders):08d}"))
            else:
                query = Query(action=("shop", random.choice(ACTIONS).action), limit=20)
            started = time.perf_counter()
            page = store.query(agent, query, visible)
            times.append((time.perf_counter() - started) * 1000)
            found += len(page.records)
        out[kind] = {
            "n": n,
            "p50_ms": round(percentile(times, 50) or 0, 3),
            "p99_ms": round(percentile(times, 99) or 0, 3),
            "records_per_answer": round(found / n, 2),
        }
    return out


def stores_at_scale(args: argparse.Namespace, procs: Procs) -> dict[str, Any]:
    out: dict[str, Any] = {}
    url, _ = start_private_redis(procs)
    out["redis_bytes"] = bytes_per_record(url, args.bytes_records)
    log(f"redis bytes: {out['redis_bytes']}")
    orders = max(1, args.records // 3)
    client = redis.Redis.from_url(url, socket_timeout=300)
    client.flushdb(asynchronous=True)
    store = RedisHistory(client, 30 * DAY)
    seconds = fill(store, "bench_query", args.records, orders)
    out["redis"] = {"records": args.records, "fill_s": round(seconds, 1), **query_latency(store, "bench_query", orders)}
    out["redis"]["used_memory_mb"] = round(int(client.info("memory")["used_memory"]) / 1e6, 1)
    log(f"redis queries at {args.records}: {out['redis']}")
    client.flushdb(asynchronous=True)
    if not args.skip_postgres:
        from tests.integration.postgres import PostgresServer
        from workers.state.history_pg import PostgresHistory

        with PostgresServer(database="history_bench") as server:
            pg = PostgresHistory(server.url().replace("postgresql+psycopg://", "postgresql://"))
            pg.migrate(90 * DAY)
            seconds = fill(pg, "bench_query", args.records, orders)
            pg._run(lambda cur: cur.execute("ANALYZE reach_history"))
            out["postgres"] = {"records": args.records, "fill_s": round(seconds, 1)}
            out["postgres"].update(query_latency(pg, "bench_query", orders))
            pg.close()
        log(f"postgres queries at {args.records}: {out['postgres']}")
    return out


FLEET_CATALOG = """
connector:
  name: hist_bench
  endpoint: {url}
  pool: {{ concurrency: 20 }}
  actions:
    - action: kept
      path: POST /tickets
      permission: write
      input:
        order_id: {{ type: string, required: true, entity: order }}
        title: {{ type: string, required: true }}
        card: {{ type: string, sensitive: true }}
      output:
        item_id: {{ type: string }}
    - action: unkept
      path: POST /tickets
      permission: write
      input:
        order_id: {{ type: string, required: true, entity: order }}
        title: {{ type: string, required: true }}
        card: {{ type: string, sensitive: true }}
      output:
        item_id: {{ type: string }}
      history: off
---
agent_app:
  name: hist_bench_agent
  connector_bindings:
    - connector: hist_bench
      allowed_actions: ["*"]
"""


ACTION_OF = {"on": "kept", "off": "unkept"}


def fleet_throughput(args: argparse.Namespace, procs: Procs) -> dict[str, Any]:
    from producers.client import ReachClient
    from tests.fleet import Fleet

    downstream, _ = start_downstream(procs)
    out: dict[str, Any] = {"on": [], "off": []}
    with Fleet(FLEET_CATALOG.format(url=downstream), ["hist_bench"]) as fleet:
        with ReachClient("hist_bench_agent", fleet.broker_url, drop_duplicates=False) as client:
            client.call("hist_bench.unkept", {"order_id": "warm", "title": "warm"}, timeout=60)
            for rep in range(args.reps):
                for variant in ("on", "off") if rep % 2 == 0 else ("off", "on"):
                    started = time.perf_counter()
                    ids = [
                        client.publish(
                            f"hist_bench.{ACTION_OF[variant]}", {"order_id": f"O-{i}", "title": "t", "card": "4111"}
                        )
                        for i in range(args.burst)
                    ]
                    ok = sum(client.wait(i, timeout=300).success for i in ids)
                    rate = args.burst / (time.perf_counter() - started)
                    out[variant].append(round(rate, 1))
                    log(f"rep {rep + 1} history {variant}: {rate:.1f} receipts/s ({ok}/{args.burst} succeeded)")
    on, off = median(out["on"]), median(out["off"])
    out["median_on"], out["median_off"] = on, off
    out["on_vs_off"] = round(on / off, 4) if on and off else None
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--records", type=int)
    parser.add_argument("--bytes-records", type=int, default=100_000)
    parser.add_argument("--burst", type=int)
    parser.add_argument("--reps", type=int)
    parser.add_argument("--skip-postgres", action="store_true")
    parser.add_argument("--skip-fleet", action="store_true")
    parser.add_argument("--output", default=str(RESULTS / "history.json"))
    args = parser.parse_args()
    args.records = args.records or (100_000 if args.quick else 1_000_000)
    args.burst = args.burst or (500 if args.quick else 2000)
    args.reps = args.reps or (2 if args.quick else 3)
    random.seed(33)
    procs = Procs(Path(tempfile.mkdtemp(prefix="bench-history-")))
    results: dict[str, Any] = {"args": {k: v for k, v in vars(args).items() if k != "output"}}
    try:
        results["stores"] = stores_at_scale(args, procs)
        if not args.skip_fleet:
            results["fleet"] = fleet_throughput(args, procs)
    finally:
        procs.stop_all()
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(results, indent=2) + "\n")
    stores = results["stores"]
    print(
        f"bytes per record in Redis: {stores['redis_bytes']['bytes_per_record']} "
        f"({stores['redis_bytes']['bytes_per_100k_receipts'] / 1e6:.1f} MB per 100,000 receipts; "
        f"record JSON {stores['redis_bytes']['record_json_bytes']} B)"
    )
    for name in ("redis", "postgres"):
        if name in stores:
            s = stores[name]
            print(
                f"{name:8s} at {s['records']:,} records: entity p50 {s['entity']['p50_ms']} ms p99 "
                f"{s['entity']['p99_ms']} ms; action p50 {s['action']['p50_ms']} ms p99 {s['action']['p99_ms']} ms"
            )
    if "fleet" in results:
        f = results["fleet"]
        print(f"fleet receipts/s: history on {f['median_on']}, off {f['median_off']}, on/off {f['on_vs_off']}")
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
