"""Picks a connector's adapter by its ``type``. Each adapter's module (and its library: zeep,
SQLAlchemy, ...) is imported only when a connector of that type is built."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from connectors.adapters.base import Adapter
from connectors.spec import ConnectorSpec


@dataclass(frozen=True)
class AdapterOptions:
    """What the process around an adapter gives it."""

    max_connections: int = 20  # the pool's threads: connections it may need at once
    max_depth: int | None = None  # nesting of ``data`` passed on (REACH_MAX_DEPTH)
    redis: Any = None  # shared state (rotated OAuth2 refresh tokens); None in single-process tools
    broker_url: str | None = None  # the fleet's broker (the agent adapter's way to other agents)
    environ: Mapping[str, str] | None = None  # where secrets are read; None: the process environment
    extra: dict[str, Any] = field(default_factory=dict)  # per-adapter knobs for tests


def build_adapter(connector: ConnectorSpec, options: AdapterOptions | None = None) -> Adapter:
    """The adapter for ``connector``. Raises MissingSecret when a secret it names is not set."""
    options = options or AdapterOptions()
    if connector.type == "http":
        from connectors.adapters.http import HttpAdapter

        kwargs: dict[str, Any] = {"max_connections": options.max_connections, "environ": options.environ}
        if options.max_depth is not None:
            kwargs["max_depth"] = options.max_depth
        return HttpAdapter(connector, redis=options.redis, **kwargs, **options.extra)
    if connector.type == "soap":
        from connectors.adapters.soap import SoapAdapter

        return SoapAdapter(connector, options)
    if connector.type == "sql":
        from connectors.adapters.sql import SqlAdapter

        return SqlAdapter(connector, options)
    if connector.type == "amqp":
        from connectors.adapters.amqp import AmqpAdapter

        return AmqpAdapter(connector, options)
    if connector.type == "agent":
        from connectors.adapters.agent import AgentAdapter

        return AgentAdapter(connector, options)
    raise ValueError(f"connector {connector.name}: unknown type {connector.type!r}")


def system_problems(connector: ConnectorSpec) -> list[str]:
    """What ``reach validate`` learns by asking the system's own description: a soap connector's
    operations and params checked against its WSDL. Empty for types with nothing to check."""
    if connector.type == "soap":
        from connectors.adapters.soap import wsdl_problems

        return wsdl_problems(connector)
    return []
