"""A workflow's start and an action's intent become jobs the same way (workers/router/jobs.py):
the intent's defaults (idempotency key, reply_to), its deadline, trace and hops carry over alike."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from connectors.catalog import Catalog, build
from connectors.loader import load_directory
from tests.unit.test_workflow_catalog import SHOP, WORKFLOW
from workers.router.decisions import Dispatch
from workers.router.intake import RawMessage
from workers.router.routing import Router
from workers.transport.job import Job
from workers.transport.topology import WORKFLOW_JOB_CONNECTOR

NOW = 1.75e9


def catalog(tmp_path: Path) -> Catalog:
    (tmp_path / "shop.yaml").write_text(SHOP + "---\n" + WORKFLOW)
    built, problems = build(load_directory(tmp_path))
    assert problems == []
    return built


def dispatched(router: Router, body: dict[str, Any]) -> Job:
    decision = router.decide(RawMessage(body=json.dumps(body).encode(), received_at=NOW))
    assert isinstance(decision, Dispatch), decision
    return decision.job


def test_a_start_and_an_action_carry_the_intents_defaults_alike(tmp_path: Path) -> None:
    router = Router(catalog(tmp_path), max_intent_bytes=256 * 1024, clock=lambda: NOW + 1)
    common = {"agent_id": "support", "deadline": "2030-01-01T00:00:00Z", "context": {"hops": 2}}
    start = dispatched(
        router, {**common, "intent_id": "s-1", "action": "refund_order", "params": {"order_id": "o", "amount": 1}}
    )
    action = dispatched(
        router, {**common, "intent_id": "a-1", "action": "shop.hold_order", "params": {"order_id": "o"}}
    )
    assert start.connector == WORKFLOW_JOB_CONNECTOR and action.connector == "shop"
    for job, intent_id in ((start, "s-1"), (action, "a-1")):
        assert job.idempotency_key == intent_id and job.reply_to == "support" and job.hops == 2
        assert job.deadline is not None and job.received_at == NOW and job.dispatched_at == NOW + 1
        assert job.traceparent is not None and job.trace_id in job.traceparent
    keyed = dispatched(
        router,
        {
            **common,
            "intent_id": "s-2",
            "action": "refund_order",
            "params": {"order_id": "o", "amount": 1},
            "idempotency_key": "refund-o",
            "reply_to": "support.s2",
        },
    )
    assert keyed.idempotency_key == "refund-o" and keyed.reply_to == "support.s2"
