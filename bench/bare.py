"""Variant b: the same two hops as the fleet in plain Celery, with no guardrails at all.

    agent --JSON--> [bare.intents] -> ROUTER (solo; reads raw JSON, like workers/router/routing.py's
                                      consumer_class) --Celery task--> [bare.connector.fast]
                  -> CONNECTOR (threads pool; httpx POST, one client, keep-alive)
                  --JSON receipt--> [bare.receipts] (topic, routing key = reply_to)

No parsing beyond json.loads, no identity, permission, rate limit, validation, idempotency, breaker,
Redis, audit, metrics or tracing. The broker settings are the fleet's (workers/transport/app.py), copied
here on purpose so this baseline does not move when the fleet's code changes: JSON, persistent
messages, publisher confirms, acks_late + reject_on_worker_lost, prefetch 1 per pool thread,
router prefetch 32 (REACH_ROUTER_PREFETCH's default), no result backend, no events, no mingle/gossip.

The isolation section adds a second connector for the slow system: the router sends intents whose
action starts with ``bench_slow.`` to ``bare.connector.slow``, everything else to ``bare.connector.fast``.

    python bench/bare.py router       # env BARE_BROKER_URL
    python bench/bare.py connector    # env BARE_BROKER_URL, BARE_DOWNSTREAM_URL, BARE_CONCURRENCY,
                                      #     BARE_CONNECTOR (fast, the default, or slow)
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from celery import Celery
from celery.worker.consumer import Consumer
from kombu import Exchange, Queue

# BARE_QUEUE_TYPE=quorum: the same pipeline on quorum queues, as the fleet declares by default
# (bench/recovery.py's control for what the queue type costs); classic otherwise
QUEUE_ARGS = {"x-queue-type": "quorum"} if os.environ.get("BARE_QUEUE_TYPE") == "quorum" else {}
INTENTS_EXCHANGE = Exchange("bare.intents", "direct", durable=True)
INTENTS_QUEUE = Queue("bare.intents", INTENTS_EXCHANGE, routing_key="intent", durable=True, queue_arguments=QUEUE_ARGS)
DISPATCH_EXCHANGE = Exchange("bare.dispatch", "direct", durable=True)
CONNECTOR_QUEUES = {
    name: Queue(
        f"bare.connector.{name}",
        DISPATCH_EXCHANGE,
        routing_key=f"bare.connector.{name}",
        durable=True,
        queue_arguments=QUEUE_ARGS,
    )
    for name in ("fast", "slow")
}
CONNECTOR_QUEUE = CONNECTOR_QUEUES["fast"]
SLOW_ACTION_PREFIX = "bench_slow."  # the isolation section's slow system (bench/catalogs.py SLOW)
RECEIPTS_EXCHANGE = Exchange("bare.receipts", "topic", durable=True)
TASK = "bare.execute"
ROUTER_PREFETCH = 32


def make_app(broker_url: str, queue: Queue, **extra: Any) -> Celery:
    app = Celery("bare", broker=broker_url, set_as_current=False)
    app.conf.update(
        task_serializer="json",
        accept_content=["json"],
        result_backend=None,
        task_ignore_result=True,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_default_delivery_mode="persistent",
        task_queues=[queue],
        task_default_queue=queue.name,
        task_create_missing_queues=False,
        worker_prefetch_multiplier=1,
        worker_send_task_events=False,
        task_send_sent_event=False,
        worker_hijack_root_logger=False,
        worker_redirect_stdouts=False,
        broker_connection_retry_on_startup=True,
        broker_heartbeat=30,
        broker_pool_limit=16,
        broker_transport_options={"confirm_publish": True},
    )
    app.conf.update(extra)
    return app


def declare(app: Celery) -> None:
    with app.connection_for_write() as conn:
        channel = conn.channel()
        for exchange in (INTENTS_EXCHANGE, DISPATCH_EXCHANGE, RECEIPTS_EXCHANGE):
            exchange.declare(channel=channel)
        for queue in (INTENTS_QUEUE, *CONNECTOR_QUEUES.values()):
            queue.bind(channel).declare()
        channel.close()


def _worker_args(pool: str, concurrency: int, queue: str, name: str) -> list[str]:
    return [
        "worker",
        "-P",
        pool,
        "-c",
        str(concurrency),
        "-Q",
        queue,
        "-n",
        f"{name}.{os.getpid()}@%h",
        "--without-mingle",
        "--without-gossip",
        "-l",
        os.environ.get("BARE_LOG_LEVEL", "INFO"),
    ]


def run_router(broker_url: str) -> None:
    app = make_app(broker_url, INTENTS_QUEUE, worker_prefetch_multiplier=ROUTER_PREFETCH)
    declare(app)

    def handle(message: Any) -> None:
        intent = json.loads(message.body)
        job = {
            "intent_id": intent["intent_id"],
            "agent_id": intent.get("agent_id"),
            "action": intent.get("action"),
            "params": intent.get("params") or {},
            "reply_to": intent.get("reply_to") or intent.get("agent_id"),
            "received_at": time.time(),
        }
        queue = CONNECTOR_QUEUES["slow"] if str(job["action"]).startswith(SLOW_ACTION_PREFIX) else CONNECTOR_QUEUE
        app.send_task(TASK, args=[job], queue=queue, task_id=f"{job['intent_id']}:{time.time_ns()}", retry=True)
        message.ack()

    class BareRouterConsumer(Consumer):
        def create_task_handler(self, promise: Any = None) -> Callable[[Any], None]:  # type: ignore[override]
            return handle

    app.conf.worker_consumer = BareRouterConsumer
    app.worker_main(_worker_args("solo", 1, INTENTS_QUEUE.name, "bare-router"))


def run_connector(broker_url: str, downstream_url: str, concurrency: int, queue: Queue) -> None:
    import httpx

    app = make_app(broker_url, queue)
    declare(app)
    client = httpx.Client(
        timeout=httpx.Timeout(15.0, connect=5.0),
        trust_env=False,
        follow_redirects=False,
        limits=httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency),
    )
    headers = {"Content-Type": "application/json", "Accept": "application/json"}

    @app.task(name=TASK, acks_late=True, reject_on_worker_lost=True, ignore_result=True)
    def execute(job: dict[str, Any]) -> None:
        response = client.post(downstream_url, content=json.dumps(job["params"]).encode(), headers=headers)
        ok = response.status_code < 400
        receipt = {
            "intent_id": job["intent_id"],
            "agent_id": job["agent_id"],
            "action": job["action"],
            "status": "succeeded" if ok else "failed",
            "success": ok,
            "data": response.json() if ok else None,
            "error": None if ok else {"code": f"HTTP_{response.status_code}"},
            "execution": {"latency_ms": round((time.time() - job["received_at"]) * 1000, 3)},
        }
        with app.producer_pool.acquire(block=True, timeout=30) as producer:
            producer.publish(
                json.dumps(receipt).encode(),
                exchange=RECEIPTS_EXCHANGE,
                routing_key=job["reply_to"],
                content_type="application/json",
                content_encoding="utf-8",
                delivery_mode=2,
                correlation_id=job["intent_id"],
                retry=True,
            )

    app.worker_main(_worker_args("threads", concurrency, queue.name, "bare-connector"))


if __name__ == "__main__":
    logging.basicConfig(
        level=os.environ.get("BARE_LOG_LEVEL", "INFO"),
        stream=sys.stdout,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    broker = os.environ["BARE_BROKER_URL"]
    role = sys.argv[1] if len(sys.argv) > 1 else ""
    if role == "router":
        run_router(broker)
    elif role == "connector":
        connector = os.environ.get("BARE_CONNECTOR", "fast")
        if connector not in CONNECTOR_QUEUES:
            sys.exit(f"BARE_CONNECTOR must be one of {sorted(CONNECTOR_QUEUES)}, not {connector!r}")
        run_connector(
            broker,
            os.environ["BARE_DOWNSTREAM_URL"],
            int(os.environ.get("BARE_CONCURRENCY", "20")),
            CONNECTOR_QUEUES[connector],
        )
    else:
        sys.exit("usage: bare.py router|connector")
