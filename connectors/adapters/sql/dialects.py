"""Which sql adapter a connector gets: the scheme of the URL in its ``dsn_env`` picks the dialect
(``postgresql://`` -> postgres.SqlAdapter, ``mariadb+pymysql://`` / ``mysql+pymysql://`` ->
mariadb.MariadbAdapter; :func:`database_url` refuses the rest, for the adapter and for ``reach
validate``). Each dialect's module, and its driver, is imported only when a connector uses it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from sqlalchemy import make_url
from sqlalchemy.engine import URL
from sqlalchemy.exc import ArgumentError

from connectors.adapters.auth import MissingSecret, read_secret
from connectors.adapters.base import AdapterOptions
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


def database_url(dsn: str, connector: ConnectorSpec) -> URL:
    """The connector's SQLAlchemy URL with its driver: psycopg 3 for PostgreSQL, PyMySQL for MariaDB
    and MySQL. Raises ValueError for anything else; never echoes the DSN (it holds a password)."""
    try:
        url = make_url(dsn.strip())
    except (ArgumentError, ValueError):
        raise ValueError(
            f"connector {connector.name}: {connector.dsn_env} is not a SQLAlchemy URL "
            "(postgresql://user:password@host:5432/database or mysql+pymysql://user:password@host:3306/database)"
        ) from None
    backend = url.get_backend_name()
    if backend == "postgresql":
        if "+" not in url.drivername:
            url = url.set(drivername="postgresql+psycopg")
        elif url.drivername != "postgresql+psycopg":
            raise ValueError(
                f"connector {connector.name}: {connector.dsn_env} asks for the driver {url.drivername}; "
                "the sql adapter uses psycopg 3 (postgresql+psycopg://)"
            )
        return url
    if backend in ("mysql", "mariadb"):
        # named, not implied: a bare mysql:// means mysqlclient to SQLAlchemy, which is not installed
        if url.get_driver_name() != "pymysql":
            raise ValueError(
                f"connector {connector.name}: {connector.dsn_env} asks for the driver {url.drivername}; "
                f"the sql adapter reaches MariaDB and MySQL through PyMySQL ({backend}+pymysql://)"
            )
        return url
    raise ValueError(
        f"connector {connector.name}: {connector.dsn_env} names a {backend} database; the sql adapter speaks "
        "PostgreSQL (postgresql://) and MariaDB or MySQL (mariadb+pymysql://, mysql+pymysql://)"
    )
