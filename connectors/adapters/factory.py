"""Picks a connector's adapter by its ``type``. Each adapter's module (and its library: zeep,
SQLAlchemy, ...) is imported only when a connector of that type is built."""

from __future__ import annotations

from typing import Any

from connectors.adapters.base import Adapter, AdapterOptions
from connectors.spec import ConnectorSpec


def build_adapter(connector: ConnectorSpec, options: AdapterOptions | None = None) -> Adapter:
    """The adapter for ``connector``. Raises MissingSecret when a secret it names is not set."""
    options = options or AdapterOptions()
    if connector.type == "http":
        from connectors.adapters.http import HttpAdapter

        kwargs: dict[str, Any] = {"environ": options.environ}
        if options.max_depth is not None:
            kwargs["max_depth"] = options.max_depth
        return HttpAdapter(connector, redis=options.redis, **kwargs, **options.extra)
    if connector.type == "soap":
        from connectors.adapters.soap import SoapAdapter

        return SoapAdapter(connector, options)
    if connector.type == "sql":
        from connectors.adapters.sql import sql_adapter

        return sql_adapter(connector, options)
    if connector.type == "amqp":
        from connectors.adapters.amqp import AmqpAdapter

        return AmqpAdapter(connector, options)
    if connector.type == "agent":
        from connectors.adapters.agent import AgentAdapter

        return AgentAdapter(connector, options)
    raise ValueError(f"connector {connector.name}: unknown type {connector.type!r}")


def system_problems(connector: ConnectorSpec) -> list[str]:
    """What ``reach validate`` learns by asking the system's own description: a soap connector's
    operations and params checked against its WSDL; a sql connector's URL names a database the
    adapter speaks. Empty for types with nothing to check."""
    if connector.type == "soap":
        from connectors.adapters.soap import wsdl_problems

        return wsdl_problems(connector)
    if connector.type == "sql":
        from connectors.adapters.sql import sql_problems

        return sql_problems(connector)
    return []
