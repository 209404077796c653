"""The connector plugin interface: what a package ships to teach the fleet a new kind of system.

A plugin is a module named by an entry point of the group ``agent_reach.adapters`` (the entry
point's name is the connector ``type`` it serves). The module holds:

- ``manifest``: a :class:`Manifest` (type name, the contract version it implements, pydantic
  models of its connector and action ``config`` keys, the guarantees it claims, its own errors
  mapped onto wire codes, and where its conformance fixture is);
- ``build(connector, config, options) -> Adapter``: the adapter for one connector, ``config``
  being the connector's ``config`` already checked against ``manifest.connector_config``;
- optionally ``problems(connector) -> list[str]``: what ``reach validate`` learns by asking the
  system's own description (a SOAP connector's WSDL), empty when all is well.

A manifest may name a ``demo`` hook: ``reach demo`` calls it when the plugin is installed and usable,
and it returns a :class:`DemoScene` (its system started, the catalog documents, the intents to send).

The adapter (:class:`connectors.adapters.base.Adapter`) is built once per pool process and called
from the pool's threads at once: ``call(action, params, ctx)`` within ``ctx.timeout`` seconds,
``probe(timeout)`` cheaply and without raising, ``close()`` on shutdown. It never raises about the
system: every failure is an :class:`~connectors.adapters.base.Outcome` with a wire code, and
``sent`` False only when nothing can have reached the system. The pool, not the adapter, retries
(workers/pool/retry.py); ``reach plugins check TYPE`` proves an adapter keeps to this.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field, field_validator

from connectors.adapters.base import Adapter, AdapterOptions
from connectors.spec import ConnectorSpec
from connectors.spec.connector import TYPE_NAME
from producers.wire import ErrorCode

# the version of this interface; a plugin built for another is refused (docs/plugins.md)
CONTRACT_VERSION = 1
SUPPORTED_CONTRACT_VERSIONS = frozenset({CONTRACT_VERSION})

# what an adapter may answer with (docs/contract.md section 3): the others belong to the router,
# the approvals and the workflow runner
ADAPTER_CODES = frozenset(
    {
        ErrorCode.VALIDATION_FAILED,
        ErrorCode.DEADLINE_EXCEEDED,
        ErrorCode.CONNECTOR_UNAVAILABLE,
        ErrorCode.DOWNSTREAM_VALIDATION_FAILED,
        ErrorCode.DOWNSTREAM_AUTH_FAILED,
        ErrorCode.DOWNSTREAM_NOT_FOUND,
        ErrorCode.DOWNSTREAM_CONFLICT,
        ErrorCode.DOWNSTREAM_RATE_LIMITED,
        ErrorCode.DOWNSTREAM_ERROR,
        ErrorCode.DOWNSTREAM_UNREACHABLE,
        ErrorCode.DOWNSTREAM_TIMEOUT,
        ErrorCode.OUTCOME_UNKNOWN,
        ErrorCode.DOWNSTREAM_CONTRACT_VIOLATION,
        ErrorCode.INTERNAL,
    }
)


ConfigModel = type[BaseModel]  # (named here: the manifest's field ``type`` hides the builtin there)


class Guarantees(BaseModel):
    """What the adapter promises beyond the interface; the conformance kit checks each claim."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    idempotency_key: bool = Field(
        description="The intent's idempotency key reaches the system on every attempt (a header, a "
        "message property, a column), so the system can drop a repeat."
    )
    timeout_may_land: bool = Field(
        description="A call that timed out after sending may have taken effect (a write's timeout is "
        "then OUTCOME_UNKNOWN and never retried); False when the system undoes it (a rolled-back "
        "transaction), so the timeout is sent=False and retried."
    )


class Manifest(BaseModel):
    """What a plugin declares about itself (checked when the fleet registers it)."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    type: str = Field(description="The connector `type` it serves; the entry point's name.")
    contract_version: int = Field(description="The version of this interface it implements.")
    description: str = Field(min_length=1, max_length=300)
    connector_config: ConfigModel | None = Field(
        default=None, description="The model of a connector's `config` keys; None: takes none."
    )
    action_config: ConfigModel | None = Field(
        default=None, description="The model of each action's `config` keys; None: takes none."
    )
    guarantees: Guarantees
    errors: dict[str, ErrorCode] = Field(
        min_length=1, description="Each of the plugin's own failures (its names) and the wire code it becomes."
    )
    conformance: str | None = Field(
        default=None,
        description="`module:attribute` of a callable returning the kit's fixture "
        "(connectors.adapters.kit.Fixture); None: `reach plugins check` cannot run.",
    )
    demo: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$",
        description="`module:attribute` of a callable without arguments that starts the plugin's demo "
        "system and returns a DemoScene; None: `reach demo` leaves the plugin out.",
    )

    @field_validator("type")
    @classmethod
    def _type(cls, v: str) -> str:
        if not TYPE_NAME.match(v):
            raise ValueError(f"type {v!r} must match {TYPE_NAME.pattern}")
        return v

    @field_validator("errors")
    @classmethod
    def _errors(cls, v: dict[str, ErrorCode]) -> dict[str, ErrorCode]:
        foreign = sorted(f"{name} -> {code}" for name, code in v.items() if code not in ADAPTER_CODES)
        if foreign:
            raise ValueError(f"errors map onto codes an adapter may not answer with: {', '.join(foreign)}")
        return v

    def parse_connector(self, connector: ConnectorSpec) -> BaseModel | None:
        """The connector's ``config`` checked against the plugin's model (raises ValidationError)."""
        if self.connector_config is None:
            if connector.config:
                raise ValueError(f"type {self.type} takes no `config`")
            return None
        return self.connector_config.model_validate(connector.config or {})

    def config_problems(self, connector: ConnectorSpec) -> list[tuple[tuple[Any, ...], str]]:
        """Each problem of the connector's and its actions' ``config`` with where it is (a path
        under ``connector``, as the loader names lines)."""
        found: list[tuple[tuple[Any, ...], str]] = []
        found += _check(self.connector_config, connector.config, ("config",), self.type)
        for i, action in enumerate(connector.actions):
            found += _check(self.action_config, action.config, ("actions", i, "config"), self.type)
        return found


class DemoIntent(BaseModel):
    """One intent the demo sends for a plugin, and what its receipt must be."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    agent: str = Field(description="The agent sending it (an agent_app of the scene's catalog).")
    action: str = Field(description="The action, as an agent names it (`connector.action`).")
    params: dict[str, Any] = Field(default_factory=dict)
    expect: str = Field(description="The receipt's status (`succeeded`) or its error's code.")
    data: dict[str, Any] | None = Field(default=None, description="Keys the receipt's `data` must hold, as given.")


class DemoScene(BaseModel):
    """What a plugin's demo hook returns: its system, started; the catalog documents that reach it
    (a connector of the plugin's type and an agent_app bound to it); the intents the demo sends
    (a read and a write); and ``close``, which stops the system."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    system: str = Field(min_length=1, max_length=200, description="What was started and where, one line.")
    catalog: str = Field(min_length=1, max_length=100_000, description="YAML documents added to the demo's catalog.")
    connector: str = Field(description="The connector of the catalog the demo starts a pool for.")
    env: dict[str, str] = Field(default_factory=dict, description="Variables the fleet's processes get.")
    intents: list[DemoIntent] = Field(min_length=1, max_length=10)
    close: Callable[[], None]


def _check(
    model: type[BaseModel] | None, value: dict[str, Any] | None, where: tuple[Any, ...], kind: str
) -> list[tuple[tuple[Any, ...], str]]:
    from pydantic import ValidationError

    if model is None:
        return [(where, f"a {kind} connector takes no `{where[-1]}` here")] if value else []
    try:
        model.model_validate(value or {})
    except ValidationError as exc:
        return [
            ((*where, *err["loc"]), f"{'.'.join(str(p) for p in (*where, *err['loc']))}: {err['msg']}")
            for err in exc.errors()[:20]
        ]
    return []


class BuildAdapter(Protocol):
    """A plugin module's ``build``."""

    def __call__(self, connector: ConnectorSpec, config: Any, options: AdapterOptions) -> Adapter: ...


SystemProblems = Callable[[ConnectorSpec], list[str]]

__all__ = [
    "ADAPTER_CODES",
    "CONTRACT_VERSION",
    "BuildAdapter",
    "DemoIntent",
    "DemoScene",
    "Guarantees",
    "Manifest",
    "SystemProblems",
]
