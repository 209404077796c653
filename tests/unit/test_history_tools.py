"""reach.history as a tool and at the router, without services: who is offered ``reach__history``
(the tool-schema export, ``reach catalog``, the MCP facade), and the answers decided before any
store is read (an unknown agent, each bad param, a fleet without a store)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from connectors.catalog import Catalog, build
from connectors.loader import load_directory
from workers.cli import main
from workers.mcp.tools import agent_tools
from workers.router.decisions import Answer
from workers.router.intake import RawMessage
from workers.router.routing import Router
from workers.state.history import Page, Query

CATALOG = """
connector:
  name: shop
  endpoint: http://127.0.0.1:9
  actions:
    - action: create_order
      path: POST /orders
      input:
        order_id: { type: string, entity: order }
    - action: list_orders
      path: GET /orders
    - action: secret_op
      path: POST /secret
      input:
        order_id: { type: string, entity: order }
      history: off
---
agent_app:
  name: clerk
  connector_bindings:
    - connector: shop
      allowed_actions: [create_order, list_orders]
---
agent_app:
  name: lister
  connector_bindings:
    - connector: shop
      allowed_actions: [list_orders]
---
agent_app:
  name: hider
  connector_bindings:
    - connector: shop
      allowed_actions: [secret_op]
"""


@pytest.fixture(scope="module")
def catalog_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("catalog")
    (root / "shop.yaml").write_text(CATALOG)
    return root


@pytest.fixture(scope="module")
def catalog(catalog_dir: Path) -> Catalog:
    built, problems = build(load_directory(catalog_dir))
    assert problems == []
    return built


class RecordingStore:
    """A store that answers one record and remembers what it was asked (only to see that the
    router asks it what the params say, and filters by the agent's bindings)."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, Query]] = []

    def write(self, records: Any) -> None:
        raise AssertionError("the router never writes")

    def query(self, agent: str, query: Query, visible: Any) -> Page:
        self.asked.append((agent, query))
        shown = [r for r in ({"connector": "shop", "action": "create_order"},) if visible(r["connector"], r["action"])]
        return Page(shown, None)

    def purge(self, agent: str, entity: Any = None) -> int:
        return 0


def decide(catalog: Catalog, agent: str, params: Any, store: Any = None, action: str = "reach.history") -> Answer:
    router = Router(catalog, max_intent_bytes=65536, history=store)
    body = json.dumps({"agent_id": agent, "action": action, "params": params}).encode()
    decision = router.decide(RawMessage(body=body, received_at=1.0))
    assert isinstance(decision, Answer)
    return decision


def test_reach__history_is_a_tool_of_agents_whose_actions_keep_history_and_name_an_entity(catalog: Catalog) -> None:
    assert [t.name for t in catalog.tools_for("clerk")][-1] == "reach__history"
    assert "reach__history" not in [t.name for t in catalog.tools_for("lister")]  # no entity to ask by
    assert "reach__history" not in [t.name for t in catalog.tools_for("hider")]  # history off


def test_reach_catalog_exports_it_in_every_format(catalog_dir: Path) -> None:
    for fmt in ("openai", "anthropic", "mcp", "json"):
        result = CliRunner().invoke(main, ["catalog", "--dir", str(catalog_dir), "--agent", "clerk", "--format", fmt])
        assert result.exit_code == 0, result.output
        assert "reach__history" in result.stdout


def test_the_mcp_facade_lists_it_read_only_and_idempotent(catalog: Catalog) -> None:
    tools = {t.name: t for t in agent_tools(catalog, "clerk").tools}
    tool = tools["reach__history"]
    assert tool.annotations is not None and tool.annotations.read_only_hint and tool.annotations.idempotent_hint
    assert set(tool.input_schema["properties"]) >= {"entity", "id", "action", "limit", "cursor", "since", "status"}
    assert "reach__history" not in {t.name for t in agent_tools(catalog, "lister").tools}


def test_an_agent_not_in_the_catalog_is_denied(catalog: Catalog) -> None:
    receipt = decide(catalog, "stranger", {"entity": "order", "id": "1"}, RecordingStore()).receipt
    assert receipt.error is not None and receipt.error.code == "PERMISSION_DENIED"
    assert receipt.action == "reach.history" and receipt.connector is None


@pytest.mark.parametrize(
    "params, field",
    [
        ({"entity": "invoice", "id": "1"}, "entity"),  # no action of the agent declares it
        ({"entity": "order", "id": "1", "limit": 51}, "limit"),
        ({"entity": "order", "id": "1", "limit": 0}, "limit"),
        ({"entity": "order", "id": "1", "cursor": "x"}, "cursor"),
        ({"entity": "order", "id": "1", "since": "soon"}, "since"),
        ({"entity": "order", "id": "1", "since": "2026-01-01T00:00:00"}, "since"),  # no offset
        ({"entity": "order"}, "id"),
        ({"id": "1"}, "entity"),
        ({}, "entity"),
        ({"action": "shop.secret_op"}, "action"),  # not bound to clerk
        ({"action": "create_order"}, "action"),  # not connector.action
        ({"entity": "order", "id": "x" * 257}, "id"),
        ({"entity": "order", "id": True}, "id"),
        ({"entity": "order", "id": "1", "extra": 1}, "extra"),
    ],
)
def test_a_bad_param_is_validation_failed_naming_it_and_the_store_is_not_asked(
    catalog: Catalog, params: dict[str, Any], field: str
) -> None:
    store = RecordingStore()
    receipt = decide(catalog, "clerk", params, store).receipt
    assert receipt.error is not None and receipt.error.code == "VALIDATION_FAILED", receipt
    assert field in {d["field"] for d in receipt.error.details}
    assert store.asked == []


def test_the_store_is_asked_for_the_callers_own_records_as_the_params_say(catalog: Catalog) -> None:
    store = RecordingStore()
    receipt = decide(
        catalog,
        "clerk",
        {"entity": "order", "id": 123, "since": "2026-01-01T00:00:00Z", "status": "failed", "limit": 5},
        store,
        action="reach__history",
    ).receipt
    assert receipt.success and receipt.data == {
        "records": [{"connector": "shop", "action": "create_order"}],
        "next_cursor": None,
    }
    agent, query = store.asked[0]
    assert agent == "clerk"
    assert query == Query(entity=("order", "123"), since_ms=1767225600000, status="failed", limit=5)


def test_a_fleet_without_a_store_says_so(catalog: Catalog) -> None:
    receipt = decide(catalog, "clerk", {"entity": "order", "id": "1"}).receipt
    assert receipt.error is not None and receipt.error.code == "CONNECTOR_UNAVAILABLE"


class FailingStore(RecordingStore):
    def __init__(self, error: Exception) -> None:
        super().__init__()
        self.error = error

    def query(self, agent: str, query: Query, visible: Any) -> Page:
        raise self.error


def test_a_store_that_does_not_answer_is_a_retryable_refusal(catalog: Catalog) -> None:
    receipt = decide(catalog, "clerk", {"entity": "order", "id": "1"}, FailingStore(RuntimeError("db down"))).receipt
    assert receipt.error is not None and receipt.error.code == "CONNECTOR_UNAVAILABLE" and receipt.error.retryable
    assert receipt.error.retry_after_ms


def test_redis_away_is_left_to_the_router_to_requeue(catalog: Catalog) -> None:
    import redis

    with pytest.raises(redis.ConnectionError):
        decide(catalog, "clerk", {"entity": "order", "id": "1"}, FailingStore(redis.ConnectionError("gone")))
