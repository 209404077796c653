"""Prometheus metrics. Labels are bounded (connector, action, code, outcome, format, status):
never intent ids, trace ids or free text."""
from __future__ import annotations

import logging

from prometheus_client import Counter, Histogram, start_http_server

log = logging.getLogger("reach.metrics")

INTENTS_RECEIVED = Counter("reach_intents_received", "Intents read from reach.intents, by format", ["format"])
INTENTS_REJECTED = Counter("reach_intents_rejected", "Intents answered by the router without dispatch, by code", ["code"])
INTENTS_DISPATCHED = Counter("reach_intents_dispatched", "Intents dispatched to a connector queue", ["connector"])
ACTIONS_EXECUTED = Counter("reach_actions_executed", "Actions executed by a pool, by outcome",
                           ["connector", "action", "outcome"])
DOWNSTREAM_SECONDS = Histogram("reach_downstream_call_seconds", "Duration of downstream calls", ["connector"])
RECEIPTS_PUBLISHED = Counter("reach_receipts_published", "Receipts published, by status", ["status"])


def serve(port: int | None) -> None:
    """Serve /metrics on ``port`` (REACH_METRICS_PORT); nothing when unset."""
    if port is None:
        return
    start_http_server(port)
    log.info("metrics on :%d/metrics", port)
