"""What every ``reach`` command shares: the exit codes, the settings and the catalog, read once
and turned into a plain message and exit code 2 when they are wrong."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import NoReturn

import click

from connectors.catalog import Catalog, build
from connectors.loader import CatalogError, load_directory
from workers.settings import Settings, SettingsError

EXIT_PROBLEMS = 1  # the thing checked is not right
EXIT_CONFIG = 2  # usage or configuration errors


def fail(message: str) -> NoReturn:
    """Say ``message`` on stderr and exit 2."""
    click.echo(message, err=True)
    sys.exit(EXIT_CONFIG)


def read_settings() -> Settings:
    """The fleet's settings from the environment; exit 2 when they are wrong."""
    try:
        return Settings.from_env()
    except SettingsError as exc:
        fail(f"configuration error: {exc}")


def setup_logging(level: str) -> None:
    """Log lines on stdout, as a process the fleet runs writes them."""
    logging.basicConfig(level=level, stream=sys.stdout, format="%(asctime)s %(levelname)s %(name)s %(message)s")


def load_catalog(directory: str) -> Catalog:
    """The catalog in ``directory``; exit 2 when it has problems."""
    catalog, problems = build(load_directory(directory))
    if problems:
        click.echo(str(CatalogError(problems)), err=True)
        fail("Run `reach validate` for the full list.")
    return catalog


def catalog_if_any(settings: Settings, without: str) -> Catalog | None:
    """The catalog when $REACH_CATALOG (default ./catalog) is a directory; None when not, saying on
    stderr what the command does ``without`` it."""
    if Path(settings.catalog_dir).is_dir():
        return load_catalog(settings.catalog_dir)
    click.echo(f"no catalog at {settings.catalog_dir!r} (REACH_CATALOG): {without}", err=True)
    return None


def check_agent(catalog: Catalog, agent: str) -> None:
    """Exit 2 unless the catalog has an agent_app named ``agent``."""
    if agent not in catalog.agents:
        fail(f"no agent_app named {agent!r} (known: {', '.join(sorted(catalog.agents)) or 'none'})")


def unreachable(settings: Settings, exc: Exception) -> NoReturn:
    """Say which service did not answer, where, and exit 2."""
    from workers.ops.fleet import Unreachable, redact_url

    where = {"Redis": settings.redis_url, "RabbitMQ": settings.broker_url}
    service = exc.service if isinstance(exc, Unreachable) else "RabbitMQ"
    fail(
        f"cannot read the fleet's state: {exc} (at {redact_url(where[service])}; "
        f"set REACH_BROKER_URL and REACH_REDIS_URL)"
    )
