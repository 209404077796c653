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
    type=click.Choice(["table", "json", "openai", "openai-responses", "anthropic", "mcp"]),
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


@main.command("route")
@click.argument("text")
@click.option("--action", "action", required=True, help="The bare action the agent would send, e.g. create_ticket.")
@click.option("--agent", "agent", required=True, help="The agent app whose connectors are ranked.")
@click.option("--domain", help="The intent's context.domain, if it would carry one.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output: the routing note.")
@click.option("--dir", "directory", help="Catalog directory (default: $REACH_CATALOG).")
def route_cmd(text: str, action: str, agent: str, domain: str | None, as_json: bool, directory: str | None) -> None:
    """Rank the connectors offering ACTION for a request TEXT, as the router would for the intent
    {"action": ACTION, "context": {"description": TEXT}} of AGENT, and say what it would do.

    Embeddings come from the router's cache in Redis ($REACH_REDIS_URL) when it answers; the
    candidates' texts are embedded here otherwise. The rule checks that need an intent's params
    or the time of day are not applied. Exit codes: 0 the ranking was printed, 2 unknown agent or
    action.
    """
    from connectors.catalog import Candidates, Refusal
    from workers.router.semantic import SemanticRouting
    from workers.state.embeddings import RedisVectorCache

    settings = _settings()
    logging.basicConfig(level="ERROR")  # the cache's warning when Redis is away is enough
    catalog = _load_catalog(directory or settings.catalog_dir)
    if agent not in catalog.agents:
        click.echo(f"no agent_app named {agent!r} (known: {', '.join(sorted(catalog.agents)) or 'none'})", err=True)
        sys.exit(EXIT_CONFIG)
    found = catalog.resolve_candidates(action, agent)
    if isinstance(found, Refusal):
        click.echo(f"{found.code.value}: {found.message}", err=True)
        sys.exit(EXIT_CONFIG)
    if not isinstance(found, Candidates):
        click.echo(f"{found.qualified}: the only connector of {agent} offering {action!r}; no ranking needed")
        return
    routing = SemanticRouting(catalog, RedisVectorCache(connect_redis(settings)), embed_all=False)
    choice = routing.choose(found, agent, text, domain, runnable=lambda ref: None)
    if as_json:
        click.echo(json.dumps({"dispatch": choice.ref.qualified if choice.ref else None, **choice.note}, indent=2))
        return
    descriptions = {r.qualified: r.connector.description or r.action.description or "" for r in found.refs}
    rows = [
        (
            str(i + 1),
            c["action"],
            *(f"{c[k]:.4f}" if k in c else "-" for k in ("score", "semantic", "lexical", "rules")),
            descriptions.get(c["action"], "")[:60],
        )
        for i, c in enumerate(choice.note["candidates"])
    ]
    print_table(("#", "action", "score", "semantic", "lexical", "rules", "connector"), rows)
    how = f"{choice.note['method']}, model {choice.note.get('model', '-')}"
    if choice.ref is not None:
        lead = choice.note.get("lead")
        click.echo(f"dispatch to {choice.ref.qualified} ({how}; lead {lead} >= margin {catalog.routing.margin})")
    else:
        click.echo(
            f"AMBIGUOUS_ACTION ({how}; lead {choice.note.get('lead')} < margin {catalog.routing.margin}): "
            "the agent would be asked to let its user choose"
        )


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
@click.option(
    "--migrate-queues",
    is_flag=True,
    help="Re-create the fleet's queues that exist with another type (REACH_QUEUE_TYPE) or other arguments, "
    "messages kept. Stop the routers and pools first.",
)
def setup(
    agent_queue_expires_ms: int,
    agent_queue_max_length: int,
    max_queues: int,
    rabbitmqctl: str | None,
    print_only: bool,
    skip_broker_policy: bool,
    migrate_queues: bool,
) -> None:
    """Declare the topology, and bound what agents may leave on the broker (idempotent).

    With a catalog ($REACH_CATALOG) every connector's queue is declared too; without, the base
    topology only (reach.intents, reach.receipts, reach.dispatch, reach.dlq): each pool declares
    its connector's queue when it starts.

    The bounds: the operator policy reach-agent-queues on ^amq\\.gen- queues (expiry, length)
    and the vhost's queue limit, set with rabbitmqctl. Where it cannot be run (a remote broker),
    setup prints the commands to run instead and exits 1.

    A queue that exists with another type or other arguments than the fleet declares (classic
    queues from before REACH_QUEUE_TYPE=quorum) is refused by the broker: setup says which and
    exits 2; --migrate-queues re-creates them with their messages (docs/operations.md, "Queue types").
    """
    import shlex
    import shutil
    from urllib.parse import urlsplit

    from kombu import Connection
    from kombu.exceptions import OperationalError

    from producers.client_settings import broker_urls
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
    from workers.transport.migration import MigrationError
    from workers.transport.migration import migrate_queues as migrate
    from workers.transport.topology import TopologyMismatch, declare_all, fleet_queues

    settings = _settings()
    if max_queues == 0:
        raise click.BadParameter(
            "0 would refuse every queue, the fleet's too; -1 means no limit", param_hint="--max-queues"
        )
    policy = AgentQueuePolicy(agent_queue_expires_ms, agent_queue_max_length)
    first_url = broker_urls(settings.broker_url)[0]  # a cluster's nodes share vhost and users
    vhost = vhost_of(first_url)
    host = urlsplit(first_url).hostname or "localhost"

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
    connectors = catalog.connectors if catalog else {}
    conn = Connection(settings.broker_url, connect_timeout=10)
    try:
        with conn:
            conn.ensure_connection(max_retries=len(broker_urls(settings.broker_url)))
            if migrate_queues:
                queues = fleet_queues(connectors, dead_letter_bounds(settings), settings.queue_type)
                done = migrate(conn, queues, report=lambda line: click.echo(line, err=True))
                for migrated in done:
                    click.echo(f"migrated {migrated.queue} ({settings.queue_type}): {migrated.moved} message(s) kept")
                if not done:
                    click.echo(f"no queue to migrate: the fleet's queues are {settings.queue_type} queues as declared")
            names = declare_all(conn, connectors, dead_letter_bounds(settings), settings.queue_type)
    except (TopologyMismatch, MigrationError) as exc:
        click.echo(f"reach setup: {exc}", err=True)
        sys.exit(EXIT_CONFIG)
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
    from workers.ops.runner import GROUP_NAME, parse_members, run_pool

    try:
        members = parse_members(connectors, concurrency)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="CONNECTOR[:THREADS]") from None
    if group is not None and not GROUP_NAME.match(group):
        raise click.BadParameter(
            f"{group!r}: lowercase letters, digits, _ and -, starting with a letter, at most 63", param_hint="--group"
        )
    settings = _settings()
    _setup_logging(settings.log_level)
    catalog = _load_catalog(settings.catalog_dir)
    unknown = [m.connector for m in members if m.connector not in catalog.connectors]
    if unknown:
        click.echo(
            f"no connector named {', '.join(repr(n) for n in unknown)} in {settings.catalog_dir} "
            f"(known: {', '.join(sorted(catalog.connectors)) or 'none'})",
            err=True,
        )
        sys.exit(EXIT_CONFIG)
    run_pool(settings, catalog, members, group)


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
    done = replay_dead_letters(
        settings.broker_url,
        connect_redis(settings),
        set(ids) if ids else None,
        jobs,
        require_user_id=settings.require_user_id,
    )
    for message_id, why in done.kept:
        click.echo(f"not replayed {message_id or '(no message id)'}: {why}")
    for message_id, why in done.refused:
        click.echo(f"not replayed {message_id}: {why}")
    missing = set(ids) - set(done.replayed) - {m for m, _ in done.kept} - {m for m, _ in done.refused}
    click.echo(
        f"replayed {len(done.replayed)} dead letter(s)"
        + (f"; {len(done.kept)} kept in reach.dlq" if done.kept else "")
        + (f"; {len(done.refused)} refused again by the router" if done.refused else "")
        + (f"; not found: {', '.join(sorted(missing))}" if missing else "")
    )
    sys.exit(EXIT_PROBLEMS if missing or done.kept or done.refused else 0)


@main.group("import")
def import_group() -> None:
    """Write catalog connectors from a system's own description."""


@import_group.command("openapi")
@click.argument("spec", type=click.Path(dir_okay=False, allow_dash=True))
@click.option("--connector", "connector", required=True, help="The connector's name (lowercase letters, digits, _).")
@click.option(
    "--endpoint", help="The system's base URL; overrides the document's servers (needed when they are relative)."
)
@click.option("--include", multiple=True, metavar="TAG|/GLOB", help="Import only these tags or paths. Repeatable.")
@click.option("--exclude", multiple=True, metavar="TAG|/GLOB", help="Leave out these tags or paths. Repeatable.")
@click.option(
    "--max",
    "max_operations",
    type=click.IntRange(min=1),
    default=200,  # connectors.openapi.DEFAULT_MAX_OPERATIONS, without importing the importer for every command
    show_default=True,
    help="Refuse to import more operations than this (choose some with --include).",
)
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Write the catalog here instead of to stdout.")
def import_openapi_cmd(
    spec: str,
    connector: str,
    endpoint: str | None,
    include: tuple[str, ...],
    exclude: tuple[str, ...],
    max_operations: int,
    output: str | None,
) -> None:
    """Write a connector for the OpenAPI document SPEC (Swagger 2.0, OpenAPI 3.0 or 3.1; JSON or
    YAML; - for stdin): one action per operation, to edit and then check with `reach validate`.

    Exit codes: 1 the document is not valid OpenAPI or nothing in it can be imported; 2 it cannot
    be read, or the options do not fit it (too many operations, a relative server URL).
    """
    from connectors.openapi import MAX_DOCUMENT_BYTES, ImportOptions, OpenAPIError, OptionsError, import_openapi

    try:
        with click.open_file(spec, "rb") as handle:
            data = handle.read(MAX_DOCUMENT_BYTES + 1)
    except OSError as exc:
        click.echo(f"cannot read {spec}: {exc.strerror or exc}", err=True)
        sys.exit(EXIT_CONFIG)
    options = ImportOptions(
        connector=connector,
        endpoint=endpoint,
        include=include,
        exclude=exclude,
        max_operations=max_operations,
        source=Path(spec).name if spec != "-" else "",
    )
    try:
        result = import_openapi(data, options)
    except OptionsError as exc:  # too many operations, a relative server URL, a bad connector name
        click.echo(f"not imported: {exc}", err=True)
        sys.exit(EXIT_CONFIG)
    except OpenAPIError as exc:
        click.echo(f"cannot import {spec}: {exc}", err=True)
        sys.exit(EXIT_PROBLEMS)
    if output:
        target = Path(output)
        partial = target.with_name(f".{target.name}.partial")  # hidden: a catalog directory skips it
        try:
            partial.write_text(result.text, encoding="utf-8")
            partial.replace(target)  # never a half-written catalog
        except OSError as exc:
            click.echo(f"cannot write {output}: {exc.strerror or exc}", err=True)
            sys.exit(EXIT_CONFIG)
    else:
        click.echo(result.text, nl=False)
    skipped = f"; {len(result.skipped)} not imported (listed at the top of the file)" if result.skipped else ""
    click.echo(f"{result.actions} action(s) from {result.chosen} operation(s){skipped}", err=True)
    if result.env:
        click.echo(f"credentials are read from: {', '.join(result.env)}", err=True)
    click.echo(
        "next: add what the actions mean to their descriptions, bind them to an agent_app, and run `reach validate`",
        err=True,
    )


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


@main.command("mcp")
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
    settings = _settings()
    catalog = _load_catalog(settings.catalog_dir)
    # stdout is the MCP wire under --stdio: logs go to stderr
    logging.basicConfig(
        level=settings.log_level, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    from workers.mcp.http import run_http
    from workers.mcp.server import run_stdio
    from workers.mcp.tokens import TokenConfigError

    if agent is not None:
        if agent not in catalog.agents:
            click.echo(f"no agent_app named {agent!r} (known: {', '.join(sorted(catalog.agents)) or 'none'})", err=True)
            sys.exit(EXIT_CONFIG)
        run_stdio(settings, catalog, agent)
        return
    try:
        run_http(settings, catalog, host or settings.mcp_host, port or settings.mcp_port)
    except TokenConfigError as exc:
        click.echo(f"configuration error: {exc}", err=True)
        sys.exit(EXIT_CONFIG)


@main.group("console", invoke_without_command=True)
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

    settings = _settings()
    _setup_logging(settings.log_level)
    try:
        run_console(settings, host or settings.console_host, port or settings.console_port)
    except (NoUsers, UsersFileError) as exc:
        click.echo(f"configuration error: {exc}", err=True)
        sys.exit(EXIT_CONFIG)


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
        click.echo(f"a password must have 1 to {MAX_PASSWORD_BYTES} bytes", err=True)
        sys.exit(EXIT_CONFIG)
    click.echo(hash_password(password))


@main.group()
def approvals() -> None:
    """Intents that wait for a person: list, show, approve, deny (docs/contract.md "Approvals")."""


class _AuditToStderr(logging.Handler):
    """The decisions' audit lines, on stderr: stdout is the command's own answer."""

    def emit(self, record: logging.LogRecord) -> None:
        click.echo(record.getMessage(), err=True)


def _approvals_client() -> tuple[Settings, Any]:
    settings = _settings()
    audit = logging.getLogger("reach.audit")
    if not any(isinstance(h, _AuditToStderr) for h in audit.handlers):
        audit.addHandler(_AuditToStderr())
        audit.setLevel(logging.INFO)
        audit.propagate = False
    return settings, connect_redis(settings)


@approvals.command("list")
@click.option("--limit", type=click.IntRange(1, 10000), default=100, show_default=True, help="Rows per page.")
@click.option("--page", type=click.IntRange(1), default=1, show_default=True, help="Which page of --limit rows.")
@click.option("--agent", default=None, help="Only this agent's approvals.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output: the rows (see --counts).")
@click.option(
    "--counts", is_flag=True, help="With --json: an object with the rows, the counts per agent and the pages."
)
def approvals_list(limit: int, page: int, agent: str | None, as_json: bool, counts: bool) -> None:
    """The approvals that still wait, fair to every agent: each agent's soonest to expire first,
    then each agent's second, and so on; the waiting count of every agent comes first."""
    from redis import RedisError

    from workers.ops.approval_decisions import pending_page
    from workers.ops.fleet import Unreachable

    settings, client = _approvals_client()
    try:
        listing = pending_page(client, limit, page, agent)
    except RedisError as exc:
        _unreachable(settings, Unreachable("Redis", exc))
    if as_json:
        shown: Any = listing.to_dict() if counts else [p.to_dict() for p in listing.rows]
        click.echo(json.dumps(shown, indent=2, ensure_ascii=False))
        return
    waiting = ", ".join(f"{name} {n}" for name, n in listing.per_agent.items())
    click.echo(f"waiting: {sum(listing.per_agent.values())}" + (f" ({waiting})" if waiting else ""))
    if not listing.rows:
        click.echo("no approvals wait" + (f" for {agent}" if agent else ""))
        return
    print_table(
        ("approval id", "expires", "agent", "action", "approvers", "summary"),
        [
            (p.approval_id, p.expires_at, p.agent_id, f"{p.connector}.{p.action}", ",".join(p.approvers), p.summary)
            for p in listing.rows
        ],
    )
    if listing.pages > 1:
        first = (listing.page - 1) * listing.per_page + 1
        more = f"; --page {listing.page + 1} for more" if listing.page < listing.pages else ""
        click.echo(
            f"rows {first}-{first + len(listing.rows) - 1} of {listing.total} (page {listing.page} of {listing.pages}{more})"
        )


@approvals.command("show")
@click.argument("approval_id")
def approvals_show(approval_id: str) -> None:
    """One approval: the exact (redacted) params, the payload hash, and its decision if any."""
    from workers.ops.approval_decisions import get_approval

    _, client = _approvals_client()
    found = get_approval(client, approval_id)
    if found is None:
        click.echo(f"no approval {approval_id!r} (unknown, or decided more than a day ago)", err=True)
        sys.exit(EXIT_PROBLEMS)
    click.echo(json.dumps(found.to_dict(), indent=2, ensure_ascii=False))


def _decide_cmd(approve: bool, approval_id: str, person: str, reason: str | None, payload_hash: str | None) -> None:
    from workers.ops import approval_decisions as ops

    settings, client = _approvals_client()
    decide = ops.approve if approve else ops.deny
    decision = decide(
        client,
        settings.broker_url,
        approval_id,
        person,
        reason,
        payload_hash=payload_hash,
        receipt_ttl_seconds=int(settings.receipt_ttl_seconds),
    )
    click.echo(f"{decision.code}: {decision.message}", err=not decision.ok)
    sys.exit(0 if decision.ok else EXIT_PROBLEMS)


@approvals.command("approve")
@click.argument("approval_id")
@click.option("--as", "person", required=True, help="Who approves (a member of one of the approver groups).")
@click.option("--reason", help="Why (kept in the audit trail).")
@click.option("--hash", "payload_hash", help="The payload hash you were shown: refuse if the parked payload differs.")
def approvals_approve(approval_id: str, person: str, reason: str | None, payload_hash: str | None) -> None:
    """Approve: the parked intent runs, exactly as it was parked. Exit 1 if refused."""
    _decide_cmd(True, approval_id, person, reason, payload_hash)


@approvals.command("deny")
@click.argument("approval_id")
@click.option("--as", "person", required=True, help="Who denies (a member of one of the approver groups).")
@click.option("--reason", help="Why: the agent gets it in its APPROVAL_DENIED receipt.")
@click.option("--hash", "payload_hash", help="The payload hash you were shown: refuse if the parked payload differs.")
def approvals_deny(approval_id: str, person: str, reason: str | None, payload_hash: str | None) -> None:
    """Deny: the agent gets APPROVAL_DENIED with the reason; nothing runs. Exit 1 if refused."""
    _decide_cmd(False, approval_id, person, reason, payload_hash)


from workers.mcp.broker_user import mcp_user  # noqa: E402

main.add_command(mcp_user, "mcp-user")

from workers.ops.agents import agent_user  # noqa: E402

main.add_command(agent_user, "agent-user")


if __name__ == "__main__":  # pragma: no cover
    main()
