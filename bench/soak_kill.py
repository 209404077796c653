"""Soak: kill -9 a pool again and again while writes are in flight, then count what went wrong.

The long version of tests/integration/test_crash_safety.py's kill test. A real fleet (router +
one pool) on the local RabbitMQ and Redis (a vhost and Redis database of its own, as in the
tests) writes to a downstream that counts executions per payload. Writes are published at a
steady rate for ``--duration`` seconds while the pool's whole process group is killed every
``--kill-every`` seconds (with jitter) and started again; then every receipt is awaited.

    python bench/soak_kill.py                       # 500 writes over 120 s, both connector kinds
    python bench/soak_kill.py --writes 200 --duration 40 --mode header
    python bench/soak_kill.py --restart-after-heartbeat  # restart after the dead pool's heartbeat expired

Prints, per connector kind (``header``: declares idempotency_header; ``plain``: non-idempotent
write): lost intents (no receipt), duplicate receipts, duplicated effects (a payload executed
twice), unknown outcomes, other failures, kills, pools that died on start, and throughput.
Exit status 1 when anything was lost or duplicated.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis  # noqa: E402

from producers.client import ReachClient  # noqa: E402
from producers.wire import Receipt  # noqa: E402
from tests.fleet import BROKER_URL, REDIS_URL, Fleet  # noqa: E402
from tests.integration.counting_system import CountingSystem  # noqa: E402
from workers.state import keys  # noqa: E402

STARTUP_CRASH = "Consumer does not have any callbacks"


def catalog(name: str, url: str, header: bool, threads: int, agent: str) -> str:
    return f"""
connector:
  name: {name}
  endpoint: {url}
  pool: {{ concurrency: {threads} }}
{"  idempotency_header: Idempotency-Key" if header else ""}
  actions:
    - action: create_item
      path: POST /items
      input:
        title: {{ type: string, required: true }}
      permission: write
      timeout: 5s
      idempotent: false
---
agent_app:
  name: {agent}
  connector_bindings:
    - connector: {name}
      allowed_actions: ["*"]
"""


class Killer(threading.Thread):
    """Kills the pool's process group every few seconds and starts it again."""

    def __init__(
        self, fleet: Fleet, system: CountingSystem, name: str, every: float, until: float, wait_heartbeat: bool
    ) -> None:
        super().__init__(daemon=True, name="killer")
        self.fleet, self.system, self.name, self.every, self.until = fleet, system, name, every, until
        self.in_flight_at_kills: list[int] = []
        self.wait_heartbeat = wait_heartbeat
        self.kills = 0
        self.startup_crashes = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while time.monotonic() + self.every < self.until:
                time.sleep(self.every * random.uniform(0.6, 1.4))
                self.in_flight_at_kills.append(self.system.in_flight())
                pid = self.fleet.kill_process(self.name)
                self.kills += 1
                if self.wait_heartbeat:
                    client = redis.Redis.from_url(REDIS_URL)
                    while any(client.scan_iter(match=keys.alive(f"*:{pid}:*"))):
                        time.sleep(0.05)
                self.start_pool()
        except BaseException as exc:  # reported by the main thread
            self.error = exc

    def start_pool(self) -> None:
        for _ in range(20):
            proc = self.fleet.start_process(self.name, ["worker", self.name])
            marker = f"{self.name}.{proc.pid}@"
            deadline = time.monotonic() + 30
            while proc.poll() is None and time.monotonic() < deadline:
                if any(marker in line and " ready." in line for line in self.fleet.log(self.name).splitlines()[-400:]):
                    return
                time.sleep(0.05)
            if proc.poll() is None:
                raise RuntimeError(f"pool not ready in 30 s; see {self.fleet.log_dir}")
            self.fleet.procs.pop(self.name, None)
            if STARTUP_CRASH not in self.fleet.log(self.name).split(marker, 1)[-1]:
                raise RuntimeError(f"pool died on start; see {self.fleet.log_dir}")
            self.startup_crashes += 1  # the PauseWatcher start-up bug; start it again like Kubernetes would
        raise RuntimeError("pool died on start 20 times in a row")


def soak(mode: str, args: argparse.Namespace) -> dict[str, Any]:
    header = mode == "header"
    name = f"soak_{mode}"
    agent = f"soak_{uuid.uuid4().hex[:6]}"
    system = CountingSystem().start()
    system.state.delay = args.delay
    redis.Redis.from_url(REDIS_URL).delete(keys.breaker(name), keys.health(name))
    fleet = Fleet(catalog(name, system.url, header, args.threads, agent), [name]).start()
    titles: dict[str, str] = {}
    receipts: list[Receipt] = []
    try:
        with ReachClient(agent, BROKER_URL, reply_to=f"{agent}.soak", drop_duplicates=False) as client:
            started = time.monotonic()
            until = started + args.duration
            killer = Killer(fleet, system, name, args.kill_every, until, args.restart_after_heartbeat)
            killer.start()
            interval = args.duration / args.writes
            for i in range(args.writes):
                while time.monotonic() < started + i * interval:
                    receipts.extend(client.receipts(timeout=0.02))
                title = f"{agent}-{i}"
                titles[client.publish(f"{name}.create_item", {"title": title})] = title
            killer.join()
            if killer.error is not None:
                raise killer.error
            finished = time.monotonic()  # when the last receipt came
            while len({r.intent_id for r in receipts} & set(titles)) < len(titles):
                batch = list(client.receipts(timeout=0.5))
                receipts.extend(batch)
                if batch:
                    finished = time.monotonic()
                elif time.monotonic() - finished > args.idle:
                    break
            receipts.extend(client.receipts(timeout=2.0))  # late duplicates
    finally:
        fleet.stop()
        system.stop()
    per_intent = Counter(r.intent_id for r in receipts)
    executions = system.executions()
    outcomes = Counter(r.error.code.value if r.error else r.status for r in receipts)
    unknown_never_sent = sum(
        1 for r in receipts if r.status == "unknown" and not system.requests("POST", titles[r.intent_id])
    )
    latencies = sorted(r.execution.latency_ms for r in receipts)
    return {
        "mode": mode,
        "writes": len(titles),
        "receipts": len(receipts),
        "lost": len(set(titles) - set(per_intent)),
        "duplicate_receipts": sum(n - 1 for n in per_intent.values() if n > 1),
        "duplicated_effects": sum(1 for n in executions.values() if n > 1),
        "succeeded": outcomes.get("succeeded", 0),
        "unknown": outcomes.get("OUTCOME_UNKNOWN", 0),
        "unknown_never_reached_system": unknown_never_sent,
        "other": {k: v for k, v in outcomes.items() if k not in ("succeeded", "OUTCOME_UNKNOWN")},
        "kills": killer.kills,
        "kills_with_writes_in_flight": sum(1 for n in killer.in_flight_at_kills if n),
        "writes_in_flight_at_kills": sum(killer.in_flight_at_kills),
        "startup_crashes": killer.startup_crashes,
        "seconds_to_last_receipt": round(finished - started, 1),
        "throughput_per_s": round(len(per_intent) / (finished - started), 1),
        "latency_ms_p50": round(statistics.median(latencies), 1) if latencies else None,
        "latency_ms_p95": round(latencies[int(len(latencies) * 0.95) - 1], 1) if latencies else None,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--writes", type=int, default=500)
    parser.add_argument("--duration", type=float, default=120.0, help="seconds of publishing and killing")
    parser.add_argument("--kill-every", type=float, default=5.0, help="mean seconds between kills")
    parser.add_argument("--threads", type=int, default=8, help="pool concurrency")
    parser.add_argument("--delay", type=float, default=0.3, help="seconds the downstream takes per write")
    parser.add_argument("--idle", type=float, default=15.0, help="stop waiting after this long without a receipt")
    parser.add_argument("--mode", choices=["header", "plain", "both"], default="both")
    parser.add_argument(
        "--restart-after-heartbeat",
        action="store_true",
        help="restart only after the dead pool's 3 s heartbeat expired (the slow-restart case)",
    )
    args = parser.parse_args()
    results = [soak(mode, args) for mode in (["header", "plain"] if args.mode == "both" else [args.mode])]
    for result in results:
        print(json.dumps(result))
    bad = any(r["lost"] or r["duplicate_receipts"] or r["duplicated_effects"] for r in results)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
