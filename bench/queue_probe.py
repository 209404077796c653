#!/usr/bin/env python
"""What the broker alone does to a hop after a burst (bench/recovery.py's broker-side control).

    .venv/bin/python bench/queue_probe.py [--burst 10000] [--seconds 5] [--reps 3]

One py-amqp publisher (confirm mode, persistent messages, as the fleet's router) and one consumer
on a queue of each type (quorum, as the fleet declares its work queues by default; classic, as the
bare pipeline's), in a vhost of the probe's own. Per repetition and queue type, alternating:
paced 100/s for ``seconds`` (steady state), then a burst of ``burst`` messages consumed to the
last, then paced again at once. Latency is publish -> delivered to the consumer (one process,
one clock); p50/p99 and the p99 of each second of the paced phase after the burst.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

from common import Vhost, ensure_services, loadavg, log, median, percentile  # noqa: E402

BODY = json.dumps({"intent_id": "x" * 36, "params": {"title": "bench", "description": "printer on fire" * 8}}).encode()


def connect(url: str) -> Any:
    import amqp

    parts = urlsplit(url)
    conn = amqp.Connection(
        host=f"{parts.hostname or '127.0.0.1'}:{parts.port or 5672}",
        userid=unquote(parts.username or "guest"),
        password=unquote(parts.password or "guest"),
        virtual_host=unquote(parts.path[1:]) or "/",
        heartbeat=0,
    )
    conn.connect()
    return conn


class Probe:
    def __init__(self, url: str, queue: str, qtype: str) -> None:
        self.queue = queue
        self.pub = connect(url)
        self.pch = self.pub.channel()
        args = {"x-queue-type": "quorum"} if qtype == "quorum" else {}
        self.pch.queue_declare(queue, durable=True, auto_delete=False, arguments=args)
        self.pch.confirm_select()
        self.sub = connect(url)
        self.sch = self.sub.channel()
        self.sch.basic_qos(0, 32, False)
        self.arrived: dict[int, float] = {}
        self.sch.basic_consume(queue, callback=self._on, no_ack=False)
        self.stop = False
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _on(self, message: Any) -> None:
        self.arrived[int(message.properties["message_id"])] = time.perf_counter()
        message.channel.basic_ack(message.delivery_tag)

    def _loop(self) -> None:
        while not self.stop:
            try:
                self.sub.drain_events(timeout=0.2)
            except TimeoutError:
                pass

    def run(self, n: int, rate: float | None) -> list[tuple[float, float]]:
        """(s into the phase sent, latency ms) of n messages; waits for every one."""
        import amqp

        self.arrived.clear()
        sent: dict[int, float] = {}
        t0 = time.perf_counter()
        for i in range(n):
            if rate:
                left = t0 + i / rate - time.perf_counter()
                if left > 0:
                    time.sleep(left)
            sent[i] = time.perf_counter()
            # a confirm per message when paced (as the router waits for each dispatch); none in a burst
            msg = amqp.Message(BODY, delivery_mode=2, message_id=str(i))
            if rate:
                self.pch.basic_publish_confirm(msg, exchange="", routing_key=self.queue)
            else:
                self.pch.basic_publish(msg, exchange="", routing_key=self.queue)
        deadline = time.perf_counter() + 120
        while len(self.arrived) < n and time.perf_counter() < deadline:
            time.sleep(0.01)
        return sorted((sent[i] - t0, (self.arrived[i] - sent[i]) * 1000) for i in self.arrived)

    def close(self) -> None:
        self.stop = True
        self.thread.join(2)
        for c in (self.pub, self.sub):
            try:
                c.close()
            except Exception:
                pass


def per_second(timeline: list[tuple[float, float]], seconds: float) -> list[float | None]:
    return [percentile([ms for t, ms in timeline if s <= t < s + 1], 99) for s in range(int(seconds))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--burst", type=int, default=10000)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--output", default=str(Path(__file__).resolve().parent / "results" / "queue_probe.json"))
    args = parser.parse_args()
    shared, _ = ensure_services()
    vhost = Vhost(shared, f"reach-probe-{os.getpid()}").create()
    out: dict[str, Any] = {"load_start": loadavg(), "config": vars(args), "reps": []}
    n = int(args.rate * args.seconds)
    try:
        probes = {t: Probe(vhost.url, f"probe.{t}", t) for t in ("quorum", "classic")}
        for p in probes.values():
            p.run(200, None)  # warm-up
        for rep in range(args.reps):
            row: dict[str, Any] = {"load": loadavg()}
            for qtype in ("quorum", "classic") if rep % 2 == 0 else ("classic", "quorum"):
                p = probes[qtype]
                steady = p.run(n, args.rate)
                p.run(args.burst, None)
                after = p.run(n, args.rate)
                row[qtype] = {
                    "steady_p50": percentile([ms for _, ms in steady], 50),
                    "steady_p99": percentile([ms for _, ms in steady], 99),
                    "after_p50": percentile([ms for _, ms in after], 50),
                    "after_p99": percentile([ms for _, ms in after], 99),
                    "after_per_second_p99": per_second(after, args.seconds),
                }
                log(f"rep {rep + 1} {qtype:7s}: {row[qtype]}; load {loadavg()[0]}")
            out["reps"].append(row)
        for p in probes.values():
            p.close()
    finally:
        vhost.delete()
    out["load_end"] = loadavg()
    out["median"] = {
        q: {k: median([r[q][k] for r in out["reps"]]) for k in ("steady_p50", "steady_p99", "after_p50", "after_p99")}
        for q in ("quorum", "classic")
    }
    Path(args.output).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out["median"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
