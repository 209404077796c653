"""History in the catalog: ``entity:`` on fields, ``history:`` on actions (refused with file and
line when wrong), and what of a receipt a record keeps (connectors/history.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from connectors import history
from connectors.loader import load_directory
from connectors.spec import ActionSpec, FieldSpec
from tests.unit.test_catalog_validate import assert_reported, catalog_of, marked_lines, validate, write


def connector(fields: str, action_extra: str = "") -> str:
    return f"""\
connector:
  name: shop
  endpoint: http://127.0.0.1:8000
  actions:
    - action: create_order
      path: POST /orders
      permission: write
      input:
{fields}{action_extra}
"""


REFUSED = {
    "entity_on_a_number": (
        connector("""\
        amount:   #!
          type: number
          entity: amount
"""),
        ("entity", "string and integer"),
    ),
    "entity_on_an_object": (
        connector("""\
        customer:   #!
          type: object
          entity: customer
"""),
        ("entity", "string and integer"),
    ),
    "entity_name_not_a_name": (
        connector("""\
        order_id:
          type: string
          entity: "Order:1"   #!
"""),
        ("entity name",),
    ),
    "entity_nested_in_an_object": (
        connector(
            """\
        customer:
          type: object
          properties:
            id: { type: string, entity: customer }
""",
        ),
        ("top-level",),
    ),
    "history_retain_not_a_duration": (
        connector(
            """\
        order_id: { type: string }
""",
            """\
      history:
        retain: forever   #!
""",
        ),
        ("duration",),
    ),
    "history_retain_too_long": (
        connector(
            """\
        order_id: { type: string }
""",
            """\
      history:
        retain: 9999d   #!
""",
        ),
        ("retain",),
    ),
    "history_unknown_word": (
        connector(
            """\
        order_id: { type: string }
""",
            """\
      history: on   #!
""",
        ),
        ("history",),
    ),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_wrong_entity_or_history_is_refused_with_file_and_line(tmp_path: Path, case: str) -> None:
    text, fragments = REFUSED[case]
    path = write(tmp_path, "shop.yaml", text)
    lines = marked_lines(text)
    # the field's own key, or (a nested entity, a whole-field problem) the line pydantic names
    problems = sorted(load_directory(tmp_path).problems)
    assert problems, "nothing was refused"
    line = lines[0] if lines else problems[0].line
    assert_reported(tmp_path, path, line, *fragments)


def test_the_sensitive_entity_is_refused_at_its_field(tmp_path: Path) -> None:
    text = connector("""\
        card:   #!
          type: string
          sensitive: true
          entity: card
""")
    path = write(tmp_path, "shop.yaml", text)
    assert_reported(tmp_path, path, marked_lines(text)[0], "sensitive", "entity")


def test_entities_and_history_that_are_right_validate(tmp_path: Path) -> None:
    write(
        tmp_path,
        "shop.yaml",
        connector(
            """\
        order_id: { type: string, entity: order }
        customer_no: { type: integer, entity: customer }
        card: { type: string, sensitive: true }
""",
            """\
      output:
        order_id: { type: string, entity: order }
      history:
        retain: 90d
    - action: ping
      path: GET /ping
      history: off
""",
        ),
    )
    assert validate(tmp_path).exit_code == 0
    catalog = catalog_of(tmp_path)
    create = catalog.refs[("shop", "create_order")].action
    ping = catalog.refs[("shop", "ping")].action
    assert history.retention(create, 30 * 86400) == 90 * 86400
    assert history.retention(ping, 30 * 86400) is None
    default = ActionSpec(action="x")
    assert history.retention(default, 123) == 123


ORDER = ActionSpec(
    action="create_order",
    input={
        "order_id": FieldSpec(type="string", entity="order"),
        "customer": FieldSpec(type="integer", entity="customer"),
        "card": FieldSpec(type="string", sensitive=True),
        "address": FieldSpec(
            type="object",
            properties={"street": FieldSpec(type="string"), "pin": FieldSpec(type="string", sensitive=True)},
        ),
    },
    output={"order_id": FieldSpec(type="string", entity="order"), "total": FieldSpec(type="number")},
)


def test_a_record_keeps_declared_fields_only_and_redacts_sensitive_ones() -> None:
    params = {
        "order_id": "123",
        "customer": 7,
        "card": "4111 1111 1111 1111",
        "address": {"street": "Main", "pin": "0000", "extra": "x"},
        "undeclared": "leak",
    }
    data = {"order_id": "123", "total": 9.5, "internal": "secret answer"}
    rec = make(params, data)
    doc = json.loads(rec.body)
    assert doc["params"] == {
        "order_id": "123",
        "customer": 7,
        "card": "[redacted]",
        "address": {"street": "Main", "pin": "[redacted]"},
    }
    assert doc["data"] == {"order_id": "123", "total": 9.5}
    assert "4111" not in rec.body.decode() and "leak" not in rec.body.decode() and "secret" not in rec.body.decode()
    assert rec.entities == [("order", "123"), ("customer", "7")]  # the output's order 123 once


def test_an_action_without_output_keeps_no_data() -> None:
    action = ActionSpec(action="a", input={"x": FieldSpec(type="string")})
    assert history.project({"anything": 1}, action.output) is None


def test_a_huge_answer_is_left_out_and_the_record_stays_under_8_kb() -> None:
    rec = make({"order_id": "1"}, {"order_id": "1", "total": 1.0, "x": "y"}, data_total="9" * 50_000)
    assert len(rec.body) <= history.MAX_RECORD_BYTES
    doc = json.loads(rec.body)
    assert history.OMITTED_KEY in doc["data"] and doc["params"] == {"order_id": "1"}


def test_huge_params_are_left_out_too() -> None:
    action = ActionSpec(action="a", input={"note": FieldSpec(type="string")})
    rec = history.record(**base(action), params={"note": "n" * 100_000}, data=None)
    assert len(rec.body) <= history.MAX_RECORD_BYTES
    assert history.OMITTED_KEY in json.loads(rec.body)["params"]


def test_long_booleans_floats_and_lone_surrogates_are_not_indexed() -> None:
    assert history.index_value("x" * 257) is None
    assert history.index_value("é" * 129) is None  # 258 bytes
    assert history.index_value("x" * 256) == "x" * 256
    assert history.index_value(True) is None
    assert history.index_value(1.5) is None
    assert history.index_value("") is None
    assert history.index_value("\ud800") is None
    assert history.index_value(-12) == "-12"


def test_at_most_16_entities_are_indexed_per_receipt() -> None:
    fields = {f"f{i}": FieldSpec(type="string", entity=f"e{i}") for i in range(40)}
    action = ActionSpec(action="a", input=fields)
    values = history.entity_values(action, {f"f{i}": str(i) for i in range(40)}, None)
    assert len(values) == history.MAX_ENTITIES


def test_the_history_tool_is_reach__history_with_its_params() -> None:
    spec = history.tool()
    assert spec.name == "reach__history"
    props = spec.input_schema["properties"]
    assert set(props) == {"entity", "id", "action", "since", "status", "limit", "cursor"}
    assert props["limit"]["maximum"] == 50
    assert spec.input_schema["additionalProperties"] is False


def base(action: ActionSpec) -> dict[str, object]:
    return {
        "agent": "desk",
        "intent_id": "i-1",
        "connector": "shop",
        "action": action,
        "status": "succeeded",
        "code": None,
        "at": "2026-01-01T00:00:00.000Z",
        "at_ms": 1,
        "trace_id": "t",
        "retain_seconds": 60,
        "version": history.action_version(action),
    }


def make(params: dict[str, object], data: dict[str, object], data_total: object = None) -> history.Record:
    if data_total is not None:
        data = {**data, "total": data_total}
    return history.record(**base(ORDER), params=params, data=data)  # type: ignore[arg-type]
