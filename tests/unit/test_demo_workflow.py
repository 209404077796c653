"""The demo's workflow without services: the shop behind it answers as its catalog declares (and
does nothing twice for one Idempotency-Key), and what ``reach demo`` expects of the two runs fits
the workflow in the demo catalog. tests/integration/test_first_run.py runs the demo itself on a
vhost the fleet has never seen and reads its output."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from connectors.catalog import Catalog, build
from connectors.loader import load_directory
from workers.ops import demo
from workers.ops.demo_assets import CATALOG_DIR
from workers.ops.demo_assets.shop import ORDERS, Shop


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    built, problems = build(load_directory(CATALOG_DIR))
    assert not problems, problems
    return built


@pytest.fixture
def shop() -> Iterator[Shop]:
    running = Shop().start()
    yield running
    running.stop()


def post(shop: Shop, path: str, body: dict[str, Any], key: str | None = None) -> tuple[int, dict[str, Any]]:
    headers = {"Content-Type": "application/json", **({"Idempotency-Key": key} if key else {})}
    request = urllib.request.Request(shop.url + path, json.dumps(body).encode(), headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=5) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_the_shop_holds_refunds_and_emails_and_undoes_the_first_two(shop: Shop) -> None:
    assert post(shop, "/holds", {"order_id": "ORD-1001"}) == (201, {"hold_id": "H-ORD-1001"})
    assert post(shop, "/refunds", {"order_id": "ORD-1001"}) == (201, {"refund_id": "RF-ORD-1001", "amount": 42.0})
    assert post(shop, "/emails", {"order_id": "ORD-1001", "text": "hi"}) == (200, {"sent_to": "ada@example.com"})
    status, doc = post(shop, "/emails", {"order_id": "ORD-1002", "text": "hi"})
    assert status == 422 and "no email address" in doc["detail"]
    assert post(shop, "/refunds/cancel", {"refund_id": "RF-ORD-1002"})[0] == 200
    assert post(shop, "/holds/release", {"hold_id": "H-ORD-1002"})[0] == 200
    assert post(shop, "/holds", {"order_id": "ORD-0000"})[0] == 404
    assert shop.done() == [
        "held ORD-1001",
        "refunded ORD-1001",
        "emailed ada@example.com",
        "could not email the customer of ORD-1002",
        "cancelled RF-ORD-1002",
        "released H-ORD-1002",
    ]


def test_one_idempotency_key_is_done_once_and_answered_the_same(shop: Shop) -> None:
    first = post(shop, "/refunds", {"order_id": "ORD-1001"}, key="k-1")
    assert post(shop, "/refunds", {"order_id": "ORD-1001"}, key="k-1") == first
    assert shop.done() == ["refunded ORD-1001"]


def test_the_demo_workflow_is_bound_to_its_agent_and_its_tools(catalog: Catalog) -> None:
    workflow = catalog.workflows[demo.WORKFLOW]
    assert [s.action for s in workflow.steps] == ["shop.hold_order", "shop.refund", "shop.email_customer"]
    assert [s.compensate is not None for s in workflow.steps] == [True, True, False]  # the last write needs no undo
    assert catalog.allows_workflow("refund_bot", demo.WORKFLOW)
    assert [t.name for t in catalog.tools_for("refund_bot")][-1] == demo.WORKFLOW
    assert not any(catalog.allows_workflow(a, demo.WORKFLOW) for a in catalog.agents if a != "refund_bot")


def test_what_the_demo_expects_fits_the_workflow_and_the_shop(catalog: Catalog) -> None:
    workflow = catalog.workflows[demo.WORKFLOW]
    ids = [s.id for s in workflow.steps]
    assert set(demo.RUNS) <= set(ORDERS)
    for order, steps in demo.RUNS.items():
        assert [s for s, _, _ in steps] == ids
        emails = ORDERS[order][0] is not None
        assert steps[-1][1] == ("succeeded" if emails else "failed")
        # a run whose last step fails has every step before it undone; one that succeeds none
        assert all(undone is not emails for _, _, undone in steps[:-1]) and steps[-1][2] is False
    undo = [line for line in demo.SHOP_LOG if line.startswith(("cancelled", "released"))]
    assert undo == ["cancelled RF-ORD-1002", "released H-ORD-1002"]  # newest first
