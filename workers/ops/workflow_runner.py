"""Starting the workflow runner (``reach workflows``): a Celery worker like the router's, consuming
two quorum queues — reach.workflows (runs started by the router) and reach.workflows.receipts (the
receipts of the steps it sends) — with the broker I/O and heartbeats on the consumer's thread and
every message handled on a thread of its own pool; a sweep thread tries failed undos again and
stops waiting for overdue steps."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from typing import Any

from celery import signals
from kombu.message import Message

from connectors.catalog import Catalog
from workers.observability import probes
from workers.observability.audit import Audit
from workers.observability.http_guard import HttpLimits
from workers.observability.tracing import configure_tracing
from workers.ops.startup import dead_letter_bounds, history_store, quiet_per_intent_logs, receipt_limits
from workers.router.intake import fleet_login
from workers.settings import Settings
from workers.state.batcher import Batcher
from workers.state.client import connect_redis
from workers.state.workflow_runs import WorkflowRuns
from workers.transport.app import create_app
from workers.transport.consuming import threaded_consumer
from workers.transport.delivery import delivery_of
from workers.transport.publisher import Publisher
from workers.transport.receipts import ReceiptSink
from workers.transport.topology import (
    WORKFLOW_REPLY_KEY,
    declare_all,
    declare_queue,
    workflow_receipts_queue,
    workflows_queue,
)
from workers.workflows.history_records import RunHistory
from workers.workflows.runner import BrokerOutlet, Crash, WorkflowRunner

log = logging.getLogger("reach")
SWEEP_SECONDS = 1.0


def runner_handler(runner: WorkflowRunner) -> Callable[[Message], Callable[[], None]]:
    """A consumer handler: a message from reach.receipts (routing key ``reach-workflows``) is a
    step's reply, anything else on the runner's queues a run's start."""

    def on_message(message: Message) -> Callable[[], None]:
        key = (message.delivery_info or {}).get("routing_key")
        delivery = delivery_of(message)
        settle = runner.handle_reply(delivery) if key == WORKFLOW_REPLY_KEY else runner.handle_start(delivery)
        return message.ack if settle == "ack" else message.requeue

    return on_message


class Sweeper(threading.Thread):
    def __init__(self, runner: WorkflowRunner, every: float = SWEEP_SECONDS) -> None:
        super().__init__(name="reach-workflow-sweep", daemon=True)
        self.runner = runner
        self.every = every
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(self.every):
            try:
                while self.runner.sweep() >= 100:  # a backlog: the next page at once
                    pass
            except Exception:
                log.exception("the workflow sweep failed; trying again in %g s", self.every)


def run_workflows(settings: Settings, catalog: Catalog) -> None:
    """Run the workflow runner until stopped (SIGTERM: warm shutdown, what is in hand finishes)."""
    quiet_per_intent_logs(settings.log_level)
    queues = [workflows_queue(settings.queue_type), workflow_receipts_queue(settings.queue_type)]
    app = create_app(settings, queues, worker_prefetch_multiplier=settings.workflow_threads)
    with app.connection_for_write() as conn:
        declare_all(conn, catalog.connectors, dead_letter_bounds(settings), settings.queue_type)
        for queue in queues:
            refused = declare_queue(conn, queue)
            if refused is not None:
                log.warning("declaring %s was refused (%s)", queue.name, refused)
    publisher = Publisher(app.producer_pool)
    publisher.prewarm(settings.workflow_threads)
    redis_client = connect_redis(settings)
    sink = ReceiptSink(publisher, redis_client, settings.receipt_ttl_seconds, receipt_limits(settings))
    # a start's idempotency key is kept as long as the pools keep an action's
    runs = WorkflowRuns(redis_client, settings.workflow_retention_seconds, settings.idempotency_ttl_seconds)
    batcher = Batcher(redis_client)
    runner = WorkflowRunner(
        catalog,
        runs,
        BrokerOutlet(publisher, sink, fleet_login(settings.broker_url)),
        crash=Crash(settings.workflow_crash_at),
        audit=Audit(redis_client, "workflows", batcher=batcher),
        history=RunHistory(history_store(settings, catalog, redis_client), settings.history_ttl_seconds),
    )
    sweeper = Sweeper(runner)
    configure_tracing("reach-workflows")
    app.conf.worker_consumer = threaded_consumer(runner_handler(runner), settings.workflow_threads, "reach-workflow")

    @signals.worker_ready.connect(weak=False)
    def _sweep(**_: Any) -> None:
        sweeper.start()

    @signals.worker_shutdown.connect(weak=False)
    def _close(**_: Any) -> None:
        sweeper.stopped.set()
        batcher.close()  # the audit lines still queued

    probes.install(app)
    probes.serve(settings.metrics_port, limits=HttpLimits.from_settings(settings))
    log.info("workflow runner: %d workflow(s), %d thread(s)", len(catalog.workflows), settings.workflow_threads)
    app.worker_main(
        [
            "worker",
            "-P",
            "solo",
            "-Q",
            ",".join(q.name for q in queues),
            "-n",
            f"workflows.{os.getpid()}@%h",
            "--without-mingle",
            "--without-gossip",
            "--without-heartbeat",
            "-l",
            settings.log_level,
        ]
    )
