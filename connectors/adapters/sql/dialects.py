"""Which sql adapter a connector gets: the scheme of the URL in its ``dsn_env`` picks the dialect
(``postgresql://`` -> postgres.SqlAdapter, ``mariadb+pymysql://`` / ``mysql+pymysql://`` ->
mariadb.MariadbAdapter; ``urls.database_url`` refuses the rest, for the adapter and for ``reach
validate``). Each dialect's module, and its driver, is imported only when a connector uses it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from connectors.adapters.auth import MissingSecret, read_secret
from connectors.adapters.base import AdapterOptions
from connectors.adapters.sql.urls import database_url
from connectors.spec import ConnectorSpec

if TYPE_CHECKING:
    from connectors.adapters.sql.transaction import SqlAdapterBase


def sql_adapter(connector: ConnectorSpec, options: AdapterOptions) -> SqlAdapterBase[Any]:
    """The adapter for the database the connector's URL names. Raises ValueError for a URL the
    adapter does not speak, MissingSecret when the variable is not set."""
    url = database_url(read_secret(connector.dsn_env, connector.name, options.environ), connector)
    if url.get_backend_name() == "postgresql":
        from connectors.adapters.sql.postgres import SqlAdapter

        return SqlAdapter(connector, options)
    from connectors.adapters.sql.mariadb import MariadbAdapter

    return MariadbAdapter(connector, options)


def sql_problems(connector: ConnectorSpec, environ: Mapping[str, str] | None = None) -> list[str]:
    """For ``reach validate``: the URL in the connector's ``dsn_env`` names a database the adapter
    speaks. Nothing to say when the variable is not set where validate runs (it is checked again
    when the pool starts)."""
    try:
        database_url(read_secret(connector.dsn_env, connector.name, environ), connector)
    except MissingSecret:
        return []
    except ValueError as exc:
        return [str(exc).removeprefix(f"connector {connector.name}: ")]
    return []
