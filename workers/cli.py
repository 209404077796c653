"""The ``reach`` command: a thin shell over the library.

Exit codes: 0 success; 1 the thing checked is not right (catalog problems, a receipt that did
not succeed, no receipt in time); 2 usage or configuration errors (unknown connector, missing
secret, unreadable catalog, broker unreachable).
"""
from __future__ import annotations

import json
import logging
import os
import sys
from typing import Any

import click

from connectors.catalog import Catalog, build
from connectors.loader import CatalogError, load_directory
from workers.settings import Settings, SettingsError

EXIT_PROBLEMS = 1
EXIT_CONFIG = 2


def _settings() -> Settings:
    try:
        return Settings.from_env()
    except SettingsError as exc:
        click.echo(f"configuration error: {exc}", err=True)
        sys.exit(EXIT_CONFIG)


def _setup_logging(level: str) -> None:
    logging.basicConfig(level=level, stream=sys.stdout, format="%(asctime)s %(levelname)s %(name)s %(message)s")


def _load_catalog(directory: str) -> Catalog:
    catalog, problems = build(load_directory(directory))
    if problems:
        click.echo(str(CatalogError(problems)), err=True)
        click.echo("Run `reach validate` for the full list.", err=True)
        sys.exit(EXIT_CONFIG)
    return catalog


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """agent-reach: a governed path from AI agents' intents to business systems."""


@main.command()
@click.argument("directory", required=False)
def validate(directory: str | None) -> None:
    """Check a catalog (default: $REACH_CATALOG) and report every problem with file and line."""
    target = directory or _settings().catalog_dir
    loaded = load_directory(target)
    catalog, problems = build(loaded)
    for warning in sorted(loaded.warnings):
        click.echo(f"{warning} (warning)")
    for problem in sorted(problems):
        click.echo(str(problem))
    if problems:
        click.echo(f"{len(problems)} problem(s) in {target}", err=True)
        sys.exit(EXIT_PROBLEMS)
    actions = sum(len(c.actions) for c in catalog.connectors.values())
    click.echo(f"ok: {len(catalog.connectors)} connector(s), {actions} action(s), {len(catalog.agents)} agent app(s) in {target}")


@main.command("catalog")
@click.option("--agent", "agent", help="Only the actions this agent app may use.")
@click.option("--format", "fmt", type=click.Choice(["table", "json", "openai", "anthropic", "mcp"]), default="table",
              show_default=True)
@click.option("--dir", "directory", help="Catalog directory (default: $REACH_CATALOG).")
def catalog_cmd(agent: str | None, fmt: str, directory: str | None) -> None:
    """Show what an agent can do, as a table or as tool schemas."""
    from producers.tools import export

    catalog = _load_catalog(directory or _settings().catalog_dir)
    if agent is not None and agent not in catalog.agents:
        click.echo(f"no agent_app named {agent!r} (known: {', '.join(sorted(catalog.agents)) or 'none'})", err=True)
        sys.exit(EXIT_CONFIG)
    tools = catalog.tools_for(agent) if agent else catalog.all_tools()
    if fmt != "table":
        click.echo(json.dumps(export(tools, fmt), indent=2, ensure_ascii=False))
        return
    refs = [r for r in catalog.refs.values() if agent is None or catalog.allows(agent, r)]
    rows = [(r.qualified, r.action.permission, r.action.method + " " + r.action.template,
             ", ".join(f"{n}{'*' if f.required else ''}" for n, f in r.action.input.items()),
             r.action.description or "") for r in refs]
    _print_table(("action", "permission", "call", "params (* required)", "description"), rows)


def _print_table(header: tuple[str, ...], rows: list[tuple[Any, ...]]) -> None:
    cells = [tuple(str(c) for c in header)] + [tuple(str(c) for c in row) for row in rows]
    widths = [min(48, max(len(r[i]) for r in cells)) for i in range(len(header))]
    for n, row in enumerate(cells):
        click.echo("  ".join(c[:w].ljust(w) for c, w in zip(row, widths)).rstrip())
        if n == 0:
            click.echo("  ".join("-" * w for w in widths))


@main.command()
def setup() -> None:
    """Declare the exchanges and queues of the topology (idempotent)."""
    from kombu import Connection

    from workers.topology import declare_all

    settings = _settings()
    catalog = _load_catalog(settings.catalog_dir)
    with Connection(settings.broker_url, connect_timeout=10) as conn:
        names = declare_all(conn, catalog.connectors)
    click.echo("declared: reach.intents (exchange), reach.receipts (exchange), " + ", ".join(names))


@main.command()
def router() -> None:
    """Run the router: consumes reach.intents and checks every intent before dispatch."""
    from workers.runner import run_router

    settings = _settings()
    _setup_logging(settings.log_level)
    run_router(settings, _load_catalog(settings.catalog_dir))


@main.command()
@click.argument("connector")
@click.option("-c", "--concurrency", type=click.IntRange(1, 1000), help="Threads (default: the connector's pool.concurrency).")
def worker(connector: str, concurrency: int | None) -> None:
    """Run CONNECTOR's isolated pool: consumes only reach.connector.CONNECTOR."""
    from workers.runner import run_pool

    settings = _settings()
    _setup_logging(settings.log_level)
    catalog = _load_catalog(settings.catalog_dir)
    if connector not in catalog.connectors:
        click.echo(f"no connector named {connector!r} in {settings.catalog_dir} "
                   f"(known: {', '.join(sorted(catalog.connectors)) or 'none'})", err=True)
        sys.exit(EXIT_CONFIG)
    run_pool(settings, catalog, connector, concurrency)


@main.command()
def beat() -> None:
    """Probe every connector's health and mark it up or down for the router."""
    from workers.runner import run_beat

    settings = _settings()
    _setup_logging(settings.log_level)
    run_beat(settings, _load_catalog(settings.catalog_dir))


def _parse_param(text: str) -> tuple[str, Any]:
    """``key=value`` gives a string; ``key:=json`` gives a typed value (httpie's convention)."""
    key, sep, value = text.partition("=")
    if not sep or not key.rstrip(":"):
        raise click.BadParameter(f"{text!r}: write key=value (a string) or key:=json (a number, boolean, list …)")
    if not key.endswith(":"):
        return key, value
    try:
        return key[:-1], json.loads(value)
    except ValueError:
        raise click.BadParameter(f"{text!r}: the value after := must be JSON") from None


@main.command()
@click.argument("action")
@click.option("--agent", "agent", required=True, help="The agent app to act as.")
@click.option("-p", "--param", "params", multiple=True, help="key=value (string) or key:=json (typed). Repeatable.")
@click.option("--idempotency-key", help="Defaults to the intent id.")
@click.option("--intent-id", help="Defaults to a new id.")
@click.option("--wait/--no-wait", default=False, help="Wait for the receipt and print it.")
@click.option("--timeout", type=float, default=30.0, show_default=True, help="Seconds to wait with --wait.")
def send(action: str, agent: str, params: tuple[str, ...], idempotency_key: str | None, intent_id: str | None,
         wait: bool, timeout: float) -> None:
    """Publish an intent from the shell; with --wait, print its receipt (exit 1 unless it succeeded)."""
    from producers.client import ReachClient, ReachError, ReceiptTimeout

    settings = _settings()
    values = dict(_parse_param(p) for p in params)
    from urllib.parse import urlsplit

    try:
        # logged in as the agent itself: send user_id, so REACH_REQUIRE_USER_ID fleets accept it
        client = ReachClient(agent, settings.broker_url, authenticated=urlsplit(settings.broker_url).username == agent)
    except Exception as exc:  # connection refused, auth: say so plainly
        click.echo(f"cannot reach the broker at {_redact(settings.broker_url)}: {exc}", err=True)
        sys.exit(EXIT_CONFIG)
    with client:
        try:
            sent_id = client.publish(action, values, intent_id=intent_id, idempotency_key=idempotency_key)
        except (ValueError, ReachError) as exc:
            click.echo(f"not sent: {exc}", err=True)
            sys.exit(EXIT_CONFIG)
        if not wait:
            click.echo(sent_id)
            return
        try:
            receipt = client.wait(sent_id, timeout=timeout)
        except ReceiptTimeout:
            click.echo(f"no receipt for {sent_id} within {timeout:g}s (is `reach router` running?)", err=True)
            sys.exit(EXIT_PROBLEMS)
    click.echo(json.dumps(receipt.model_dump(mode="json"), indent=2, ensure_ascii=False))
    sys.exit(0 if receipt.success else EXIT_PROBLEMS)


@main.command()
@click.option("--keep-running", is_flag=True, help="Leave the fleet running after the scripted intents (Ctrl-C stops).")
def demo(keep_running: bool) -> None:
    """Run the whole fleet on this machine with an example ticket system."""
    from workers.demo import run_demo

    sys.exit(run_demo(_settings(), keep_running=keep_running))


from workers.agents import agent_user  # noqa: E402

main.add_command(agent_user, "agent-user")


def _redact(url: str) -> str:
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.password:
        return url.replace(f":{parts.password}@", ":***@")
    return url


if __name__ == "__main__":  # pragma: no cover
    main()
