"""``reach setup``: the broker made ready for the fleet. It declares the topology and bounds what
agents may leave on the broker (the agent-queue policy and the vhost's queue limit), or prints the
commands that do it where rabbitmqctl cannot be run."""

from __future__ import annotations

import json
import sys

import click

from workers.cli.common import EXIT_CONFIG, EXIT_PROBLEMS, catalog_if_any, fail, read_settings


@click.command()
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
    topology only (reach.intents, reach.receipts, reach.dispatch, the workflow runner's
    reach.workflows and reach.workflows.receipts, reach.dlq): each pool declares its connector's
    queue when it starts.

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
    from workers.ops.agents import AgentUserError, apply_broker_policy
    from workers.ops.broker_policy import (
        AGENT_QUEUE_POLICY,
        AgentQueuePolicy,
        management_api_requests,
        policy_command,
        vhost_limits_command,
    )
    from workers.ops.fleet import redact_url
    from workers.ops.startup import dead_letter_bounds
    from workers.transport.migration import MigrationError
    from workers.transport.migration import migrate_queues as migrate
    from workers.transport.rabbitmqctl import vhost_of
    from workers.transport.topology import TopologyMismatch, declare_all, fleet_queues

    settings = read_settings()
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
    catalog = catalog_if_any(settings, "declaring the base topology")
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
        fail(f"reach setup: {exc}")
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
