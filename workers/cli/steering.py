"""Watching and steering the running fleet: ``reach pause`` and ``reach resume`` a connector,
``reach status`` per connector, and ``reach trace`` of one intent."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from workers.cli.common import EXIT_PROBLEMS, catalog_if_any, fail, read_settings, unreachable
from workers.ops.table import print_table
from workers.settings import Settings
from workers.state.client import connect_redis


def _known_connector(settings: Settings, client: Any, connector: str) -> None:
    """Exit 2 unless ``connector`` is in the catalog, or (no catalog) has left state in Redis."""
    from redis import RedisError

    from workers.ops.fleet import Unreachable, discover_connectors

    catalog = catalog_if_any(settings, "looking the connector up in Redis")
    if catalog is not None:
        known = sorted(catalog.connectors)
    else:
        try:
            known = discover_connectors(client)
        except RedisError as exc:
            unreachable(settings, Unreachable("Redis", exc))
    if connector not in known:
        where = "" if catalog is not None else " in Redis"
        fail(f"no connector named {connector!r}{where} (known: {', '.join(known) or 'none'})")


@click.command()
@click.argument("connector")
def pause(connector: str) -> None:
    """Make CONNECTOR's pools stop consuming; intents wait in its queue (nothing is lost)."""
    from workers.state.control import set_paused

    settings = read_settings()
    client = connect_redis(settings)
    _known_connector(settings, client, connector)
    set_paused(client, connector, True)
    click.echo(f"{connector}: paused (its pools stop consuming within a second; `reach resume {connector}` undoes it)")


@click.command()
@click.argument("connector")
def resume(connector: str) -> None:
    """Make CONNECTOR's pools consume again."""
    from workers.state.control import set_paused

    settings = read_settings()
    client = connect_redis(settings)
    _known_connector(settings, client, connector)
    set_paused(client, connector, False)
    click.echo(f"{connector}: resumed")


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def status(as_json: bool) -> None:
    """Per connector: queue depth, consumers, in-flight, breaker, health, paused, last error.

    The connectors are the catalog's ($REACH_CATALOG) when there is one; without, those that
    left state in Redis (pools, health probes, breakers, pauses). Needs only REACH_BROKER_URL and
    REACH_REDIS_URL. Exits 2 when the broker or Redis cannot be reached.
    """
    from workers.ops.fleet import Unreachable, fleet_status

    settings = read_settings()
    catalog = catalog_if_any(settings, "showing the connectors found in Redis")
    try:
        rows = fleet_status(
            None if catalog is None else catalog.connectors, settings.broker_url, connect_redis(settings)
        )
    except Unreachable as exc:
        unreachable(settings, exc)
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


@click.command()
@click.argument("intent_id")
@click.option(
    "--agent", "agent", default=None, help="The agent that sent the intent (found by a bounded scan if omitted)."
)
def trace(intent_id: str, agent: str | None) -> None:
    """The stages of one intent with timings (kept in Redis for a day, per agent)."""
    from workers.observability.audit import read_trace, trace_agents

    settings = read_settings()
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
