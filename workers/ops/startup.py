"""Starting the router and the pools as Celery workers, with everything they need built first."""

from __future__ import annotations

import gc
import logging
import os
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import redis
from celery import signals

from connectors.adapters.auth import MissingSecret
from connectors.adapters.base import AdapterOptions
from connectors.adapters.factory import build_adapter
from connectors.catalog import Catalog
from connectors.history import longest_retention
from workers.observability import metrics, probes
from workers.observability.audit import Audit
from workers.observability.http_guard import HttpLimits
from workers.observability.tracing import configure_tracing
from workers.ops.binding_sweep import BindingSweep
from workers.pool.consumer import job_handler
from workers.pool.history_writes import HistoryWrites
from workers.pool.runtime import PoolOptions, PoolOutput, PoolRuntime, PoolState
from workers.settings import Settings
from workers.state.batcher import Batcher
from workers.state.breaker import SharedBreaker
from workers.state.client import connect_redis
from workers.state.control import PoolStatus
from workers.state.health import DEFAULT_INTERVAL, Beat, HealthBoard
from workers.state.history import HistoryStore
from workers.state.history_stores import open_store
from workers.state.ledger import Heartbeat, Ledger
from workers.state.redeliveries import Redeliveries
from workers.transport.app import JobMessages, create_app
from workers.transport.consuming import Bulkhead, bulkhead_consumer, lanes_for, threaded_consumer
from workers.transport.delivery import handler_for
from workers.transport.dispatch import Dispatcher
from workers.transport.pause import Watched, install_pause_watcher
from workers.transport.publisher import BatchPublisher, Publisher
from workers.transport.receipts import ReceiptLimits, ReceiptSink
from workers.transport.topology import INTENTS_QUEUE, DeadLetterBounds, connector_queue, declare_all

if TYPE_CHECKING:  # numpy: a pool process never imports the routing index
    from connectors.routing.index import VectorCache

log = logging.getLogger("reach")


def quiet_per_intent_logs(level: str) -> None:
    """Below DEBUG, drop Celery's and httpx's log line per task and per request.

    The audit trail already has a line per stage of every intent; these only cost CPU. Failures still log."""
    if logging.getLevelName(level) == logging.DEBUG:
        return
    for name in ("celery.worker.strategy", "celery.app.trace", "httpx"):
        logging.getLogger(name).setLevel(logging.WARNING)


@signals.worker_ready.connect(weak=False)
def _freeze_startup_objects(**_: Any) -> None:
    """Move what start-up built (catalog, models, Celery, kombu) out of the collector's sight: it
    lives as long as the process, and full collections walking it would stall every intent in flight."""
    gc.collect()
    gc.freeze()


def _common_worker_args(loglevel: str) -> list[str]:
    # mingle/gossip add start-up latency and chatter and are not needed: pools share nothing via
    # Celery; nothing listens to Celery's worker-heartbeat events (liveness is the probes' and
    # Redis's), so their timer would only cost an idle pool CPU
    return ["--without-mingle", "--without-gossip", "--without-heartbeat", "-l", loglevel]


def _pool_probe_detail(connectors: list[str]) -> Callable[[list[str]], None]:
    """What /readyz says besides ready: which connectors consume and which are paused on purpose."""

    def detail(paused: list[str]) -> None:
        if len(connectors) == 1:
            probes.PROBE.detail = "paused (idle on purpose)" if paused else "consuming"
            return
        consuming = [c for c in connectors if c not in paused]
        text = f"consuming {', '.join(consuming)}" if consuming else "consuming nothing"
        probes.PROBE.detail = text + (f"; paused (idle on purpose): {', '.join(paused)}" if paused else "")

    return detail


def _export_bulkhead(connector: str, threads: int, status: PoolStatus) -> None:
    """A connector's bulkhead in /metrics, read at scrape time: its size, what it is executing,
    and whether it is paused (a pool group exports one series of each per connector)."""
    metrics.POOL_THREADS.labels(connector=connector).set(threads)
    metrics.POOL_IN_FLIGHT.labels(connector=connector).set_function(lambda: status.in_flight)
    metrics.POOL_PAUSED.labels(connector=connector).set_function(lambda: 0 if status.consuming else 1)


def dead_letter_bounds(settings: Settings) -> DeadLetterBounds:
    return DeadLetterBounds(settings.dlq_max_length, settings.dlq_max_bytes, settings.dlq_ttl_seconds)


def history_store(settings: Settings, catalog: Catalog, client: redis.Redis) -> HistoryStore:
    """Where history records go: REACH_HISTORY_URL's PostgreSQL, else the fleet's Redis."""
    actions = [ref.action for ref in catalog.refs.values()]
    return open_store(client, settings.history_url, longest_retention(actions, settings.history_ttl_seconds))


def receipt_limits(settings: Settings) -> ReceiptLimits:
    return ReceiptLimits(settings.max_details, settings.max_receipt_bytes)


def routing_vectors(settings: Settings, shared: VectorCache) -> VectorCache:
    """Where the router finds its texts' embeddings: the saved-vector file beside the catalog
    (``reach route warm``) first, when there is one, then the shared cache in Redis."""
    from connectors.routing.saved import Layered, SavedVectors

    path = settings.routing_vectors_path()
    if path is None:
        return shared
    saved = SavedVectors.load(path)
    if saved.vectors:
        log.info("semantic routing: %d saved vector(s) in %s", len(saved.vectors), path)
    return Layered(saved, shared)


def run_router(settings: Settings, catalog: Catalog) -> None:
    # the router's own modules are imported here, not at the top: a pool process never loads them
    # (the embedding model's numpy, the guards), which keeps its memory down (pool groups)
    from workers.router.approval_parking import Parking
    from workers.router.approval_settling import PublisherOutlet, Settler
    from workers.router.approval_sweep import Sweeper
    from workers.router.intake import fleet_login
    from workers.router.routing import Router
    from workers.router.runtime import RouterRuntime
    from workers.router.semantic import SemanticRouting
    from workers.state.approval_store import ApprovalStore
    from workers.state.budgets import RedisBudgets, repeat_window_ms
    from workers.state.embeddings import RedisVectorCache
    from workers.state.guards import RedisGuards
    from workers.state.ratelimit import RedisRateLimiter, parse_rate
    from workers.state.workflow_runs import WorkflowRuns

    quiet_per_intent_logs(settings.log_level)
    app = create_app(settings, [INTENTS_QUEUE], worker_prefetch_multiplier=settings.router_prefetch)
    with app.connection_for_write() as conn:
        declare_all(conn, catalog.connectors, dead_letter_bounds(settings), settings.queue_type)
    publisher = Publisher(app.producer_pool)
    publisher.prewarm(settings.router_threads)  # one connection per routing thread
    redis_client = connect_redis(settings)
    sink = ReceiptSink(publisher, redis_client, settings.receipt_ttl_seconds, receipt_limits(settings))
    intervals = {name: (c.health.interval if c.health else DEFAULT_INTERVAL) for name, c in catalog.connectors.items()}
    semantic = SemanticRouting(catalog, routing_vectors(settings, RedisVectorCache(redis_client)))
    semantic.warm()  # the model and every action's embedding, now rather than on the first intent
    router = Router(
        catalog,
        max_intent_bytes=settings.max_intent_bytes,
        max_depth=settings.max_depth,
        max_details=settings.max_details,
        limiter=RedisRateLimiter(redis_client),
        invalid_rate=parse_rate(settings.agent_invalid_rate),
        guards=RedisGuards(redis_client, dict(catalog.connectors), intervals),
        require_user_id=settings.require_user_id,
        semantic=semantic,
        semantic_rate=parse_rate(settings.semantic_rate),
        budgets=RedisBudgets(redis_client, repeat_within_ms=repeat_window_ms(settings.idempotency_ttl_seconds)),
        fleet_user=fleet_login(settings.broker_url),  # may publish for an agent: `reach dlq replay`
        workflow_runs=WorkflowRuns(redis_client, settings.workflow_retention_seconds),  # vouches for steps
        history=history_store(settings, catalog, redis_client),  # reach.history
    )
    batcher = Batcher(redis_client)
    audit = Audit(redis_client, "router", batcher=batcher)
    # intents that wait for a person; the sweep runs in every router (beat is optional)
    approvals = ApprovalStore(redis_client)
    # a connector queue found missing (deleted while the fleet runs) is declared again at dispatch
    dispatcher = Dispatcher(publisher, JobMessages(app), app.connection_for_write, settings.queue_type)
    Sweeper(approvals, Settler(approvals, PublisherOutlet(dispatcher, sink), audit)).start()
    metrics.APPROVALS_PENDING.set_function(lambda: _or_nan(approvals.pending_total))
    runtime = RouterRuntime(
        router,
        dispatcher,
        sink,
        publisher,
        audit,
        keep_unparsable=settings.dlq_keep_unparsable,
        max_deliveries=settings.max_deliveries,
        parking=Parking(approvals, publisher, sink, audit, settings.max_pending_approvals),
        redeliveries=Redeliveries(redis_client),
    )
    configure_tracing("reach-router")
    # several routing threads, so that several publisher confirms are in flight at once (intents of
    # one agent may be dispatched out of order); one lane per sender served round-robin, so a flood
    # from one agent does not delay the others; the bytes held bounded; held messages not yet
    # started are left to the broker on shutdown (workers/transport/consuming.py)
    app.conf.worker_consumer = threaded_consumer(
        handler_for(runtime.handle),
        settings.router_threads,
        "reach-route",
        lane_of=lanes_for(settings.require_user_id) if settings.router_fair else None,
        hold_bytes=settings.router_hold_bytes,
        drain_on_shutdown=False,
    )
    metrics.register_fleet_collector(metrics.FleetCollector(redis_client, app.connection_for_read, catalog.connectors))

    @signals.worker_shutdown.connect(weak=False)
    def _close(**_: Any) -> None:
        batcher.close()  # the audit lines and trace entries still queued

    probes.install(app)
    probes.serve(settings.metrics_port, limits=HttpLimits.from_settings(settings))
    log.info(
        "router: %d connector(s), %d action(s), %d agent(s)",
        len(catalog.connectors),
        len(catalog.refs),
        len(catalog.agents),
    )
    # solo: the consumer's loop only hands messages to the routing threads (see consumer_class)
    app.worker_main(
        [
            "worker",
            "-P",
            "solo",
            "-Q",
            INTENTS_QUEUE.name,
            "-n",
            f"router.{os.getpid()}@%h",
            *_common_worker_args(settings.log_level),
        ]
    )


@dataclass(frozen=True)
class Member:
    """One connector of a pool process, and its threads (None: the catalog's pool.concurrency)."""

    connector: str
    threads: int | None = None


GROUP_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")


def parse_members(args: Sequence[str], threads: int | None = None) -> list[Member]:
    """``reach worker``'s arguments: ``NAME`` or ``NAME:THREADS`` each (``threads`` for those
    without a count; None: the catalog's). A connector name holds no ":".

    Raises:
        ValueError: a count that is not a whole number from 1 to 1000, or a connector named twice.
    """
    members: list[Member] = []
    for arg in args:
        connector, sep, count = arg.partition(":")
        own = threads
        if sep:
            if not count.isdigit() or not 1 <= int(count) <= 1000:
                raise ValueError(f"{arg!r}: the threads after ':' must be a whole number from 1 to 1000")
            own = int(count)
        if any(m.connector == connector for m in members):
            raise ValueError(f"{connector!r} is named twice")
        members.append(Member(connector, own))
    return members


def group_name(members: Sequence[Member], name: str | None = None) -> str:
    """The name a pool process goes by (Celery's node name, `reach status`): the connector's own
    for one connector, else ``name`` or the connectors joined by "+" (kept short: a node name
    ends up in AMQP short strings)."""
    if name:
        return name
    if len(members) == 1:
        return members[0].connector
    joined = "+".join(m.connector for m in members)
    return joined if len(joined) <= 100 else f"{members[0].connector}+{len(members) - 1}"


def _or_nan(read: Callable[[], float]) -> float:
    """A gauge read from Redis at scrape time: NaN when Redis does not answer (the scrape still works)."""
    try:
        return read()
    except redis.RedisError:
        return float("nan")


def run_pool(settings: Settings, catalog: Catalog, members: Sequence[Member], name: str | None = None) -> None:
    """Run one pool process for ``members``: one connector (`reach worker A`) or a pool group
    (`reach worker A B C`). Each connector is a bulkhead of its own — its consumer and prefetch,
    threads, adapter, breaker, status and pause flag — and they share what is per process: the
    broker connection and channel, the receipt publisher, Redis and its batcher, the heartbeat
    that proves the process alive, the metrics server."""
    quiet_per_intent_logs(settings.log_level)
    group = group_name(members, name)
    threads = {m.connector: m.threads or catalog.connectors[m.connector].pool.concurrency for m in members}
    queues = [connector_queue(m.connector) for m in members]
    # solo: the consumer's loop hands each job to its connector's threads. The channel-wide
    # prefetch is every connector's together; each queue's consumer gets its own (bulkhead_consumer)
    prefetch = {name: count * settings.pool_prefetch_per_thread for name, count in threads.items()}
    app = create_app(settings, queues, worker_prefetch_multiplier=sum(prefetch.values()))
    redis_client = connect_redis(settings)
    adapters = {}
    for member in members:
        connector = catalog.connectors[member.connector]
        options = AdapterOptions(
            max_connections=threads[member.connector],
            max_depth=settings.max_depth,
            redis=redis_client,
            broker_url=settings.broker_url,
        )
        try:
            adapters[member.connector] = build_adapter(connector, options)
        except (MissingSecret, ValueError) as exc:  # an unset secret, or one that is not usable (a bad DSN)
            print(f"reach worker {member.connector}: {exc}", file=sys.stderr)
            sys.exit(2)
    with app.connection_for_write() as conn:
        declare_all(conn, catalog.connectors, dead_letter_bounds(settings), settings.queue_type)
    batcher = Batcher(redis_client)
    publisher = BatchPublisher(app.producer_pool, batcher)  # it writes receipts' sent marks
    publisher.prewarm()  # its connection open before the first intent
    sink = ReceiptSink(publisher, redis_client, settings.receipt_ttl_seconds, receipt_limits(settings))
    heartbeat = Heartbeat(redis_client).start()
    ledger = Ledger(redis_client, heartbeat, settings.idempotency_ttl_seconds)
    history = HistoryWrites(catalog, history_store(settings, catalog, redis_client), settings.history_ttl_seconds)
    bulkheads, watched = [], []
    for member, queue in zip(members, queues):
        connector = catalog.connectors[member.connector]
        status = PoolStatus(redis_client, connector.name, heartbeat.worker_id, group if len(members) > 1 else None)
        runtime = PoolRuntime(
            connector,
            catalog,
            adapters[connector.name],
            state=PoolState(
                redis_client, batcher, ledger, SharedBreaker(redis_client, connector.name, connector.breaker), status
            ),
            output=PoolOutput(
                sink, publisher, Audit(redis_client, f"pool:{connector.name}", batcher=batcher), history=history
            ),
            options=PoolOptions(max_deliveries=settings.max_deliveries),
        )
        # each job runs on one of its connector's threads; what is held is finished on a warm shutdown
        bulkheads.append(
            Bulkhead(
                queue.name,
                handler_for(job_handler(runtime)),
                threads[connector.name],
                f"reach-{connector.name}",
                prefetch[connector.name],
            )
        )
        watched.append(Watched(connector.name, queue.name, status))
        _export_bulkhead(connector.name, threads[connector.name], status)
    app.conf.worker_consumer = bulkhead_consumer(bulkheads)
    # the readiness step first: its start says "consuming", the pause watcher's start then says which
    probes.install(app)
    install_pause_watcher(app, redis_client, watched, on_change=_pool_probe_detail([m.connector for m in members]))
    configure_tracing(f"reach-pool-{group}")

    @signals.worker_shutdown.connect(weak=False)
    def _close(**_: Any) -> None:
        publisher.close()  # before the batcher: a batch's sent marks go through it
        batcher.close()
        heartbeat.stop()
        for adapter in adapters.values():
            adapter.close()

    probes.serve(settings.metrics_port, limits=HttpLimits.from_settings(settings))
    for member, queue in zip(members, queues):
        connector = catalog.connectors[member.connector]
        log.info(
            "pool %s: %d thread(s) on %s -> %s system",
            connector.name,
            threads[connector.name],
            queue.name,
            connector.type,
        )
    app.worker_main(
        [
            "worker",
            "-P",
            "solo",
            "-Q",
            ",".join(q.name for q in queues),
            "-n",
            f"{group}.{os.getpid()}@%h",
            *_common_worker_args(settings.log_level),
        ]
    )


def run_beat(settings: Settings, catalog: Catalog) -> None:
    """Probe every connector's health until stopped (SIGTERM/SIGINT)."""
    import signal

    redis_client = connect_redis(settings)
    targets = []
    for connector in catalog.connectors.values():
        try:
            options = AdapterOptions(max_connections=1, redis=redis_client, broker_url=settings.broker_url)
            targets.append((connector, build_adapter(connector, options)))
        except (MissingSecret, ValueError) as exc:
            print(f"reach beat: {exc}", file=sys.stderr)
            sys.exit(2)
    beat = Beat(targets, HealthBoard(redis_client), heartbeat=probes.PROBE.beat)
    sweep = BindingSweep.from_settings(settings)  # agents' exchange-to-exchange bindings

    def stop(*_: Any) -> None:
        beat.stop()
        if sweep is not None:
            sweep.stop()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    probes.PROBE.ready = True
    probes.PROBE.detail = "probing"
    probes.serve(settings.metrics_port, limits=HttpLimits.from_settings(settings))
    log.info("beat: probing %d connector(s)", len(catalog.connectors))
    if sweep is not None:
        log.info("beat: sweeping agents' exchange bindings every %d s", settings.binding_sweep_seconds)
        sweep.start()
    beat.run()
