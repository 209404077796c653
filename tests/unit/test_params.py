"""ParamValidator: an agent's params against an action's declared input (docs/contract.md section 5)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from connectors.schema import (
    DEFAULT_MAX_PROBLEMS,
    MAX_HEADER_VALUE_BYTES,
    MAX_PATH_SEGMENT_BYTES,
    MAX_URL_BYTES,
    FieldProblem,
    ParamValidator,
    Problems,
    suggestion_for,
)
from connectors.spec import ActionSpec


def validator(fields: dict[str, Any], path: str = "POST /things") -> ParamValidator:
    return ParamValidator(ActionSpec.model_validate({"action": "act", "path": path, "input": fields}))


def check(
    fields: dict[str, Any], params: dict[str, Any], path: str = "POST /things"
) -> tuple[dict[str, Any], list[FieldProblem]]:
    return validator(fields, path).validate(params)


def codes(problems: list[FieldProblem]) -> dict[str, str]:
    return {p.field: p.code for p in problems}


def only_problem(fields: dict[str, Any], params: dict[str, Any]) -> FieldProblem:
    _, problems = check(fields, params)
    assert len(problems) == 1, problems
    return problems[0]


# -- types -----------------------------------------------------------------------------------

VALID = [
    ({"type": "string"}, "hello"),
    ({"type": "string"}, ""),
    ({"type": "integer"}, 42),
    ({"type": "integer"}, -7),
    ({"type": "number"}, 2.5),
    ({"type": "number"}, 3),
    ({"type": "boolean"}, False),
    ({"type": "enum", "values": ["low", "high"]}, "low"),
    ({"type": "enum", "values": [1, 2, 3]}, 2),
    ({"type": "datetime"}, "2024-06-15T10:00:00+08:00"),
    ({"type": "datetime"}, "2024-06-15T02:00:00Z"),
    ({"type": "date"}, "2024-06-15"),
    ({"type": "array", "items": {"type": "integer"}}, [1, 2, 3]),
    ({"type": "array", "items": {"type": "string"}}, []),
    ({"type": "object", "properties": {"city": {"type": "string"}}}, {"city": "Paris"}),
    ({"type": "object"}, {"anything": [1, {"x": None}]}),
]


@pytest.mark.parametrize("spec, value", VALID)
def test_value_of_the_declared_type_is_accepted_unchanged(spec: dict[str, Any], value: Any) -> None:
    cleaned, problems = check({"v": spec}, {"v": value})
    assert problems == []
    assert cleaned == {"v": value}


INVALID = [
    ({"type": "string"}, 5, "type", "string"),
    ({"type": "string"}, ["a"], "type", "string"),
    ({"type": "integer"}, "42", "type", "integer"),
    ({"type": "integer"}, 4.5, "type", "integer"),
    ({"type": "integer"}, True, "type", "integer"),
    ({"type": "integer"}, False, "type", "integer"),
    ({"type": "number"}, "2.5", "type", "number"),
    ({"type": "number"}, True, "type", "number"),
    ({"type": "number"}, float("nan"), "type", "number"),
    ({"type": "number"}, float("inf"), "type", "number"),
    ({"type": "boolean"}, 1, "type", "true or false"),
    ({"type": "boolean"}, "true", "type", "true or false"),
    ({"type": "enum", "values": [1, 2, 3]}, True, "enum", "one of"),
    ({"type": "enum", "values": [1, 2, 3]}, "2", "enum", "one of"),
    ({"type": "datetime"}, "yesterday", "format", "ISO 8601"),
    ({"type": "datetime"}, "2024-06-15T10:00:00", "format", "timezone"),
    ({"type": "datetime"}, 1718445600, "type", "date-time"),
    ({"type": "date"}, "15/06/2024", "format", "date"),
    ({"type": "date"}, "2024-02-30", "format", "date"),
    ({"type": "date"}, 20240615, "type", "date"),
    ({"type": "array", "items": {"type": "string"}}, "a,b", "type", "array"),
    ({"type": "object", "properties": {"city": {"type": "string"}}}, "Paris", "type", "object"),
]


@pytest.mark.parametrize("spec, value, code, words", INVALID)
def test_value_of_the_wrong_type_is_reported_for_its_field(
    spec: dict[str, Any], value: Any, code: str, words: str
) -> None:
    problem = only_problem({"v": spec}, {"v": value})
    assert (problem.field, problem.code) == ("v", code)
    assert words.lower() in problem.message.lower()


def test_booleans_are_not_integers_nor_numbers() -> None:
    _, problems = check({"count": {"type": "integer"}, "ratio": {"type": "number"}}, {"count": True, "ratio": False})
    assert codes(problems) == {"count": "type", "ratio": "type"}
    assert all("boolean" in p.message for p in problems)


def test_integral_float_is_accepted_as_an_integer() -> None:
    cleaned, problems = check({"n": {"type": "integer"}}, {"n": 3.0})
    assert problems == [] and cleaned["n"] == 3 and isinstance(cleaned["n"], int)


def test_enum_violation_is_reported_with_allowed_values() -> None:
    problem = only_problem({"priority": {"type": "enum", "values": ["low", "medium", "high"]}}, {"priority": "urgent"})
    assert problem.code == "enum"
    assert problem.allowed == ["low", "medium", "high"]
    assert "low, medium, high" in problem.message and "urgent" in problem.message
    assert problem.to_detail() == {
        "field": "priority",
        "code": "enum",
        "message": problem.message,
        "allowed": ["low", "medium", "high"],
    }


def test_array_items_are_checked_each_with_its_index() -> None:
    _, problems = check({"ids": {"type": "array", "items": {"type": "integer", "min": 1}}}, {"ids": [1, "two", 0, 4]})
    assert codes(problems) == {"ids[1]": "type", "ids[2]": "min"}


def test_object_properties_are_checked_with_dotted_names() -> None:
    fields = {
        "address": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "required": True},
                "zip": {"type": "string", "pattern": r"^\d{5}$"},
                "country": {"type": "string", "default": "FR"},
            },
        }
    }
    cleaned, problems = check(fields, {"address": {"zip": "ABCDE", "street": "x"}})
    assert codes(problems) == {"address.city": "required", "address.zip": "pattern", "address.street": "unknown"}
    cleaned, problems = check(fields, {"address": {"city": "Lyon"}})
    assert problems == [] and cleaned == {"address": {"city": "Lyon", "country": "FR"}}


# -- required, defaults, unknown ------------------------------------------------------------


def test_missing_required_fields_are_all_reported() -> None:
    _, problems = check({"title": {"required": True}, "body": {"required": True}, "tag": {}}, {})
    assert codes(problems) == {"title": "required", "body": "required"}
    assert all(p.message == "is required" for p in problems)


def test_defaults_are_applied_for_missing_fields_only() -> None:
    fields = {
        "priority": {"type": "enum", "values": ["low", "medium", "high"], "default": "medium"},
        "notify": {"type": "boolean", "default": False},
        "retries": {"type": "integer", "default": 0},
        "note": {"type": "string"},
    }
    cleaned, problems = check(fields, {})
    assert problems == []
    assert cleaned == {"priority": "medium", "notify": False, "retries": 0}
    cleaned, _ = check(fields, {"priority": "high", "notify": True})
    assert cleaned == {"priority": "high", "notify": True, "retries": 0}


def test_unknown_param_is_rejected_with_a_suggestion() -> None:
    _, problems = check(
        {"title": {"type": "string"}, "priority": {"type": "string"}}, {"title": "x", "priorty": "high"}
    )
    assert codes(problems) == {"priorty": "unknown"}
    assert "did you mean priority?" in problems[0].message


def test_unknown_param_without_close_match_lists_the_declared_ones() -> None:
    _, problems = check({"title": {}, "body": {}}, {"zzz": 1})
    assert codes(problems) == {"zzz": "unknown"}
    assert "declared: title, body" in problems[0].message


def test_unknown_param_on_an_action_without_input_is_rejected() -> None:
    _, problems = check({}, {"anything": 1})
    assert codes(problems) == {"anything": "unknown"}
    assert "none" in problems[0].message


def test_every_problem_is_reported_at_once() -> None:
    fields = {
        "title": {"required": True, "max_length": 5},
        "count": {"type": "integer", "min": 1},
        "level": {"type": "enum", "values": ["a", "b"]},
    }
    _, problems = check(fields, {"title": "too long title", "count": 0, "level": "c", "extra": 1})
    assert codes(problems) == {"title": "max_length", "count": "min", "level": "enum", "extra": "unknown"}


# -- bounds, patterns, null -----------------------------------------------------------------


@pytest.mark.parametrize(
    "spec, value, code",
    [
        ({"type": "integer", "min": 1}, 0, "min"),
        ({"type": "integer", "max": 10}, 11, "max"),
        ({"type": "number", "min": 0.5}, 0.25, "min"),
        ({"type": "number", "max": 1.5}, 1.75, "max"),
        ({"type": "string", "min_length": 3}, "ab", "min_length"),
        ({"type": "string", "max_length": 3}, "abcd", "max_length"),
        ({"type": "array", "items": {"type": "string"}, "min_length": 1}, [], "min_length"),
        ({"type": "array", "items": {"type": "string"}, "max_length": 2}, ["a", "b", "c"], "max_length"),
        ({"type": "string", "pattern": r"^TK-\d{4}$"}, "TK-12", "pattern"),
    ],
)
def test_bounds_and_patterns_are_enforced(spec: dict[str, Any], value: Any, code: str) -> None:
    problem = only_problem({"v": spec}, {"v": value})
    assert problem.code == code


@pytest.mark.parametrize(
    "spec, value",
    [
        ({"type": "integer", "min": 1, "max": 10}, 1),
        ({"type": "integer", "min": 1, "max": 10}, 10),
        ({"type": "string", "min_length": 3, "max_length": 3}, "abc"),
        ({"type": "string", "pattern": r"^TK-\d{4}$"}, "TK-0001"),
    ],
)
def test_values_on_the_bounds_are_accepted(spec: dict[str, Any], value: Any) -> None:
    assert check({"v": spec}, {"v": value})[1] == []


def test_bound_messages_name_the_limit() -> None:
    assert "at least 1" in only_problem({"n": {"type": "integer", "min": 1}}, {"n": 0}).message
    assert "at most 100 characters" in only_problem({"t": {"max_length": 100}}, {"t": "x" * 101}).message
    assert r"^TK-\d{4}$" in only_problem({"t": {"pattern": r"^TK-\d{4}$"}}, {"t": "nope"}).message


def test_null_is_refused_unless_the_field_is_nullable() -> None:
    _, problems = check({"note": {"type": "string"}}, {"note": None})
    assert codes(problems) == {"note": "null"}
    cleaned, problems = check({"note": {"type": "string", "nullable": True}}, {"note": None})
    assert problems == [] and cleaned == {"note": None}


def test_null_for_a_required_field_is_refused_unless_nullable() -> None:
    assert codes(check({"t": {"required": True}}, {"t": None})[1]) == {"t": "null"}
    assert check({"t": {"required": True, "nullable": True}}, {"t": None})[1] == []


def test_empty_path_parameter_is_refused() -> None:
    _, problems = check({"tid": {"type": "string"}}, {"tid": ""}, path="GET /tickets/{tid}")
    assert codes(problems) == {"tid": "min_length"}
    _, problems = check({"tid": {"type": "string", "nullable": True}}, {"tid": None}, path="GET /tickets/{tid}")
    assert codes(problems) == {"tid": "min_length"}


# -- sensitive values never echoed ------------------------------------------------------------

SECRET = "s3cr3t-Value-9F"


@pytest.mark.parametrize(
    "spec",
    [
        {"type": "string", "sensitive": True, "pattern": r"^\d{4}$"},
        {"type": "string", "sensitive": True, "max_length": 4},
        {"type": "string", "sensitive": True, "min_length": 40},
        {"type": "enum", "sensitive": True, "values": ["a", "b"]},
        {"type": "integer", "sensitive": True},
        {"type": "date", "sensitive": True},
        {"type": "datetime", "sensitive": True},
        {"type": "string", "sensitive": True, "in": "header", "name": "X-Token"},
    ],
)
def test_sensitive_value_never_appears_in_a_problem(spec: dict[str, Any]) -> None:
    value = SECRET + "\n" if spec.get("in") == "header" else SECRET
    _, problems = check({"token": spec}, {"token": value})
    assert problems, "the value should have been refused"
    rendered = repr(problems) + suggestion_for(problems) + repr([p.to_detail() for p in problems])
    assert SECRET not in rendered


def test_non_sensitive_value_is_shown_to_help_the_model() -> None:
    problem = only_problem({"code": {"pattern": r"^\d{4}$"}}, {"code": "12a4"})
    assert "12a4" in problem.message


@pytest.mark.parametrize(
    "spec, value",
    [
        ({"type": "array", "sensitive": True, "items": {"type": "string", "pattern": r"^\d+$"}}, [SECRET]),
        (
            {"type": "object", "sensitive": True, "properties": {"pin": {"type": "enum", "values": ["a", "b"]}}},
            {"pin": SECRET},
        ),
    ],
)
def test_values_inside_a_sensitive_array_or_object_never_appear_in_a_problem(spec: dict[str, Any], value: Any) -> None:
    _, problems = check({"secret": spec}, {"secret": value})
    assert problems
    assert SECRET not in repr(problems) + suggestion_for(problems)


# -- header-placed params -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "value", ["a\r\nX-Injected: 1", "line\nbreak", "carriage\rreturn", "nul\x00byte", "tab\tbed", "del\x7f"]
)
def test_header_param_with_control_characters_is_refused(value: str) -> None:
    problem = only_problem({"note": {"type": "string", "in": "header", "name": "X-Note"}}, {"note": value})
    assert (problem.field, problem.code) == ("note", "header")


def test_line_breaks_are_fine_outside_headers() -> None:
    assert check({"note": {"type": "string"}}, {"note": "line one\nline two\r\n"})[1] == []


# -- suggestion_for -----------------------------------------------------------------------------


def test_suggestion_names_every_field_with_its_problem() -> None:
    fields = {
        "title": {"required": True},
        "count": {"type": "integer", "max": 3},
        "level": {"type": "enum", "values": ["a", "b"]},
        "when": {"type": "date"},
    }
    _, problems = check(fields, {"count": 9, "level": "z", "when": "soon", "colour": "red"})
    text = suggestion_for(problems)
    for name in ("title", "count", "level", "when", "colour"):
        assert name in text
    assert "is required" in text and "at most 3" in text and "a, b" in text
    assert text.startswith("Fix these params")


def test_suggestion_counts_the_problems_it_does_not_list() -> None:
    fields = {f"f{i}": {"required": True} for i in range(11)}
    _, problems = check(fields, {})
    text = suggestion_for(problems)
    assert "(and 3 more)" in text


# -- never raises -----------------------------------------------------------------------------

KITCHEN_SINK = {
    "s": {"type": "string", "min_length": 1, "max_length": 20, "pattern": "^[a-z]+$"},
    "i": {"type": "integer", "min": 0, "max": 100},
    "n": {"type": "number", "min": -1.5, "max": 1.5, "nullable": True},
    "b": {"type": "boolean", "default": False},
    "e": {"type": "enum", "values": ["x", 1, True]},
    "dt": {"type": "datetime"},
    "d": {"type": "date"},
    "arr": {"type": "array", "items": {"type": "object", "properties": {"k": {"type": "integer"}}}, "max_length": 5},
    "obj": {"type": "object", "properties": {"inner": {"type": "array", "items": {"type": "string"}}}},
    "free": {"type": "object"},
    "h": {"type": "string", "in": "header", "name": "X-H", "sensitive": True},
    "pid": {"type": "string", "required": True},
}

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner, max_size=5),
    max_leaves=20,
)
param_keys = st.sampled_from(sorted(KITCHEN_SINK)) | st.text(max_size=10)
_SINK_VALIDATOR = validator(KITCHEN_SINK, path="PUT /things/{pid}")


@settings(max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(param_keys, json_values, max_size=8))
def test_random_json_params_never_raise(params: dict[str, Any]) -> None:
    cleaned, problems = _SINK_VALIDATOR.validate(params)
    assert isinstance(cleaned, dict) and isinstance(problems, list)
    assert all(isinstance(p, FieldProblem) for p in problems)
    assert set(cleaned) <= set(KITCHEN_SINK)
    suggestion_for(problems)
    if not problems:
        assert "pid" in cleaned


def test_huge_integer_for_a_number_field_is_a_problem_not_a_crash() -> None:
    _, problems = check({"n": {"type": "number", "max": 10}}, {"n": 10**400})
    assert codes(problems) == {"n": "max"}


# -- bounded work: wire sizes and the number of problems kept -----------------------------------

URL_FIELDS = {"tid": {"required": True}, "note": {"in": "header", "name": "X-Note"}, "q": {}}


def test_a_100k_path_parameter_is_a_problem_for_its_field() -> None:
    _, problems = check(URL_FIELDS, {"tid": "x" * 100_000}, path="GET /things/{tid}")
    assert [(p.field, p.code) for p in problems] == [("tid", "max_length")]
    assert str(MAX_PATH_SEGMENT_BYTES) in problems[0].message


def test_the_path_bound_counts_bytes_once_url_encoded() -> None:
    over = "é" * (MAX_PATH_SEGMENT_BYTES // 6 + 1)  # %C3%A9: 6 bytes each
    assert codes(check(URL_FIELDS, {"tid": over}, path="GET /things/{tid}")[1]) == {"tid": "max_length"}
    assert check(URL_FIELDS, {"tid": "x" * MAX_PATH_SEGMENT_BYTES}, path="GET /things/{tid}")[1] == []


def test_an_over_long_header_value_is_a_problem_for_its_field() -> None:
    too_long = {"tid": "1", "note": "n" * (MAX_HEADER_VALUE_BYTES + 1)}
    assert codes(check(URL_FIELDS, too_long, path="GET /things/{tid}")[1]) == {"note": "max_length"}
    on_bound = {"tid": "1", "note": "n" * MAX_HEADER_VALUE_BYTES}
    assert check(URL_FIELDS, on_bound, path="GET /things/{tid}")[1] == []


def test_query_params_that_make_the_url_too_long_are_a_problem_for_the_longest() -> None:
    _, problems = check(URL_FIELDS, {"tid": "1", "q": "q" * MAX_URL_BYTES}, path="GET /things/{tid}")
    assert codes(problems) == {"q": "max_length"} and "URL" in problems[0].message


def test_long_body_params_are_not_bounded_by_the_url() -> None:
    assert check({"text": {}}, {"text": "x" * 100_000}, path="POST /things")[1] == []


def test_125k_unknown_keys_keep_a_bounded_list_and_count_them_all() -> None:
    params = {f"k{i}": i for i in range(125_000)}
    _, problems = check({"title": {"required": True}}, params)
    assert isinstance(problems, Problems)
    assert len(problems) == DEFAULT_MAX_PROBLEMS
    assert problems.total == 125_001 and problems.more == 125_001 - DEFAULT_MAX_PROBLEMS
    assert f"(and {125_001 - 8} more)" in suggestion_for(problems)


def test_max_problems_sets_how_many_are_kept() -> None:
    fields = {f"f{i}": {"required": True} for i in range(10)}
    _, three = validator(fields).validate({}, max_problems=3)
    assert [p.field for p in three] == ["f0", "f1", "f2"] and three.total == 10
    _, every = validator(fields).validate({"x": 1}, max_problems=None)
    assert len(every) == every.total == 11


def test_a_missing_path_parameter_is_counted_once_when_the_list_is_full() -> None:
    _, problems = validator({"tid": {"required": True}}, path="GET /t/{tid}").validate(
        {f"k{i}": 1 for i in range(5)}, max_problems=2
    )
    assert problems.total == 6
