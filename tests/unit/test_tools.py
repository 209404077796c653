"""Tool-schema export for OpenAI, Anthropic, MCP and plain JSON."""

from __future__ import annotations

import json

import pytest

from producers.tools import ToolSpec, export, to_anthropic, to_mcp, to_openai, to_openai_responses

SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "description": "Ticket title"},
        "priority": {"type": "string", "enum": ["low", "medium", "high"], "default": "medium"},
    },
    "required": ["title"],
    "additionalProperties": False,
}
CREATE = ToolSpec("local_ticket_system__create_ticket", "Create a new ticket", SCHEMA)
QUERY = ToolSpec(
    "local_ticket_system__query_ticket",
    "Get a ticket by its id",
    {
        "type": "object",
        "properties": {"tid": {"type": "string"}},
        "required": ["tid"],
        "additionalProperties": False,
    },
)


def test_openai_export_wraps_each_tool_as_a_function() -> None:
    assert to_openai([CREATE]) == [
        {
            "type": "function",
            "function": {
                "name": "local_ticket_system__create_ticket",
                "description": "Create a new ticket",
                "parameters": SCHEMA,
            },
        }
    ]


def test_openai_responses_export_is_flat_and_not_strict() -> None:
    # the Responses API takes the function's fields at the top level, and defaults `strict` to
    # true, which would refuse a schema with optional properties such as `priority`
    assert to_openai_responses([CREATE]) == [
        {
            "type": "function",
            "name": "local_ticket_system__create_ticket",
            "description": "Create a new ticket",
            "parameters": SCHEMA,
            "strict": False,
        }
    ]


def test_anthropic_export_uses_input_schema() -> None:
    assert to_anthropic([CREATE]) == [
        {
            "name": "local_ticket_system__create_ticket",
            "description": "Create a new ticket",
            "input_schema": SCHEMA,
        }
    ]


def test_mcp_export_uses_camel_case_input_schema() -> None:
    assert to_mcp([CREATE]) == [
        {
            "name": "local_ticket_system__create_ticket",
            "description": "Create a new ticket",
            "inputSchema": SCHEMA,
        }
    ]


@pytest.mark.parametrize(
    ("fmt", "render"),
    [
        ("openai", to_openai),
        ("openai-responses", to_openai_responses),
        ("anthropic", to_anthropic),
        ("mcp", to_mcp),
        ("json", lambda tools: [t.to_dict() for t in tools]),
    ],
)
def test_export_dispatches_by_format_and_keeps_order(fmt: str, render: object) -> None:
    result = export(iter([CREATE, QUERY]), fmt)
    assert result == render([CREATE, QUERY])  # type: ignore[operator]
    assert len(result) == 2
    json.dumps(result)  # every format is plain JSON


def test_export_of_no_tools_is_an_empty_list() -> None:
    for fmt in ("openai", "openai-responses", "anthropic", "mcp", "json"):
        assert export([], fmt) == []


@pytest.mark.parametrize("fmt", ["OpenAI", "table", "", "yaml"])
def test_unknown_export_format_raises_value_error_listing_the_known_ones(fmt: str) -> None:
    with pytest.raises(ValueError, match="openai, anthropic, mcp, json"):
        export([CREATE], fmt)


def test_to_dict_and_from_dict_round_trip() -> None:
    d = CREATE.to_dict()
    assert d == {"name": CREATE.name, "description": CREATE.description, "input_schema": SCHEMA}
    assert ToolSpec.from_dict(d) == CREATE
    assert ToolSpec.from_dict(json.loads(json.dumps(d))) == CREATE


def test_exported_schemas_are_copies_so_callers_cannot_change_the_spec() -> None:
    for rendered in (
        to_openai([CREATE])[0]["function"]["parameters"],
        to_openai_responses([CREATE])[0]["parameters"],
        to_mcp([CREATE])[0]["inputSchema"],
        CREATE.to_dict()["input_schema"],
    ):
        rendered["properties"].clear()
    assert CREATE.input_schema == SCHEMA


@pytest.mark.parametrize(
    "d",
    [
        {"description": "x", "input_schema": {}},
        {"name": "", "description": "x", "input_schema": {}},
        {"name": "a", "description": 3, "input_schema": {}},
        {"name": "a", "description": "x", "input_schema": "object"},
        ["a"],
    ],
)
def test_from_dict_rejects_malformed_documents(d: object) -> None:
    with pytest.raises(ValueError):
        ToolSpec.from_dict(d)  # type: ignore[arg-type]
