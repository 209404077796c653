"""Intent shapes: detection, normalisation and the strict JSON parser (docs/contract.md section 2)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from producers.formats import FORMATS, FormatError, Normalized, loads_strict, normalize
from producers.wire import Intent

NOT_AN_INTENT = "not an intent: expected an object with 'action'"


# -- each shape normalises ---------------------------------------------------------------------


def test_native_intent_is_returned_unchanged() -> None:
    doc = {"action": "create_ticket", "params": {"title": "x"}, "agent_id": "bot", "extra": 1}
    result = normalize(doc)
    assert result == Normalized(doc, "native")
    # native field types are pydantic's job: a wrong type still passes through here
    assert normalize({"action": 42}).intent == {"action": 42}


def test_openai_tool_call_becomes_native_intent() -> None:
    doc = {
        "id": "call_abc123",
        "type": "function",
        "function": {
            "name": "local_ticket_system__create_ticket",
            "arguments": '{"title": "Printer broken", "priority": "high"}',
        },
    }
    result = normalize(doc)
    assert result.format == "openai"
    assert result.intent == {
        "action": "local_ticket_system__create_ticket",
        "params": {"title": "Printer broken", "priority": "high"},
        "intent_id": "call_abc123",
    }
    Intent.model_validate(result.intent)


def test_openai_responses_function_call_becomes_native_intent_keyed_by_its_call_id() -> None:
    # an output item of the Responses API, forwarded as the model produced it
    doc = {
        "type": "function_call",
        "id": "fc_67ca09c5efe0819096d0511c92b8c890",
        "call_id": "call_unLAR8MvFNptuiZK6K6HCy5k",
        "name": "local_ticket_system__create_ticket",
        "arguments": '{"title": "Printer broken", "priority": "high"}',
        "status": "completed",
    }
    result = normalize(doc)
    assert result.format == "openai-responses"
    # call_id, not the item id: it is what the model pairs the function_call_output with
    assert result.intent == {
        "action": "local_ticket_system__create_ticket",
        "params": {"title": "Printer broken", "priority": "high"},
        "intent_id": "call_unLAR8MvFNptuiZK6K6HCy5k",
    }
    Intent.model_validate(result.intent)


def test_openai_responses_function_call_without_call_id_or_status_uses_its_item_id() -> None:
    doc = {"type": "function_call", "id": "fc_1", "name": "query_ticket", "arguments": '{"tid": "TK-1"}'}
    assert normalize(doc).intent == {"action": "query_ticket", "params": {"tid": "TK-1"}, "intent_id": "fc_1"}


@pytest.mark.parametrize("status", ["in_progress", "incomplete", 3])
def test_openai_responses_function_call_that_is_not_completed_is_refused(status: Any) -> None:
    doc = {"type": "function_call", "call_id": "c1", "name": "a", "arguments": '{"x": 1', "status": status}
    with pytest.raises(FormatError, match="only a completed call"):
        normalize(doc)


def test_anthropic_tool_use_becomes_native_intent() -> None:
    doc = {
        "type": "tool_use",
        "id": "toolu_01A09q90qw90lq917835lq9",
        "name": "query_ticket",
        "input": {"tid": "TK-0001"},
    }
    result = normalize(doc)
    assert result.format == "anthropic"
    assert result.intent == {
        "action": "query_ticket",
        "params": {"tid": "TK-0001"},
        "intent_id": "toolu_01A09q90qw90lq917835lq9",
    }


@pytest.mark.parametrize("rpc_id", [7, "req-1"])
def test_mcp_tools_call_becomes_native_intent_without_taking_the_session_scoped_id(rpc_id: Any) -> None:
    doc = {
        "jsonrpc": "2.0",
        "id": rpc_id,
        "method": "tools/call",
        "params": {"name": "query_ticket", "arguments": {"tid": "TK-0001"}},
    }
    result = normalize(doc)
    assert result.format == "mcp"
    # JSON-RPC ids restart at 1 in every session: the message_id (or a new id) is the intent id
    assert result.intent["action"] == "query_ticket" and result.intent["params"] == {"tid": "TK-0001"}
    assert result.intent.get("intent_id") is None


@pytest.mark.parametrize("arguments", [None, "absent"])
def test_mcp_tools_call_without_arguments_has_empty_params(arguments: Any) -> None:
    params: dict[str, Any] = {"name": "list_things"}
    if arguments != "absent":
        params["arguments"] = arguments
    doc = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}
    assert normalize(doc).intent["params"] == {}


@pytest.mark.parametrize("typed", [True, False])
def test_langchain_tool_call_becomes_native_intent(typed: bool) -> None:
    doc: dict[str, Any] = {"name": "query_ticket", "args": {"tid": "TK-0001"}, "id": "run-1"}
    if typed:
        doc["type"] = "tool_call"
    result = normalize(doc)
    assert result.format == "langchain"
    assert result.intent == {
        "action": "query_ticket",
        "params": {"tid": "TK-0001"},
        "intent_id": "run-1",
    }


@pytest.mark.parametrize(
    "doc",
    [
        {"type": "tool_use", "id": "has space", "name": "a", "input": {}},
        {"type": "tool_use", "id": "x" * 129, "name": "a", "input": {}},
        {"type": "tool_use", "id": 12, "name": "a", "input": {}},
        {"type": "tool_use", "name": "a", "input": {}},
        {"name": "a", "args": {}, "id": None},
        {"jsonrpc": "2.0", "id": True, "method": "tools/call", "params": {"name": "a"}},
        {"jsonrpc": "2.0", "method": "tools/call", "params": {"name": "a"}},
    ],
)
def test_foreign_id_that_is_not_a_valid_intent_id_is_dropped(doc: dict[str, Any]) -> None:
    intent = normalize(doc).intent
    assert "intent_id" not in intent
    assert intent["action"] == "a"


def test_tool_name_with_double_underscore_passes_through_unchanged() -> None:
    doc = {"type": "tool_use", "id": "t1", "name": "crm__find_customer", "input": {}}
    assert normalize(doc).intent["action"] == "crm__find_customer"


def test_normalised_foreign_intent_carries_native_keys_only() -> None:
    doc = {"type": "tool_use", "id": "t1", "name": "a", "input": {}, "cache_control": {"x": 1}}
    assert set(normalize(doc).intent) <= set(Intent.model_fields)


# -- what is not an intent ---------------------------------------------------------------------


@pytest.mark.parametrize("doc", [None, 1, 1.5, True, "create_ticket", [], [{"action": "a"}]])
def test_non_object_is_not_an_intent(doc: Any) -> None:
    with pytest.raises(FormatError, match=NOT_AN_INTENT):
        normalize(doc)


@pytest.mark.parametrize(
    "doc",
    [{}, {"title": "x"}, {"name": "a"}, {"type": "message", "name": "a", "args": {}}, {"args": {}}],
)
def test_object_of_no_known_shape_is_not_an_intent(doc: dict[str, Any]) -> None:
    with pytest.raises(FormatError, match=NOT_AN_INTENT) as info:
        normalize(doc)
    for shape in (
        "OpenAI tool call",
        "OpenAI Responses function_call",
        "Anthropic tool_use",
        "MCP tools/call",
        "LangChain ToolCall",
    ):
        assert shape in str(info.value)


# -- recognised shapes with wrong fields name the field ----------------------------------------


def _openai(function: Any) -> dict[str, Any]:
    return {"id": "call_1", "type": "function", "function": function}


@pytest.mark.parametrize(
    ("doc", "field"),
    [
        (_openai("create_ticket"), "'function'"),
        ({"id": "call_1", "type": "function"}, "'function'"),
        (_openai({"name": 3, "arguments": "{}"}), "'function.name'"),
        (_openai({"name": "", "arguments": "{}"}), "'function.name'"),
        (_openai({"name": "a", "arguments": {"x": 1}}), "'function.arguments'"),
        (_openai({"name": "a"}), "'function.arguments'"),
        (_openai({"name": "a", "arguments": "[1, 2]"}), "'function.arguments'"),
        (_openai({"name": "a", "arguments": "{not json"}), "'function.arguments'"),
        (_openai({"name": "a", "arguments": '{"x": NaN}'}), "'function.arguments'"),
        (_openai({"name": "a", "arguments": '{"x": 1, "x": 2}'}), "'function.arguments'"),
        ({"type": "function_call", "call_id": "c", "arguments": "{}"}, "'name'"),
        ({"type": "function_call", "call_id": "c", "name": "a", "arguments": {"x": 1}}, "'arguments'"),
        ({"type": "function_call", "call_id": "c", "name": "a"}, "'arguments'"),
        ({"type": "function_call", "call_id": "c", "name": "a", "arguments": "[1]"}, "'arguments'"),
        ({"type": "function_call", "call_id": "c", "name": "a", "arguments": '{"x": NaN}'}, "'arguments'"),
        ({"type": "tool_use", "id": "t", "name": None, "input": {}}, "'name'"),
        ({"type": "tool_use", "id": "t", "name": "a", "input": "tid=1"}, "'input'"),
        ({"type": "tool_use", "id": "t", "name": "a"}, "'input'"),
        ({"jsonrpc": "1.0", "id": 1, "method": "tools/call", "params": {"name": "a"}}, "'jsonrpc'"),
        ({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, "'method'"),
        ({"jsonrpc": "2.0", "id": 1, "method": "tools/call"}, "'params'"),
        ({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": ["a"]}, "'params'"),
        (
            {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"arguments": {}}},
            "'params.name'",
        ),
        (
            {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "tools/call",
                "params": {"name": "a", "arguments": [1]},
            },
            "'params.arguments'",
        ),
        ({"name": ["a"], "args": {}, "id": "r"}, "'name'"),
        ({"name": "a", "args": "x=1", "id": "r"}, "'args'"),
        ({"type": "tool_call", "name": "a", "id": "r"}, "'args'"),
    ],
)
def test_recognised_shape_with_wrong_field_names_the_field(doc: dict[str, Any], field: str) -> None:
    with pytest.raises(FormatError) as info:
        normalize(doc)
    assert field in str(info.value)


def test_openai_arguments_error_says_why_the_json_is_bad() -> None:
    with pytest.raises(FormatError, match="more than once"):
        normalize(_openai({"name": "a", "arguments": '{"x": 1, "x": 2}'}))


# -- loads_strict --------------------------------------------------------------------------------


def test_loads_strict_parses_ordinary_json_from_bytes_and_str() -> None:
    doc = {"action": "a", "params": {"n": 1.5, "s": "é😀", "l": [None, True]}}
    text = json.dumps(doc, ensure_ascii=False)
    assert loads_strict(text) == doc
    assert loads_strict(text.encode("utf-8")) == doc
    assert loads_strict(json.dumps(doc)) == doc  # \u escapes, including a surrogate pair


@pytest.mark.parametrize(
    ("text", "word"),
    [
        ('{"x": NaN}', "NaN"),
        ('{"x": Infinity}', "Infinity"),
        ('{"x": -Infinity}', "-Infinity"),
        ("[1e999]", "finite"),
        ("-1e400", "finite"),
    ],
)
def test_loads_strict_rejects_non_finite_numbers(text: str, word: str) -> None:
    with pytest.raises(FormatError, match=word):
        loads_strict(text)


def test_loads_strict_rejects_duplicate_keys_even_when_nested() -> None:
    with pytest.raises(FormatError, match="'k' more than once"):
        loads_strict('{"a": [{"k": 1, "k": 1}]}')


def test_loads_strict_rejects_invalid_utf8() -> None:
    with pytest.raises(FormatError, match="not valid UTF-8"):
        loads_strict(b'{"action": "\xff"}')


def test_loads_strict_rejects_deep_nesting() -> None:
    with pytest.raises(FormatError, match="nests 100000 levels deep; at most 35"):
        loads_strict("[" * 100_000 + "]" * 100_000)
    with pytest.raises(FormatError, match="nests 100000 levels deep; at most 35"):
        loads_strict(b'{"a":' * 100_000 + b"1" + b"}" * 100_000)


@pytest.mark.parametrize("text", ['"\\ud800"', '{"\\udc00": 1}', '["ok", {"a": ["\\uDBFF"]}]', '"\ud800"'])
def test_loads_strict_rejects_unpaired_surrogates(text: str) -> None:
    with pytest.raises(FormatError, match="surrogate"):
        loads_strict(text)


@pytest.mark.parametrize("text", ["", "{", "{'a': 1}", '{"a": 1} x', "\ufeff{}", "[1,]"])
def test_loads_strict_rejects_malformed_json_with_a_position(text: str) -> None:
    with pytest.raises(FormatError, match="not valid JSON"):
        loads_strict(text)


def test_loads_strict_rejects_overlong_integers() -> None:
    with pytest.raises(FormatError, match="too many digits"):
        loads_strict("9" * 5000)


# -- fuzzing: nothing but FormatError comes out --------------------------------------------------

_json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text()
_keys = st.sampled_from(
    [
        "action",
        "type",
        "function",
        "name",
        "arguments",
        "input",
        "args",
        "id",
        "jsonrpc",
        "method",
        "params",
        "call_id",
        "status",
    ]
) | st.text(max_size=5)
_json_values = st.recursive(
    _json_scalars
    | st.sampled_from(
        ["function", "function_call", "completed", "tool_use", "tool_call", "2.0", "tools/call", "{}", '{"a":1}', "[]"]
    ),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(_keys, children, max_size=5),
    max_leaves=30,
)


def _normalize_text(data: bytes | str) -> None:
    try:
        result = normalize(loads_strict(data))
    except FormatError:
        return
    assert result.format in FORMATS
    assert isinstance(result.intent, dict)


@settings(max_examples=500, deadline=None)
@given(_json_values)
def test_normalize_of_any_json_raises_only_format_error(value: Any) -> None:
    _normalize_text(json.dumps(value))
    _normalize_text(json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass"))


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=200) | st.text(max_size=200))
def test_normalize_of_arbitrary_bytes_and_text_raises_only_format_error(data: bytes | str) -> None:
    _normalize_text(data)


@settings(max_examples=300, deadline=None)
@given(
    st.fixed_dictionaries(
        {
            "id": _json_values,
            "type": st.just("function"),
            "function": st.fixed_dictionaries({"name": _json_values, "arguments": st.text(max_size=50) | _json_values}),
        }
    )
)
def test_normalize_of_openai_lookalikes_raises_only_format_error(doc: dict[str, Any]) -> None:
    try:
        normalize(doc)
    except FormatError:
        pass
