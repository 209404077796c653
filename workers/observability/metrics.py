"""Prometheus metrics. Names start with ``reach_``; labels are bounded (connector, action, code,
outcome, format, status; workflow and step names from the catalog) — never intent ids, trace ids
or free text. Latencies are seconds.

Each process uses the threads or solo pool, so the default single-process registry is correct;
``FleetCollector`` (router only) reads shared state from Redis and the broker at scrape time.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from typing import Any

from prometheus_client import REGISTRY, Counter, Gauge, Histogram, disable_created_metrics
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

log = logging.getLogger("reach.metrics")

disable_created_metrics()  # the *_created series would double every scrape for no use here
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)

INTENTS_RECEIVED = Counter("reach_intents_received", "Intents read from reach.intents, by format", ["format"])
INTENTS_REJECTED = Counter(
    "reach_intents_rejected", "Intents answered by the router without dispatch, by code", ["code"]
)
INTENTS_DISPATCHED = Counter("reach_intents_dispatched", "Intents dispatched to a connector queue", ["connector"])
ACTIONS_EXECUTED = Counter(
    "reach_actions_executed", "Intents finished by a pool, by outcome", ["connector", "action", "outcome"]
)
RETRIES = Counter("reach_retries", "Downstream calls repeated after a transient failure", ["connector"])
DEAD_LETTERS = Counter("reach_dead_letters", "Messages put in reach.dlq, by how much of the body was kept", ["kept"])
DEAD_LETTERS_DROPPED = Counter(
    "reach_dead_letters_dropped",
    "Dead letters not kept, by reason (dlq_full, sender_over_limit, publish_failed)",
    ["reason"],
)
MESSAGES_DROPPED = Counter(
    "reach_messages_dropped",
    "Messages acked without a receipt because none could be sent (the reason is logged)",
    ["reason"],
)
APPROVALS_PARKED = Counter("reach_approvals_parked", "Intents parked to wait for a person's approval", ["connector"])
# read from Redis at each scrape, by every router alike: take max() over routers, not sum()
APPROVALS_PENDING = Gauge("reach_approvals_pending", "Intents waiting for a person's approval, fleet-wide")
APPROVAL_NOTICES_LOST = Counter(
    "reach_approval_notices_lost",
    "approval_pending notices the broker refused (the intent stays parked; its receipt still comes)",
)
APPROVALS_EXPIRING_WITHIN_SECONDS = 900
# counted by every router's sweep from Redis: each reports the fleet's count (alert on max)
APPROVALS_EXPIRING = Gauge(
    "reach_approvals_expiring_soon",
    "Pending approvals that expire within 15 minutes unless a person decides, fleet-wide",
    ["connector"],
)
APPROVAL_RESENDS_HELD = Counter(
    "reach_approval_resends_held",
    "Messages not answered because their intent id waits for an approval (answered by the notice again)",
)
RECEIPTS_PUBLISHED = Counter("reach_receipts_published", "Receipts published, by status", ["status"])
DOWNSTREAM_SECONDS = Histogram(
    "reach_downstream_call_seconds",
    "Time spent calling the downstream system per intent",
    ["connector"],
    buckets=_LATENCY_BUCKETS,
)
QUEUE_WAIT_SECONDS = Histogram(
    "reach_queue_wait_seconds",
    "Time a dispatched intent waited in its connector queue",
    ["connector"],
    buckets=_LATENCY_BUCKETS,
)
INTENT_LATENCY_SECONDS = Histogram(
    "reach_intent_latency_seconds",
    "From the router reading an intent to its receipt",
    ["connector"],
    buckets=_LATENCY_BUCKETS,
)

# a pool process's bulkheads (one per connector, several in a pool group): in use / size is saturation
POOL_THREADS = Gauge(
    "reach_pool_threads", "Threads (and prefetch) of a connector's bulkhead in this process", ["connector"]
)
POOL_IN_FLIGHT = Gauge("reach_pool_in_flight", "Intents this process is executing for the connector", ["connector"])
POOL_PAUSED = Gauge(
    "reach_pool_paused", "1 while this process does not consume the connector's queue (reach pause)", ["connector"]
)

# every HTTP server of the process (workers/observability/http_guard.py)
HTTP_CONNECTIONS_CLOSED = Counter(
    "reach_http_connections_closed",
    "Connections an HTTP server closed unserved, by server (mcp, console, probes) and reason "
    "(header_timeout, body_timeout, per_client_limit, max_connections)",
    ["server", "reason"],
)

# reach beat's sweep of agents' exchange-to-exchange bindings (workers/ops/binding_sweep.py)
BINDING_SWEEPS = Counter(
    "reach_binding_sweeps",
    "Sweeps of agents' exchange-to-exchange bindings by reach beat, by outcome (swept, failed)",
    ["outcome"],
)

# the workflow runner (workers/workflows/runner.py); workflow and step are names from the catalog
WORKFLOW_RUNS_STARTED = Counter("reach_workflow_runs_started", "Workflow runs started by this runner", ["workflow"])
WORKFLOW_RUNS = Counter(
    "reach_workflow_runs",
    "Workflow runs whose one final receipt was decided, by outcome (succeeded, failed, unknown, parked)",
    ["workflow", "outcome"],
)
WORKFLOW_STEP_SECONDS = Histogram(
    "reach_workflow_step_seconds",
    "From writing a step's (kind=do) or an undo's (kind=undo) intent to the run taking its answer",
    ["workflow", "step", "kind"],
    buckets=_LATENCY_BUCKETS,
)
WORKFLOW_UNDOS_FAILED = Counter(
    "reach_workflow_undos_failed",
    "Undo intents answered without success (tried again, or the run parked)",
    ["workflow"],
)
# read from Redis by every runner's sweep alike: take max() over runners, not sum()
WORKFLOW_RUNS_IN_FLIGHT = Gauge(
    "reach_workflow_runs_in_flight",
    "Runs the runners' sweep watches (running, compensating, or an outbound message not yet confirmed), fleet-wide",
)

_BREAKER_VALUE = {"closed": 0, "half-open": 1, "open": 2}
_HEALTH_VALUE = {"up": 1, "down": 0, "unknown": -1}


class FleetCollector(Collector):
    """Breaker state, connector health and queue depth, read when Prometheus scrapes."""

    def __init__(self, redis_client: Any, connection_factory: Any, connectors: Iterable[str]) -> None:
        self._redis = redis_client
        self._connect = connection_factory
        self._connectors = list(connectors)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        from workers.state import keys
        from workers.transport.topology import connector_queue

        breaker = GaugeMetricFamily(
            "reach_breaker_state", "Circuit breaker: 0 closed, 1 half-open, 2 open", labels=["connector"]
        )
        health = GaugeMetricFamily(
            "reach_connector_health", "Health checks: 1 up, 0 down, -1 unknown", labels=["connector"]
        )
        depth = GaugeMetricFamily("reach_queue_depth", "Intents waiting in the connector's queue", labels=["connector"])
        consumers = GaugeMetricFamily(
            "reach_queue_consumers", "Consumers on the connector's queue", labels=["connector"]
        )
        try:
            pipe = self._redis.pipeline(transaction=False)
            for name in self._connectors:
                pipe.hget(keys.breaker(name), "state")
                pipe.get(keys.health(name))
            values = pipe.execute()
            for i, name in enumerate(self._connectors):
                state, mark = values[2 * i], values[2 * i + 1]
                breaker.add_metric([name], _BREAKER_VALUE.get(state.decode() if state else "closed", 0))
                health.add_metric([name], _HEALTH_VALUE.get(mark.decode() if mark else "unknown", -1))
        except Exception as exc:  # a scrape must not fail because Redis blinked
            log.warning("metrics: cannot read breaker/health state: %s", exc)
        try:
            with self._connect() as conn:
                channel = conn.channel()
                for name in self._connectors:
                    try:
                        ok = channel.queue_declare(connector_queue(name).name, passive=True)
                        depth.add_metric([name], ok.message_count)
                        consumers.add_metric([name], ok.consumer_count)
                    except Exception:  # queue not declared yet: the channel is closed by the broker
                        channel = conn.channel()
        except Exception as exc:
            log.warning("metrics: cannot read queue depth: %s", exc)
        yield from (breaker, health, depth, consumers)


def register_fleet_collector(collector: FleetCollector) -> None:
    REGISTRY.register(collector)
