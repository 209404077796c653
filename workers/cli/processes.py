"""The long-running processes: ``reach router``, ``reach worker``, ``reach beat``, ``reach mcp``,
``reach console`` and ``reach demo`` (all of them on this machine). Each reads its settings and
catalog here and hands them to the function that runs it."""

from __future__ import annotations

import logging
import sys

import click

from workers.cli.common import check_agent, fail, load_catalog, read_settings, setup_logging


@click.command()
def router() -> None:
    """Run the router: consumes reach.intents and checks every intent before dispatch."""
    from workers.ops.startup import run_router

    settings = read_settings()
    setup_logging(settings.log_level)
    run_router(settings, load_catalog(settings.catalog_dir))


@click.command()
@click.argument("connectors", nargs=-1, required=True, metavar="CONNECTOR[:THREADS]...")
@click.option(
    "-c",
    "--concurrency",
    type=click.IntRange(1, 1000),
    help="Threads of each connector named without :THREADS (default: its pool.concurrency).",
)
@click.option("--group", "group", help="The pool group's name in logs and `reach status` (default: NAME+NAME...).")
def worker(connectors: tuple[str, ...], concurrency: int | None, group: str | None) -> None:
    """Run a connector's isolated pool: consumes only reach.connector.CONNECTOR.

    Several connectors make a pool group: one process, and each connector still a bulkhead of its
    own (its consumer and prefetch, threads, breaker, pause flag), so a slow one cannot take the
    others' threads. CONNECTOR:THREADS sets one connector's threads. Give large or critical
    connectors a process of their own.
    """
    from workers.ops.startup import GROUP_NAME, parse_members, run_pool

    try:
        members = parse_members(connectors, concurrency)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="CONNECTOR[:THREADS]") from None
    if group is not None and not GROUP_NAME.match(group):
        raise click.BadParameter(
            f"{group!r}: lowercase letters, digits, _ and -, starting with a letter, at most 63", param_hint="--group"
        )
    settings = read_settings()
    setup_logging(settings.log_level)
    catalog = load_catalog(settings.catalog_dir)
    unknown = [m.connector for m in members if m.connector not in catalog.connectors]
    if unknown:
        fail(
            f"no connector named {', '.join(repr(n) for n in unknown)} in {settings.catalog_dir} "
            f"(known: {', '.join(sorted(catalog.connectors)) or 'none'})"
        )
    run_pool(settings, catalog, members, group)


@click.command()
def beat() -> None:
    """Probe every connector's health and mark it up or down for the router."""
    from workers.ops.startup import run_beat

    settings = read_settings()
    setup_logging(settings.log_level)
    run_beat(settings, load_catalog(settings.catalog_dir))


@click.command()
@click.option("--keep-running", is_flag=True, help="Leave the fleet running after the scripted intents (Ctrl-C stops).")
def demo(keep_running: bool) -> None:
    """Run the whole fleet on this machine with an example ticket system."""
    from workers.ops.demo import run_demo

    sys.exit(run_demo(read_settings(), keep_running=keep_running))


@click.command("mcp")
@click.option("--stdio", "transport", flag_value="stdio", help="Serve one agent on stdin/stdout (needs --agent).")
@click.option("--http", "transport", flag_value="http", help="Serve every agent over stateless Streamable HTTP.")
@click.option("--agent", "agent", help="With --stdio: the agent app; REACH_BROKER_URL should be its own login.")
@click.option("--host", help="With --http: listen address (default: $REACH_MCP_HOST).")
@click.option("--port", type=click.IntRange(1, 65535), help="With --http: port (default: $REACH_MCP_PORT).")
def mcp_cmd(transport: str | None, agent: str | None, host: str | None, port: int | None) -> None:
    """Serve each agent's own tools over MCP; a tools/call is an intent, its receipt the result.

    Over HTTP the agent is the bearer token's (REACH_MCP_TOKENS_FILE, REACH_MCP_JWT_KEY) and the
    broker login needs the impersonator tag (`reach mcp-user create`).
    """
    if transport is None or (transport == "stdio") != (agent is not None):
        raise click.UsageError("use --stdio --agent NAME, or --http (the agent then comes from the bearer token)")
    settings = read_settings()
    catalog = load_catalog(settings.catalog_dir)
    # stdout is the MCP wire under --stdio: logs go to stderr
    logging.basicConfig(
        level=settings.log_level, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    from workers.mcp.http import run_http
    from workers.mcp.server import run_stdio
    from workers.mcp.tokens import TokenConfigError

    if agent is not None:
        check_agent(catalog, agent)
        run_stdio(settings, catalog, agent)
        return
    try:
        run_http(settings, catalog, host or settings.mcp_host, port or settings.mcp_port)
    except TokenConfigError as exc:
        fail(f"configuration error: {exc}")


@click.group("console", invoke_without_command=True)
@click.option("--host", help="Listen address (default: $REACH_CONSOLE_HOST, 127.0.0.1).")
@click.option("--port", type=click.IntRange(1, 65535), help="Port (default: $REACH_CONSOLE_PORT, 8090).")
@click.pass_context
def console_cmd(ctx: click.Context, host: str | None, port: int | None) -> None:
    """Serve the operator web page: fleet, approvals, dead letters, trace (docs/operations.md, "Console").

    Users and roles come from REACH_CONSOLE_USERS (hashes from `reach console hash-password`).
    Exit 2 when it is unset or cannot be read.
    """
    if ctx.invoked_subcommand is not None:
        return
    from workers.console.server import NoUsers, run_console
    from workers.console.users import UsersFileError

    settings = read_settings()
    setup_logging(settings.log_level)
    try:
        run_console(settings, host or settings.console_host, port or settings.console_port)
    except (NoUsers, UsersFileError) as exc:
        fail(f"configuration error: {exc}")


@console_cmd.command("hash-password")
@click.option("--stdin", "from_stdin", is_flag=True, help="Read the password from stdin instead of prompting.")
def console_hash_password(from_stdin: bool) -> None:
    """Print the scrypt hash of a password for a REACH_CONSOLE_USERS entry."""
    from workers.console.users import MAX_PASSWORD_BYTES, hash_password

    if from_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    else:
        password = click.prompt("password", hide_input=True, confirmation_prompt=True)
    if not password or len(password.encode()) > MAX_PASSWORD_BYTES:
        fail(f"a password must have 1 to {MAX_PASSWORD_BYTES} bytes")
    click.echo(hash_password(password))
