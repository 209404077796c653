"""``reach plugins``: the installed connector types, and the conformance kit run on one of them."""

from __future__ import annotations

import sys

import click

from workers.cli.common import EXIT_CONFIG, EXIT_PROBLEMS
from workers.ops.table import print_table


@click.group()
def plugins() -> None:
    """Connector plugins: the types the fleet can reach (entry points of agent_reach.adapters)."""


@plugins.command("list")
def plugins_list() -> None:
    """Show every installed connector type: its package, contract version, guarantees and status
    (a refused plugin's line says why). Exit codes: 0 all usable, 1 any refused."""
    from connectors.adapters.registry import registry

    found = registry().all()
    rows = []
    for p in found:
        m = p.manifest
        claims = ", ".join(k for k, v in m.guarantees.model_dump().items() if v) or "-" if m is not None else "-"
        rows.append(
            (
                p.type,
                p.package,
                str(m.contract_version) if m is not None else "-",
                claims,
                "yes" if m is not None and m.conformance else "no",
                "ok" if p.status == "ok" else f"refused: {p.reason}",
            )
        )
    print_table(("type", "package", "contract", "claims", "kit fixture", "status"), rows, max_width=200)
    if any(p.status != "ok" for p in found):
        sys.exit(EXIT_PROBLEMS)


@plugins.command("check")
@click.argument("kind", metavar="TYPE")
@click.option(
    "--database-env",
    "database_env",
    metavar="VAR",
    help="The environment variable holding a PostgreSQL URL the sql fixture may add a schema to (dropped after).",
)
def plugins_check(kind: str, database_env: str | None) -> None:
    """Run the conformance kit against TYPE's adapter, with a fake system the kit controls, and
    print a table of the guarantees. Exit codes: 0 every row PASS or SKIP, 1 any FAIL, 2 the kit
    cannot run (type not installed, refused, or without a fixture, or the fixture cannot start)."""
    import os

    from connectors.adapters.kit import KitContext
    from workers.ops.conformance import KitError, check
    from workers.settings import Settings, SettingsError

    try:
        broker_url: str | None = Settings.from_env().broker_url
    except SettingsError:
        broker_url = None  # only fixtures that need a broker say so
    try:
        database_url = os.environ.get(database_env) if database_env else None
        rows = check(kind, context=KitContext(broker_url=broker_url, database_url=database_url))
    except KitError as exc:
        click.echo(f"reach plugins check {kind}: {exc}", err=True)
        sys.exit(EXIT_CONFIG)
    print_table(("guarantee", "result", "seen"), [(r.guarantee, r.status, r.detail) for r in rows], max_width=120)
    failed = [r for r in rows if r.status == "FAIL"]
    if failed:
        click.echo(f"{len(failed)} of {len(rows)} guarantee(s) FAIL for type {kind}", err=True)
        sys.exit(EXIT_PROBLEMS)
    click.echo(f"ok: type {kind} keeps every guarantee it claims ({len(rows)} rows)")
