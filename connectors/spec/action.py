"""One semantic action: its target on the system, its fields, errors, hours and approval."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, StringConstraints, field_validator, model_validator

from connectors.durations import Duration
from connectors.spec.base import NAME_PATTERN, OPERATION_NAME, ROUTINE_NAME, ApproverGroup, Spec, check_hours
from connectors.spec.fields import FieldSpec
from connectors.spec.http_parts import body_problems, header_name_problem, path_param_problems, split_path
from connectors.spec.policies import RetryPolicy

MAX_APPROVAL_SECONDS = 7 * 86400


class ErrorRule(Spec):
    """Maps a downstream answer to a reach code with the system's own words for a model."""

    status: int = Field(ge=100, le=599)
    field: str | None = None  # dotted path into the JSON body, e.g. error.code
    equals: Any = None
    code: str
    message: str | None = None
    suggestion: str | None = None

    @field_validator("code")
    @classmethod
    def _known_code(cls, v: str) -> str:
        from producers.wire import ErrorCode

        if v not in ErrorCode.__members__:
            raise ValueError(f"unknown error code {v!r}")
        return v


class ApprovalSpec(Spec):
    """``approval:`` on an action or a binding: the intent waits for a person (docs/contract.md
    "Approvals"). Either ``required: true`` or a ``when`` condition over the action's params."""

    required: bool = False
    when: str | None = None
    approvers: list[ApproverGroup] = Field(min_length=1, max_length=20)  # defined by ``approvers:`` documents
    expires: Duration = 3600.0

    @field_validator("when")
    @classmethod
    def _parses(cls, v: str | None) -> str | None:
        if v is not None:
            from connectors.conditions import parse_condition

            parse_condition(v)  # its ConditionError (a ValueError) says what is wrong
        return v

    @model_validator(mode="after")
    def _one_trigger(self) -> ApprovalSpec:
        if self.required == (self.when is not None):
            raise ValueError("give either `required: true` or a `when:` condition")
        if not 0 < self.expires <= MAX_APPROVAL_SECONDS:
            raise ValueError("`expires` must be more than 0 and at most 7 days")
        return self


MAX_HISTORY_RETAIN_SECONDS = 10 * 366 * 86400


class HistorySpec(Spec):
    """``history: {retain: 90d}`` on an action: how long its receipts stay askable through
    ``reach.history``; ``history: off`` (read as ``off: true``): never recorded; no ``history``:
    REACH_HISTORY_TTL."""

    retain: Duration | None = None
    off: bool = False

    @field_validator("retain")
    @classmethod
    def _bounded(cls, v: float | None) -> float | None:
        if v is not None and not 1 <= v <= MAX_HISTORY_RETAIN_SECONDS:
            raise ValueError("`retain` must be at least 1s and at most 3660d")
        return v

    @model_validator(mode="after")
    def _one(self) -> HistorySpec:
        if self.off == (self.retain is not None):
            raise ValueError("write `history: off` or `history: {retain: 90d}`")
        return self


MAX_EXAMPLES = 20  # example requests per action: each is a row of the routing index, embedded once
MAX_EXAMPLE_CHARS = 300


class ActionSpec(Spec):
    """One semantic action: what an agent may ask for, and how it reaches the system."""

    action: str
    description: str | None = None
    # how the action reaches its system; which one is needed depends on the connector's type
    path: str | None = None  # http: "METHOD /template"
    body: Literal["json", "form", "multipart", "binary"] | None = None  # http: how the body is written (json)
    operation: str | None = None  # soap: the WSDL operation
    procedure: str | None = None  # sql: CALL schema.name(...)
    function: str | None = None  # sql: SELECT * FROM schema.name(...)
    exchange: str | None = None  # amqp: where the request is published ("" = the default exchange)
    routing_key: str | None = None  # amqp
    config: dict[str, Any] | None = None  # a plugin type's own action keys, checked by its manifest's model
    input: dict[str, FieldSpec] = Field(default_factory=dict)
    output: dict[str, FieldSpec] | None = None
    permission: Literal["read", "write", "read_only"] = "read"
    timeout: Duration | None = None
    idempotent: bool | None = None
    retry: RetryPolicy | None = None
    errors: list[ErrorRule] = Field(default_factory=list)
    allowed_hours: str | None = None
    approval: ApprovalSpec | None = None  # a person approves each intent (or those matching `when`)
    history: HistorySpec | None = None  # reach.history's memory of it (connectors/history.py)
    # short requests (any language) a user might make of this action: semantic routing compares a
    # request with them as with the action's own text (docs/contract.md "Semantic routing")
    examples: list[
        Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=MAX_EXAMPLE_CHARS)]
    ] = Field(default_factory=list, max_length=MAX_EXAMPLES)

    @field_validator("action")
    @classmethod
    def _name(cls, v: str) -> str:
        if not NAME_PATTERN.match(v) or "__" in v or "." in v:
            raise ValueError(f"action name {v!r} must start with a letter and use letters, digits, _ or - (no '__')")
        return v

    @field_validator("history", mode="before")
    @classmethod
    def _history_off(cls, v: Any) -> Any:
        # YAML 1.1 reads a bare off as false (and on as true)
        if v is False or v == "off":
            return {"off": True}
        if isinstance(v, bool | str):
            raise ValueError("write `history: off` or `history: {retain: 90d}`")
        return v

    @field_validator("path")
    @classmethod
    def _path(cls, v: str | None) -> str | None:
        if v is not None:
            split_path(v)
        return v

    @field_validator("procedure", "function")
    @classmethod
    def _routine(cls, v: str | None) -> str | None:
        if v is not None and not ROUTINE_NAME.match(v):
            raise ValueError(f"{v!r} must be a routine name like name or schema.name (letters, digits, _)")
        return v

    @field_validator("operation")
    @classmethod
    def _operation(cls, v: str | None) -> str | None:
        if v is not None and not OPERATION_NAME.match(v):
            raise ValueError(f"operation {v!r} must be a WSDL operation name (letters, digits, _ . -)")
        return v

    @field_validator("allowed_hours")
    @classmethod
    def _hours(cls, v: str | None) -> str | None:
        return check_hours(v)

    @model_validator(mode="after")
    def _path_params_declared(self) -> ActionSpec:
        # the loader reports the same problems from the raw YAML with lines (structure_problems);
        # this keeps programmatically built specs honest too
        for problem in path_param_problems(self.path, {k: v.in_ for k, v in self.input.items()}):
            raise ValueError(problem)
        return self

    @model_validator(mode="after")
    def _body_fits(self) -> ActionSpec:
        if self.path is None and self.body is None:
            return self  # not an http action: its fields' places are not the adapter's
        shapes = {k: (v.in_, v.type, v.items.type if v.items else None) for k, v in self.input.items()}
        for problem in body_problems(self.path, self.body, shapes):
            raise ValueError(problem)
        return self

    @model_validator(mode="after")
    def _header_inputs_named(self) -> ActionSpec:
        for key, spec in self.input.items():
            # a header field without `name` is sent under its input name (a `name` is checked on the field)
            if spec.in_ == "header" and spec.name is None and (problem := header_name_problem("input", key)):
                raise ValueError(f"{problem}; give it a `name`")
        return self

    @model_validator(mode="after")
    def _entities_on_top_level_fields(self) -> ActionSpec:
        for side, fields in (("input", self.input), ("output", self.output or {})):
            for key, spec in fields.items():
                if _nested_entity(spec):
                    raise ValueError(f"{side}.{key}: `entity` only applies to top-level input and output fields")
        return self

    @property
    def method(self) -> str:
        """The HTTP method (POST for the non-HTTP types: what a call to them is)."""
        return split_path(self.path)[0] if self.path else "POST"

    @property
    def template(self) -> str:
        return split_path(self.path)[1] if self.path else ""

    @property
    def target(self) -> str:
        """What one call does, for people: ``POST /tickets``, ``soap CreateInvoice``, ..."""
        if self.path:
            return self.path
        if self.operation:
            return f"soap {self.operation}"
        if self.procedure:
            return f"CALL {self.procedure}"
        if self.function:
            return f"SELECT {self.function}"
        if self.config is not None:
            return f"{self.action} (plugin)"
        if self.routing_key is not None:
            return f"amqp {self.exchange or '(default)'} / {self.routing_key}"
        return f"agent {self.action}"

    @property
    def is_write(self) -> bool:
        return self.permission == "write"

    @property
    def is_idempotent(self) -> bool:
        """Explicit `idempotent`, else true for reads (safe to repeat)."""
        if self.idempotent is not None:
            return self.idempotent
        return not self.is_write

    @property
    def timeout_seconds(self) -> float:
        if self.timeout is not None:
            return self.timeout
        return 15.0 if self.is_write else 5.0


def _nested_entity(spec: FieldSpec) -> bool:
    """Whether a field nested in ``spec`` (its items or properties) declares an entity."""
    inner = [spec.items] if spec.items is not None else []
    inner += list((spec.properties or {}).values())
    return any(f.entity is not None or _nested_entity(f) for f in inner)
