"""Workflows everywhere agents look, without services: reach.find_tools ranks a bound workflow
with the agent's actions (never for an agent not bound to it), ``reach catalog`` exports it in
every tool format and lists it in its table, and the MCP facade lists it as a tool with hints from
its steps, says which steps a failed run undid, and never advises calling a workflow again when
its outcome is unknown. (tests/integration/test_workflow_tools.py calls it through the live fleet
and MCP.)"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import anyio
import mcp_types as types
import pytest
from click.testing import CliRunner

from connectors.catalog import Catalog, build
from connectors.loader import load_directory
from connectors.routing import ActionIndex
from connectors.routing.index import workflow_text
from producers.wire import ErrorCode, ErrorInfo, Execution, Receipt
from tests.unit.test_semantic_ranking import CountingEmbedder
from tests.unit.test_semantic_router import Loader, intent
from workers.cli import main
from workers.mcp import results
from workers.mcp.clients import Undelivered
from workers.mcp.server import Facade
from workers.mcp.tools import agent_tools
from workers.router.decisions import Answer
from workers.router.routing import Router
from workers.router.semantic import SemanticRouting
from workers.settings import Settings

SHOP = """\
connector:
  name: shop
  description: The web shop's orders and payments
  endpoint: http://127.0.0.1:9
  idempotency_header: Idempotency-Key
  actions:
    - action: hold_order
      description: Stop an order from shipping
      path: POST /holds
      permission: write
      input: { order_id: { type: string, required: true } }
      output: { hold_id: { type: string, required: true } }
    - action: release_hold
      description: Let a held order ship again
      path: POST /holds/release
      permission: write
      input: { hold_id: { type: string, required: true } }
    - action: refund
      description: Pay the customer back
      path: POST /refunds
      permission: write
      input: { order_id: { type: string, required: true } }
      output: { refund_id: { type: string, required: true } }
    - action: cancel_refund
      description: Take a refund back
      path: POST /refunds/cancel
      permission: write
      input: { refund_id: { type: string, required: true } }
    - action: notify
      description: Send the customer an email
      path: POST /notify
      permission: write
      input:
        order_id: { type: string, required: true }
        text: { type: string, required: true }
    - action: track_parcel
      description: Where a parcel is on its way to the customer
      path: GET /parcels/{parcel}
      permission: read
      input: { parcel: { type: string, required: true, description: Tracking number } }
---
workflow:
  name: refund_order
  description: Refund a customer's order and tell them; a hold stops it shipping meanwhile.
  input: { order_id: { type: string, required: true, description: "The order, e.g. ORD-1001" } }
  steps:
    - id: hold
      action: shop.hold_order
      params: { order_id: $input.order_id }
      compensate: { action: shop.release_hold, params: { hold_id: $steps.hold.hold_id } }
    - id: refund
      action: shop.refund
      params: { order_id: $input.order_id }
      compensate: { action: shop.cancel_refund, params: { refund_id: $steps.refund.refund_id } }
    - id: notify
      action: shop.notify
      params: { order_id: $input.order_id, text: "Refund {$steps.refund.refund_id} is on its way" }
  output: { refund_id: $steps.refund.refund_id }
---
agent_app:
  name: support
  connector_bindings: [{ connector: shop, allowed_actions: ["*"] }]
  workflows: [refund_order]
---
agent_app:
  name: courier
  connector_bindings: [{ connector: shop, allowed_actions: ["*"] }]
"""
ROUTING_NONE = "---\nrouting: { model: none }\n"


def shop_catalog(directory: Path, extra: str = "") -> Catalog:
    (directory / "shop.yaml").write_text(SHOP + extra)
    built, problems = build(load_directory(directory))
    assert not problems, problems
    return built


@pytest.fixture(scope="module")
def catalog(tmp_path_factory: pytest.TempPathFactory) -> Catalog:
    return shop_catalog(tmp_path_factory.mktemp("wf-tools"))


def find_tools(
    catalog: Catalog, agent: str, description: str, k: int = 3, fmt: str = "json", real: bool = False
) -> dict[str, Any]:
    """reach.find_tools through Router.decide, with the counting stand-in model (or the real one)."""
    semantic = SemanticRouting(catalog) if real else SemanticRouting(catalog, loader=Loader())
    router = Router(catalog, max_intent_bytes=256 * 1024, semantic=semantic)
    params = {"description": description, "k": k, "format": fmt}
    decision = router.decide(intent("reach.find_tools", agent=agent, params=params))
    assert isinstance(decision, Answer) and decision.receipt.success, decision.receipt.error
    data: dict[str, Any] = decision.receipt.data
    return data


# -- reach.find_tools --------------------------------------------------------------------------


def test_the_workflow_is_indexed_after_the_actions_with_its_steps_in_its_text(catalog: Catalog) -> None:
    index = ActionIndex(catalog, CountingEmbedder())
    assert index.size == len(catalog.refs) + 1 == index.workflow_rows["refund_order"] + 1
    text = index.texts[index.workflow_rows["refund_order"]]
    assert text == workflow_text(catalog.workflows["refund_order"])
    assert text.startswith("refund order. Refund a customer's order") and "hold order, then refund, then notify" in text
    index.prepare()
    assert index.ready and index.embedded == index.size


def test_find_tools_offers_the_bound_workflow_with_its_input_schema(catalog: Catalog) -> None:
    data = find_tools(catalog, "support", "the customer wants a refund for her order and an email about it")
    tools = {t["name"]: t for t in data["tools"]}
    assert "refund_order" in tools and [s["name"] for s in data["scores"]] == list(tools)
    assert tools["refund_order"]["description"].startswith("Refund a customer's order")
    assert tools["refund_order"]["input_schema"]["required"] == ["order_id"]


def test_find_tools_never_offers_a_workflow_to_an_agent_not_bound_to_it(catalog: Catalog) -> None:
    data = find_tools(catalog, "courier", "the customer wants a refund for her order and an email about it", k=50)
    names = [t["name"] for t in data["tools"]]
    assert "refund_order" not in names and len(names) == len(catalog.refs)


def test_the_real_model_puts_the_workflow_first_when_its_description_matches(catalog: Catalog) -> None:
    request = "The customer wants her money back for order ORD-1001 and to be told about it"
    data = find_tools(catalog, "support", request, real=True)
    assert data["tools"][0]["name"] == "refund_order", data["scores"]
    data = find_tools(
        catalog, "support", "where is the parcel with tracking number 1Z999", k=7, fmt="openai", real=True
    )
    names = [t["function"]["name"] for t in data["tools"]]
    assert names[0] == "shop__track_parcel" and "refund_order" in names  # k covers every tool
    courier = find_tools(catalog, "courier", request, k=50, real=True)
    assert "refund_order" not in [t["name"] for t in courier["tools"]]


def test_find_tools_without_a_model_finds_the_workflow_by_its_words(tmp_path: Path) -> None:
    lexical = shop_catalog(tmp_path, ROUTING_NONE)
    router = Router(lexical, max_intent_bytes=256 * 1024, semantic=SemanticRouting(lexical))
    decision = router.decide(
        intent("reach.find_tools", agent="support", params={"description": "refund order ORD-7", "k": 2})
    )
    assert isinstance(decision, Answer) and decision.receipt.success
    assert decision.receipt.data["tools"][0]["name"] == "refund_order" and decision.receipt.data["model"] == "none"


# -- reach catalog -----------------------------------------------------------------------------


def _names(fmt: str, output: str) -> list[str]:
    doc = json.loads(output)
    return [t["function"]["name"] if fmt == "openai" else t["name"] for t in doc]


@pytest.mark.parametrize("fmt", ["openai", "openai-responses", "anthropic", "mcp", "json"])
def test_reach_catalog_exports_the_workflow_as_a_tool_in_every_format(tmp_path: Path, fmt: str) -> None:
    shop_catalog(tmp_path)
    bound = CliRunner().invoke(main, ["catalog", "--dir", str(tmp_path), "--agent", "support", "--format", fmt])
    assert bound.exit_code == 0, bound.output
    assert _names(fmt, bound.stdout)[-1] == "refund_order"
    unbound = CliRunner().invoke(main, ["catalog", "--dir", str(tmp_path), "--agent", "courier", "--format", fmt])
    assert "refund_order" not in _names(fmt, unbound.stdout)
    every = CliRunner().invoke(main, ["catalog", "--dir", str(tmp_path), "--format", fmt])
    assert "refund_order" in _names(fmt, every.stdout)


def test_reach_catalog_lists_the_workflow_in_its_table_with_its_steps(tmp_path: Path) -> None:
    shop_catalog(tmp_path)
    bound = CliRunner().invoke(main, ["catalog", "--dir", str(tmp_path), "--agent", "support"])
    assert bound.exit_code == 0, bound.output
    (row,) = [line for line in bound.stdout.splitlines() if line.startswith("refund_order")]
    assert "workflow" in row and "order_id*" in row
    assert "shop.hold_order > shop.refund > shop.notify" in row
    unbound = CliRunner().invoke(main, ["catalog", "--dir", str(tmp_path), "--agent", "courier"])
    assert "refund_order" not in unbound.stdout


# -- the MCP facade's tools --------------------------------------------------------------------


def test_mcp_lists_the_bound_workflow_as_a_tool_with_its_input_and_hints(catalog: Catalog) -> None:
    tools = {t.name: t for t in agent_tools(catalog, "support").tools}
    assert list(tools)[-1] == "refund_order"
    tool = tools["refund_order"]
    assert tool.description is not None and tool.description.startswith("Refund a customer's order")
    assert tool.input_schema["required"] == ["order_id"] and tool.input_schema["additionalProperties"] is False
    assert tool.annotations is not None
    assert (tool.annotations.read_only_hint, tool.annotations.destructive_hint) == (False, True)
    assert tool.annotations.idempotent_hint is False  # a second call is a second run
    assert "refund_order" not in {t.name for t in agent_tools(catalog, "courier").tools}


def test_a_failed_run_is_an_mcp_error_saying_which_steps_were_undone() -> None:
    steps = [
        {"step": "hold", "intent_id": "r-1.hold", "status": "succeeded", "code": None, "undone": True},
        {"step": "refund", "intent_id": "r-1.refund", "status": "succeeded", "code": None, "undone": True},
        {
            "step": "notify",
            "intent_id": "r-1.notify",
            "status": "failed",
            "code": "DOWNSTREAM_CONFLICT",
            "undone": False,
        },
    ]
    receipt = Receipt(
        intent_id="r-1",
        agent_id="support",
        action="refund_order",
        connector=None,
        status="failed",
        success=False,
        error=ErrorInfo(
            code=ErrorCode.STEP_FAILED, message="step notify failed", retryable=False, suggestion="Ask a person."
        ),
        execution=Execution(
            trace_id="t" * 32, received_at="2026-12-05T00:00:00Z", finished_at="2026-12-05T00:00:01Z", steps=steps
        ),
    )
    result = results.from_receipt(receipt)
    assert result.is_error and result.structured_content is None
    assert text_of(result).splitlines()[:2] == [
        "STEP_FAILED (failed, not retryable): step notify failed",
        "Suggestion: Ask a person.",
    ]
    assert text_of(result).splitlines()[2:6] == [
        "Steps of the run:",
        "- hold: succeeded, undone",
        "- refund: succeeded, undone",
        "- notify: failed DOWNSTREAM_CONFLICT",
    ]
    assert result.meta is not None and result.meta[results.RECEIPT_META_KEY]["execution"]["steps"] == steps


def text_of(result: types.CallToolResult) -> str:
    return "\n".join(block.text for block in result.content if isinstance(block, types.TextContent))


class _Unanswered:
    """AgentClients that publish and never see a receipt."""

    async def call(self, call: Any, on_published: Any = None) -> Any:
        raise Undelivered("no receipt within 1 s", published=True)


@pytest.mark.parametrize("tool", ["refund_order", "shop__track_parcel"])
def test_a_call_without_an_answer_never_advises_running_a_workflow_again(catalog: Catalog, tool: str) -> None:
    facade = Facade(catalog, _Unanswered(), Settings(), lambda _ctx: "support")  # type: ignore[arg-type]
    params = types.CallToolRequestParams(name=tool, arguments={"order_id": "ORD-1", "parcel": "1Z"})
    result = anyio.run(facade.call_tool, SimpleNamespace(meta=None), params)  # type: ignore[arg-type]
    text = text_of(result)
    assert result.is_error and text.startswith("Outcome unknown: no receipt within 1 s.")
    assert result.meta is not None and result.meta[results.INTENT_META_KEY]
    if tool == "refund_order":  # the same key would start a second run: look the run up instead
        run_id = result.meta[results.INTENT_META_KEY]
        assert "Do not call refund_order again" in text and f"reach workflow show {run_id}" in text
        assert "idempotency_key" not in text
    else:  # an action: the same key gets the first outcome from the ledger
        assert "idempotency_key" in text and "Do not call" not in text
