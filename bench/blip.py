#!/usr/bin/env python
"""A broker connection blip under load: does every intent still get exactly one outcome, how
much extra work does the fleet do, and how long until it is back?

    .venv/bin/python bench/blip.py [N]      # default 1500 intents

A fleet (router + bench_fast pool, the benchmark catalog) in a vhost and a redis-server of its
own; N intents are published as fast as possible (pipelined confirms); two seconds later every
connection in the vhost is closed (``rabbitmqctl close_all_connections -p VHOST``: what a broker
restart or a network blip does to the fleet). Then, every 2 s until all N receipts are stored in
Redis: receipts stored, queue depths. At the end: receipt statuses, calls the downstream
received (more than N = a duplicated effect), the most the connector queue held (more than N =
the router dispatched intents again), duplicate deliveries the pool absorbed, and the longest
stretch without progress. Exit status 1 when an intent was lost or executed twice.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

import catalogs  # noqa: E402
from common import (
    Agent,
    Procs,
    Vhost,
    downstream_stats,
    ensure_services,
    queue_state,  # noqa: E402
    start_downstream,
    start_private_redis,
    tmpdir,
)
from reachfleet import ReachFleet  # noqa: E402

from workers.state import keys  # noqa: E402

FAST_QUEUE = "reach.connector." + catalogs.FAST


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1500
    work = tmpdir("reach-blip-")
    procs = Procs(work)
    shared, _ = ensure_services()
    vhost = Vhost(shared, f"reach-blip-{os.getpid()}").create()
    bad = False
    try:
        import redis

        redis_url, _ = start_private_redis(procs)
        downstream, _ = start_downstream(procs)
        fleet = ReachFleet(
            procs, catalogs.write(work / "catalog", catalogs.main_catalog(downstream)), vhost.url, redis_url
        )
        fleet.start_router()
        fleet.start_pool(catalogs.FAST)
        fleet.wait_consuming("reach.intents")
        fleet.wait_consuming(FAST_QUEUE)
        agent = Agent(procs, "agent")
        agent.connect_amqp(vhost.url, "reach.intents", "reach.receipts", "*.blip")
        prefix = f"blip{os.getpid()}"
        res = agent.run(
            None,
            mode="burst",
            n=n,
            wait_receipts=False,
            timeout=60,
            intent={
                "action": "create_ticket",
                "params": catalogs.PARAMS,
                "agents": [catalogs.AGENT],
                "id_prefix": prefix,
                "reply_suffix": "blip",
            },
        )
        print(f"published {res['published']} intents, {res['unconfirmed']} unconfirmed", flush=True)
        time.sleep(2)
        client = redis.Redis.from_url(redis_url)

        def stored() -> int:
            return sum(1 for _ in client.scan_iter(keys.receipt(catalogs.AGENT, f"{prefix}-*"), count=1000))

        print(
            f"before the blip: {stored()} receipts; reach.intents {queue_state(vhost.url, 'reach.intents')}, "
            f"{FAST_QUEUE} {queue_state(vhost.url, FAST_QUEUE)} (ready, consumers)",
            flush=True,
        )
        subprocess.run(
            ["rabbitmqctl", "close_all_connections", "-p", vhost.name, "bench blip"], capture_output=True, timeout=60
        )
        t0 = time.time()
        peak, last_count, last_progress, longest_stall = 0, -1, t0, 0.0
        while time.time() - t0 < 300:
            count = stored()
            depth = queue_state(vhost.url, FAST_QUEUE)[0]
            peak = max(peak, depth)
            now = time.time()
            if count != last_count:
                longest_stall = max(longest_stall, now - last_progress)
                last_count, last_progress = count, now
            print(
                f"  t+{now - t0:5.1f} s  receipts {count:5d}  reach.intents {queue_state(vhost.url, 'reach.intents')}"
                f"  {FAST_QUEUE} ({depth}, ...)",
                flush=True,
            )
            if count >= n:
                break
            time.sleep(2)
        longest_stall = max(longest_stall, time.time() - last_progress if last_count < n else 0)
        time.sleep(3)
        statuses: dict[str, int] = {}
        for key in client.scan_iter(keys.receipt(catalogs.AGENT, f"{prefix}-*"), count=1000):
            doc = json.loads(client.get(key))
            status = doc["status"] + ("/" + doc["error"]["code"] if doc.get("error") else "")
            statuses[status] = statuses.get(status, 0) + 1
        calls = downstream_stats(downstream)["requests"]
        pool_log = procs.items[f"fleet-{catalogs.FAST}"].log_text()
        absorbed = pool_log.count("already has its receipt") + pool_log.count("was already sent; not sending another")
        router_restarts = procs.items["fleet-router"].log_text().count("Connection to broker lost")
        pool_restarts = pool_log.count("Connection to broker lost")
        print(f"\nreceipts stored {sum(statuses.values())} of {n} after {time.time() - t0:.1f} s: {statuses}")
        print(f"downstream calls {calls} for {n} intents" + ("  <- DUPLICATED EFFECTS" if calls > n else ""))
        print(
            f"the connector queue held up to {peak} messages for {n} intents"
            + (f"  <- about {peak - n}+ dispatched again" if peak > n else "")
        )
        print(f"duplicate deliveries the pool absorbed (already-sent receipts): {absorbed}")
        print(f"consumer restarts after connection loss: router {router_restarts}, pool {pool_restarts}")
        print(f"longest stretch without a new receipt: {longest_stall:.1f} s")
        bad = sum(statuses.values()) < n or calls > n
    finally:
        procs.stop_all()
        vhost.delete()
        print(f"logs: {work}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
