"""Per-intent CPU of the router's and the pool's own code, in process, one thread, profiled.

Not a throughput figure (no Celery consumer, no contention): it isolates what the fleet's code
costs per intent — decision, Redis round trips, publish with confirm, HTTP call, receipt — so a
change to the hot path can be judged in seconds, with cProfile's breakdown (thread CPU time, not
wall time: waiting for a socket costs nothing) beside it. Uses the
running RabbitMQ (vhost "/") and Redis (database 15), and starts bench/downstream.py.

    .venv/bin/python bench/hotpath.py [--n 2000] [--profile router|pool] [--top 25]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import subprocess
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import catalogs  # noqa: E402
import redis  # noqa: E402
from kombu import Connection  # noqa: E402

from connectors.adapters.http import HttpAdapter  # noqa: E402
from connectors.catalog import build  # noqa: E402
from connectors.loader import load_directory  # noqa: E402
from workers.observability.audit import Audit  # noqa: E402
from workers.pool.runtime import PoolOutput, PoolRuntime, PoolState  # noqa: E402
from workers.router.decisions import Dispatch  # noqa: E402
from workers.router.intake import RawMessage  # noqa: E402
from workers.router.routing import Router  # noqa: E402
from workers.router.runtime import RouterRuntime  # noqa: E402
from workers.settings import Settings  # noqa: E402
from workers.state.batcher import Batcher  # noqa: E402
from workers.state.breaker import SharedBreaker  # noqa: E402
from workers.state.guards import RedisGuards  # noqa: E402
from workers.state.ledger import Heartbeat, Ledger  # noqa: E402
from workers.transport.app import JobMessages, create_app  # noqa: E402
from workers.transport.dispatch import Dispatcher  # noqa: E402
from workers.transport.publisher import BatchPublisher, Publisher  # noqa: E402
from workers.transport.receipts import ReceiptSink  # noqa: E402
from workers.transport.topology import connector_queue, declare_all  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--profile", choices=["router", "pool"])
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--threads", type=int, default=1, help="pool threads (1: no contention)")
    parser.add_argument("--callers", help="also print who calls functions matching this (pstats pattern)")
    args = parser.parse_args()
    down = subprocess.Popen([sys.executable, str(HERE / "downstream.py"), "0"], stdout=subprocess.PIPE, text=True)
    port = int(down.stdout.readline().split()[1])  # type: ignore[union-attr]
    work = Path(tempfile.mkdtemp(prefix="reach-hot-"))
    catalogs.write(work, catalogs.main_catalog(f"http://127.0.0.1:{port}"))
    catalog, problems = build(load_directory(str(work)))
    assert not problems, problems
    settings = Settings(broker_url="amqp://guest:guest@127.0.0.1:5672//", redis_url="redis://127.0.0.1:6379/15")
    client = redis.Redis.from_url(settings.redis_url)
    app = create_app(settings, [connector_queue(catalogs.FAST)])
    with Connection(settings.broker_url) as conn:
        declare_all(conn, catalog.connectors)
    devnull = open("/dev/null", "w")
    batcher = Batcher(client, write_lines=lambda lines: devnull.write("\n".join(lines) + "\n"))
    publisher = Publisher(app.producer_pool)  # as the runner gives them: per-thread for the router,
    pool_publisher = BatchPublisher(app.producer_pool, batcher)  # one batching thread for the pool
    sink = ReceiptSink(publisher, client, 600)
    pool_sink = ReceiptSink(pool_publisher, client, 600)
    router = Router(
        catalog, max_intent_bytes=settings.max_intent_bytes, guards=RedisGuards(client, dict(catalog.connectors), {})
    )
    runtime = RouterRuntime(
        router, Dispatcher(publisher, JobMessages(app)), sink, publisher, Audit(client, "router", batcher=batcher)
    )
    spec = catalog.connectors[catalogs.FAST]
    heartbeat = Heartbeat(client).start()
    pool = PoolRuntime(
        spec,
        catalog,
        HttpAdapter(spec),
        state=PoolState(
            client, batcher, Ledger(client, heartbeat, 600), SharedBreaker(client, catalogs.FAST, spec.breaker)
        ),
        output=PoolOutput(pool_sink, pool_publisher, Audit(client, "pool", batcher=batcher)),
    )

    def raw() -> RawMessage:
        intent = {
            "intent_id": str(uuid.uuid4()),
            "agent_id": catalogs.AGENT,
            "action": f"{catalogs.FAST}.create_ticket",
            "params": {**catalogs.PARAMS, "title": uuid.uuid4().hex[:12]},
        }
        return RawMessage(
            body=json.dumps(intent).encode(),
            headers={},
            user_id=None,
            message_id=None,
            content_type="application/json",
            received_at=time.time(),
        )

    # jobs come from the router's decisions, exactly as the pool gets them
    raws = [raw() for _ in range(args.n + 200)]
    jobs = []
    for r in raws[:200]:
        decision = router.decide(r)
        assert isinstance(decision, Dispatch), decision
        runtime._carry_out(decision, r)
        pool.execute(decision.job)
    results = {}

    def route_all() -> None:
        for r in raws[200:]:
            decision = router.decide(r)
            runtime._carry_out(decision, r)
            jobs.append(decision.job)  # type: ignore[union-attr]

    def execute_all() -> None:
        if args.threads <= 1:
            for job in jobs:
                pool.execute(job)
            return
        with ThreadPoolExecutor(args.threads) as executor:
            list(executor.map(pool.execute, jobs))

    for name, fn in (("router", route_all), ("pool", execute_all)):
        profiler = cProfile.Profile(time.thread_time) if args.profile == name else None
        t_cpu, t_wall = time.process_time(), time.perf_counter()
        if profiler:
            profiler.enable()
        fn()
        if profiler:
            profiler.disable()
        results[name] = ((time.process_time() - t_cpu) / args.n * 1000, (time.perf_counter() - t_wall) / args.n * 1000)
        if profiler:
            stats = pstats.Stats(profiler)
            stats.sort_stats("cumulative").print_stats(args.top)
            stats.sort_stats("tottime").print_stats(args.top)
            if args.callers:
                stats.print_callers(args.callers)
    for name, (cpu, wall) in results.items():
        threads = args.threads if name == "pool" else 1
        print(f"{name}: {cpu:.3f} ms CPU, {wall:.3f} ms wall per intent (n={args.n}, {threads} thread(s), in process)")
    heartbeat.stop()
    down.terminate()
    client.flushdb()
    with app.connection_for_write() as conn:
        conn.default_channel.queue_purge(f"reach.connector.{catalogs.FAST}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
