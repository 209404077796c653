"""``reach history``: an agent's history as ``reach.history`` answers it; ``reach history purge``
(erasure on demand); ``reach history migrate`` (the PostgreSQL store's schema).

Exit codes: 0 done; 1 nothing found (show); 2 usage or configuration (a bad question, an unknown
agent, the store unreachable)."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from workers.cli.common import EXIT_PROBLEMS, check_agent, fail, load_catalog, read_settings


@click.group("history", invoke_without_command=True)
@click.option("--agent", default=None, help="The agent whose history is shown.")
@click.option("--entity", default=None, metavar="NAME:ID", help="Records naming this entity value, e.g. order:123.")
@click.option("--action", default=None, metavar="C.A", help="Records of this action (connector.action).")
@click.option("--since", default=None, help="Only records at or after this time (ISO 8601, with an offset).")
@click.option(
    "--status",
    type=click.Choice(["succeeded", "failed", "rejected", "unknown"]),
    default=None,
    help="Only this status.",
)
@click.option("--limit", type=click.IntRange(1, 50), default=20, show_default=True, help="Records shown.")
@click.option("--cursor", default=None, help="next_cursor of the previous answer.")
@click.option("--json", "as_json", is_flag=True, help='Machine-readable: {"records": [...], "next_cursor"}.')
@click.pass_context
def history(
    ctx: click.Context,
    agent: str | None,
    entity: str | None,
    action: str | None,
    since: str | None,
    status: str | None,
    limit: int,
    cursor: str | None,
    as_json: bool,
) -> None:
    """What an agent already did, newest first, as reach.history answers it (docs/contract.md "History")."""
    if ctx.invoked_subcommand is not None:
        return
    from workers.ops.history_commands import BadQuery, entity_arg, open_history, show

    if agent is None or (entity is None) == (action is None):
        fail("give --agent and either --entity NAME:ID or --action CONNECTOR.ACTION")
    settings = read_settings()
    catalog = load_catalog(settings.catalog_dir)
    check_agent(catalog, agent)
    params: dict[str, Any] = {"limit": limit}
    if entity is not None:
        try:
            params["entity"], params["id"] = entity_arg(entity)
        except ValueError as exc:
            fail(str(exc))
    for key, value in (("action", action), ("since", since), ("status", status), ("cursor", cursor)):
        if value is not None:
            params[key] = value
    try:
        page = show(open_history(settings, catalog), catalog, agent, params)
    except BadQuery as exc:
        fail(f"cannot ask that: {exc}")
    except Exception as exc:  # the store did not answer (Redis or PostgreSQL)
        fail(f"cannot read the history store: {type(exc).__name__}: {exc}")
    if as_json:
        click.echo(json.dumps({"records": page.records, "next_cursor": page.next_cursor}, indent=2))
        return
    if not page.records:
        click.echo("no records")
        sys.exit(EXIT_PROBLEMS)
    from workers.ops.table import print_table

    print_table(
        ("at", "action", "status", "code", "intent id", "params"),
        [
            (
                r.get("at"),
                f"{r.get('connector')}.{r.get('action')}",
                r.get("status"),
                r.get("code") or "-",
                r.get("intent_id"),
                json.dumps(r.get("params"), ensure_ascii=False)[:80],
            )
            for r in page.records
        ],
    )
    if page.next_cursor:
        click.echo(f"more: --cursor '{page.next_cursor}'")


@history.command("purge")
@click.option("--agent", required=True, help="The agent whose history is deleted.")
@click.option("--entity", default=None, metavar="NAME:ID", help="Only the records naming this entity value.")
def purge(agent: str, entity: str | None) -> None:
    """Delete an agent's history, or one entity value's records (erasure on request)."""
    from workers.ops.history_commands import entity_arg, open_history

    target = None
    if entity is not None:
        try:
            target = entity_arg(entity)
        except ValueError as exc:
            fail(str(exc))
    settings = read_settings()
    try:
        deleted = open_history(settings, None).purge(agent, target)
    except Exception as exc:
        fail(f"cannot reach the history store: {type(exc).__name__}: {exc}")
    what = f"{agent}'s records of {entity}" if entity else f"all of {agent}'s history"
    click.echo(f"purged {what}: {deleted} key(s) or row(s) deleted")


@history.command("migrate")
def migrate() -> None:
    """Create the PostgreSQL store's table and partitions, and drop months past every retention
    (REACH_HISTORY_URL; run it before the fleet starts and then daily)."""
    from workers.ops.history_commands import migrate as run_migrate

    settings = read_settings()
    catalog = load_catalog(settings.catalog_dir)
    try:
        for line in run_migrate(settings, catalog):
            click.echo(line)
    except ValueError as exc:
        fail(str(exc))
    except Exception as exc:
        fail(f"cannot migrate the history store: {type(exc).__name__}: {exc}")
