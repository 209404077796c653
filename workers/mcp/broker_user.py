r"""The MCP facade's own RabbitMQ user: it may publish intents as any agent, and nothing else.

Over HTTP the facade publishes each agent's intents with AMQP ``user_id`` = that agent, so the
router (and REACH_REQUIRE_USER_ID=1) keeps trusting ``user_id`` as a broker-checked identity.
RabbitMQ lets a connection set a ``user_id`` other than its login only if the login has the
``impersonator`` tag; this user has it, and otherwise an agent user's rights::

    tags       impersonator
    configure  ^amq\.gen-.*$                      its server-named receipt queues
    write      ^(reach\.intents|amq\.gen-.*)$     publish intents; bind its queues
    read       ^(reach\.receipts|amq\.gen-.*)$    bind to reach.receipts; consume its queues
    topic permissions on reach.receipts:
      write    ^$
      read     ^<agent>\.mcp\.<32 hex>$           only the keys the facade's clients bind

So the facade can act as every agent but can read no agent's own receipts, touch no connector
queue and publish nowhere but ``reach.intents``. Give this login to the facade alone: whoever
holds it can act as any agent (docs/operations.md "The MCP facade").
"""

from __future__ import annotations

import os
import re
import secrets
import shlex
import subprocess
import sys
from collections.abc import Sequence
from typing import NoReturn
from urllib.parse import unquote, urlsplit

import click

from workers.mcp.clients import REPLY_KEY_PATTERN
from workers.settings import Settings, SettingsError
from workers.transport.topology import INTENTS_EXCHANGE, RECEIPTS_EXCHANGE

EXIT_CONFIG = 2  # as in workers.ops.cli
FACADE_TAG = "impersonator"
DEFAULT_USER = "reach_mcp"
PASSWORD_PLACEHOLDER = "<password>"
USER_PATTERN = re.compile(r"^[a-z][a-z0-9_.-]{0,62}\Z")
_SERVER_NAMED_QUEUE = r"amq\.gen-.*"


class FacadeUserError(RuntimeError):
    """rabbitmqctl refused or failed; the message carries its output."""


def rabbitmqctl_commands(user: str, vhost: str = "/", password_stdin: bool = True) -> list[list[str]]:
    """The rabbitmqctl commands that create the facade's user with its tag and permissions.

    With ``password_stdin`` add_user reads the password from stdin; otherwise the command holds
    :data:`PASSWORD_PLACEHOLDER`. The tag and permissions come after the user exists, so a failed
    run leaves a user that can open no vhost.

    Raises:
        ValueError: ``user`` is not a usable name.
    """
    if not USER_PATTERN.match(user):
        raise ValueError(f"user name {user!r} must be 1-63 of a-z 0-9 _ . - starting with a letter")
    add_user = ["rabbitmqctl", "add_user", "--", user]
    if not password_stdin:
        add_user.append(PASSWORD_PLACEHOLDER)
    return [
        add_user,
        ["rabbitmqctl", "set_user_tags", "--", user, FACADE_TAG],
        [
            "rabbitmqctl",
            "set_permissions",
            f"--vhost={vhost}",
            "--",
            user,
            f"^{_SERVER_NAMED_QUEUE}$",
            f"^({re.escape(INTENTS_EXCHANGE.name)}|{_SERVER_NAMED_QUEUE})$",
            f"^({re.escape(RECEIPTS_EXCHANGE.name)}|{_SERVER_NAMED_QUEUE})$",
        ],
        [
            "rabbitmqctl",
            "set_topic_permissions",
            f"--vhost={vhost}",
            "--",
            user,
            RECEIPTS_EXCHANGE.name,
            "^$",
            f"^{REPLY_KEY_PATTERN}$",
        ],
    ]


def create_facade_user(
    user: str, password: str, vhost: str = "/", rabbitmqctl: str | Sequence[str] = "rabbitmqctl"
) -> None:
    """Create the facade's user (or give an existing one the new password), then its tag and permissions.

    Raises:
        ValueError: A bad name, or a password rabbitmqctl would store differently.
        FacadeUserError: rabbitmqctl failed.
    """
    if not password or password != password.strip() or any(c in password for c in "\r\n"):
        raise ValueError("the password must be non-empty, without line breaks or surrounding whitespace")
    add_user, *rest = rabbitmqctl_commands(user, vhost)
    prefix = shlex.split(rabbitmqctl) if isinstance(rabbitmqctl, str) else list(rabbitmqctl)
    result = _run(prefix, add_user[1:], stdin=password + "\n", check=False)
    if result.returncode != 0:
        if "already exists" not in result.stderr + result.stdout:
            raise _failure(add_user[1:], result)
        _run(prefix, ["change_password", "--", user], stdin=password + "\n")
    for command in rest:
        _run(prefix, command[1:])


def delete_facade_user(user: str, rabbitmqctl: str | Sequence[str] = "rabbitmqctl") -> None:
    """Delete the facade's user; RabbitMQ closes its connections at once.

    Raises:
        FacadeUserError: No such user, or rabbitmqctl failed.
    """
    prefix = shlex.split(rabbitmqctl) if isinstance(rabbitmqctl, str) else list(rabbitmqctl)
    _run(prefix, ["delete_user", "--", user])


def _run(
    prefix: list[str], args: list[str], *, stdin: str = "", check: bool = True
) -> subprocess.CompletedProcess[str]:
    try:
        result = subprocess.run([*prefix, *args], input=stdin, capture_output=True, text=True, timeout=120)
    except FileNotFoundError as exc:
        raise FacadeUserError(f"{prefix[0]!r} not found: run this where rabbitmqctl works, or use --print") from exc
    except subprocess.TimeoutExpired as exc:
        raise FacadeUserError(f"rabbitmqctl {args[0]} did not finish within {exc.timeout:g} s") from exc
    if check and result.returncode != 0:
        raise _failure(args, result)
    return result


def _failure(args: list[str], result: subprocess.CompletedProcess[str]) -> FacadeUserError:
    output = (result.stderr.strip() or result.stdout.strip())[-2000:]
    return FacadeUserError(f"rabbitmqctl {args[0]} failed (exit {result.returncode}): {output}")


# -- the `reach mcp-user` command ------------------------------------------------------------------


def _fail(message: str) -> NoReturn:
    click.echo(message, err=True)
    sys.exit(EXIT_CONFIG)


def _vhost(option: str | None) -> str:
    if option is not None:
        return option
    try:
        first = Settings.from_env().broker_url.split(";", 1)[0].strip()  # a cluster's nodes share the vhost
        return unquote(urlsplit(first).path[1:]) or "/"
    except SettingsError as exc:
        _fail(str(exc))


@click.group("mcp-user")
def mcp_user() -> None:
    """The MCP facade's RabbitMQ user: it may publish as any agent (impersonator tag), nothing more."""


@mcp_user.command("create")
@click.argument("name", default=DEFAULT_USER)
@click.option("--password-env", metavar="VAR", help="Take the password from this variable (default: generate one).")
@click.option("--vhost", help="Default: the vhost of $REACH_BROKER_URL.")
@click.option("--rabbitmqctl", "rabbitmqctl", default="rabbitmqctl", show_default=True, metavar="CMD")
@click.option(
    "--print", "print_only", is_flag=True, help="Only print the rabbitmqctl commands to run on the broker host."
)
def create_cmd(name: str, password_env: str | None, vhost: str | None, rabbitmqctl: str, print_only: bool) -> None:
    """Create the facade's user NAME (default reach_mcp); prints a generated password once.

    `reach mcp --http` then runs with REACH_BROKER_URL=amqp://NAME:PASSWORD@host/vhost.
    """
    target = _vhost(vhost)
    try:
        commands = rabbitmqctl_commands(name, target, password_stdin=False)
    except ValueError as exc:
        _fail(str(exc))
    if print_only:
        for command in commands:
            click.echo(shlex.join(command))
        return
    password = os.environ.get(password_env, "") if password_env else secrets.token_urlsafe(32)
    if not password:
        _fail(f"${password_env} is not set or empty")
    try:
        create_facade_user(name, password, target, rabbitmqctl)
    except (ValueError, FacadeUserError) as exc:
        _fail(f"cannot create the facade user {name!r}: {exc}")
    click.echo(f"facade user {name!r} ready in vhost {target!r} (tag {FACADE_TAG}: give this login to reach mcp only)")
    if not password_env:
        click.echo(password)


@mcp_user.command("delete")
@click.argument("name", default=DEFAULT_USER)
@click.option("--rabbitmqctl", "rabbitmqctl", default="rabbitmqctl", show_default=True, metavar="CMD")
def delete_cmd(name: str, rabbitmqctl: str) -> None:
    """Delete the facade's user NAME; its connections close at once."""
    try:
        delete_facade_user(name, rabbitmqctl)
    except FacadeUserError as exc:
        _fail(f"cannot delete the facade user {name!r}: {exc}")
    click.echo(f"facade user {name!r} deleted")
