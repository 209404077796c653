"""``reach dlq``: the dead letters in reach.dlq, listed with their reasons and sent back through
the fleet."""

from __future__ import annotations

import sys

import click

from workers.cli.common import EXIT_PROBLEMS, read_settings
from workers.ops.table import print_table
from workers.state.client import connect_redis


@click.group()
def dlq() -> None:
    """Dead letters: messages the fleet could not process, with the reason."""


@dlq.command("list")
@click.option("--limit", type=click.IntRange(1, 10000), default=100, show_default=True)
def dlq_list(limit: int) -> None:
    """Show dead letters (reason, agent, time, a redacted preview) without removing them."""
    from workers.ops.fleet import list_dead_letters

    letters = list_dead_letters(read_settings().broker_url, limit)
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

    settings = read_settings()
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
