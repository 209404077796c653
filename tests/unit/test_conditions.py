"""Approval conditions (connectors/conditions.py): what they decide, what `reach validate` says about
them, what the router does with them, and that hostile text is refused with bounded work."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from connectors.catalog import build
from connectors.conditions import MAX_DEPTH, MAX_LENGTH, ConditionError, parse_condition
from connectors.loader import load_directory
from connectors.spec import FieldSpec
from workers.router.approval_parking import Park
from workers.router.decisions import Dispatch
from workers.router.intake import RawMessage
from workers.router.routing import Router

FIELDS = {
    "amount": FieldSpec(type="number", required=True),
    "count": FieldSpec(type="integer"),
    "currency": FieldSpec(type="enum", values=["EUR", "USD"]),
    "note": FieldSpec(type="string"),
    "urgent": FieldSpec(type="boolean"),
    "tags": FieldSpec(type="array", items=FieldSpec(type="string")),
}


@pytest.mark.parametrize(
    "text, params, expected",
    [
        ("amount > 500", {"amount": 500}, False),
        ("amount > 500", {"amount": 500.01}, True),
        ("amount >= 500", {"amount": 500}, True),
        ("100 < amount <= 500", {"amount": 300}, True),
        ("100 < amount <= 500", {"amount": 501}, False),
        ("amount > 500 and currency == 'EUR'", {"amount": 900, "currency": "USD"}, False),
        ("amount > 500 or currency == 'EUR'", {"amount": 10, "currency": "EUR"}, True),
        ("not (amount > 500)", {"amount": 10}, True),
        ("currency in ['EUR', 'USD']", {"currency": "USD"}, True),
        ("currency not in ('EUR',)", {"currency": "USD"}, True),
        ("'vip' in tags", {"tags": ["a", "vip"]}, True),
        ("urgent", {"urgent": True}, True),
        ("urgent", {"urgent": 1}, False),  # only the boolean true is true
        ("urgent == true", {"urgent": True}, True),
        ("amount > -1", {"amount": 0}, True),
        ("note == null", {}, True),  # a param left out is null
        ("amount > 500", {}, False),  # an ordering with a missing value is false
        ("amount > 'x'", {"amount": 5}, False),  # different kinds never order
        ("count == 1", {"count": True}, False),  # true is not 1
    ],
)
def test_conditions_decide_as_written(text: str, params: dict[str, Any], expected: bool) -> None:
    assert parse_condition(text).evaluate(params) is expected


@pytest.mark.parametrize(
    "text",
    [
        "amount.real > 1",  # attribute access
        "__import__('os').system('id')",  # a call
        "len(note) > 3",
        "tags[0] == 'a'",  # subscript
        "amount * 2 > 3",  # arithmetic
        "(lambda: 1)()",
        "[x for x in tags]",
        "f'{amount}' == '1'",
        "(x := 1)",
        "amount if urgent else 0",
        "{'a': 1}",
        "amount in [note]",  # lists hold literals only
        "(amount > 1) == true",  # a comparison is not an operand
        "-amount < 0",
        "b'x' == note",
        "...",
        "1 +",  # does not parse
        "",
    ],
)
def test_anything_outside_the_language_is_refused(text: str) -> None:
    with pytest.raises(ConditionError):
        parse_condition(text)


def test_hostile_text_is_refused_quickly_and_boundedly() -> None:
    started = time.monotonic()
    with pytest.raises(ConditionError, match="characters"):
        parse_condition("amount > " + "9" * (MAX_LENGTH + 1))
    with pytest.raises(ConditionError, match="characters"):
        parse_condition("note == '" + "x" * 10_000_000 + "'")
    with pytest.raises(ConditionError, match="nest"):
        parse_condition("(" * 400 + "urgent" + ")" * 400)  # the parser's own limit, or ours
    with pytest.raises(ConditionError, match="nest"):
        parse_condition("not " * (MAX_DEPTH + 1) + "urgent")
    with pytest.raises(ConditionError, match="nest"):
        parse_condition(" and ".join(["(urgent" for _ in range(60)]) + ")" * 60)
    with pytest.raises(ConditionError, match="at most"):
        parse_condition("count in [" + ",".join(["1"] * 101) + "]")
    with pytest.raises(ConditionError):
        parse_condition(42)
    assert time.monotonic() - started < 2


def test_within_the_bounds_deep_conditions_still_work() -> None:
    text = "not " * (MAX_DEPTH - 2) + "urgent"
    assert parse_condition(text).evaluate({"urgent": True}) is ((MAX_DEPTH - 2) % 2 == 0)


@pytest.mark.parametrize(
    "text, problem",
    [
        ("total > 5", "'total', which is not a declared param"),
        ("amount > 'x'", "amount is a number but is compared ('>') with 'x', a string"),
        ("note > 5", "note is a string but is compared ('>') with 5, a number"),
        ("currency == 'GBP'", "'GBP' is not one of the enum's values"),
        ("currency in ['EUR', 'GBP']", "'GBP' is not one of the enum's values"),
        ("amount in [1, 'two']", "compared ('in') with 'two'"),
        ("amount", "'amount' is a number param; compare it"),
        ("urgent > true", "'>' orders numbers or texts"),
        ("tags > 1", "'>' orders numbers or texts"),
        ("amount in 5", "needs a list of values"),
        ("1 in tags", "1 is a number but is compared ('in') with tags"),
        ("5", "a literal on its own is not a condition"),
    ],
)
def test_type_problems_name_what_is_wrong(text: str, problem: str) -> None:
    problems = parse_condition(text).type_problems(FIELDS)
    assert any(problem in p for p in problems), problems


@pytest.mark.parametrize(
    "text",
    ["amount > 500", "currency in ['EUR']", "urgent and count < 3", "note == null", "'a' in note", "'vip' in tags"],
)
def test_well_typed_conditions_have_no_problems(text: str) -> None:
    assert parse_condition(text).type_problems(FIELDS) == []


CATALOG = """\
connector:
  name: shop
  endpoint: http://127.0.0.1:9
  actions:
    - action: refund
      path: POST /refunds
      permission: write
      input:
        amount: {{ type: number, required: true }}
        card: {{ type: string, sensitive: true }}
      approval:
        when: "{when}"
        approvers: [{group}]
    - action: close
      path: POST /close
      permission: write
---
approvers:
  finance: [alice, bob]
---
agent_app:
  name: shopbot
  owners: [bob]
  connector_bindings:
    - connector: shop
      allowed_actions: [refund, close]
"""


def problems_of(tmp_path: Path, when: str, group: str = "finance") -> list[str]:
    (tmp_path / "c.yaml").write_text(CATALOG.format(when=when, group=group))
    _, problems = build(load_directory(tmp_path))
    return [str(p) for p in problems]


def test_validate_reports_an_unparsable_condition_with_its_line(tmp_path: Path) -> None:
    problems = problems_of(tmp_path, "amount >> 500")
    assert len(problems) == 1 and ":12: " in problems[0] and "approval.when" in problems[0], problems


def test_validate_reports_a_forbidden_construct_with_its_line(tmp_path: Path) -> None:
    problems = problems_of(tmp_path, "amount.real > 500")
    assert len(problems) == 1 and ":12: " in problems[0] and "attribute is not allowed" in problems[0], problems


def test_validate_reports_an_undeclared_param_with_its_line(tmp_path: Path) -> None:
    problems = problems_of(tmp_path, "total > 500")
    assert len(problems) == 1 and ":12: " in problems[0] and "'total'" in problems[0], problems


def test_validate_reports_a_wrongly_typed_comparison_with_its_line(tmp_path: Path) -> None:
    problems = problems_of(tmp_path, "amount > 'lots'")
    assert len(problems) == 1 and ":12: " in problems[0] and "a number but is compared" in problems[0], problems


def test_validate_reports_an_unknown_approver_group(tmp_path: Path) -> None:
    problems = problems_of(tmp_path, "amount > 500", group="treasury")
    assert len(problems) == 1 and ":13: " in problems[0] and "'treasury' is not declared" in problems[0], problems


def test_validate_reports_a_binding_condition_against_every_action_it_allows(tmp_path: Path) -> None:
    text = CATALOG.format(when="amount > 500", group="finance") + (
        "      approval: { when: 'amount > 5', approvers: [finance] }\n"
    )
    (tmp_path / "c.yaml").write_text(text)
    _, problems = build(load_directory(tmp_path))
    assert [p.line for p in problems] == [27] and "of close" in problems[0].message, problems


def test_an_approval_nobody_may_give_is_a_problem(tmp_path: Path) -> None:
    (tmp_path / "c.yaml").write_text(
        CATALOG.format(when="amount > 500", group="finance").replace("[bob]", "[alice, bob]")
    )
    _, problems = build(load_directory(tmp_path))
    assert len(problems) == 1 and "nobody may approve" in problems[0].message


def test_the_router_parks_above_the_threshold_and_dispatches_below(tmp_path: Path) -> None:
    (tmp_path / "c.yaml").write_text(CATALOG.format(when="amount > 500", group="finance"))
    catalog, problems = build(load_directory(tmp_path))
    assert problems == []
    router = Router(catalog, max_intent_bytes=65536)

    def decide(params: dict[str, Any], action: str = "refund") -> Any:
        body = json.dumps({"agent_id": "shopbot", "action": action, "params": params}).encode()
        return router.decide(RawMessage(body=body, received_at=time.time()))

    assert isinstance(decide({"amount": 500}), Dispatch)
    parked = decide({"amount": 501, "card": "4111"})
    assert isinstance(parked, Park)
    assert parked.job.params == {"amount": 501, "card": "4111"}  # the job as it will run
    assert parked.redacted_params == {"amount": 501, "card": "[redacted]"}  # what people are shown
    assert parked.policy.eligible == {"alice"} and parked.why == "amount > 500"
    assert isinstance(decide({}, action="close"), Dispatch)  # no approval on close
    assert catalog.approvals.keys() == {("shopbot", "shop", "refund")}
