"""Workflows everywhere agents look, through the real fleet (router, the shop's pools, the workflow
runner) and ``reach mcp --stdio`` driven by the official MCP client SDK, against the workflow
tests' fake shop (tests/integration/workflow_shop.py), which logs what it did.

reach.list_tools and reach.find_tools offer an agent the workflows it is bound to and no others;
over MCP a bound workflow is a tool, a call runs it and answers the final receipt (``data`` as
structuredContent), a failed run is a tool error that says which steps were undone, and an agent
not bound to the workflow neither sees it nor can run it.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import anyio
import mcp_types as types
import pytest
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from producers.client import ReachClient
from tests.fleet import REPO, Fleet
from tests.integration.workflow_shop import AGENT, OTHER, Shop, catalog, order, running_shop, start_runner

WORKFLOWS = ["refund_order", "refund_quick", "post_order"]  # AGENT's, in its binding's order
T = TypeVar("T")


@pytest.fixture(scope="module")
def shop() -> Iterator[Shop]:
    with running_shop() as server:
        yield server


@pytest.fixture(scope="module")
def fleet(shop: Shop) -> Iterator[Fleet]:
    # lexical ranking (no model to load): find_tools is about which tools are offered, not the model
    text = catalog(shop.url) + "\n---\nrouting: { model: none }\n"
    with Fleet(text, ["wfshop", "wfpost"], env={"REACH_MCP_WAIT": "60s"}) as running:
        start_runner(running)
        yield running


@asynccontextmanager
async def mcp_session(fleet: Fleet, agent: str) -> AsyncIterator[ClientSession]:
    """``reach mcp --stdio --agent AGENT`` on the fleet's broker login (the fleet does not ask for
    a user_id), as an MCP client session."""
    server = StdioServerParameters(
        command=sys.executable, args=["-m", "workers.cli", "mcp", "--stdio", "--agent", agent], env=fleet.env, cwd=REPO
    )
    with open(fleet.log_dir / f"mcp-stdio-{agent}.log", "a") as errlog:
        async with stdio_client(server, errlog=errlog) as (read, write):
            async with ClientSession(read, write) as client:
                await client.initialize()
                yield client


def in_session(fleet: Fleet, agent: str, scenario: Callable[[ClientSession], Awaitable[T]]) -> T:
    async def main() -> T:
        async with mcp_session(fleet, agent) as client:
            return await scenario(client)

    return anyio.run(main)


def text_of(result: types.CallToolResult) -> str:
    return "\n".join(block.text for block in result.content if isinstance(block, types.TextContent))


def receipt_of(result: types.CallToolResult) -> dict[str, Any]:
    assert result.meta is not None, text_of(result)
    receipt: dict[str, Any] = result.meta["agent-reach/receipt"]
    return receipt


# -- reach.list_tools and reach.find_tools -------------------------------------------------------


def test_list_tools_and_find_tools_offer_the_bound_workflows_only(fleet: Fleet) -> None:
    with ReachClient(AGENT, fleet.broker_url) as bound, ReachClient(OTHER, fleet.broker_url) as other:
        listed = [t["name"] for t in bound.tools("json")]
        assert listed[-3:] == WORKFLOWS
        assert not set(WORKFLOWS) & {t["name"] for t in other.tools("json")}

        ask = {"description": "refund the order and tell the customer", "k": 3, "format": "openai"}
        found = bound.call("reach.find_tools", ask, timeout=30)
        assert found.success, found.error
        names = [t["function"]["name"] for t in found.data["tools"]]
        assert names[0] in ("refund_order", "refund_quick") and found.data["model"] == "none"
        assert found.data["tools"][0]["function"]["parameters"]["required"] == ["order_id"]

        found = other.call("reach.find_tools", {**ask, "k": 50}, timeout=30)
        assert found.success, found.error
        names = [t["function"]["name"] for t in found.data["tools"]]
        assert names and not set(WORKFLOWS) & set(names)


# -- the MCP facade --------------------------------------------------------------------------------


def test_over_mcp_a_bound_workflow_is_a_tool_that_runs_and_answers_its_final_receipt(fleet: Fleet, shop: Shop) -> None:
    through, conflict = order(), order()
    shop.conflict_on.add(conflict)

    async def scenario(
        client: ClientSession,
    ) -> tuple[dict[str, types.Tool], types.CallToolResult, types.CallToolResult]:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
        ok = await client.call_tool("refund_order", {"order_id": through})
        failed = await client.call_tool("refund_order", {"order_id": conflict})
        return tools, ok, failed

    tools, ok, failed = in_session(fleet, AGENT, scenario)

    assert [name for name in tools if name in WORKFLOWS] == WORKFLOWS
    tool = tools["refund_order"]
    assert tool.description == "Hold the order, refund it, tell the customer."
    assert tool.input_schema["required"] == ["order_id"] and set(tool.input_schema["properties"]) == {
        "order_id",
        "amount",
    }
    assert tool.annotations is not None and tool.annotations.destructive_hint is True
    assert tool.annotations.idempotent_hint is False

    assert not ok.is_error, text_of(ok)
    assert ok.structured_content == {"refund_id": f"R-{through}"}
    receipt = receipt_of(ok)
    assert (receipt["action"], receipt["connector"], receipt["status"]) == ("refund_order", None, "succeeded")
    assert [(s["step"], s["status"], s["undone"]) for s in receipt["execution"]["steps"]] == [
        ("hold", "succeeded", False),
        ("refund", "succeeded", False),
        ("notify", "succeeded", False),
    ]
    assert shop.calls(through) == ["/holds", "/refunds", "/notify"]

    # the last step answers 409: a tool error, like any failure, saying what was undone
    assert failed.is_error and failed.structured_content is None
    text = text_of(failed)
    assert text.startswith("STEP_FAILED (failed, not retryable): ") and "DOWNSTREAM_CONFLICT" in text
    assert "- hold: succeeded, undone\n- refund: succeeded, undone\n- notify: failed DOWNSTREAM_CONFLICT" in text
    assert receipt_of(failed)["error"]["code"] == "STEP_FAILED"
    assert shop.calls(conflict) == ["/holds", "/refunds", "/refunds/cancel", "/holds/release"]


def test_over_mcp_an_agent_not_bound_to_a_workflow_neither_sees_nor_runs_it(fleet: Fleet, shop: Shop) -> None:
    mine = order()

    async def scenario(client: ClientSession) -> tuple[list[str], types.CallToolResult]:
        names = [tool.name for tool in (await client.list_tools()).tools]
        return names, await client.call_tool("refund_order", {"order_id": mine})

    names, result = in_session(fleet, OTHER, scenario)
    assert names and not set(WORKFLOWS) & set(names)
    assert result.is_error and "PERMISSION_DENIED" in text_of(result)
    assert receipt_of(result)["error"]["code"] == "PERMISSION_DENIED"
    assert shop.calls(mine) == []
