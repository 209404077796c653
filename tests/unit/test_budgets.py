"""Value budgets without services: the catalog shape, `reach validate`'s checks, which receipts give
an amount back, the router's budget step (with a recording counter) and its scripts' keys."""

from __future__ import annotations

import json
import re
import textwrap
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from redis.crc import key_slot

from connectors.catalog import Catalog, build
from connectors.loader import load_directory
from connectors.spec import Binding, BudgetSpec, parse_budget_window
from producers.wire import ErrorCode
from workers.router.decisions import Answer, Dispatch
from workers.router.intake import RawMessage
from workers.router.routing import Router
from workers.settings import Settings
from workers.state import budgets as budgets_module
from workers.state import keys
from workers.state.approval_store import RETENTION_MS as APPROVALS_KEPT_MS
from workers.state.budgets import (
    BudgetVerdict,
    Exceeded,
    Spend,
    budget_index,
    budget_tag,
    gives_back,
    repeat_window_ms,
)
from workers.transport.receipts import build_receipt

CONNECTOR = """\
connector:
  name: payments
  endpoint: http://127.0.0.1:9
  actions:
    - action: refund
      path: POST /refunds
      permission: write
      input:
        order: { type: string, required: true }
        amount: { type: number, required: true }
        note: { type: string }
        count: { type: integer, default: 1 }
        maybe: { type: number }
    - action: lookup
      path: GET /orders
      input:
        order: { type: string, required: true }
"""


def catalog_with(binding_extra: str, documents: str = "") -> tuple[Catalog, list[str]]:
    return _build(
        CONNECTOR
        + "---\nagent_app:\n  name: bot\n  connector_bindings:\n    - connector: payments\n"
        + "      allowed_actions: [refund, lookup]\n"
        + textwrap.indent(textwrap.dedent(binding_extra), "      ")
        + documents
    )


def _build(text: str) -> tuple[Catalog, list[str]]:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "c.yaml").write_text(text)
        catalog, problems = build(load_directory(tmp))
    return catalog, [p.message for p in problems]


# -- the catalog shape --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "ms"),
    [("1d", 86_400_000), ("2s", 2000), ("10m", 600_000), ("1h", 3_600_000), ("day", 86_400_000), ("30 sec", 30_000)],
)
def test_budget_windows_are_written_like_rate_limits_and_durations(text: str, ms: int) -> None:
    assert parse_budget_window(text) == ms


@pytest.mark.parametrize("text", ["0d", "1w", "", "1.5h", "-1d", "367d", "１d", "1d2h", "99999999999999999999d"])
def test_a_bad_window_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="budget window"):
        parse_budget_window(text)


def test_one_mapping_or_a_list_of_them() -> None:
    one = Binding.model_validate(
        {"connector": "c", "allowed_actions": ["a"], "budget": {"param": "amount", "max": 500, "per": "1d"}}
    )
    many = Binding.model_validate(
        {
            "connector": "c",
            "allowed_actions": ["a"],
            "budget": [{"param": "amount", "max": 500, "per": "1d"}, {"param": "amount", "max": 50, "per": "1m"}],
        }
    )
    assert [b.per_ms for b in one.budget] == [86_400_000]
    assert [(b.max, b.on_exceed) for b in many.budget] == [(500, "reject"), (50, "reject")]


@pytest.mark.parametrize(
    "budget",
    [
        {"param": "amount", "max": 0, "per": "1d"},
        {"param": "amount", "max": -5, "per": "1d"},
        {"param": "amount", "max": float("nan"), "per": "1d"},
        {"param": "amount", "max": float("inf"), "per": "1d"},
        {"param": "amount", "max": 1e300, "per": "1d"},
        {"param": "amount", "max": "lots", "per": "1d"},
        {"param": "amount", "max": 5, "per": "whenever"},
        {"param": "amount", "max": 5, "per": "1d", "on_exceed": "ignore"},
        {"param": "amount", "max": 5, "per": "1d", "typo": 1},
        {"param": "a.b", "max": 5, "per": "1d"},
        {"param": "amount", "per": "1d"},
    ],
)
def test_a_bad_budget_is_refused(budget: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        BudgetSpec.model_validate(budget)


def test_two_budgets_counting_the_same_thing_are_refused() -> None:
    with pytest.raises(ValidationError, match="two budgets on amount per 24h|two budgets on amount"):
        Binding.model_validate(
            {
                "connector": "c",
                "allowed_actions": ["a"],
                "budget": [{"param": "amount", "max": 5, "per": "1d"}, {"param": "amount", "max": 9, "per": "24h"}],
            }
        )


# -- reach validate ----------------------------------------------------------------------


def test_a_budget_on_a_declared_numeric_param_is_valid_and_indexed_for_the_actions_that_have_it() -> None:
    catalog, problems = catalog_with("budget: {param: amount, max: 500, per: 1d}\n")
    assert problems == []
    index = budget_index(catalog)
    assert set(index) == {("bot", "payments", "refund")}  # lookup has no amount: not counted
    assert index[("bot", "payments", "refund")][0].on_exceed == "reject"


def test_on_exceed_approval_needs_an_approval_that_names_the_approvers() -> None:
    _, problems = catalog_with("budget: {param: amount, max: 500, per: 1d, on_exceed: approval}\n")
    assert len(problems) == 1 and "on_exceed: approval needs an approval:" in problems[0]
    catalog, problems = catalog_with(
        "budget: {param: amount, max: 500, per: 1d, on_exceed: approval}\n"
        "approval: {when: 'order == \"manual\"', approvers: [finance]}\n",
        "---\napprovers:\n  finance: [ann]\n",
    )
    assert problems == []
    assert budget_index(catalog)[("bot", "payments", "refund")][0].on_exceed == "approval"


@pytest.mark.parametrize(
    ("budget", "expected"),
    [
        ("{param: missing, max: 5, per: 1d}", "not an input of any action this binding allows"),
        ("{param: note, max: 5, per: 1d}", "is string, not integer or number"),
        ("{param: maybe, max: 5, per: 1d}", "must be required or have a default"),
    ],
)
def test_validate_checks_the_param_against_the_actions(budget: str, expected: str) -> None:
    _, problems = catalog_with(f"budget: {budget}\n")
    assert len(problems) == 1 and expected in problems[0]


def test_an_integer_param_with_a_default_may_be_counted() -> None:
    _, problems = catalog_with("budget: [{param: count, max: 5, per: 1h}, {param: amount, max: 5, per: 1h}]\n")
    assert problems == []


def test_validate_reports_a_bad_window() -> None:
    _, problems = catalog_with("budget: {param: amount, max: 5, per: fortnight}\n")
    assert len(problems) == 1 and "budget window 'fortnight'" in problems[0]


# -- which receipts give their amount back -------------------------------------------------


def receipt(code: ErrorCode | None, attempts: int = 1, deduplicated: bool = False) -> Any:
    return build_receipt(
        intent_id="i1",
        agent_id="bot",
        action="refund",
        connector="payments",
        trace_id="0" * 32,
        received_at=0.0,
        code=code,
        message="m",
        suggestion="s",
        attempts=attempts,
        deduplicated=deduplicated,
    )


@pytest.mark.parametrize(
    ("code", "attempts", "deduplicated", "back"),
    [
        (None, 1, False, False),  # it happened
        (ErrorCode.OUTCOME_UNKNOWN, 1, False, False),  # it may have happened: stays counted
        (ErrorCode.DOWNSTREAM_CONFLICT, 1, False, True),  # the system refused it
        (ErrorCode.DOWNSTREAM_UNREACHABLE, 3, False, True),
        (ErrorCode.DEADLINE_EXCEEDED, 0, False, True),  # the pool answered before calling
        (ErrorCode.IDEMPOTENCY_KEY_REUSED, 0, False, True),
        (ErrorCode.INTERNAL, 0, False, False),  # poison: earlier deliveries may have called
        (None, 0, True, True),  # a replayed outcome: the earlier intent was counted
    ],
)
def test_what_gives_an_amount_back(code: ErrorCode | None, attempts: int, deduplicated: bool, back: bool) -> None:
    assert gives_back(receipt(code, attempts, deduplicated)) is back


# -- the router's step ---------------------------------------------------------------------


class RecordingCounter:
    """A counter that says yes until ``room`` is spent (what Redis does, in one process)."""

    def __init__(self, room: float) -> None:
        self.room = room
        self.reserved: list[tuple[str, str, str, list[tuple[str, float]]]] = []
        self.refunded: list[str] = []

    def reserve(
        self, agent: str, connector: str, intent_id: str, tag: str, spends: Sequence[Spend], *, force: bool = False
    ) -> BudgetVerdict:
        total = sum(s.amount for s in spends)
        if total > self.room:
            return BudgetVerdict(False, (Exceeded(spends[0].budget, 4321, 77.0),))
        self.room -= total
        self.reserved.append((agent, connector, intent_id, [(s.budget.param, s.amount) for s in spends]))
        return BudgetVerdict(True)

    def refund(self, agent: str, connector: str, intent_id: str, tag: str, budgets: Sequence[BudgetSpec]) -> bool:
        self.refunded.append(intent_id)
        return True


def decide(catalog: Catalog, counter: RecordingCounter, params: Any, action: str = "payments.refund") -> Any:
    router = Router(catalog, max_intent_bytes=65536, budgets=counter)
    body = {"agent_id": "bot", "intent_id": "i-1", "action": action, "params": params}
    return router.decide(RawMessage(body=json.dumps(body).encode(), received_at=datetime.now(UTC).timestamp()))


@pytest.fixture(scope="module")
def budgeted() -> Catalog:
    catalog, problems = catalog_with("budget: {param: amount, max: 500, per: 1d}\n")
    assert problems == []
    return catalog


def test_an_intent_within_budget_is_counted_and_dispatched(budgeted: Catalog) -> None:
    counter = RecordingCounter(500)
    decision = decide(budgeted, counter, {"order": "o1", "amount": 120.5})
    assert isinstance(decision, Dispatch)
    assert counter.reserved == [("bot", "payments", "i-1", [("amount", 120.5)])]


def test_over_budget_is_budget_exceeded_with_retry_after(budgeted: Catalog) -> None:
    decision = decide(budgeted, RecordingCounter(100), {"order": "o1", "amount": 120})
    assert isinstance(decision, Answer) and decision.receipt.error is not None
    error = decision.receipt.error
    assert (error.code, error.retryable, error.retry_after_ms) == (ErrorCode.BUDGET_EXCEEDED, True, 4321)
    assert decision.receipt.status == "rejected" and "500 amount per 1d" in error.message


def test_an_action_without_the_param_is_not_counted(budgeted: Catalog) -> None:
    counter = RecordingCounter(0)
    assert isinstance(decide(budgeted, counter, {"order": "o1"}, "payments.lookup"), Dispatch)
    assert counter.reserved == []


@pytest.mark.parametrize(
    ("amount", "code", "field_code"),
    [
        (-1, ErrorCode.VALIDATION_FAILED, "min"),  # would refill the window
        (-1e308, ErrorCode.VALIDATION_FAILED, "min"),
        (10**400, ErrorCode.VALIDATION_FAILED, "max"),  # more than the whole budget: never fits
        (500.0001, ErrorCode.VALIDATION_FAILED, "max"),
        ("NaN", ErrorCode.VALIDATION_FAILED, "type"),  # the params schema refuses it first
        ("12", ErrorCode.VALIDATION_FAILED, "type"),
        (True, ErrorCode.VALIDATION_FAILED, "type"),
        (None, ErrorCode.VALIDATION_FAILED, "null"),
    ],
)
def test_hostile_amounts_are_refused_before_anything_is_counted(
    budgeted: Catalog, amount: Any, code: ErrorCode, field_code: str
) -> None:
    counter = RecordingCounter(10**9)
    decision = decide(budgeted, counter, {"order": "o1", "amount": amount})
    assert isinstance(decision, Answer) and decision.receipt.error is not None
    assert decision.receipt.error.code is code
    assert decision.receipt.error.details[0]["field"] == "amount"
    assert decision.receipt.error.details[0]["code"] == field_code
    assert counter.reserved == []


def test_non_finite_numbers_never_reach_the_budget(budgeted: Catalog) -> None:
    counter = RecordingCounter(10**9)
    router = Router(budgeted, max_intent_bytes=65536, budgets=counter)
    for literal in (b"NaN", b"Infinity", b"-Infinity", b"1e999"):
        body = b'{"agent_id":"bot","action":"payments.refund","params":{"order":"o","amount":' + literal + b"}}"
        decision = router.decide(RawMessage(body=body, received_at=0.0))
        assert isinstance(decision, Answer) and decision.receipt.error is not None
        assert decision.receipt.error.code is ErrorCode.INVALID_INTENT
    assert counter.reserved == []


@pytest.mark.parametrize("amount", [0, -0.0, 5e-324, 1e-300])
def test_an_amount_that_would_count_nothing_is_refused(budgeted: Catalog, amount: float) -> None:
    # it would run even with the window full: zero, subnormal, or lost in the window's float sum
    counter = RecordingCounter(0)
    decision = decide(budgeted, counter, {"order": "o1", "amount": amount})
    assert isinstance(decision, Answer) and decision.receipt.error is not None
    assert decision.receipt.error.code is ErrorCode.VALIDATION_FAILED
    assert decision.receipt.error.details[0]["code"] == "min"
    assert counter.reserved == []


def test_a_catalog_without_budgets_has_an_empty_index() -> None:
    catalog, problems = catalog_with("rate_limit: 10/min\n")
    assert problems == [] and budget_index(catalog) == {}


# -- the scripts' keys (Redis Cluster: KEYS only, one slot) --------------------------------

CALL = re.compile(r"redis\.call\('(?P<cmd>[A-Z]+)',\s*(?P<key>[^,)]+)")
ALIAS = re.compile(r"local (\w+) = KEYS\[[^\]]+\]")


@pytest.mark.parametrize("name", ["_RESERVE", "_REFUND"])
def test_every_key_a_script_touches_comes_from_keys(name: str) -> None:
    script = getattr(budgets_module, name)
    aliases = set(ALIAS.findall(script))
    calls = [c for c in CALL.finditer(script) if c["cmd"] != "TIME"]
    assert calls
    for call in calls:
        assert call["key"].strip() in aliases, f"{name}: {call[0]} names a key not from KEYS"


def test_an_intents_budget_keys_share_the_agents_slot() -> None:
    several = [*keys.budget("bot", "payments", "amount", 86_400_000), *keys.budget("bot", "payments", "count", 1000)]
    several.append(keys.budget_held("bot", "intent-1"))
    assert {key_slot(k.encode()) for k in several} == {key_slot(keys.receipt("bot", "x").encode())}
    assert keys.budget("bot", "payments", "amount", 1000) == (
        "reach:budget:{bot}:payments:amount:1000",
        "reach:budget-amounts:{bot}:payments:amount:1000",
    )


def test_the_contracts_budget_example_validates() -> None:
    contract = (Path(__file__).resolve().parents[2] / "docs" / "contract.md").read_text()
    block = re.search(r"```yaml\n(agent_app:\n(?:(?!```).)*?# one mapping, or a list of them.*?)```", contract, re.S)
    assert block is not None
    shop = CONNECTOR.replace("name: payments", "name: shop")
    catalog, problems = _build(shop + "---\n" + block.group(1) + "---\napprovers:\n  finance: [ann]\n")
    assert problems == []
    assert [(b.max, b.per_ms, b.on_exceed) for b in budget_index(catalog)[("shop_bot", "shop", "refund")]] == [
        (500, 86_400_000, "reject"),
        (100, 600_000, "approval"),
    ]


# -- review fixes: hard caps, several exceeded budgets, reused ids, nullable params ----------


class FixedCounter:
    """A counter that answers one verdict and records the tags it was asked with."""

    def __init__(self, verdict: BudgetVerdict) -> None:
        self.verdict = verdict
        self.calls: list[tuple[str, str, bool]] = []

    def reserve(
        self, agent: str, connector: str, intent_id: str, tag: str, spends: Sequence[Spend], *, force: bool = False
    ) -> BudgetVerdict:
        self.calls.append((intent_id, tag, force))
        return BudgetVerdict(True) if force else self.verdict

    def refund(self, agent: str, connector: str, intent_id: str, tag: str, budgets: Sequence[BudgetSpec]) -> bool:
        return False


def contract_catalog() -> Catalog:
    catalog, problems = catalog_with(
        "budget:\n"
        "  - { param: amount, max: 500, per: 1d }\n"
        "  - { param: amount, max: 100, per: 10m, on_exceed: approval }\n"
        "approval: { when: 'order == \"manual\"', approvers: [finance] }\n",
        "---\napprovers:\n  finance: [ann]\n",
    )
    assert problems == []
    return catalog


def test_an_amount_over_max_is_refused_even_when_a_person_could_approve() -> None:
    # a person approving 1e300 would have let it into the window, where it wiped out the total
    only_approval, problems = catalog_with(
        "budget: { param: amount, max: 100, per: 10m, on_exceed: approval }\n"
        "approval: { when: 'order == \"manual\"', approvers: [finance] }\n",
        "---\napprovers:\n  finance: [ann]\n",
    )
    assert problems == []
    counter = FixedCounter(BudgetVerdict(True))
    for catalog, amount in [(only_approval, 1e300), (only_approval, 100.5), (contract_catalog(), 400)]:
        decision = decide(catalog, counter, {"order": "o1", "amount": amount})
        assert isinstance(decision, Answer) and decision.receipt.error is not None, amount
        assert decision.receipt.error.code is ErrorCode.VALIDATION_FAILED
        assert decision.receipt.error.details[0] == {
            "field": "amount",
            "code": "max",
            "message": "must be at most 100",
        }
    assert counter.calls == []


def test_a_reject_budget_exceeded_is_a_hard_cap_even_when_an_approval_budget_frees_later() -> None:
    catalog = contract_catalog()
    daily, ten_minutes = budget_index(catalog)[("bot", "payments", "refund")]
    # both exceeded; the approval budget (listed first here) frees last
    verdict = BudgetVerdict(False, (Exceeded(ten_minutes, 500_000, 90.0), Exceeded(daily, 60_000, 450.0)))
    counter = FixedCounter(verdict)
    decision = decide(catalog, counter, {"order": "o1", "amount": 60})
    assert isinstance(decision, Answer) and decision.receipt.error is not None
    error = decision.receipt.error
    assert (error.code, error.retry_after_ms) == (ErrorCode.BUDGET_EXCEEDED, 60_000)
    assert "500 amount per 1d" in error.message
    assert [force for _, _, force in counter.calls] == [False]  # not counted past the cap for a person


def test_only_approval_budgets_exceeded_parks_the_intent_naming_each() -> None:
    catalog = contract_catalog()
    _, ten_minutes = budget_index(catalog)[("bot", "payments", "refund")]
    counter = FixedCounter(BudgetVerdict(False, (Exceeded(ten_minutes, 500_000, 90.0),)))
    decision = decide(catalog, counter, {"order": "o1", "amount": 60})
    assert type(decision).__name__ == "Park"
    assert "over the budget of 100 amount per 10m (90 counted)" in decision.why
    assert [force for _, _, force in counter.calls] == [False, True]


def test_a_reused_intent_id_with_another_payload_is_refused() -> None:
    counter = FixedCounter(BudgetVerdict(False, reused=True))
    decision = decide(contract_catalog(), counter, {"order": "o1", "amount": 60})
    assert isinstance(decision, Answer) and decision.receipt.error is not None
    assert decision.receipt.status == "rejected"
    assert decision.receipt.error.code is ErrorCode.INVALID_INTENT
    assert "reused with a different payload" in decision.receipt.error.message


def test_the_router_counts_under_the_tag_that_the_pool_and_approvals_give_back_with(budgeted: Catalog) -> None:
    counter = FixedCounter(BudgetVerdict(True))
    decision = decide(budgeted, counter, {"order": "o1", "amount": 60})
    assert isinstance(decision, Dispatch)
    job = decision.job
    tag = budget_tag(job.agent_id, job.connector, job.action, job.params, job.idempotency_key)
    assert counter.calls == [("i-1", tag, False)]
    other = decide(budgeted, counter, {"order": "o1", "amount": 61})
    assert isinstance(other, Dispatch) and counter.calls[-1][1] != tag  # the same id, another payload


@pytest.mark.parametrize(
    ("idempotency_ttl", "window_ms"),
    [("1h", 3_600_000), ("86399", 86_399_000), ("24h", APPROVALS_KEPT_MS), ("168h", APPROVALS_KEPT_MS)],
)
def test_a_repeat_counts_as_counted_only_while_the_ledger_and_its_approval_are_both_on_record(
    idempotency_ttl: str, window_ms: int
) -> None:
    # the shorter of REACH_IDEMPOTENCY_TTL and the approvals' retention (a day): a longer ledger
    # does not stretch it, since a repeat whose approval is forgotten would be parked again
    assert APPROVALS_KEPT_MS == 24 * 3600 * 1000
    settings = Settings.from_env({"REACH_IDEMPOTENCY_TTL": idempotency_ttl})
    assert repeat_window_ms(settings.idempotency_ttl_seconds) == window_ms


def test_validate_refuses_a_nullable_budget_param_with_its_line() -> None:
    import tempfile

    text = CONNECTOR.replace(
        "amount: { type: number, required: true }", "amount: { type: number, required: true, nullable: true }"
    ) + (
        "---\nagent_app:\n  name: bot\n  connector_bindings:\n    - connector: payments\n"
        "      allowed_actions: [refund]\n"
        "      budget: {param: amount, max: 5, per: 1d}\n"
    )
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "c.yaml").write_text(text)
        _, problems = build(load_directory(tmp))
    assert [(p.line, p.message) for p in problems] == [
        (
            text.splitlines().index("      budget: {param: amount, max: 5, per: 1d}") + 1,
            "budget param 'amount' of refund must not be nullable (budget 1)",
        )
    ]
