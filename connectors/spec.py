"""Catalog models: connectors with their semantic actions, and agent apps with their bindings.

The YAML shapes of docs/contract.md section 5 load into these models unchanged. Every model forbids
unknown keys so a typo in YAML is an error with a line number, not a silent default.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from connectors.durations import Duration
from connectors.patterns import compile_pattern
from connectors.rates import parse_rate
from producers.wire import AGENT_ID_PATTERN, NAME_RULE

ROUTINE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}(\.[A-Za-z_][A-Za-z0-9_]{0,62})?$")
OPERATION_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,127}$")
NAME_PATTERN = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,63}$")
HTTP_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
PATH_PARAM = re.compile(r"\{([^{}]*)\}")
HOURS_WINDOW = re.compile(r"^\s*(\d{2}):(\d{2})\s*-\s*(\d{2}):(\d{2})\s+(\S+)\s*$")
# an HTTP field name (RFC 7230 token), at most an AMQP short string: header names the catalog
# writes are checked by `reach validate`, not found out on every call (a newline in one broke them all)
HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,255}$")

ConnectorType = Literal["http", "soap", "sql", "amqp", "agent"]
FieldType = Literal["string", "integer", "number", "boolean", "enum", "datetime", "date", "array", "object"]
# reserved: the router answers `reach.list_tools` itself
RESERVED_CONNECTOR_NAMES = frozenset({"reach"})
# an agent named "intent" could bind its receipts back into reach.intents (routing key "intent")
RESERVED_AGENT_NAMES = frozenset({"intent"})


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


def header_name_problem(what: str, name: str) -> str | None:
    """Why ``name`` cannot be an HTTP header name (``what`` says whose), or None."""
    if HEADER_NAME.fullmatch(name):  # (match would let a trailing newline through `$`)
        return None
    return (
        f"{what} {name[:80]!r} is not a valid HTTP header name: use 1-255 letters, digits and "
        "!#$%&'*+-.^_`|~ (no spaces, colons or control characters)"
    )


class FieldSpec(_Spec):
    """One input or output field of an action."""

    type: FieldType = "string"
    required: bool = False
    default: Any = None
    description: str | None = None
    values: list[Any] | None = None
    min: float | None = None
    max: float | None = None
    min_length: int | None = Field(default=None, ge=0)
    max_length: int | None = Field(default=None, ge=0)
    pattern: str | None = None
    nullable: bool = False
    sensitive: bool = False
    in_: Literal["path", "query", "body", "header"] | None = Field(default=None, alias="in")
    name: str | None = None
    as_: Literal["string"] | None = Field(default=None, alias="as")
    format: str | None = None
    timezone: str | None = None
    null_as: Literal["", "omit", "null"] | None = None
    items: FieldSpec | None = None
    properties: dict[str, FieldSpec] | None = None

    @field_validator("pattern")
    @classmethod
    def _pattern_compiles(cls, v: str | None) -> str | None:
        if v is not None:
            compile_pattern(v)  # PatternError is a ValueError: reach validate reports it with file and line
        return v

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, v: str | None) -> str | None:
        if v is not None:
            from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

            try:
                ZoneInfo(v)
            except (ZoneInfoNotFoundError, ValueError) as exc:
                raise ValueError(f"unknown timezone {v!r}; use an IANA name such as Asia/Shanghai") from exc
        return v

    @model_validator(mode="after")
    def _consistent(self) -> FieldSpec:
        if self.type == "enum" and not self.values:
            raise ValueError("an enum field needs a non-empty `values` list")
        if self.type == "array" and self.items is None:
            raise ValueError("an array field needs `items`")
        if self.items is not None and self.type != "array":
            raise ValueError("`items` only applies to type array")
        if self.properties is not None and self.type != "object":
            raise ValueError("`properties` only applies to type object")
        if self.as_ is not None and self.type not in ("boolean", "integer", "number"):
            raise ValueError("`as: string` only applies to boolean, integer and number fields")
        if (self.format or self.timezone) and self.type not in ("datetime", "date"):
            raise ValueError("`format` and `timezone` only apply to datetime and date fields")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError("`min` is greater than `max`")
        if self.min_length is not None and self.max_length is not None and self.min_length > self.max_length:
            raise ValueError("`min_length` is greater than `max_length`")
        if self.in_ == "header" and self.name is not None and (problem := header_name_problem("`name`", self.name)):
            raise ValueError(problem)
        return self


class RetryPolicy(_Spec):
    """How often and how patiently a transient failure is retried."""

    max_attempts: int = Field(default=3, ge=1, le=20)
    initial_backoff: Duration = 0.1
    max_backoff: Duration = 5.0

    @model_validator(mode="after")
    def _ordered(self) -> RetryPolicy:
        if self.initial_backoff > self.max_backoff:
            raise ValueError("initial_backoff is longer than max_backoff")
        return self


class BreakerSpec(_Spec):
    fail_max: int = Field(default=5, ge=1)
    reset_timeout: Duration = 30.0


class PoolSpec(_Spec):
    concurrency: int = Field(default=20, ge=1, le=1000)


class HealthSpec(_Spec):
    path: str = "GET /"
    interval: Duration = 10.0

    @field_validator("path")
    @classmethod
    def _path(cls, v: str) -> str:
        split_path(v)
        return v


AuthType = Literal[
    "none",
    "api_key",
    "bearer",
    "basic",
    "oauth2_client_credentials",
    "oauth2_refresh_token",
    "form_login",
    "mtls",
    "jwt",
]


class AuthSpec(_Spec):
    """Credentials are named by environment variable, never written inline."""

    type: AuthType = "none"
    in_: Literal["header", "query"] = Field(default="header", alias="in")
    name: str | None = None  # api_key: header or query parameter name
    token_env: str | None = None  # bearer
    username_env: str | None = None  # basic
    password_env: str | None = None  # basic
    token_url: str | None = None  # oauth2_client_credentials
    client_id_env: str | None = None
    client_secret_env: str | None = None
    scope: str | None = None
    refresh_token_env: str | None = None  # oauth2_refresh_token: the first refresh token
    login_url: str | None = None  # form_login: where the credentials are POSTed
    username_field: str = "username"  # form_login: form field names
    password_field: str = "password"
    cert_env: str | None = None  # mtls: path of the client certificate (PEM)
    key_env: str | None = None  # mtls: path of its private key; api_key: the key itself
    ca_env: str | None = None  # mtls (optional): path of the CA bundle that signed the server
    signing_key_env: str | None = None  # jwt: HS256 secret or RS256 private key (PEM)
    algorithm: Literal["HS256", "RS256"] = "HS256"  # jwt
    issuer: str = "agent-reach"  # jwt `iss`
    audience: str | None = None  # jwt `aud`
    ttl: Duration = 60.0  # jwt lifetime, at most 5 minutes

    @model_validator(mode="after")
    def _complete(self) -> AuthSpec:
        needed = {
            "none": [],
            "api_key": ["name", "key_env"],
            "bearer": ["token_env"],
            "basic": ["username_env", "password_env"],
            "oauth2_client_credentials": ["token_url", "client_id_env", "client_secret_env"],
            "oauth2_refresh_token": ["token_url", "client_id_env", "refresh_token_env"],
            "form_login": ["login_url", "username_env", "password_env"],
            "mtls": ["cert_env", "key_env"],
            "jwt": ["signing_key_env", "audience"],
        }[self.type]
        if self.type == "jwt" and not 0 < self.ttl <= 300:
            raise ValueError("jwt ttl must be between 0 and 5m")
        missing = [k for k in needed if getattr(self, k) is None]
        if missing:
            raise ValueError(f"auth type {self.type} needs {', '.join(missing)}")
        if self.type == "api_key" and self.in_ == "header" and self.name is not None:
            if problem := header_name_problem("api_key header name", self.name):
                raise ValueError(problem)
        return self


class ErrorRule(_Spec):
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


def split_path(path: str) -> tuple[str, str]:
    """``"POST /tickets/{tid}"`` -> ``("POST", "/tickets/{tid}")``."""
    parts = path.split(None, 1) if isinstance(path, str) else []
    if len(parts) != 2:
        raise ValueError(f"path {path!r} must be 'METHOD /template', e.g. 'GET /tickets/{{tid}}'")
    method, template = parts[0], parts[1].strip()
    if method not in HTTP_METHODS:
        raise ValueError(f"method {method!r} in path is not one of {', '.join(HTTP_METHODS)}")
    if not template.startswith("/") or "://" in template or any(c in template for c in " \t\r\n?#"):
        raise ValueError(
            f"template {template!r} must be an absolute path like /tickets/{{tid}} (no scheme, query or fragment)"
        )
    for name in PATH_PARAM.findall(template):
        if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", name):
            raise ValueError(f"path parameter {{{name}}} is not a valid name")
    return method, template


def path_param_problems(path: Any, placements: dict[str, Any]) -> list[str]:
    """Path parameters of ``path`` not declared in input, or declared elsewhere (name -> ``in``)."""
    try:
        _, template = split_path(path)
    except ValueError:
        return []  # reported as a bad path on its own
    named = PATH_PARAM.findall(template)
    problems = []
    for name in named:
        if name not in placements:
            problems.append(f"path parameter {{{name}}} is not declared in input")
        elif placements[name] not in (None, "path"):
            problems.append(f"path parameter {{{name}}} is declared with in: {placements[name]}")
    for name, place in placements.items():
        if place == "path" and name not in named:
            problems.append(f"input {name} has in: path but the template has no {{{name}}}")
    return problems


# approver and owner names: people as the operators' identity system knows them (a login, an email)
PERSON_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@+-]{0,127}\Z")
MAX_APPROVAL_SECONDS = 7 * 86400


class ApprovalSpec(_Spec):
    """``approval:`` on an action or a binding: the intent waits for a person (docs/contract.md
    "Approvals"). Either ``required: true`` or a ``when`` condition over the action's params."""

    required: bool = False
    when: str | None = None
    approvers: list[str] = Field(min_length=1, max_length=20)  # approver group names (``approvers:`` document)
    expires: Duration = 3600.0

    @field_validator("when")
    @classmethod
    def _parses(cls, v: str | None) -> str | None:
        if v is not None:
            from connectors.conditions import parse_condition

            parse_condition(v)  # its ConditionError (a ValueError) says what is wrong
        return v

    @field_validator("approvers")
    @classmethod
    def _groups(cls, v: list[str]) -> list[str]:
        for name in v:
            if not AGENT_ID_PATTERN.match(name):
                raise ValueError(f"approver group {name!r} must be {NAME_RULE}")
        return v

    @model_validator(mode="after")
    def _one_trigger(self) -> ApprovalSpec:
        if self.required == (self.when is not None):
            raise ValueError("give either `required: true` or a `when:` condition")
        if not 0 < self.expires <= MAX_APPROVAL_SECONDS:
            raise ValueError("`expires` must be more than 0 and at most 7 days")
        return self


class ActionSpec(_Spec):
    """One semantic action: what an agent may ask for, and how it reaches the system."""

    action: str
    description: str | None = None
    # how the action reaches its system; which one is needed depends on the connector's type
    path: str | None = None  # http: "METHOD /template"
    operation: str | None = None  # soap: the WSDL operation
    procedure: str | None = None  # sql: CALL schema.name(...)
    function: str | None = None  # sql: SELECT * FROM schema.name(...)
    exchange: str | None = None  # amqp: where the request is published ("" = the default exchange)
    routing_key: str | None = None  # amqp
    input: dict[str, FieldSpec] = Field(default_factory=dict)
    output: dict[str, FieldSpec] | None = None
    permission: Literal["read", "write", "read_only"] = "read"
    timeout: Duration | None = None
    idempotent: bool | None = None
    retry: RetryPolicy | None = None
    errors: list[ErrorRule] = Field(default_factory=list)
    allowed_hours: str | None = None
    approval: ApprovalSpec | None = None  # a person approves each intent (or those matching `when`)

    @field_validator("action")
    @classmethod
    def _name(cls, v: str) -> str:
        if not NAME_PATTERN.match(v) or "__" in v or "." in v:
            raise ValueError(f"action name {v!r} must start with a letter and use letters, digits, _ or - (no '__')")
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
    def _header_inputs_named(self) -> ActionSpec:
        for key, spec in self.input.items():
            # a header field without `name` is sent under its input name (a `name` is checked on the field)
            if spec.in_ == "header" and spec.name is None and (problem := header_name_problem("input", key)):
                raise ValueError(f"{problem}; give it a `name`")
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


class ConnectorSpec(_Spec):
    """A business system and the semantic actions it offers."""

    name: str
    description: str | None = None
    type: ConnectorType = "http"
    endpoint: str | None = None  # http (required); soap: overrides the WSDL's service address
    wsdl: str | None = None  # soap: a file path or an http(s) URL
    dsn_env: str | None = None  # sql: env variable holding a SQLAlchemy URL
    url_env: str | None = None  # amqp: env variable holding the legacy system's broker URL
    agent: str | None = None  # agent: the agent that answers this connector's actions
    auth: AuthSpec = Field(default_factory=AuthSpec)
    health: HealthSpec | None = None
    breaker: BreakerSpec = Field(default_factory=BreakerSpec)
    pool: PoolSpec = Field(default_factory=PoolSpec)
    retry: RetryPolicy = Field(default_factory=RetryPolicy)
    idempotency_header: str | None = None
    domain: str | None = None
    actions: list[ActionSpec] = Field(min_length=1)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not AGENT_ID_PATTERN.match(v) or "__" in v:
            raise ValueError(f"connector name {v!r} must be {NAME_RULE} (pattern ^[a-z][a-z0-9_]{{0,62}}$, no '__')")
        if v in RESERVED_CONNECTOR_NAMES:
            raise ValueError(f"connector name {v!r} is reserved")
        return v

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, v: str | None) -> str | None:
        from urllib.parse import urlsplit

        if v is None:
            return v
        parts = urlsplit(v)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"endpoint {v!r} must be an http:// or https:// URL with a host")
        if parts.query or parts.fragment or parts.username or parts.password:
            raise ValueError(f"endpoint {v!r} must not carry a query, fragment or credentials (use auth)")
        return v.rstrip("/")

    @field_validator("idempotency_header")
    @classmethod
    def _idempotency_header(cls, v: str | None) -> str | None:
        if v is not None and (problem := header_name_problem("idempotency_header", v)):
            raise ValueError(problem)
        return v

    @field_validator("agent")
    @classmethod
    def _agent(cls, v: str | None) -> str | None:
        if v is not None and not AGENT_ID_PATTERN.match(v):
            raise ValueError(f"agent {v!r} must be {NAME_RULE}")
        return v

    @model_validator(mode="after")
    def _fits_type(self) -> ConnectorSpec:
        for problem in type_problems(self.model_dump(by_alias=True, exclude_unset=True)):
            raise ValueError(problem)
        return self

    def action(self, name: str) -> ActionSpec | None:
        for action in self.actions:
            if action.action == name:
                return action
        return None

    def safe_to_repeat(self, action: ActionSpec) -> bool:
        """Whether calling ``action`` twice is harmless: it is idempotent, or this system
        deduplicates by ``idempotency_header`` (the one rule retries and orphaned calls follow)."""
        return action.is_idempotent or bool(self.idempotency_header)

    def check_first_suggestion(self, action: str) -> str:
        """What to tell a model when a write's outcome is unknown: look before resending."""
        reads = [a.action for a in self.actions if not a.is_write]
        check = f" with a read action such as {self.name}.{reads[0]}" if reads else " with a read action"
        return f"Do not resend blindly: {action} may have taken effect. Check its result{check} first."


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


class BudgetSpec(_Spec):
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


class Binding(_Spec):
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


class AgentApp(_Spec):
    name: str
    description: str | None = None
    # semantic routing prefers connectors of this domain for the agent's bare actions
    domain: str | None = None
    connector_bindings: list[Binding] = Field(default_factory=list)
    # the people answerable for this agent: none of them may approve its intents
    owners: list[str] = Field(default_factory=list, max_length=100)

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


def check_hours(v: str | None) -> str | None:
    if v is None:
        return v
    match = HOURS_WINDOW.match(v)
    if not match:
        raise ValueError(f"allowed_hours {v!r} must look like '08:00-22:00 Asia/Shanghai'")
    h1, m1, h2, m2, zone = match.groups()
    if int(h1) > 24 or int(h2) > 24 or int(m1) > 59 or int(m2) > 59:
        raise ValueError(f"allowed_hours {v!r} has an impossible time")
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    try:
        ZoneInfo(zone)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ValueError(f"allowed_hours {v!r}: unknown timezone {zone!r}") from exc
    return v


# per connector type: the connector keys it needs, the action keys it needs (one of), and the
# connector / action keys that belong to other types
CONNECTOR_KEYS: dict[str, tuple[str, ...]] = {
    "http": ("endpoint",),
    "soap": ("wsdl",),
    "sql": ("dsn_env",),
    "amqp": ("url_env",),
    "agent": ("agent",),
}
ACTION_KEYS: dict[str, tuple[str, ...]] = {
    "http": ("path",),
    "soap": ("operation",),
    "sql": ("procedure", "function"),
    "amqp": ("routing_key",),
    "agent": (),
}
_ACTION_ONLY_FOR = {"exchange": "amqp"}
_AUTH_FOR_TYPE: dict[str, tuple[str, ...]] = {
    # sql and amqp carry credentials in their URL; agent is the fleet's own broker
    "sql": ("none",),
    "amqp": ("none",),
    "agent": ("none",),
}


def type_problems(connector: dict[str, Any]) -> list[str]:
    """What a connector declares that its ``type`` does not use, or lacks what it needs (raw
    YAML dict or a dumped model, so the loader can report these with line numbers)."""
    kind = connector.get("type", "http")
    if kind not in CONNECTOR_KEYS:
        return []  # reported by the model's Literal
    problems = []
    for key in CONNECTOR_KEYS[kind]:
        if connector.get(key) in (None, ""):
            problems.append(f"a connector of type {kind} needs `{key}`")
    for other, keys in CONNECTOR_KEYS.items():
        for key in keys:
            if other != kind and key not in CONNECTOR_KEYS[kind] and connector.get(key) is not None:
                if not (kind == "soap" and key == "endpoint"):
                    problems.append(f"`{key}` belongs to connectors of type {other}, not {kind}")
    auth = connector.get("auth")
    auth_type = auth.get("type", "none") if isinstance(auth, dict) else "none"
    if kind in _AUTH_FOR_TYPE and auth_type not in _AUTH_FOR_TYPE[kind]:
        problems.append(f"a connector of type {kind} takes no `auth` (its credentials are in its URL or the fleet's)")
    if kind == "sql" or kind == "amqp" or kind == "agent":
        if connector.get("health") is not None and isinstance(connector.get("health"), dict):
            if "path" in connector["health"]:
                problems.append(f"health.path is for http connectors; a {kind} connector is probed by its adapter")
    actions = connector.get("actions")
    for i, action in enumerate(actions if isinstance(actions, list) else []):
        if not isinstance(action, dict):
            continue
        wanted = ACTION_KEYS[kind]
        given = [k for k in wanted if action.get(k) is not None]
        name = action.get("action", i)
        if wanted and len(given) != 1:
            need = " or ".join(f"`{k}`" for k in wanted)
            problems.append(
                f"action {name}: a {kind} action needs {'exactly one of ' if len(wanted) > 1 else ''}{need}"
            )
        for other, keys in ACTION_KEYS.items():
            for key in keys:
                if other != kind and key not in wanted and action.get(key) is not None:
                    problems.append(f"action {name}: `{key}` belongs to {other} actions, not {kind}")
        for key, owner in _ACTION_ONLY_FOR.items():
            if owner != kind and action.get(key) is not None:
                problems.append(f"action {name}: `{key}` belongs to {owner} actions, not {kind}")
    return problems


# sentence-embedding models semantic routing can use (connectors/routing/embedders.py); "none"
# ranks by the lexical scorer and the domain rules only
EmbeddingModel = Literal["use-m3+e5-small", "use-m3", "e5-small", "none"]


class RoutingWeights(_Spec):
    """How much each path counts in a candidate's score (docs/contract.md "Semantic routing")."""

    semantic: float = Field(default=1.0, ge=0, le=10)  # cosine of description and action text
    lexical: float = Field(default=0.1, ge=0, le=10)  # BM25 over the most the request could score, in [0, 1]
    domain: float = Field(default=0.3, ge=0, le=10)  # the connector's domain is the intent's context.domain
    # ... or the agent app's own domain: above the margin, so it decides when nothing else differs,
    # yet a clear description for another connector outweighs it
    agent_domain: float = Field(default=0.05, ge=0, le=10)


class RoutingSpec(_Spec):
    """The catalog's ``routing:`` document: how a bare action offered by several of an agent's
    connectors is routed. At most one per catalog; without one these defaults apply."""

    model: EmbeddingModel = "use-m3+e5-small"
    # the winner must lead the runner-up by this much, else AMBIGUOUS_ACTION
    margin: float = Field(default=0.046, ge=0, le=10)
    weights: RoutingWeights = Field(default_factory=RoutingWeights)


class ConnectorDocument(_Spec):
    connector: ConnectorSpec


class AgentAppDocument(_Spec):
    agent_app: AgentApp


class RoutingDocument(_Spec):
    routing: RoutingSpec


def _group_name(v: str) -> str:
    if not AGENT_ID_PATTERN.match(v):
        raise ValueError(f"approver group {v!r} must be {NAME_RULE}")
    return v


def _person(v: str) -> str:
    if not PERSON_PATTERN.match(v):
        raise ValueError(f"{v!r} must be 1-128 letters, digits or . _ @ + - (a login or an email)")
    return v


class ApproversDocument(_Spec):
    """``approvers:`` maps each approver group to the people in it (several documents may add groups)."""

    approvers: dict[
        Annotated[str, AfterValidator(_group_name)],
        Annotated[list[Annotated[str, AfterValidator(_person)]], Field(min_length=1, max_length=1000)],
    ]
