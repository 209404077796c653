"""HttpAdapter against hostile sizes: over-long params and answers too deep or too large to pass on.

The system is an ``httpx.MockTransport``, so each test sees exactly what would have been sent.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from connectors.adapters.base import CallContext, Outcome
from connectors.adapters.http import DEFAULT_MAX_DEPTH, HttpAdapter
from connectors.adapters.json_nesting import json_depth
from connectors.schema import DEFAULT_MAX_PROBLEMS, MAX_HEADER_VALUE_BYTES, MAX_PATH_SEGMENT_BYTES
from connectors.spec import ConnectorSpec
from producers.wire import ErrorCode

GET_ONE = {
    "action": "get_thing",
    "path": "GET /things/{tid}",
    "permission": "read",
    "input": {"tid": {"required": True}, "note": {"in": "header", "name": "X-Note"}, "q": {}},
}
CREATE = {
    "action": "create_thing",
    "path": "POST /things",
    "permission": "write",
    "idempotent": False,
    "input": {"name": {}},
}
READ_WITH_OUTPUT = {
    "action": "read_thing",
    "path": "GET /thing",
    "permission": "read",
    "output": {"a": {"type": "object"}},
}
READ = {"action": "read_any", "path": "GET /any", "permission": "read"}


class System:
    """A mock downstream: answers ``status``/``content`` and keeps every request it got."""

    def __init__(self, content: bytes = b"{}", status: int = 200, headers: dict[str, str] | None = None) -> None:
        self.content, self.status, self.headers = content, status, headers or {}
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return httpx.Response(self.status, content=self.content, headers=self.headers)


def call(
    system: System, action: str, params: dict[str, Any] | None = None, ctx: CallContext | None = None, **adapter: Any
) -> Outcome:
    spec = ConnectorSpec.model_validate(
        {"name": "sys", "endpoint": "http://sys.example", "actions": [GET_ONE, CREATE, READ_WITH_OUTPUT, READ]}
    )
    client = HttpAdapter(spec, environ={}, transport=httpx.MockTransport(system), **adapter)
    try:
        found = spec.action(action)
        assert found is not None
        return client.call(found, params or {}, ctx or CallContext("intent-1"))
    finally:
        client.close()


def nested(levels: int) -> bytes:
    """An object whose ``a`` holds arrays ``levels - 1`` deep: ``levels`` levels in all."""
    return b'{"a":' + b"[" * (levels - 1) + b"]" * (levels - 1) + b"}"


# -- over-long params never raise and are never sent --------------------------------------------


def test_a_100k_path_parameter_is_refused_unsent_naming_the_field() -> None:
    system = System()
    outcome = call(system, "get_thing", {"tid": "x" * 100_000})
    assert outcome.code is ErrorCode.VALIDATION_FAILED and not outcome.sent
    assert [(d["field"], d["code"]) for d in outcome.details] == [("tid", "max_length")]
    assert system.requests == []


def test_a_path_parameter_past_the_bound_only_once_encoded_is_refused() -> None:
    system = System()
    outcome = call(system, "get_thing", {"tid": "é" * (MAX_PATH_SEGMENT_BYTES // 6 + 1)})  # 6 bytes each, encoded
    assert outcome.code is ErrorCode.VALIDATION_FAILED and outcome.details[0]["field"] == "tid"
    assert system.requests == []


def test_a_path_parameter_on_the_bound_is_sent() -> None:
    system = System()
    assert call(system, "get_thing", {"tid": "x" * MAX_PATH_SEGMENT_BYTES}).ok
    assert len(system.requests) == 1


def test_an_over_long_header_value_is_refused_unsent_naming_the_field() -> None:
    system = System()
    outcome = call(system, "get_thing", {"tid": "1", "note": "n" * (MAX_HEADER_VALUE_BYTES + 1)})
    assert outcome.code is ErrorCode.VALIDATION_FAILED and not outcome.sent
    assert outcome.details[0]["field"] == "note"
    assert system.requests == []


@pytest.mark.parametrize("size", [9_000, 100_000])  # past ours; past httpx's own 64 KiB
def test_an_over_long_query_string_is_refused_unsent(size: int) -> None:
    system = System()
    outcome = call(system, "get_thing", {"tid": "1", "q": "q" * size})
    assert outcome.code is ErrorCode.VALIDATION_FAILED and not outcome.sent
    assert system.requests == []


# -- answers nested too deep ---------------------------------------------------------------------


@pytest.mark.parametrize("levels", [300, 100_000])  # past orjson's 254; past Python's recursion limit
def test_a_deep_answer_to_a_write_keeps_the_success_with_a_marker(levels: int) -> None:
    system = System(nested(levels), status=201)
    outcome = call(system, "create_thing", {"name": "n"})
    assert outcome.ok and outcome.code is None and outcome.http_status == 201
    reason = f"the system's answer nests {levels} levels; the limit is {DEFAULT_MAX_DEPTH}"
    assert outcome.data == {"_reach_omitted": reason, "bytes": len(system.content)}
    assert len(system.requests) == 1
    json.dumps(outcome.data)  # the receipt can carry it


def test_a_deep_answer_to_a_read_without_declared_output_succeeds_with_the_marker() -> None:
    outcome = call(System(nested(40)), "read_any")
    assert outcome.ok and "nests 40 levels" in outcome.data["_reach_omitted"]


def test_a_deep_answer_to_a_read_with_declared_output_is_a_contract_violation() -> None:
    outcome = call(System(nested(300)), "read_thing")
    assert outcome.code is ErrorCode.DOWNSTREAM_CONTRACT_VIOLATION and "nests 300 levels" in outcome.message


def test_an_answer_on_the_depth_limit_is_passed_on_whole() -> None:
    outcome = call(System(nested(DEFAULT_MAX_DEPTH)), "create_thing")
    assert outcome.ok and "a" in outcome.data


def test_a_top_level_array_counts_the_result_wrapper_as_a_level() -> None:
    within = b"[" * (DEFAULT_MAX_DEPTH - 1) + b"]" * (DEFAULT_MAX_DEPTH - 1)
    assert "result" in call(System(within), "read_any").data
    past = b"[" * DEFAULT_MAX_DEPTH + b"]" * DEFAULT_MAX_DEPTH
    assert "_reach_omitted" in call(System(past), "read_any").data


def test_brackets_inside_strings_are_not_nesting() -> None:
    body = json.dumps({"a": "[" * 500, "b": 'x\\"{{{{' + "{" * 500, "c": "\\"}).encode()
    outcome = call(System(body), "create_thing")
    assert outcome.ok and outcome.data == json.loads(body)


def test_the_depth_limit_comes_from_the_constructor_or_the_call_context() -> None:
    body = nested(5)
    assert "_reach_omitted" in call(System(body), "read_any", max_depth=4).data
    assert "_reach_omitted" in call(System(body), "read_any", ctx=CallContext("i", max_depth=4)).data
    assert "a" in call(System(body), "read_any", ctx=CallContext("i", max_depth=5), max_depth=4).data


def test_a_deep_error_answer_maps_by_its_status() -> None:
    outcome = call(System(nested(300), status=503), "read_any")
    assert outcome.code is ErrorCode.DOWNSTREAM_ERROR and "503" in outcome.message


@pytest.mark.parametrize(
    "text, depth",
    [
        (b"{}", 1),
        (b'{"a":[1,{"b":[]}]}', 4),
        (b"[[],[[]]]", 3),
        (b'"[[["', 0),
        (b'["\\\\", [[]]]', 3),
        (b'["\\"[[[", {}]', 2),
        (b'{"a": "\\\\\\"]]]["}', 1),
    ],
)
def test_json_depth_counts_only_brackets_outside_strings(text: bytes, depth: int) -> None:
    assert json_depth(text) == depth


# -- answers too large ---------------------------------------------------------------------------


def test_an_oversized_answer_to_a_write_keeps_the_success_with_a_marker() -> None:
    system = System(b'{"blob":"' + b"x" * 5000 + b'"}', status=201)
    outcome = call(system, "create_thing", max_response_bytes=1024)
    assert outcome.ok and outcome.http_status == 201
    assert outcome.data == {
        "_reach_omitted": "the system's answer is larger than 1024 bytes, the limit",
        "bytes": len(system.content),
    }


def test_an_oversized_error_answer_maps_by_its_status() -> None:
    outcome = call(System(b"x" * 5000, status=500), "read_any", max_response_bytes=1024)
    assert outcome.code is ErrorCode.DOWNSTREAM_ERROR and outcome.http_status == 500


def test_an_answer_breaking_the_declared_output_in_many_ways_keeps_a_bounded_list() -> None:
    strays = json.dumps({"a": {f"k{i}": i for i in range(60_000)}}).encode()  # each an unknown property
    spec = ConnectorSpec.model_validate(
        {
            "name": "sys",
            "endpoint": "http://sys.example",
            "actions": [
                {
                    "action": "read_thing",
                    "path": "GET /thing",
                    "permission": "read",
                    "output": {"a": {"type": "object", "properties": {"x": {}}}},
                }
            ],
        }
    )
    client = HttpAdapter(spec, environ={}, transport=httpx.MockTransport(System(strays)))
    try:
        outcome = client.call(spec.actions[0], {}, CallContext("intent-1"))
    finally:
        client.close()
    assert outcome.code is ErrorCode.DOWNSTREAM_CONTRACT_VIOLATION
    assert len(outcome.details) == DEFAULT_MAX_PROBLEMS
