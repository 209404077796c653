"""The ``reach`` command: a thin shell over the library.

Exit codes: 0 success; 1 the thing checked is not right (catalog problems, a receipt that did
not succeed, no receipt in time); 2 usage or configuration errors (unknown connector, missing
secret, unreadable catalog, broker unreachable).
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any, NoReturn

import click

from connectors.catalog import Catalog, build
from connectors.loader import CatalogError, LoadResult, Problem, load_directory
from connectors.spec import ConnectorSpec
from workers.ops.table import print_table
from workers.settings import Settings, SettingsError
from workers.state.client import connect_redis

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


def _catalog_if_any(settings: Settings, without: str) -> Catalog | None:
    """The catalog when $REACH_CATALOG (default ./catalog) is a directory; None when not, saying on
    stderr what the command does ``without`` it."""
    if Path(settings.catalog_dir).is_dir():
        return _load_catalog(settings.catalog_dir)
    click.echo(f"no catalog at {settings.catalog_dir!r} (REACH_CATALOG): {without}", err=True)
    return None


def _unreachable(settings: Settings, exc: Exception) -> NoReturn:
    """Say which service did not answer, where, and exit 2."""
    from workers.ops.fleet import Unreachable, redact_url

    where = {"Redis": settings.redis_url, "RabbitMQ": settings.broker_url}
    service = exc.service if isinstance(exc, Unreachable) else "RabbitMQ"
    click.echo(
        f"cannot read the fleet's state: {exc} (at {redact_url(where[service])}; "
        f"set REACH_BROKER_URL and REACH_REDIS_URL)",
        err=True,
    )
    sys.exit(EXIT_CONFIG)


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
    problems.extend(_system_problems(catalog, loaded))
    if problems:
        click.echo(f"{len(problems)} problem(s) in {target}", err=True)
        sys.exit(EXIT_PROBLEMS)
    actions = sum(len(c.actions) for c in catalog.connectors.values())
    click.echo(
        f"ok: {len(catalog.connectors)} connector(s), {actions} action(s), {len(catalog.agents)} agent app(s) in {target}"
    )


def _system_problems(catalog: Catalog, loaded: LoadResult) -> list[Problem]:
    """Check connectors against their systems' own descriptions (a SOAP connector's WSDL), and
    print what does not match."""
    from connectors.adapters.factory import system_problems

    found = []
    for doc in loaded.connectors:
        connector = doc.model
        if not isinstance(connector, ConnectorSpec) or connector.name not in catalog.connectors:
            continue
        for message in system_problems(connector):
            problem = Problem(doc.file, doc.line, f"connector {connector.name}: {message}")
            click.echo(str(problem))
            found.append(problem)
    return found


@main.command("catalog")
@click.option("--agent", "agent", help="Only the actions this agent app may use.")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["table", "json", "openai", "anthropic", "mcp"]),
    default="table",
    show_default=True,
)
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
    rows = [
        (
            r.qualified,
            r.action.permission,
            r.action.target,
            ", ".join(f"{n}{'*' if f.required else ''}" for n, f in r.action.input.items()),
            r.action.description or "",
        )
        for r in refs
    ]
    print_table(("action", "permission", "call", "params (* required)", "description"), rows)


@main.command()
@click.option(
    "--agent-queue-expires-ms",
    type=click.IntRange(min=1),
    default=60_000,
    show_default=True,
    help="An agent's amq.gen-* queue that nobody uses this long is deleted, with its bindings.",
)
@click.option(
    "--agent-queue-max-length",
    type=click.IntRange(min=1),
    default=10_000,
    show_default=True,
    help="Messages an agent's amq.gen-* queue keeps (the oldest are dropped).",
)
@click.option(
    "--max-queues",
    type=click.IntRange(min=-1),
    default=10_000,
    show_default=True,
    help="Queues in the vhost, the fleet's and agents' together (-1: no limit; other vhost limits are kept).",
)
@click.option(
    "--rabbitmqctl",
    "rabbitmqctl",
    metavar="CMD",
    help="How to run rabbitmqctl against this broker, e.g. "
    "'docker exec -i rabbitmq rabbitmqctl' (default: rabbitmqctl, only when the broker is on this host).",
)
@click.option(
    "--print",
    "print_only",
    is_flag=True,
    help="Only print the broker policy commands (rabbitmqctl and management API); declare nothing.",
)
@click.option("--skip-broker-policy", is_flag=True, help="Declare the topology only (the policy is applied elsewhere).")
def setup(
    agent_queue_expires_ms: int,
    agent_queue_max_length: int,
    max_queues: int,
    rabbitmqctl: str | None,
    print_only: bool,
    skip_broker_policy: bool,
) -> None:
    """Declare the topology, and bound what agents may leave on the broker (idempotent).

    With a catalog ($REACH_CATALOG) every connector's queue is declared too; without, the base
    topology only (reach.intents, reach.receipts, reach.dispatch, reach.dlq): each pool declares
    its connector's queue when it starts.

    The bounds: the operator policy reach-agent-queues on ^amq\\.gen- queues (expiry, length)
    and the vhost's queue limit, set with rabbitmqctl. Where it cannot be run (a remote broker),
    setup prints the commands to run instead and exits 1.
    """
    import shlex
    import shutil
    from urllib.parse import urlsplit

    from kombu import Connection
    from kombu.exceptions import OperationalError

    from workers.ops.agents import AgentUserError, apply_broker_policy, vhost_of
    from workers.ops.broker_policy import (
        AGENT_QUEUE_POLICY,
        AgentQueuePolicy,
        management_api_requests,
        policy_command,
        vhost_limits_command,
    )
    from workers.ops.fleet import redact_url
    from workers.ops.runner import dead_letter_bounds
    from workers.transport.topology import declare_all

    settings = _settings()
    if max_queues == 0:
        raise click.BadParameter(
            "0 would refuse every queue, the fleet's too; -1 means no limit", param_hint="--max-queues"
        )
    policy = AgentQueuePolicy(agent_queue_expires_ms, agent_queue_max_length)
    vhost = vhost_of(settings.broker_url)
    host = urlsplit(settings.broker_url).hostname or "localhost"

    def instructions() -> None:
        click.echo(
            f"on the broker host, run (set_vhost_limits replaces the vhost's other limits; "
            f"see `rabbitmqctl list_vhost_limits --vhost={vhost}`):",
            err=True,
        )
        for command in (policy_command(vhost, policy), vhost_limits_command(vhost, {"max-queues": max_queues})):
            click.echo("  " + shlex.join(command), err=True)
        click.echo("or over the management API (a user with the administrator tag):", err=True)
        for request in management_api_requests(vhost, policy, max_queues, f"http://{host}:15672"):
            click.echo("  " + request, err=True)

    if print_only:
        for command in (policy_command(vhost, policy), vhost_limits_command(vhost, {"max-queues": max_queues})):
            click.echo(shlex.join(command))
        for request in management_api_requests(vhost, policy, max_queues, f"http://{host}:15672"):
            click.echo("# or: " + request)
        return
    catalog = _catalog_if_any(settings, "declaring the base topology")
    conn = Connection(settings.broker_url, connect_timeout=10)
    try:
        with conn:
            conn.ensure_connection(max_retries=1)
            names = declare_all(conn, catalog.connectors if catalog else [], dead_letter_bounds(settings))
    except (OperationalError, *conn.connection_errors, *conn.channel_errors) as exc:
        # refused, access refused, no such vhost: the broker's own words say which
        click.echo(
            f"cannot declare the topology on RabbitMQ at {redact_url(settings.broker_url)}: "
            f"{type(exc).__name__}: {exc}",
            err=True,
        )
        sys.exit(EXIT_CONFIG)
    click.echo(
        "declared: reach.intents (exchange), reach.receipts (exchange), reach.dispatch (exchange), " + ", ".join(names)
    )
    if catalog is None:
        click.echo(
            "connector queues (reach.connector.NAME) are declared by their pools (`reach worker NAME`) when they start",
            err=True,
        )
    if skip_broker_policy:
        click.echo(
            f"broker policy skipped: agents' amq.gen-* queues are bounded only if {AGENT_QUEUE_POLICY} "
            f"is applied elsewhere (`reach setup --print` shows how)",
            err=True,
        )
        return
    if rabbitmqctl is None:
        if host not in ("localhost", "127.0.0.1", "::1") or shutil.which("rabbitmqctl") is None:
            # a local rabbitmqctl would change some other broker
            click.echo(
                f"NOT applied: the agent-queue policy and queue limit of vhost {vhost!r} (no rabbitmqctl "
                f"for the broker at {host}; pass --rabbitmqctl CMD, or --skip-broker-policy)",
                err=True,
            )
            instructions()
            sys.exit(EXIT_PROBLEMS)
        rabbitmqctl = "rabbitmqctl"
    try:
        bounds = apply_broker_policy(vhost, policy, max_queues, rabbitmqctl)
    except AgentUserError as exc:
        click.echo(f"NOT applied: the agent-queue policy and queue limit of vhost {vhost!r}: {exc}", err=True)
        instructions()
        sys.exit(EXIT_PROBLEMS)
    click.echo(
        f"operator policy {AGENT_QUEUE_POLICY} on ^amq\\.gen- queues in vhost {vhost!r}: "
        f"{json.dumps(bounds.policy, sort_keys=True)}; vhost max-queues {bounds.max_queues}"
    )


@main.command()
def router() -> None:
    """Run the router: consumes reach.intents and checks every intent before dispatch."""
    from workers.ops.runner import run_router

    settings = _settings()
    _setup_logging(settings.log_level)
    run_router(settings, _load_catalog(settings.catalog_dir))


@main.command()
@click.argument("connector")
@click.option(
    "-c", "--concurrency", type=click.IntRange(1, 1000), help="Threads (default: the connector's pool.concurrency)."
)
def worker(connector: str, concurrency: int | None) -> None:
    """Run CONNECTOR's isolated pool: consumes only reach.connector.CONNECTOR."""
    from workers.ops.runner import run_pool

    settings = _settings()
    _setup_logging(settings.log_level)
    catalog = _load_catalog(settings.catalog_dir)
    if connector not in catalog.connectors:
        click.echo(
            f"no connector named {connector!r} in {settings.catalog_dir} "
            f"(known: {', '.join(sorted(catalog.connectors)) or 'none'})",
            err=True,
        )
        sys.exit(EXIT_CONFIG)
    run_pool(settings, catalog, connector, concurrency)


@main.command()
def beat() -> None:
    """Probe every connector's health and mark it up or down for the router."""
    from workers.ops.runner import run_beat

    settings = _settings()
    _setup_logging(settings.log_level)
    run_beat(settings, _load_catalog(settings.catalog_dir))


def _known_connector(settings: Settings, client: Any, connector: str) -> None:
    """Exit 2 unless ``connector`` is in the catalog, or (no catalog) has left state in Redis."""
    from redis import RedisError

    from workers.ops.fleet import Unreachable, discover_connectors

    catalog = _catalog_if_any(settings, "looking the connector up in Redis")
    if catalog is not None:
        known = sorted(catalog.connectors)
    else:
        try:
            known = discover_connectors(client)
        except RedisError as exc:
            _unreachable(settings, Unreachable("Redis", exc))
    if connector not in known:
        where = "" if catalog is not None else " in Redis"
        click.echo(f"no connector named {connector!r}{where} (known: {', '.join(known) or 'none'})", err=True)
        sys.exit(EXIT_CONFIG)


@main.command()
@click.argument("connector")
def pause(connector: str) -> None:
    """Make CONNECTOR's pools stop consuming; intents wait in its queue (nothing is lost)."""
    from workers.state.control import set_paused

    settings = _settings()
    client = connect_redis(settings)
    _known_connector(settings, client, connector)
    set_paused(client, connector, True)
    click.echo(f"{connector}: paused (its pools stop consuming within a second; `reach resume {connector}` undoes it)")


@main.command()
@click.argument("connector")
def resume(connector: str) -> None:
    """Make CONNECTOR's pools consume again."""
    from workers.state.control import set_paused

    settings = _settings()
    client = connect_redis(settings)
    _known_connector(settings, client, connector)
    set_paused(client, connector, False)
    click.echo(f"{connector}: resumed")


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def status(as_json: bool) -> None:
    """Per connector: queue depth, consumers, in-flight, breaker, health, paused, last error.

    The connectors are the catalog's ($REACH_CATALOG) when there is one; without, those that
    left state in Redis (pools, health probes, breakers, pauses). Needs only REACH_BROKER_URL and
    REACH_REDIS_URL. Exits 2 when the broker or Redis cannot be reached.
    """
    from workers.ops.fleet import Unreachable, fleet_status

    settings = _settings()
    catalog = _catalog_if_any(settings, "showing the connectors found in Redis")
    try:
        rows = fleet_status(
            None if catalog is None else catalog.connectors, settings.broker_url, connect_redis(settings)
        )
    except Unreachable as exc:
        _unreachable(settings, exc)
    if as_json:
        click.echo(json.dumps([r.to_dict() for r in rows], indent=2))
        return
    if not rows and catalog is None:
        click.echo("no connectors found in Redis: no pool has run against it yet", err=True)
    print_table(
        ("connector", "queued", "consumers", "in-flight", "workers", "breaker", "health", "paused", "last error"),
        [
            (
                r.connector,
                "-" if r.queue_depth is None else r.queue_depth,
                "-" if r.consumers is None else r.consumers,
                r.in_flight,
                r.workers,
                r.breaker,
                r.health,
                "yes" if r.paused else "no",
                r.last_error or "-",
            )
            for r in rows
        ],
    )


@main.command()
@click.argument("intent_id")
@click.option(
    "--agent", "agent", default=None, help="The agent that sent the intent (found by a bounded scan if omitted)."
)
def trace(intent_id: str, agent: str | None) -> None:
    """The stages of one intent with timings (kept in Redis for a day, per agent)."""
    from workers.observability.audit import read_trace, trace_agents

    settings = _settings()
    client = connect_redis(settings)
    if agent is None:
        agents = trace_agents(client, intent_id)
        if not agents:
            click.echo(f"no stages recorded for {intent_id} (unknown id, expired, or audit_level none)", err=True)
            sys.exit(EXIT_PROBLEMS)
        if len(agents) > 1:
            click.echo(
                f"{len(agents)} agents sent an intent {intent_id}: {', '.join(agents)}; choose one with --agent",
                err=True,
            )
            sys.exit(EXIT_PROBLEMS)
        agent = agents[0]
        click.echo(f"agent {agent}", err=True)
    events = read_trace(client, agent, intent_id)
    if not events:
        click.echo(
            f"no stages recorded for {intent_id} of agent {agent} (unknown id, expired, or audit_level none)", err=True
        )
        sys.exit(EXIT_PROBLEMS)
    start = events[0]["ts"]
    skip = {"ts", "event", "stage", "intent_id"}
    for event in events:
        details = " ".join(f"{k}={v}" for k, v in event.items() if k not in skip)
        click.echo(f"+{(event['ts'] - start) * 1000:9.1f} ms  {event['stage']:<10} {details}")


@main.group()
def dlq() -> None:
    """Dead letters: messages the fleet could not process, with the reason."""


@dlq.command("list")
@click.option("--limit", type=click.IntRange(1, 10000), default=100, show_default=True)
def dlq_list(limit: int) -> None:
    """Show dead letters (reason, agent, time, a redacted preview) without removing them."""
    from workers.ops.fleet import list_dead_letters

    letters = list_dead_letters(_settings().broker_url, limit)
    if not letters:
        click.echo("reach.dlq is empty")
        return
    print_table(
        ("message id", "received", "agent", "connector", "reason", "preview"),
        [
            (d.message_id or "-", d.received_at or "-", d.agent or "-", d.connector or "-", d.reason, d.preview)
            for d in letters
        ],
    )


@dlq.command("replay")
@click.option("--id", "ids", multiple=True, help="Message id to replay (repeatable); default: all.")
def dlq_replay(ids: tuple[str, ...]) -> None:
    """Send dead letters back through the fleet; idempotency keys are kept, so nothing runs twice.

    A letter whose sensitive params were redacted is not replayed (the system would get the
    placeholder): it stays in reach.dlq, is reported, and the exit code is 1.
    """
    from workers.ops.fleet import replay_dead_letters
    from workers.transport.app import JobMessages, create_app
    from workers.transport.topology import connector_queue

    settings = _settings()
    # only for the reach.execute message template, as the router builds it (no params in headers)
    jobs = JobMessages(create_app(settings, [connector_queue("_replay")]))
    done = replay_dead_letters(settings.broker_url, connect_redis(settings), set(ids) if ids else None, jobs)
    for message_id, why in done.kept:
        click.echo(f"not replayed {message_id or '(no message id)'}: {why}")
    missing = set(ids) - set(done.replayed) - {message_id for message_id, _ in done.kept}
    click.echo(
        f"replayed {len(done.replayed)} dead letter(s)"
        + (f"; {len(done.kept)} kept in reach.dlq" if done.kept else "")
        + (f"; not found: {', '.join(sorted(missing))}" if missing else "")
    )
    sys.exit(EXIT_PROBLEMS if missing or done.kept else 0)


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
def send(
    action: str,
    agent: str,
    params: tuple[str, ...],
    idempotency_key: str | None,
    intent_id: str | None,
    wait: bool,
    timeout: float,
) -> None:
    """Publish an intent from the shell; with --wait, print its receipt (exit 1 unless it succeeded)."""
    from producers.client import ReachClient, ReachError, ReceiptTimeout
    from workers.ops.fleet import redact_url

    settings = _settings()
    values = dict(_parse_param(p) for p in params)
    from urllib.parse import urlsplit

    try:
        # logged in as the agent itself: send user_id, so REACH_REQUIRE_USER_ID fleets accept it
        client = ReachClient(agent, settings.broker_url, authenticated=urlsplit(settings.broker_url).username == agent)
    except Exception as exc:  # connection refused, auth: say so plainly
        click.echo(f"cannot reach the broker at {redact_url(settings.broker_url)}: {exc}", err=True)
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
    from workers.ops.demo import run_demo

    sys.exit(run_demo(_settings(), keep_running=keep_running))


from workers.ops.agents import agent_user  # noqa: E402

main.add_command(agent_user, "agent-user")


if __name__ == "__main__":  # pragma: no cover
    main()
