"""Step contracts checked when the catalog loads: each rule of a ``workflow:`` document has its own
fixture, and `reach validate` names the file and the line (marked ``#!`` in the fixture).

The shop below is valid; each test breaks one thing in its workflow and expects exactly the
problem it causes.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from connectors.catalog import build
from connectors.loader import Problem, load_directory
from connectors.workflows.references import Missing, Reference, Template, parse_value, resolve
from workers.cli import main

SHOP = """\
connector:
  name: shop
  endpoint: http://127.0.0.1:9
  idempotency_header: Idempotency-Key
  actions:
    - action: hold_order
      path: POST /holds
      permission: write
      input:
        order_id: { type: string, required: true }
      output:
        hold_id: { type: string, required: true }
        note: { type: string }
        level: { type: enum, values: [soft, hard], required: true }
        card: { type: string, required: true, sensitive: true }
        qty: { type: integer, required: true }
    - action: release_hold
      path: POST /holds/release
      permission: write
      input:
        hold_id: { type: string, required: true }
    - action: refund
      path: POST /refunds
      permission: write
      input:
        order_id: { type: string, required: true }
        amount: { type: number, required: true }
        level: { type: enum, values: [soft, hard, none] }
        memo: { type: string }
      output:
        refund_id: { type: string, required: true }
        count: { type: integer, required: true }
    - action: cancel_refund
      path: POST /refunds/cancel
      permission: write
      input:
        refund_id: { type: string, required: true }
    - action: notify
      path: POST /notify
      permission: write
      input:
        order_id: { type: string, required: true }
        text: { type: string, required: true }
        tags: { type: array, items: { type: string } }
---
connector:
  name: mail
  endpoint: http://127.0.0.1:9
  actions:
    - action: send
      path: POST /send
      permission: write
      input:
        text: { type: string, required: true }
    - action: unsend
      path: POST /unsend
      permission: write
      input:
        text: { type: string, required: true }
---
agent_app:
  name: support
  connector_bindings:
    - connector: shop
      allowed_actions: ["*"]
  workflows: [refund_order]
"""

WORKFLOW = """\
workflow:
  name: refund_order
  description: Hold the order, refund it, tell the customer.
  timeout: 10m
  input:
    order_id: { type: string, required: true }
    amount: { type: number, required: true }
    memo: { type: string }
  steps:
    - id: hold
      action: shop.hold_order
      params: { order_id: $input.order_id }
      compensate: { action: shop.release_hold, params: { hold_id: $steps.hold.hold_id } }
    - id: refund
      action: shop.refund
      params:
        order_id: $input.order_id
        amount: $input.amount
        level: $steps.hold.level
        memo: $input.memo ?? "none"
      compensate: { action: shop.cancel_refund, params: { refund_id: $steps.refund.refund_id } }
    - id: notify
      action: shop.notify
      params:
        order_id: $input.order_id
        text: "Refund {$steps.refund.refund_id} for {$input.order_id} ({$steps.hold.note ?? no note})"
  output:
    refund_id: $steps.refund.refund_id
"""


def problems_for(tmp_path: Path, workflow: str, shop: str = SHOP) -> tuple[list[Problem], int | None]:
    """The catalog's problems, and the line marked ``#!`` in the workflow file (None: no mark)."""
    (tmp_path / "shop.yaml").write_text(shop)
    text = textwrap.dedent(workflow)
    (tmp_path / "workflow.yaml").write_text(text)
    marked = [i + 1 for i, line in enumerate(text.splitlines()) if line.rstrip().endswith("#!")]
    result = load_directory(tmp_path)
    _, problems = build(result)
    return problems, (marked[0] if marked else None)


def one_problem(tmp_path: Path, workflow: str, *words: str, shop: str = SHOP) -> Problem:
    problems, line = problems_for(tmp_path, workflow, shop)
    assert len(problems) == 1, [str(p) for p in problems]
    problem = problems[0]
    for word in words:
        assert word in problem.message, str(problem)
    if line is not None:
        assert (problem.file.endswith("workflow.yaml"), problem.line) == (True, line), str(problem)
    return problem


def test_the_valid_workflow_loads_with_its_binding(tmp_path: Path) -> None:
    problems, _ = problems_for(tmp_path, WORKFLOW)
    assert problems == []
    catalog, _ = build(load_directory(tmp_path))
    assert catalog.allows_workflow("support", "refund_order")
    assert not catalog.allows_workflow("nobody", "refund_order")
    assert [s.id for s in catalog.workflows["refund_order"].steps] == ["hold", "refund", "notify"]


def test_reach_validate_passes_and_then_fails_with_file_and_line(tmp_path: Path) -> None:
    problems_for(tmp_path, WORKFLOW)
    assert CliRunner().invoke(main, ["validate", str(tmp_path)]).exit_code == 0
    broken = WORKFLOW.replace("$steps.refund.refund_id\n", "$steps.refund.refundId\n")
    (tmp_path / "workflow.yaml").write_text(broken)
    out = CliRunner().invoke(main, ["validate", str(tmp_path)])
    assert out.exit_code == 1
    assert "workflow.yaml:" in out.output and "refundId" in out.output


def test_a_field_the_source_step_does_not_declare(tmp_path: Path) -> None:
    wf = WORKFLOW.replace(
        "      compensate: { action: shop.cancel_refund, params: { refund_id: $steps.refund.refund_id } }",
        "      compensate: { action: shop.cancel_refund, params: { refund_id: $steps.refund.refundId } } #!",
    )
    one_problem(tmp_path, wf, "$steps.refund.refundId", "declares no field 'refundId'")


def test_a_reference_to_a_later_step(tmp_path: Path) -> None:
    wf = WORKFLOW.replace(
        "      params: { order_id: $input.order_id }\n", "      params: { order_id: $steps.refund.refund_id } #!\n"
    )
    one_problem(tmp_path, wf, "has not run yet")


def test_unknown_step_and_unknown_input(tmp_path: Path) -> None:
    wf = WORKFLOW.replace("        amount: $input.amount\n", "        amount: $input.amout #!\n")
    one_problem(tmp_path, wf, "$input.amout", "declares no field 'amout'")
    wf = WORKFLOW.replace("        level: $steps.hold.level\n", "        level: $steps.hodl.level #!\n")
    one_problem(tmp_path, wf, "there is no step 'hodl'")


def test_types_that_cannot_flow(tmp_path: Path) -> None:
    # a string into an enum
    wf = WORKFLOW.replace("        level: $steps.hold.level\n", "        level: $steps.hold.hold_id #!\n")
    one_problem(tmp_path, wf, "string cannot flow into an enum")
    # an integer into a string is refused too (no silent conversion)
    wf = WORKFLOW.replace('        memo: $input.memo ?? "none"\n', "        memo: $steps.hold.qty #!\n")
    one_problem(tmp_path, wf, "integer cannot flow into a string")
    wf = WORKFLOW.replace('        text: "Refund', '        tags: $steps.refund.refund_id #!\n        text: "Refund')
    one_problem(tmp_path, wf, "string cannot flow into an array")


def test_an_enum_whose_values_are_not_a_subset(tmp_path: Path) -> None:
    shop = SHOP.replace("level: { type: enum, values: [soft, hard, none] }", "level: { type: enum, values: [soft] }")
    wf = WORKFLOW.replace("        level: $steps.hold.level\n", "        level: $steps.hold.level #!\n")
    one_problem(tmp_path, wf, "['hard'] are not allowed", shop=shop)


def test_an_optional_source_into_a_required_target_needs_a_fallback(tmp_path: Path) -> None:
    notify = '        text: "Refund {$steps.refund.refund_id} for {$input.order_id} ({$steps.hold.note ?? no note})"\n'
    wf = WORKFLOW.replace(notify, "        text: $input.memo #!\n")
    one_problem(tmp_path, wf, "may be missing", "?? fallback")
    # inside a string too
    wf = WORKFLOW.replace(notify, '        text: "Memo: {$input.memo}" #!\n')
    one_problem(tmp_path, wf, "may be missing or null")
    # with the fallback it loads
    wf = WORKFLOW.replace(notify, '        text: $input.memo ?? "no memo"\n')
    assert problems_for(tmp_path, wf)[0] == []
    # an optional input into an optional param needs none: left out when the agent leaves it out
    wf = WORKFLOW.replace('        memo: $input.memo ?? "none"\n', "        memo: $input.memo\n")
    assert problems_for(tmp_path, wf)[0] == []


def test_a_declared_output_field_is_always_there(tmp_path: Path) -> None:
    """The pool refuses an answer without every declared output field, so a field the output does
    not mark required still flows into a required param without ``??`` (null still needs one)."""
    notify = '        text: "Refund {$steps.refund.refund_id} for {$input.order_id} ({$steps.hold.note ?? no note})"\n'
    wf = WORKFLOW.replace(notify, "        text: $steps.hold.note\n")
    assert problems_for(tmp_path, wf)[0] == []


def test_a_nullable_source_into_a_field_that_is_not(tmp_path: Path) -> None:
    shop = SHOP.replace(
        "hold_id: { type: string, required: true }\n        note",
        "hold_id: { type: string, required: true, nullable: true }\n        note",
    )
    wf = WORKFLOW.replace(
        "      compensate: { action: shop.release_hold, params: { hold_id: $steps.hold.hold_id } }",
        "      compensate: { action: shop.release_hold, params: { hold_id: $steps.hold.hold_id } } #!",
    )
    one_problem(tmp_path, wf, "may be null", shop=shop)


def test_a_required_param_left_unmapped_and_an_undeclared_name(tmp_path: Path) -> None:
    wf = WORKFLOW.replace("        amount: $input.amount\n", "")
    wf = wf.replace("      action: shop.refund\n      params:\n", "      action: shop.refund\n      params: #!\n")
    one_problem(tmp_path, wf, "needs param 'amount'")
    wf = WORKFLOW.replace("        amount: $input.amount\n", "        amount: $input.amount\n        amonut: 3 #!\n")
    one_problem(tmp_path, wf, "has no param 'amonut'")


def test_a_literal_that_does_not_fit(tmp_path: Path) -> None:
    wf = WORKFLOW.replace("        amount: $input.amount\n", "        amount: lots #!\n")
    one_problem(tmp_path, wf, "the literal does not fit")


def test_a_sensitive_source_into_a_field_that_is_not(tmp_path: Path) -> None:
    wf = WORKFLOW.replace('        memo: $input.memo ?? "none"\n', "        memo: $steps.hold.card #!\n")
    one_problem(tmp_path, wf, "is sensitive")


def test_a_compensation_that_is_not_safe_to_repeat(tmp_path: Path) -> None:
    shop = SHOP.replace("  idempotency_header: Idempotency-Key\n", "")
    wf = WORKFLOW.replace(
        "      compensate: { action: shop.release_hold", "      compensate: { action: shop.release_hold"
    ).replace(
        "      compensate: { action: shop.cancel_refund, params: { refund_id: $steps.refund.refund_id } }",
        "      compensate: { action: shop.cancel_refund, params: { refund_id: $steps.refund.refund_id } } #!",
    )
    problems, line = problems_for(tmp_path, wf, shop)
    assert sorted(p.message.split(" undoes")[0] for p in problems) == ["shop.cancel_refund", "shop.release_hold"]
    assert line in [p.line for p in problems]


def test_a_write_without_compensate_must_come_last(tmp_path: Path) -> None:
    wf = WORKFLOW.replace(
        "      compensate: { action: shop.release_hold, params: { hold_id: $steps.hold.hold_id } }\n", ""
    )
    wf = wf.replace("    - id: hold\n", "    - id: hold #!\n")
    one_problem(tmp_path, wf, "step 'hold' writes and has no compensate", "must come last")


def test_an_agent_bound_to_the_workflow_but_not_to_every_action(tmp_path: Path) -> None:
    shop = SHOP.replace(
        '      allowed_actions: ["*"]', "      allowed_actions: [hold_order, refund, notify, cancel_refund]"
    )
    problems, _ = problems_for(tmp_path, WORKFLOW, shop)
    assert [p.message for p in problems] == [
        "agent 'support' runs workflow 'refund_order' but may not call shop.release_hold"
    ]
    assert (
        problems[0].file.endswith("shop.yaml")
        and problems[0].line == shop.splitlines().index("  workflows: [refund_order]") + 1
    )


def test_a_step_approval_that_outlasts_the_workflow(tmp_path: Path) -> None:
    shop = SHOP.replace(
        "      path: POST /refunds\n",
        "      path: POST /refunds\n      approval: { required: true, approvers: [finance], expires: 1h }\n",
    )
    shop += "---\napprovers:\n  groups:\n    finance: [ann]\n"
    problems, _ = problems_for(tmp_path, WORKFLOW, shop)
    messages = [p.message for p in problems]
    assert any("shop.refund waits up to 3600s for approval" in m for m in messages), messages


def test_unknown_workflow_on_an_agent_and_an_unknown_action(tmp_path: Path) -> None:
    shop = SHOP.replace("  workflows: [refund_order]", "  workflows: [refund_ordr]")
    problems, _ = problems_for(tmp_path, WORKFLOW, shop)
    assert any("no workflow 'refund_ordr'" in p.message for p in problems)
    wf = WORKFLOW.replace("      action: shop.notify\n", "      action: shop.notfy #!\n")
    one_problem(tmp_path, wf, "has no action 'notfy'")


def test_a_workflow_named_like_an_action(tmp_path: Path) -> None:
    shop = SHOP.replace("  workflows: [refund_order]", "  workflows: [notify]")
    wf = WORKFLOW.replace("  name: refund_order\n", "  name: notify #!\n")
    one_problem(tmp_path, wf, "has the name of an action", shop=shop)


@pytest.mark.parametrize(
    "text, message",
    [
        ("$input", "is not a reference"),
        ("$steps.hold", "names a step but no field"),
        ("$input.a ?? [1]", "must be a literal"),
        ("$input.a ?? $input.b", "must be a literal"),
        ("x {$input.a", "unclosed"),
        ("$input.a.b c", "is not a reference"),
    ],
)
def test_malformed_references_are_refused(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_value(text)


def test_values_resolve_with_fallbacks_and_templates() -> None:
    inputs = {"order_id": "o-1", "tags": ["a", "b"]}
    steps = {"hold": {"hold_id": "h-9", "note": None, "n": 3}}
    assert resolve(parse_value("$steps.hold.hold_id"), inputs, steps) == "h-9"
    assert resolve(parse_value("$steps.hold.note ?? 'none'"), inputs, steps) == "none"
    assert resolve(parse_value("$steps.hold.note"), inputs, steps) is None  # a declared null flows as null
    assert resolve(parse_value("$input.tags.1"), inputs, steps) == "b"
    assert resolve(parse_value("{$input.order_id}/{$steps.hold.n}"), inputs, steps) == "o-1/3"
    assert resolve(parse_value({"a": ["$input.order_id", 1]}), inputs, steps) == {"a": ["o-1", 1]}
    assert resolve(parse_value("$$input.x"), inputs, steps) == "$input.x"
    with pytest.raises(Missing) as missing:
        resolve(parse_value("$steps.hold.stock_level"), inputs, steps)
    assert missing.value.reference == "$steps.hold.stock_level"
    assert isinstance(parse_value("a {$input.x} b"), Template)
    # params: an optional input the agent left out is left out; a step's declared field missing
    # from its answer (or its whole answer gone) is a broken contract, named
    params = parse_value({"order_id": "$input.order_id", "memo": "$input.memo"})
    assert resolve(params, inputs, steps) == {"order_id": "o-1"}
    for broken in ({"level": "$steps.hold.level"}, {"id": "$steps.gone.hold_id"}, {"memo": "memo: {$input.memo}"}):
        with pytest.raises(Missing):
            resolve(parse_value(broken), inputs, steps)
    assert isinstance(parse_value("$input.x ?? 3"), Reference)


def test_a_workflow_is_a_tool_of_the_agents_bound_to_it(tmp_path: Path) -> None:
    problems_for(tmp_path, WORKFLOW)
    catalog, _ = build(load_directory(tmp_path))
    tools = {t.name: t for t in catalog.tools_for("support")}
    assert tools["refund_order"].description.startswith("Hold the order")
    schema = tools["refund_order"].input_schema
    assert schema["required"] == ["order_id", "amount"] and set(schema["properties"]) == {"order_id", "amount", "memo"}
    assert "refund_order" in {t.name for t in catalog.all_tools()}
    assert "refund_order" not in {t.name for t in catalog.tools_for("stranger")}
