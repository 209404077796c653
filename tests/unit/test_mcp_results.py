"""What an MCP client sees: the catalog as tools, and a receipt (or the lack of one) as a tool result."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest
from jsonschema import Draft202012Validator

from connectors.catalog import Catalog, build
from connectors.loader import load_directory
from producers.tools import ROUTING_GUIDE
from producers.wire import ErrorCode, ErrorInfo, Execution, Receipt
from workers.mcp import results, server
from workers.mcp.tools import OMITTED_KEY, agent_tools, output_check, output_schema, output_validator

CATALOG = """
connector:
  name: shop
  endpoint: http://shop.example
  actions:
    - action: create_order
      description: Place an order
      path: POST /orders
      input:
        sku: { type: string, required: true }
        qty: { type: integer, min: 1, max: 10 }
      output:
        order_id: { type: string }
        total: { type: number, min: 0 }
        lines: { type: array, items: { type: object, properties: { sku: { type: string } } } }
      permission: write
    - action: get_order
      path: GET /orders/{oid}
      input:
        oid: { type: string, required: true }
      permission: read
    - action: cancel_order
      path: POST /orders/{oid}/cancel
      input:
        oid: { type: string, required: true }
      permission: write
      idempotent: true
---
agent_app:
  name: buyer
  connector_bindings:
    - connector: shop
      allowed_actions: ["*"]
---
agent_app:
  name: auditor
  connector_bindings:
    - connector: shop
      allowed_actions: [get_order]
"""


@pytest.fixture(scope="module")
def catalog(tmp_path_factory: pytest.TempPathFactory) -> Catalog:
    directory: Path = tmp_path_factory.mktemp("catalog")
    (directory / "shop.yaml").write_text(CATALOG)
    built, problems = build(load_directory(directory))
    assert problems == []
    return built


def receipt(status: str = "succeeded", data: Any = None, error: ErrorInfo | None = None) -> Receipt:
    return Receipt(
        intent_id="i-1",
        agent_id="buyer",
        action="create_order",
        connector="shop",
        status=status,  # type: ignore[arg-type]
        success=status == "succeeded",
        data=data,
        error=error,
        execution=Execution(
            trace_id="4bf92f3577b34da6a3ce929d0e0e4736",
            received_at="2026-01-31T11:59:58.100Z",
            finished_at="2026-01-31T11:59:58.113Z",
        ),
    )


def failure(code: ErrorCode, **fields: Any) -> ErrorInfo:
    return ErrorInfo(
        code=code, message="it went wrong", retryable=code.retryable, suggestion="Do this instead.", **fields
    )


def text(result: types.CallToolResult) -> str:
    (block,) = result.content
    assert isinstance(block, types.TextContent)
    return block.text


# -- tools/list ----------------------------------------------------------------------------------


def test_each_agent_gets_exactly_the_tools_reach_list_tools_gives_it(catalog: Catalog) -> None:
    for agent in ("buyer", "auditor"):
        tools = agent_tools(catalog, agent).tools
        listed = catalog.tools_for(agent)
        assert [t.name for t in tools] == [s.name for s in listed]
        assert [t.input_schema for t in tools] == [s.input_schema for s in listed]
        assert [t.description for t in tools] == [s.description for s in listed]
    assert [t.name for t in agent_tools(catalog, "auditor").tools] == ["shop__get_order"]
    assert agent_tools(catalog, "nobody").tools == []


def test_hints_follow_permission_and_idempotency(catalog: Catalog) -> None:
    hints = {t.name: t.annotations for t in agent_tools(catalog, "buyer").tools}
    create, get, cancel = hints["shop__create_order"], hints["shop__get_order"], hints["shop__cancel_order"]
    assert create is not None and get is not None and cancel is not None
    assert (create.read_only_hint, create.destructive_hint, create.idempotent_hint) == (False, True, False)
    assert (get.read_only_hint, get.destructive_hint, get.idempotent_hint) == (True, False, True)
    assert (cancel.read_only_hint, cancel.idempotent_hint) == (False, True)


def test_only_an_action_with_a_declared_output_has_an_output_schema(catalog: Catalog) -> None:
    tools = {t.name: t for t in agent_tools(catalog, "buyer").tools}
    assert tools["shop__get_order"].output_schema is None
    schema = tools["shop__create_order"].output_schema
    assert schema is not None and schema["type"] == "object"
    assert schema["properties"]["total"] == {"type": "number", "minimum": 0}
    assert agent_tools(catalog, "buyer").outputs.keys() == {"shop__create_order"}


@pytest.mark.parametrize(
    "data, conforms",
    [
        ({"order_id": "O-1", "total": 9.5, "lines": [{"sku": "A"}]}, True),
        ({"order_id": "O-1", "total": 9.5, "lines": [], "extra": "kept, as the pool keeps it"}, True),
        ({OMITTED_KEY: "the answer was 2000000 bytes"}, True),  # a success too large to pass on
        ({"order_id": "O-1", "total": 9.5}, False),  # a declared field missing
        ({"order_id": "O-1", "total": -1, "lines": []}, False),
        ({"order_id": "O-1", "total": 1, "lines": [{"sku": "A", "colour": "red"}]}, False),
    ],
)
def test_the_output_schema_admits_what_the_pool_lets_through_and_nothing_else(
    catalog: Catalog, data: dict[str, Any], conforms: bool
) -> None:
    schema = output_schema(catalog.refs[("shop", "create_order")].action)
    assert schema is not None
    Draft202012Validator.check_schema(schema)
    assert (output_check(Draft202012Validator(schema))(data) is None) is conforms


# RE2 reads both; Python's re cannot compile the first and backtracks on the second
LETTERS, WORDS = r"^\p{L}+$", r"^([a-zA-Z0-9]+\s?)*$"
PATTERNED = f"""
connector:
  name: names
  endpoint: http://names.example
  actions:
    - action: lookup
      path: GET /names/{{nid}}
      input:
        nid: {{ type: string, required: true }}
      output:
        given: {{ type: string, pattern: '{LETTERS}' }}
        motto: {{ type: string, pattern: '{WORDS}' }}
        tags: {{ type: array, items: {{ type: object, properties: {{ code: {{ type: string, pattern: '^[a-z]+$' }} }} }} }}
      permission: read
---
agent_app:
  name: reader
  connector_bindings:
    - connector: names
      allowed_actions: [lookup]
"""


@pytest.fixture(scope="module")
def patterned(tmp_path_factory: pytest.TempPathFactory) -> Catalog:
    directory: Path = tmp_path_factory.mktemp("patterned")
    (directory / "names.yaml").write_text(PATTERNED)
    built, problems = build(load_directory(directory))
    assert problems == []
    return built


def contains_key(value: Any, key: str) -> bool:
    if isinstance(value, dict):
        return key in value or any(contains_key(v, key) for v in value.values())
    return isinstance(value, list) and any(contains_key(v, key) for v in value)


@pytest.mark.parametrize(
    "data, problem",
    [
        ({"given": "Zürich", "motto": "plain words here", "tags": [{"code": "ok"}]}, None),
        ({"given": "Zürich1", "motto": "x", "tags": []}, "given: does not match the pattern ^\\p{L}+$"),
        ({"given": "Ana", "motto": "a" * 4999 + "!", "tags": []}, f"motto: does not match the pattern {WORDS}"),
        # RE2's $ is the very end (Python's also matches before a final newline), as the pool reads it
        (
            {"given": "Ana", "motto": "x", "tags": [{"code": "ok\n"}]},
            "tags/0/code: does not match the pattern ^[a-z]+$",
        ),
    ],
)
def test_the_facade_checks_output_patterns_on_re2_in_linear_time(
    patterned: Catalog, data: dict[str, Any], problem: str | None
) -> None:
    check = output_check(agent_tools(patterned, "reader").outputs["names__lookup"])
    started = time.monotonic()
    assert check(data) == problem
    assert time.monotonic() - started < 0.5  # Python's re takes minutes on the 5,000 characters


def test_the_published_output_schema_leaves_patterns_to_the_fleet(patterned: Catalog) -> None:
    """Clients check structuredContent with their own engines (the official SDK: Python's re, which
    cannot even compile \\p{L}), so the outputSchema they get has every keyword but pattern."""
    (tool,) = agent_tools(patterned, "reader").tools
    assert tool.output_schema is not None and not contains_key(tool.output_schema, "pattern")
    Draft202012Validator.check_schema(tool.output_schema)  # checks each pattern with re: it would fail on \p{L}
    assert tool.output_schema["properties"]["given"] == {"type": "string"}
    assert tool.output_schema["anyOf"][0] == {"required": ["given", "motto", "tags"]}
    declared = output_schema(patterned.refs[("names", "lookup")].action)
    assert declared is not None and declared["properties"]["given"]["pattern"] == LETTERS  # what the facade checks
    assert output_check(output_validator(declared))({"given": "Ana1", "motto": "", "tags": []}) is not None


# -- tools/call results --------------------------------------------------------------------------


def test_a_success_carries_its_data_as_structured_content_and_text_and_the_receipt_in_meta() -> None:
    done = receipt(data={"order_id": "O-1", "total": 9.5, "note": "café"})
    result = results.from_receipt(done)
    assert result.is_error is False
    assert result.structured_content == done.data
    assert json.loads(text(result)) == done.data
    assert result.meta == {results.RECEIPT_META_KEY: json.loads(done.to_json())}


@pytest.mark.parametrize("data", [[1, 2], "ok", 3, None])
def test_a_success_whose_data_is_not_an_object_is_wrapped_as_result(data: Any) -> None:
    result = results.from_receipt(receipt(data=data))
    assert result.is_error is False and result.structured_content == {"result": data}


def test_a_success_that_breaks_the_output_schema_is_an_error_saying_it_took_effect(catalog: Catalog) -> None:
    schema = output_schema(catalog.refs[("shop", "create_order")].action)
    assert schema is not None
    result = results.from_receipt(receipt(data={"order_id": "O-1"}), output_check(Draft202012Validator(schema)))
    assert result.is_error and result.structured_content is None
    assert "took effect" in text(result) and "do not call it again" in text(result)
    assert result.meta is not None and result.meta[results.RECEIPT_META_KEY]["status"] == "succeeded"


def test_a_rejection_names_the_code_retryability_message_suggestion_and_each_field() -> None:
    error = failure(
        ErrorCode.VALIDATION_FAILED,
        details=[
            {"field": "qty", "code": "max", "message": "must be at most 10"},
            {"field": "colour", "code": "enum", "message": "must be one of red, blue", "allowed": ["red", "blue"]},
        ],
    )
    result = results.from_receipt(receipt("rejected", error=error))
    assert result.is_error and result.structured_content is None
    assert text(result).splitlines() == [
        "VALIDATION_FAILED (rejected, not retryable): it went wrong",
        "Suggestion: Do this instead.",
        "- qty: must be at most 10",
        "- colour: must be one of red, blue (allowed: red, blue)",
        "Intent i-1, trace 4bf92f3577b34da6a3ce929d0e0e4736.",
    ]
    assert result.meta is not None and result.meta[results.RECEIPT_META_KEY]["error"]["code"] == "VALIDATION_FAILED"


@pytest.mark.parametrize("tier", ["confirm", "open"])
def test_an_ambiguous_action_names_its_tier_and_each_candidate_as_a_tool(tier: str) -> None:
    details = [
        {"action": "it.create_ticket", "connector": "it", "description": "IT desk", "score": 0.5},
        {"action": "care.create_ticket", "connector": "care", "description": "Customer care", "score": 0.49},
    ]
    if tier == "confirm":
        details[0]["suggested"], details[1]["suggested"] = True, False
    ambiguous = receipt("rejected", error=failure(ErrorCode.AMBIGUOUS_ACTION, details=details))
    ambiguous = ambiguous.model_copy(
        update={"execution": ambiguous.execution.model_copy(update={"routing": {"method": "semantic", "tier": tier}})}
    )
    lines = text(results.from_receipt(ambiguous)).splitlines()
    mark = " (suggested)" if tier == "confirm" else ""
    assert lines[2:5] == [
        f"Routing tier: '{tier}'.",
        f"- it__create_ticket{mark}: IT desk",
        "- care__create_ticket: Customer care",
    ]
    assert ROUTING_GUIDE in server.INSTRUCTIONS and "'confirm'" in ROUTING_GUIDE and "'open'" in ROUTING_GUIDE


def test_a_retryable_failure_says_when_to_retry() -> None:
    result = results.from_receipt(receipt("rejected", error=failure(ErrorCode.RATE_LIMITED, retry_after_ms=1500)))
    assert text(result).startswith("RATE_LIMITED (rejected, may be retried after 1500 ms): it went wrong")


def test_an_unknown_outcome_says_so_plainly_first() -> None:
    result = results.from_receipt(receipt("unknown", error=failure(ErrorCode.OUTCOME_UNKNOWN)))
    assert result.is_error
    first, second = text(result).splitlines()[:2]
    assert first == "Outcome unknown: the action may or may not have taken effect."
    assert second.startswith("OUTCOME_UNKNOWN (unknown, not retryable)")


def test_many_details_are_cut_short_in_the_text_but_kept_in_the_receipt() -> None:
    details = [{"field": f"f{i}", "code": "unknown", "message": "is not a parameter"} for i in range(30)]
    result = results.from_receipt(receipt("rejected", error=failure(ErrorCode.VALIDATION_FAILED, details=details)))
    lines = text(result).splitlines()
    assert sum(line.startswith("- f") for line in lines) == results.MAX_DETAILS_SHOWN
    assert f"- and {30 - results.MAX_DETAILS_SHOWN} more (see the receipt)" in lines
    assert result.meta is not None and len(result.meta[results.RECEIPT_META_KEY]["error"]["details"]) == 30


def test_no_receipt_tells_how_to_learn_the_outcome_without_running_it_twice() -> None:
    result = results.no_receipt("i-9", "key-9", "shop__create_order", "no receipt within 60 s")
    assert result.is_error and result.meta == {results.INTENT_META_KEY: "i-9"}
    assert text(result).startswith("Outcome unknown: no receipt within 60 s.")
    assert '_meta {"idempotency_key": "key-9"}' in text(result) and "shop__create_order" in text(result)


def test_nothing_sent_says_calling_again_is_safe() -> None:
    result = results.not_sent("cannot reach the broker: refused")
    assert result.is_error and result.meta is None
    assert text(result).startswith("NOT SENT: cannot reach the broker: refused.") and "safe" in text(result)


def test_a_local_refusal_names_the_code_and_that_nothing_was_sent() -> None:
    result = results.refused("INVALID_INTENT", "_meta.idempotency_key must be a string", "Send a string.")
    assert result.is_error
    assert text(result) == (
        "INVALID_INTENT (rejected, nothing was sent): _meta.idempotency_key must be a string\nSuggestion: Send a string."
    )
