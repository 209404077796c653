"""``reach send``: publish an intent from the shell as an agent, and with --wait print its receipt."""

from __future__ import annotations

import json
import sys
from typing import Any
from urllib.parse import urlsplit

import click

from workers.cli.common import EXIT_PROBLEMS, fail, read_settings


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


@click.command()
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

    settings = read_settings()
    values = dict(_parse_param(p) for p in params)
    try:
        # logged in as the agent itself: send user_id, so REACH_REQUIRE_USER_ID fleets accept it
        client = ReachClient(agent, settings.broker_url, authenticated=urlsplit(settings.broker_url).username == agent)
    except Exception as exc:  # connection refused, auth: say so plainly
        fail(f"cannot reach the broker at {redact_url(settings.broker_url)}: {exc}")
    with client:
        try:
            sent_id = client.publish(action, values, intent_id=intent_id, idempotency_key=idempotency_key)
        except (ValueError, ReachError) as exc:
            fail(f"not sent: {exc}")
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
