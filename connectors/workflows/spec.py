"""The ``workflow:`` catalog document: several actions that hold together, and how to undo them.

Steps run in order; each names an action (``connector.action``), its ``params`` (literals or
references, connectors/workflows/references.py) and optionally the action that undoes it. What can be checked
on one document alone is checked here; what needs the rest of the catalog (actions, their fields,
agent bindings) is checked by connectors/workflows/check.py when the catalog is built.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from connectors.durations import Duration
from connectors.spec import FieldSpec
from connectors.workflows.references import ReferenceError_, Value, parse_value, references_in

WORKFLOW_NAME = re.compile(r"^[a-z][a-z0-9_]{0,62}$")
STEP_ID = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
QUALIFIED_ACTION = re.compile(r"^([a-z][a-z0-9_]{0,62})\.([A-Za-z][A-Za-z0-9_-]{0,63})$")
MAX_STEPS = 20
MAX_WORKFLOW_SECONDS = 7 * 86400.0


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def split_qualified(name: str) -> tuple[str, str]:
    match = QUALIFIED_ACTION.match(name)
    if match is None:
        raise ValueError(f"{name!r} must name an action as connector.action")
    return match.group(1), match.group(2)


class _Call(_Spec):
    """An action and the params it is called with (parsed once, kept beside the YAML text)."""

    action: str
    params: dict[str, Any] = Field(default_factory=dict)
    _parsed: dict[str, Value] = PrivateAttr(default_factory=dict)

    @field_validator("action")
    @classmethod
    def _qualified(cls, v: str) -> str:
        split_qualified(v)
        return v

    @field_validator("params")
    @classmethod
    def _values(cls, v: dict[str, Any]) -> dict[str, Any]:
        for name, raw in v.items():
            try:
                parse_value(raw)
            except ReferenceError_ as exc:
                raise ValueError(f"param {name}: {exc}") from exc
        return v

    def model_post_init(self, context: Any) -> None:
        self._parsed = {name: parse_value(raw) for name, raw in self.params.items()}

    @property
    def connector(self) -> str:
        return split_qualified(self.action)[0]

    @property
    def action_name(self) -> str:
        return split_qualified(self.action)[1]

    @property
    def values(self) -> dict[str, Value]:
        return self._parsed


class CompensateSpec(_Call):
    """``compensate:`` — the action that undoes a step. Its params may read the step's own output."""


class StepSpec(_Call):
    id: str
    compensate: CompensateSpec | None = None
    timeout: Duration | None = None
    on_unknown: Literal["halt", "compensate"] = "halt"

    @field_validator("id")
    @classmethod
    def _id(cls, v: str) -> str:
        if not STEP_ID.match(v):
            raise ValueError(f"step id {v!r} must be lowercase letters, digits and _, starting with a letter (≤ 32)")
        return v


class WorkflowSpec(_Spec):
    name: str
    description: str | None = None
    input: dict[str, FieldSpec] = Field(default_factory=dict)
    steps: list[StepSpec] = Field(min_length=1, max_length=MAX_STEPS)
    output: dict[str, Any] = Field(default_factory=dict)
    timeout: Duration = 300.0
    _output: dict[str, Value] = PrivateAttr(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not WORKFLOW_NAME.match(v) or "__" in v:
            raise ValueError(f"workflow name {v!r} must be lowercase letters, digits and _ (no '__'), ≤ 63")
        return v

    @field_validator("output")
    @classmethod
    def _output_values(cls, v: dict[str, Any]) -> dict[str, Any]:
        for name, raw in v.items():
            try:
                parse_value(raw)
            except ReferenceError_ as exc:
                raise ValueError(f"output {name}: {exc}") from exc
        return v

    @model_validator(mode="after")
    def _shape(self) -> WorkflowSpec:
        if not 0 < self.timeout <= MAX_WORKFLOW_SECONDS:
            raise ValueError("`timeout` must be more than 0 and at most 7 days")
        seen: set[str] = set()
        for step in self.steps:
            if step.id in seen:
                raise ValueError(f"two steps are called {step.id!r}")
            seen.add(step.id)
        return self

    def model_post_init(self, context: Any) -> None:
        self._output = {name: parse_value(raw) for name, raw in self.output.items()}

    @property
    def output_values(self) -> dict[str, Value]:
        return self._output

    def step(self, step_id: str) -> StepSpec | None:
        return next((s for s in self.steps if s.id == step_id), None)

    def reads(self) -> list[tuple[tuple[Any, ...], str]]:
        """(location in the document, reference text) of every reference, for messages."""
        found: list[tuple[tuple[Any, ...], str]] = []
        for i, step in enumerate(self.steps):
            for name, value in step.values.items():
                found += [(("steps", i, "params", name), r.text) for r in references_in(value)]
        return found


class WorkflowDocument(_Spec):
    workflow: WorkflowSpec
