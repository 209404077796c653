"""``reach agent-user`` and ``reach mcp-user``: the broker users the fleet's logins are, made with
rabbitmqctl. An agent's user gets least privilege (:mod:`workers.ops.agents`); the MCP facade's
may publish as any agent (:mod:`workers.mcp.broker_user`). Both take their password from a
variable the operator names, or a generated one printed once."""

from __future__ import annotations

import os
import secrets
import shlex

import click

from workers.cli.common import fail
from workers.mcp.broker_user import (
    DEFAULT_USER,
    FACADE_TAG,
    FacadeUserError,
    create_facade_user,
    delete_facade_user,
)
from workers.mcp.broker_user import rabbitmqctl_commands as facade_commands
from workers.ops.agents import (
    PASSWORD_PLACEHOLDER,
    AgentUserError,
    check_agent_name,
    create_agent_user,
    delete_agent_user,
    rabbitmqctl_commands,
    sweep_agent_bindings,
)
from workers.ops.broker_policy import (
    DEFAULT_VHOST_MAX_QUEUES,
    AgentLimits,
    AgentQueuePolicy,
    policy_command,
    sweep_bindings_command,
    vhost_limits_command,
)
from workers.settings import Settings, SettingsError
from workers.transport.rabbitmqctl import vhost_of


def _vhost(option: str | None) -> str:
    if option is not None:
        return option
    try:
        return vhost_of(Settings.from_env().broker_url)  # a cluster's nodes share the vhost
    except SettingsError as exc:
        fail(str(exc))


def _password(password_env: str | None) -> str:
    """The password in the variable the operator named, or a new one."""
    if password_env is None:
        return secrets.token_urlsafe(32)
    password = os.environ.get(password_env, "")
    if not password:
        fail(f"${password_env} is not set or empty")
    return password


def _checked_name(name: str) -> str:
    try:
        check_agent_name(name)
    except ValueError as exc:
        fail(str(exc))
    if "." in name:
        click.echo(
            f"warning: {name!r} contains '.': it may read the receipts of any agent named "
            f"{name!r} + '.<suffix>', so do not also create such agents",
            err=True,
        )
    return name


@click.group("agent-user")
def agent_user() -> None:
    """Create and delete agents' RabbitMQ users with least privilege (runs rabbitmqctl)."""


@agent_user.command("create")
@click.argument("name")
@click.option(
    "--password-env",
    metavar="VAR",
    help="Take the password from this environment variable (default: generate one and print it once).",
)
@click.option("--vhost", help="Default: the vhost of $REACH_BROKER_URL.")
@click.option(
    "--print",
    "print_only",
    is_flag=True,
    help="Only print the rabbitmqctl commands, with a password placeholder, to run on the broker host.",
)
@click.option(
    "--max-connections",
    type=click.IntRange(min=1),
    default=AgentLimits.max_connections,
    show_default=True,
    help="Connections the user may hold at once (in all vhosts).",
)
@click.option(
    "--max-channels",
    type=click.IntRange(min=1),
    default=AgentLimits.max_channels,
    show_default=True,
    help="Channels the user may hold at once, over all its connections.",
)
def agent_create_cmd(
    name: str, password_env: str | None, vhost: str | None, print_only: bool, max_connections: int, max_channels: int
) -> None:
    """Create agent NAME's user: write on reach.intents, read its own receipts and requests, nothing else.

    The user gets connection and channel limits. RabbitMQ has no per-user queue limit: the vhost
    gets the agent-queue policy and a queue limit (defaults, unless it has them; see `reach setup`).
    An existing user gets the new password, and its limits and permissions reset.
    """
    name = _checked_name(name)
    target = _vhost(vhost)
    limits = AgentLimits(max_connections, max_channels)
    if print_only:
        for command in rabbitmqctl_commands(name, target, password_stdin=False, limits=limits):
            click.echo(shlex.join(command))
        click.echo(
            "# once per vhost, unless `reach setup` has done it (set_vhost_limits replaces the vhost's other limits):"
        )
        click.echo(shlex.join(policy_command(target, AgentQueuePolicy())))
        click.echo(shlex.join(vhost_limits_command(target, {"max-queues": DEFAULT_VHOST_MAX_QUEUES})))
        click.echo(
            f"(or leave out {PASSWORD_PLACEHOLDER} and pipe the password into add_user, "
            "which keeps it off the command line)",
            err=True,
        )
        return
    password = _password(password_env)
    try:
        create_agent_user(name, password, target, limits=limits)
    except (ValueError, AgentUserError) as exc:
        fail(f"cannot create agent user {name!r}: {exc}")
    if password_env is not None:
        click.echo(f"agent user {name!r} ready in vhost {target!r}")
        return
    click.echo(f"agent user {name!r} ready in vhost {target!r}; its password follows, shown only once:", err=True)
    click.echo(password)


@agent_user.command("delete")
@click.argument("name")
@click.option("--vhost", help="Default: the vhost of $REACH_BROKER_URL.")
def agent_delete_cmd(name: str, vhost: str | None) -> None:
    """Revoke agent NAME's permissions in the vhost, and delete the user if no other vhost grants it any."""
    target = _vhost(vhost)
    try:
        delete_agent_user(name, target)
    except (ValueError, AgentUserError) as exc:
        fail(f"cannot delete agent user {name!r}: {exc}")
    click.echo(f"agent user {name!r} removed from vhost {target!r}")


@agent_user.command("sweep-bindings")
@click.option("--vhost", help="Default: the vhost of $REACH_BROKER_URL.")
@click.option("--print", "print_only", is_flag=True, help="Only print the rabbitmqctl command.")
def agent_sweep_cmd(vhost: str | None, print_only: bool) -> None:
    """Remove the exchange-to-exchange bindings agents made from reach.receipts (run it on a schedule).

    Permissions cannot forbid them (exchange.bind needs the rights an agent publishes and binds its
    receipt queue with), and they outlive every connection; the fleet makes none.
    """
    target = _vhost(vhost)
    if print_only:
        click.echo(shlex.join(sweep_bindings_command(target)))
        return
    try:
        removed = sweep_agent_bindings(target)
    except AgentUserError as exc:
        fail(f"cannot sweep bindings in vhost {target!r}: {exc}")
    click.echo(f"removed {removed} exchange-to-exchange binding(s) from reach.receipts in vhost {target!r}")


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
def mcp_create_cmd(name: str, password_env: str | None, vhost: str | None, rabbitmqctl: str, print_only: bool) -> None:
    """Create the facade's user NAME (default reach_mcp); prints a generated password once.

    `reach mcp --http` then runs with REACH_BROKER_URL=amqp://NAME:PASSWORD@host/vhost.
    """
    target = _vhost(vhost)
    try:
        commands = facade_commands(name, target, password_stdin=False)
    except ValueError as exc:
        fail(str(exc))
    if print_only:
        for command in commands:
            click.echo(shlex.join(command))
        return
    password = _password(password_env)
    try:
        create_facade_user(name, password, target, rabbitmqctl)
    except (ValueError, FacadeUserError) as exc:
        fail(f"cannot create the facade user {name!r}: {exc}")
    click.echo(f"facade user {name!r} ready in vhost {target!r} (tag {FACADE_TAG}: give this login to reach mcp only)")
    if password_env is None:
        click.echo(password)


@mcp_user.command("delete")
@click.argument("name", default=DEFAULT_USER)
@click.option("--rabbitmqctl", "rabbitmqctl", default="rabbitmqctl", show_default=True, metavar="CMD")
def mcp_delete_cmd(name: str, rabbitmqctl: str) -> None:
    """Delete the facade's user NAME; its connections close at once."""
    try:
        delete_facade_user(name, rabbitmqctl)
    except FacadeUserError as exc:
        fail(f"cannot delete the facade user {name!r}: {exc}")
    click.echo(f"facade user {name!r} deleted")
