"""``reach approvals``: the intents that wait for a person, listed fairly across agents, shown,
approved or denied. The decisions' audit lines go to stderr; stdout is the command's answer."""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

import click

from workers.cli.common import EXIT_PROBLEMS, read_settings, unreachable
from workers.ops.table import print_table
from workers.settings import Settings
from workers.state.client import connect_redis


@click.group()
def approvals() -> None:
    """Intents that wait for a person: list, show, approve, deny (docs/contract.md "Approvals")."""


class _AuditToStderr(logging.Handler):
    """The decisions' audit lines, on stderr: stdout is the command's own answer."""

    def emit(self, record: logging.LogRecord) -> None:
        click.echo(record.getMessage(), err=True)


def _approvals_client() -> tuple[Settings, Any]:
    settings = read_settings()
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
        unreachable(settings, Unreachable("Redis", exc))
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
