"""A sql connector's database URL: the DSN's scheme names the database and its driver."""

from __future__ import annotations

from sqlalchemy import make_url
from sqlalchemy.engine import URL
from sqlalchemy.exc import ArgumentError

from connectors.spec import ConnectorSpec


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
