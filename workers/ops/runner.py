"""Starting the router and the pools as Celery workers, with everything they need built first."""

from __future__ import annotations

import gc
import logging
import os
import sys
from typing import Any

from celery import signals

from connectors.adapters.base import AdapterOptions
from connectors.adapters.factory import build_adapter
from connectors.auth import MissingSecret
from connectors.catalog import Catalog
from workers.observability import metrics, probes
from workers.observability.audit import Audit
from workers.observability.tracing import configure_tracing
from workers.pool.consumer import job_handler
from workers.pool.runtime import PoolOptions, PoolOutput, PoolRuntime, PoolState
from workers.router.routing import Router
from workers.router.runtime import RouterRuntime
from workers.settings import Settings
from workers.state.batcher import Batcher
from workers.state.breaker import SharedBreaker
from workers.router.semantic import SemanticRouting
from workers.state.client import connect_redis
from workers.state.control import PoolStatus
from workers.state.embeddings import RedisVectorCache
from workers.state.guards import RedisGuards
from workers.state.health import DEFAULT_INTERVAL, Beat, HealthBoard
from workers.state.ledger import Heartbeat, Ledger
from workers.state.ratelimit import RedisRateLimiter, parse_rate
from workers.transport.app import JobMessages, create_app
from workers.transport.consuming import sender_key, threaded_consumer
from workers.transport.delivery import handler_for
from workers.transport.pause import install_pause_watcher
from workers.transport.publisher import BatchPublisher, Publisher
from workers.transport.receipts import ReceiptLimits, ReceiptSink
from workers.transport.topology import INTENTS_QUEUE, DeadLetterBounds, connector_queue, declare_all

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


def _probe_detail(paused: bool) -> None:
    probes.PROBE.detail = "paused (idle on purpose)" if paused else "consuming"


def dead_letter_bounds(settings: Settings) -> DeadLetterBounds:
    return DeadLetterBounds(settings.dlq_max_length, settings.dlq_max_bytes, settings.dlq_ttl_seconds)


def receipt_limits(settings: Settings) -> ReceiptLimits:
    return ReceiptLimits(settings.max_details, settings.max_receipt_bytes)


def run_router(settings: Settings, catalog: Catalog) -> None:
    quiet_per_intent_logs(settings.log_level)
    app = create_app(settings, [INTENTS_QUEUE], worker_prefetch_multiplier=settings.router_prefetch)
    with app.connection_for_write() as conn:
        declare_all(conn, catalog.connectors, dead_letter_bounds(settings))
    publisher = Publisher(app.producer_pool)
    publisher.prewarm(settings.router_threads)  # one connection per routing thread
    redis_client = connect_redis(settings)
    sink = ReceiptSink(publisher, redis_client, settings.receipt_ttl_seconds, receipt_limits(settings))
    intervals = {name: (c.health.interval if c.health else DEFAULT_INTERVAL) for name, c in catalog.connectors.items()}
    semantic = SemanticRouting(catalog, RedisVectorCache(redis_client))
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
    )
    batcher = Batcher(redis_client)
    runtime = RouterRuntime(
        router,
        JobMessages(app),
        sink,
        publisher,
        Audit(redis_client, "router", batcher=batcher),
        keep_unparsable=settings.dlq_keep_unparsable,
        max_deliveries=settings.max_deliveries,
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
        lane_of=sender_key if settings.router_fair else None,
        hold_bytes=settings.router_hold_bytes,
        drain_on_shutdown=False,
    )
    metrics.register_fleet_collector(metrics.FleetCollector(redis_client, app.connection_for_read, catalog.connectors))

    @signals.worker_shutdown.connect(weak=False)
    def _close(**_: Any) -> None:
        batcher.close()  # the audit lines and trace entries still queued

    probes.install(app)
    probes.serve(settings.metrics_port)
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


def run_pool(settings: Settings, catalog: Catalog, name: str, concurrency: int | None) -> None:
    quiet_per_intent_logs(settings.log_level)
    connector = catalog.connectors[name]
    threads = concurrency or connector.pool.concurrency
    queue = connector_queue(name)
    # solo + prefetch = threads: the consumer's loop hands each job to one of the pool's threads
    app = create_app(settings, [queue], worker_prefetch_multiplier=threads)
    redis_client = connect_redis(settings)
    try:
        adapter = build_adapter(
            connector,
            AdapterOptions(
                max_connections=threads,
                max_depth=settings.max_depth,
                redis=redis_client,
                broker_url=settings.broker_url,
            ),
        )
    except (MissingSecret, ValueError) as exc:  # an unset secret, or one that is not usable (a bad DSN)
        print(f"reach worker {name}: {exc}", file=sys.stderr)
        sys.exit(2)
    with app.connection_for_write() as conn:
        declare_all(conn, catalog.connectors, dead_letter_bounds(settings))
    batcher = Batcher(redis_client)
    publisher = BatchPublisher(app.producer_pool, batcher)  # it writes receipts' sent marks
    publisher.prewarm()  # its connection open before the first intent
    sink = ReceiptSink(publisher, redis_client, settings.receipt_ttl_seconds, receipt_limits(settings))
    heartbeat = Heartbeat(redis_client).start()
    status = PoolStatus(redis_client, name, heartbeat.worker_id)
    runtime = PoolRuntime(
        connector,
        catalog,
        adapter,
        state=PoolState(
            redis_client,
            batcher,
            Ledger(redis_client, heartbeat, settings.idempotency_ttl_seconds),
            SharedBreaker(redis_client, name, connector.breaker),
            status,
        ),
        output=PoolOutput(sink, publisher, Audit(redis_client, f"pool:{name}", batcher=batcher)),
        options=PoolOptions(max_deliveries=settings.max_deliveries),
    )
    # each job runs on one of the pool's threads; what is held is finished on a warm shutdown
    app.conf.worker_consumer = threaded_consumer(handler_for(job_handler(runtime)), threads, "reach-pool")
    install_pause_watcher(app, redis_client, name, queue.name, status, on_change=_probe_detail)
    configure_tracing(f"reach-pool-{name}")

    @signals.worker_shutdown.connect(weak=False)
    def _close(**_: Any) -> None:
        publisher.close()  # before the batcher: a batch's sent marks go through it
        batcher.close()
        heartbeat.stop()
        adapter.close()

    probes.install(app)
    probes.serve(settings.metrics_port)
    log.info("pool %s: %d thread(s) on %s -> %s system", name, threads, queue.name, connector.type)
    app.worker_main(
        [
            "worker",
            "-P",
            "solo",
            "-Q",
            queue.name,
            "-n",
            f"{name}.{os.getpid()}@%h",
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
    signal.signal(signal.SIGTERM, lambda *_: beat.stop())
    signal.signal(signal.SIGINT, lambda *_: beat.stop())
    probes.PROBE.ready = True
    probes.PROBE.detail = "probing"
    probes.serve(settings.metrics_port)
    log.info("beat: probing %d connector(s)", len(catalog.connectors))
    beat.run()
