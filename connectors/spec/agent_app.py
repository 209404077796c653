"""An agent app and its bindings: which actions of which connectors it may use, at what rate,
in which hours, under which approval and within which value budgets."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, field_validator

from connectors.rates import parse_rate
from connectors.spec.action import ApprovalSpec
from connectors.spec.base import PERSON_PATTERN, Spec, check_hours
from connectors.spec.connector import ConnectorSpec
from producers.wire import AGENT_ID_PATTERN, NAME_RULE

# an agent named "intent" could bind its receipts back into reach.intents (routing key "intent")
RESERVED_AGENT_NAMES = frozenset({"intent"})
BUDGET_WINDOW = re.compile(r"^\s*([0-9]*)\s*(s|sec|m|min|h|hour|d|day)\s*$")
_WINDOW_MS = {"s": 1000, "sec": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000, "hour": 3_600_000}
_WINDOW_MS |= {"d": 86_400_000, "day": 86_400_000}
MAX_BUDGET_WINDOW_MS = 366 * 86_400_000
# amounts are summed as doubles in Redis: beyond 2**53 whole units they stop being exact
MAX_BUDGET = float(2**53)


def parse_budget_window(text: str) -> int:
    """``"1d"`` -> 86400000 (ms). The units of rate limits (``sec``, ``min``, ``hour``) and of
    durations (``s``, ``m``, ``h``), plus ``d``/``day``; a missing count is 1 (``per: day``)."""
    match = BUDGET_WINDOW.match(text) if isinstance(text, str) else None
    if not match or (match.group(1) and int(match.group(1)) == 0):
        raise ValueError(f"budget window {text!r} must look like 30s, 10m, 1h, 1d (or sec, min, hour, day)")
    ms = int(match.group(1) or 1) * _WINDOW_MS[match.group(2)]
    if ms > MAX_BUDGET_WINDOW_MS:
        raise ValueError(f"budget window {text!r} is longer than 366 days")
    return ms


class BudgetSpec(Spec):
    """A value budget on a binding: the sum of ``param`` over the last ``per`` stays at most ``max``
    (docs/contract.md "Value budgets")."""

    param: str
    max: float = Field(gt=0, le=MAX_BUDGET, allow_inf_nan=False)
    per: str
    on_exceed: Literal["reject", "approval"] = "reject"

    @field_validator("param")
    @classmethod
    def _param(cls, v: str) -> str:
        if not re.match(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$", v):
            raise ValueError(f"budget param {v!r} must be an input name (letters, digits, _)")
        return v

    @field_validator("per")
    @classmethod
    def _per(cls, v: str) -> str:
        parse_budget_window(v)
        return v

    @property
    def per_ms(self) -> int:
        return parse_budget_window(self.per)


class Binding(Spec):
    """What one agent app may do on one connector."""

    connector: str
    allowed_actions: list[str] = Field(min_length=1)
    rate_limit: str | None = None
    audit_level: Literal["full", "summary", "none"] = "full"
    allowed_hours: str | None = None
    approval: ApprovalSpec | None = None  # for this agent, instead of the action's own
    # one mapping or a list of them; always a list here
    budget: list[BudgetSpec] = Field(default_factory=list, max_length=8)

    @field_validator("budget", mode="before")
    @classmethod
    def _budget_list(cls, v: Any) -> Any:
        return [v] if isinstance(v, dict) else v

    @field_validator("budget")
    @classmethod
    def _distinct_budgets(cls, v: list[BudgetSpec]) -> list[BudgetSpec]:
        # a budget is counted under its param and window: two with both equal would share one count
        seen = set()
        for budget in v:
            if (budget.param, budget.per_ms) in seen:
                raise ValueError(f"two budgets on {budget.param} per {budget.per}")
            seen.add((budget.param, budget.per_ms))
        return v

    @field_validator("rate_limit")
    @classmethod
    def _rate(cls, v: str | None) -> str | None:
        if v is not None:
            parse_rate(v)  # its ValueError says what is wrong
        return v

    @field_validator("allowed_hours")
    @classmethod
    def _hours(cls, v: str | None) -> str | None:
        return check_hours(v)


class AgentApp(Spec):
    name: str
    description: str | None = None
    # semantic routing prefers connectors of this domain for the agent's bare actions
    domain: str | None = None
    connector_bindings: list[Binding] = Field(default_factory=list)
    # the people answerable for this agent: none of them may approve its intents
    owners: list[str] = Field(default_factory=list, max_length=100)
    # the workflows (``workflow:`` documents) this agent may start, by name
    workflows: list[str] = Field(default_factory=list, max_length=200)

    @field_validator("owners")
    @classmethod
    def _owners(cls, v: list[str]) -> list[str]:
        for person in v:
            if not PERSON_PATTERN.match(person):
                raise ValueError(f"owner {person!r} must be 1-128 letters, digits or . _ @ + - (a login or an email)")
        return v

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        # no dots: receipts route by "<agent>" and "<agent>.<suffix>", so agent "a" could read
        # the receipts of an agent "a.b"; no ':': Redis keys start with "<agent>:"
        if not AGENT_ID_PATTERN.match(v):
            raise ValueError(f"agent name {v!r} must be {NAME_RULE} (pattern ^[a-z][a-z0-9_]{{0,62}}$)")
        if v in RESERVED_AGENT_NAMES:
            raise ValueError(f"agent name {v!r} is reserved")
        return v


def budget_problems(binding: Binding, connector: ConnectorSpec) -> list[tuple[int, str]]:
    """What is wrong with a binding's budgets against its connector, as (budget index, message).

    A budget counts the actions the binding allows that declare its ``param``; there it must be a
    number or integer the intent always carries (required, or with a default) and that cannot be
    null, else an intent could slip past the count by leaving it out or sending null.
    """
    allowed = [a for a in connector.actions if "*" in binding.allowed_actions or a.action in binding.allowed_actions]
    problems = []
    for i, budget in enumerate(binding.budget):
        counted = [a for a in allowed if budget.param in a.input]
        if not counted:
            problems.append((i, f"budget param {budget.param!r} is not an input of any action this binding allows"))
        for action in counted:
            field = action.input[budget.param]
            if field.type not in ("integer", "number"):
                problems.append(
                    (i, f"budget param {budget.param!r} of {action.action} is {field.type}, not integer or number")
                )
            elif not field.required and field.default is None:
                problems.append(
                    (i, f"budget param {budget.param!r} of {action.action} must be required or have a default")
                )
            if field.nullable:
                # null is neither a number to count nor one to check against the max
                problems.append((i, f"budget param {budget.param!r} of {action.action} must not be nullable"))
            if budget.on_exceed == "approval" and binding.approval is None and action.approval is None:
                problems.append(
                    (i, f"on_exceed: approval needs an approval: on the binding or on {action.action} (its approvers)")
                )
    return problems
