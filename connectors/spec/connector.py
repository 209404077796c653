"""A connector: one business system, how it is reached, and the actions it offers.

What a connector of each ``type`` needs and may not declare is in ``type_problems``, which the
loader also runs on the raw YAML to report with line numbers.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from connectors.spec.action import ActionSpec
from connectors.spec.auth import AuthSpec
from connectors.spec.base import Spec
from connectors.spec.http_parts import header_name_problem
from connectors.spec.policies import BreakerSpec, HealthSpec, PoolSpec, RetryPolicy
from producers.wire import AGENT_ID_PATTERN, NAME_RULE

ConnectorType = Literal["http", "soap", "sql", "amqp", "agent"]
BUILTIN_TYPES: frozenset[str] = frozenset(("http", "soap", "sql", "amqp", "agent"))
# a plugin's type name (connectors/adapters/plugin.py): a connector of any other type is checked
# against the installed plugins by `reach validate` and the fleet, not here (the spec knows no plugins)
TYPE_NAME = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
# reserved: the router answers `reach.list_tools` itself
RESERVED_CONNECTOR_NAMES = frozenset({"reach"})


class ConnectorSpec(Spec):
    """A business system and the semantic actions it offers."""

    name: str
    description: str | None = None
    type: str = "http"  # a built-in type or an installed plugin's (connectors/adapters/registry.py)
    endpoint: str | None = None  # http (required); soap: overrides the WSDL's service address
    wsdl: str | None = None  # soap: a file path or an http(s) URL
    dsn_env: str | None = None  # sql: env variable holding a SQLAlchemy URL
    url_env: str | None = None  # amqp: env variable holding the legacy system's broker URL
    agent: str | None = None  # agent: the agent that answers this connector's actions
    config: dict[str, Any] | None = None  # a plugin type's own connector keys, checked by its manifest's model
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

    @field_validator("type")
    @classmethod
    def _type(cls, v: str) -> str:
        if not TYPE_NAME.match(v):
            raise ValueError(
                f"type {v!r} must be one of {', '.join(sorted(BUILTIN_TYPES))} or an installed plugin's type "
                "(lowercase letters, digits and _, starting with a letter, at most 32)"
            )
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
_ACTION_ONLY_FOR = {"exchange": "amqp", "body": "http"}
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
    if not isinstance(kind, str) or not TYPE_NAME.match(kind):
        return []  # reported by the model's validator
    if kind not in CONNECTOR_KEYS:
        return _plugin_type_problems(kind, connector)
    problems = []
    if connector.get("config") is not None:
        problems.append(f"`config` is for connectors of a plugin's type; {kind} takes its own keys")
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
        if action.get("config") is not None:
            problems.append(f"action {name}: `config` is for actions of a plugin's type, not {kind}")
        for key, owner in _ACTION_ONLY_FOR.items():
            if owner != kind and action.get(key) is not None:
                problems.append(f"action {name}: `{key}` belongs to {owner} actions, not {kind}")
        problems.extend(f"action {name}: {p}" for p in _body_places(kind, action))
    return problems


def _body_places(kind: str, action: dict[str, Any]) -> list[str]:
    """``in: file`` and ``in: whole_body`` are places in an HTTP request body: no other type has one."""
    inputs = action.get("input")
    if kind == "http" or not isinstance(inputs, dict):
        return []
    return [
        f"input {key} has in: {field['in']}, which only an http action's body has"
        for key, field in inputs.items()
        if isinstance(field, dict) and field.get("in") in ("file", "whole_body")
    ]


def _plugin_type_problems(kind: str, connector: dict[str, Any]) -> list[str]:
    """A plugin type's connector takes the shared keys (endpoint, idempotency_header, breaker,
    pool, retry, health's interval) and its own under ``config``; the built-in types' keys and
    ``auth`` (a plugin reads its secrets itself, named in its config) are refused."""
    problems = []
    for other, keys in CONNECTOR_KEYS.items():
        for key in keys:
            if key != "endpoint" and connector.get(key) is not None:
                problems.append(f"`{key}` belongs to connectors of type {other}, not {kind}")
    auth = connector.get("auth")
    if isinstance(auth, dict) and auth.get("type", "none") != "none":
        problems.append(f"a connector of plugin type {kind} takes no `auth`: its secrets are named in its `config`")
    health = connector.get("health")
    if isinstance(health, dict) and "path" in health:
        problems.append(f"health.path is for http connectors; a {kind} connector is probed by its adapter")
    actions = connector.get("actions")
    for i, action in enumerate(actions if isinstance(actions, list) else []):
        if not isinstance(action, dict):
            continue
        name = action.get("action", i)
        for other, keys in ACTION_KEYS.items():
            for key in keys:
                if action.get(key) is not None:
                    problems.append(f"action {name}: `{key}` belongs to {other} actions, not {kind}")
        for key, owner in _ACTION_ONLY_FOR.items():
            if action.get(key) is not None:
                problems.append(f"action {name}: `{key}` belongs to {owner} actions, not {kind}")
        problems.extend(f"action {name}: {p}" for p in _body_places(kind, action))
    return problems
