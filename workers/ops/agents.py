r"""Agents as RabbitMQ users with least privilege, so the broker itself refuses what they may not do.

An agent user may, in its vhost (checked against RabbitMQ 3.10 by
``tests/integration/test_agent_identity.py``)::

    configure  ^amq\.gen-.*$                       declare its own server-named receipt queue
                                                   (checked on the generated amq.gen-* name)
    write      ^(reach\.intents|amq\.gen-.*)$      publish intents; queue.bind needs write on the queue
    read       ^(reach\.receipts|amq\.gen-.*)$     queue.bind needs read on the exchange; consume its queue
    topic permissions on reach.receipts:
      write    ^$                                  (it may not publish there anyway)
      read     ^<agent>(\..+)?$                    bind only its own routing keys: no ``#``, no other agent

and, to answer connectors of type agent (``agent: <agent>``; see connectors.adapters.agent)::

    read       reach\.agent\.<agent>                consume its own request queue, no other agent's
    write      reach\.agent-replies                 publish answers there ...
    topic permissions on reach.agent-replies:
      write    ^<agent>\..+$                        ... only to the reply queues of calls made to it
      read     ^$

Nothing on ``amq.default`` (the default exchange reaches every queue by name), ``reach.dispatch``,
``reach.connector.*``, ``reach.dlq`` or the ``reach.intents`` queue. Passive declares need no
permission, so the client checks that the fleet's exchanges exist without configure rights.
Exclusive queues are locked to the connection that declared them, so the shared ``amq.gen-*``
pattern does not let one agent read another's receipts.

That configure right cannot say "exclusive only": RabbitMQ has no permission for durable queues,
so an agent may also declare durable, non-exclusive ``amq.gen-*`` queues and bind them, and they
outlive its connection. The broker bounds them instead (:mod:`workers.ops.broker_policy`): every agent
user gets per-user limits (max-connections, max-channels), and the vhost gets the operator policy
``reach-agent-queues`` (an unused ``amq.gen-*`` queue expires with its bindings; its length is
capped) and a queue limit, because RabbitMQ has no per-user queue limit.

The same write and read rights let an agent bind ``reach.receipts`` to ``reach.intents`` or
``reach.agent-replies`` (``exchange.bind``), bindings that outlive its connections, without limit;
no permission tells them apart from publishing and binding a queue. :func:`sweep_agent_bindings`
(``reach agent-user sweep-bindings``) removes them all: the fleet itself binds no exchange to an
exchange.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shlex
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NoReturn
from urllib.parse import unquote, urlsplit

import click

from producers.wire import AGENT_ID_PATTERN, NAME_RULE
from workers.ops.broker_policy import (
    AGENT_QUEUE_POLICY,
    DEFAULT_VHOST_MAX_QUEUES,
    AgentLimits,
    AgentQueuePolicy,
    check_max_queues,
    policy_command,
    sweep_bindings_command,
    user_limits_command,
    vhost_limits_command,
)
from workers.settings import Settings, SettingsError
from workers.transport.topology import (
    AGENT_REPLIES_EXCHANGE,
    INTENTS_EXCHANGE,
    INTENTS_QUEUE,
    RECEIPTS_EXCHANGE,
    agent_queue,
)

EXIT_CONFIG = 2  # as in workers.ops.cli: usage or configuration errors
PASSWORD_PLACEHOLDER = "<password>"
_SERVER_NAMED_QUEUE = r"amq\.gen-.*"


class AgentUserError(RuntimeError):
    """rabbitmqctl refused or failed; the message carries its output."""


@dataclass(frozen=True)
class AgentPermissions:
    """The regular expressions RabbitMQ matches resource names and routing keys against."""

    configure: str
    write: str
    read: str
    topic_write: str
    topic_read: str
    topic_exchange: str = RECEIPTS_EXCHANGE.name
    # an agent answering agent connectors: the reply keys it may publish (the pools' reply queues)
    reply_topic_write: str = "^$"
    reply_exchange: str = AGENT_REPLIES_EXCHANGE.name


def check_agent_name(agent: str) -> None:
    """Raise ValueError unless ``agent`` can be an agent's broker user.

    ``intent`` is refused: its own receipt key would equal the intents routing key, and an agent
    may bind reach.receipts to reach.intents (exchange.bind needs only the write and read
    permissions it has), which would feed its receipts back to the router without end.
    """
    if not isinstance(agent, str) or not AGENT_ID_PATTERN.match(agent):
        raise ValueError(f"agent name {agent!r} must be {NAME_RULE}")
    if agent == INTENTS_QUEUE.routing_key:
        raise ValueError(f"agent name {agent!r} is reserved: it is the routing key of the intents exchange")


def agent_permissions(agent: str) -> AgentPermissions:
    """The least privilege an agent needs to publish intents and read its own receipts.

    Raises:
        ValueError: The name is not a valid agent id, or is reserved.
    """
    check_agent_name(agent)
    replies = re.escape(AGENT_REPLIES_EXCHANGE.name)
    return AgentPermissions(
        configure=f"^{_SERVER_NAMED_QUEUE}$",
        write=f"^({re.escape(INTENTS_EXCHANGE.name)}|{_SERVER_NAMED_QUEUE}|{replies})$",
        read=f"^({re.escape(RECEIPTS_EXCHANGE.name)}|{_SERVER_NAMED_QUEUE}|{re.escape(agent_queue(agent).name)})$",
        topic_write="^$",
        topic_read=rf"^{re.escape(agent)}(\..+)?$",
        reply_topic_write=rf"^{re.escape(agent)}\..+$",
    )


def rabbitmqctl_commands(
    agent: str, vhost: str = "/", password_stdin: bool = True, limits: AgentLimits = AgentLimits()
) -> list[list[str]]:
    """The rabbitmqctl commands that create ``agent`` with ``limits`` and :func:`agent_permissions`.

    With ``password_stdin`` add_user reads the password from stdin (it strips the line end);
    otherwise the command carries :data:`PASSWORD_PLACEHOLDER` where the password goes. ``--``
    keeps a name that starts with ``-`` from being read as an option. The limits come before the
    permissions, so a user is never usable without them.
    """
    perms = agent_permissions(agent)
    add_user = ["rabbitmqctl", "add_user", "--", agent]
    if not password_stdin:
        add_user.append(PASSWORD_PLACEHOLDER)
    return [
        add_user,
        user_limits_command(agent, limits),
        ["rabbitmqctl", "set_permissions", f"--vhost={vhost}", "--", agent, perms.configure, perms.write, perms.read],
        [
            "rabbitmqctl",
            "set_topic_permissions",
            f"--vhost={vhost}",
            "--",
            agent,
            perms.topic_exchange,
            perms.topic_write,
            perms.topic_read,
        ],
        [
            "rabbitmqctl",
            "set_topic_permissions",
            f"--vhost={vhost}",
            "--",
            agent,
            perms.reply_exchange,
            perms.reply_topic_write,
            "^$",
        ],
    ]


def create_agent_user(
    agent: str,
    password: str,
    vhost: str = "/",
    rabbitmqctl: str | Sequence[str] = "rabbitmqctl",
    limits: AgentLimits = AgentLimits(),
) -> None:
    """Create the agent's user (or change its password if it exists), limit it and set its permissions.

    The vhost gets the default agent-queue policy and queue limit of :mod:`workers.ops.broker_policy`
    unless it has them already (``reach setup`` or the operator may have chosen other values).

    Args:
        agent: The agent id, which becomes the broker login.
        password: Sent to rabbitmqctl on stdin, never on a command line.
        vhost: The fleet's vhost.
        rabbitmqctl: The command to run, e.g. ``"docker exec -i rabbitmq rabbitmqctl"``.
        limits: The user's connection and channel limits (they hold in every vhost).

    Raises:
        ValueError: Bad agent name, or a password rabbitmqctl would store differently.
        AgentUserError: rabbitmqctl failed; the message carries its output. A user created
            before the failure has no permissions yet (it can open no vhost); run it again.
    """
    if not password or password != password.strip() or any(c in password for c in "\r\n"):
        raise ValueError(
            "the password must be non-empty, without line breaks or leading/trailing "
            "whitespace (rabbitmqctl strips them when reading stdin)"
        )
    add_user, set_limits, *grants = rabbitmqctl_commands(agent, vhost, limits=limits)
    prefix = _prefix(rabbitmqctl)
    result = _run(prefix, add_user[1:], stdin=password + "\n", check=False)
    if result.returncode != 0:
        # rabbitmqctl has no "create or update": an existing user gets the new password instead
        if "already exists" not in result.stderr + result.stdout:
            raise _failure(add_user[1:], result)
        _run(prefix, ["change_password", "--", agent], stdin=password + "\n")
    _run(prefix, set_limits[1:])
    apply_broker_policy(vhost, rabbitmqctl=prefix)
    for command in grants:
        _run(prefix, command[1:])


@dataclass(frozen=True)
class BrokerBounds:
    """The agent-queue policy and vhost queue limit in force after :func:`apply_broker_policy`."""

    policy: dict[str, Any]
    max_queues: int
    changed: tuple[str, ...]  # what this call set: "policy", "max-queues"


def apply_broker_policy(
    vhost: str,
    policy: AgentQueuePolicy | None = None,
    max_queues: int | None = None,
    rabbitmqctl: str | Sequence[str] = "rabbitmqctl",
) -> BrokerBounds:
    """Give ``vhost`` the operator policy for agents' ``amq.gen-*`` queues and a queue limit.

    Args:
        vhost: The fleet's vhost.
        policy: Set this policy (replacing the vhost's); None keeps the one in force and sets
            the default only where there is none.
        max_queues: Set this vhost queue limit (-1: none), keeping the vhost's other limits;
            None keeps the one in force and sets :data:`DEFAULT_VHOST_MAX_QUEUES` only where
            there is none.
        rabbitmqctl: The command to run.

    Raises:
        ValueError: A bad ``max_queues``.
        AgentUserError: rabbitmqctl is missing, cannot reach the node, or failed.
    """
    if max_queues is not None:
        check_max_queues(max_queues)
    prefix = _prefix(rabbitmqctl)
    changed: list[str] = []
    current = None if policy is not None else _operator_policy(prefix, vhost)
    if current is None:
        policy = policy or AgentQueuePolicy()
        _run(prefix, policy_command(vhost, policy)[1:])
        current = policy.definition()
        changed.append("policy")
    limits = _vhost_limits(prefix, vhost)
    if max_queues is not None or "max-queues" not in limits:
        limits["max-queues"] = DEFAULT_VHOST_MAX_QUEUES if max_queues is None else max_queues
        _run(prefix, vhost_limits_command(vhost, limits)[1:])
        changed.append("max-queues")
    return BrokerBounds(current, int(limits["max-queues"]), tuple(changed))


def _operator_policy(prefix: list[str], vhost: str) -> dict[str, Any] | None:
    listed = _run(prefix, ["list_operator_policies", f"--vhost={vhost}", "--silent", "--formatter", "json"])
    try:
        for entry in json.loads(listed.stdout or "[]"):
            if entry.get("name") == AGENT_QUEUE_POLICY:
                definition = entry.get("definition")
                # rabbitmqctl 3.10 prints the definition as a JSON string inside the JSON
                return dict(json.loads(definition) if isinstance(definition, str) else definition)
    except (ValueError, AttributeError, TypeError) as exc:
        raise AgentUserError(
            f"unexpected output of rabbitmqctl list_operator_policies: {listed.stdout[:500]!r}"
        ) from exc
    return None


def _vhost_limits(prefix: list[str], vhost: str) -> dict[str, Any]:
    listed = _run(prefix, ["list_vhost_limits", f"--vhost={vhost}", "--silent"])
    try:
        limits = json.loads(listed.stdout.strip() or "{}")
        if not isinstance(limits, dict):
            raise ValueError("not an object")
    except ValueError as exc:
        raise AgentUserError(f"unexpected output of rabbitmqctl list_vhost_limits: {listed.stdout[:500]!r}") from exc
    return limits


def sweep_agent_bindings(vhost: str = "/", rabbitmqctl: str | Sequence[str] = "rabbitmqctl") -> int:
    """Remove every exchange-to-exchange binding from ``reach.receipts`` in ``vhost`` (only agents
    make them); the number removed.

    Raises:
        AgentUserError: rabbitmqctl is missing, cannot reach the node, or failed.
    """
    result = _run(_prefix(rabbitmqctl), sweep_bindings_command(vhost)[1:])
    text = result.stdout.strip().splitlines()[-1:] or [""]
    try:
        return int(text[0])
    except ValueError as exc:
        raise AgentUserError(f"unexpected output of rabbitmqctl eval: {result.stdout[:500]!r}") from exc


def delete_agent_user(agent: str, vhost: str = "/", rabbitmqctl: str | Sequence[str] = "rabbitmqctl") -> None:
    """Revoke the agent's permissions in ``vhost``; delete the user when no other vhost grants it any.

    RabbitMQ closes a deleted user's connections at once.

    Raises:
        ValueError: Bad agent name.
        AgentUserError: No such user, or rabbitmqctl failed.
    """
    if not isinstance(agent, str) or not AGENT_ID_PATTERN.match(agent):
        raise ValueError(f"agent name {agent!r} must be {NAME_RULE}")
    prefix = _prefix(rabbitmqctl)
    listed = _run(prefix, ["list_user_permissions", "--silent", "--formatter", "json", "--", agent], check=False)
    if listed.returncode != 0:
        if "no_such_user" in listed.stderr + listed.stdout:
            raise AgentUserError(f"there is no broker user named {agent!r}")
        raise _failure(["list_user_permissions"], listed)
    try:
        elsewhere = [p for p in json.loads(listed.stdout or "[]") if p.get("vhost") != vhost]
    except (ValueError, AttributeError) as exc:
        raise AgentUserError(
            f"unexpected output of rabbitmqctl list_user_permissions: {listed.stdout[:500]!r}"
        ) from exc
    if elsewhere:
        _run(prefix, ["clear_topic_permissions", f"--vhost={vhost}", "--", agent])
        _run(prefix, ["clear_permissions", f"--vhost={vhost}", "--", agent])
    else:
        _run(prefix, ["delete_user", "--", agent])


def vhost_of(broker_url: str) -> str:
    """The vhost of an AMQP URL (the first, when it lists a cluster's nodes split by ``;``): the path
    without its leading slash, ``/`` when empty."""
    return unquote(urlsplit(broker_url.split(";", 1)[0].strip()).path[1:]) or "/"


def _prefix(rabbitmqctl: str | Sequence[str]) -> list[str]:
    return shlex.split(rabbitmqctl) if isinstance(rabbitmqctl, str) else list(rabbitmqctl)


def _run(
    prefix: list[str], args: list[str], *, stdin: str | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    try:
        result = subprocess.run(
            [*prefix, *args], input=stdin if stdin is not None else "", capture_output=True, text=True, timeout=120
        )
    except FileNotFoundError as exc:
        raise AgentUserError(
            f"{prefix[0]!r} not found: run this where rabbitmqctl works, or print the "
            "commands with --print and run them on the broker host"
        ) from exc
    except subprocess.TimeoutExpired as exc:
        raise AgentUserError(f"rabbitmqctl {args[0]} did not finish within {exc.timeout:g} s") from exc
    if check and result.returncode != 0:
        raise _failure(args, result)
    return result


def _failure(args: list[str], result: subprocess.CompletedProcess[str]) -> AgentUserError:
    output = (result.stderr.strip() or result.stdout.strip())[-2000:]
    return AgentUserError(f"rabbitmqctl {args[0]} failed (exit {result.returncode}): {output}")


# -- the `reach agent-user` command ----------------------------------------------------------------


def _fail(message: str) -> NoReturn:
    click.echo(message, err=True)
    sys.exit(EXIT_CONFIG)


def _vhost(option: str | None) -> str:
    if option is not None:
        return option
    try:
        return vhost_of(Settings.from_env().broker_url)
    except SettingsError as exc:
        _fail(str(exc))


def _checked_name(name: str) -> str:
    try:
        check_agent_name(name)
    except ValueError as exc:
        _fail(str(exc))
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
def create_cmd(
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
    if password_env is not None:
        password = os.environ.get(password_env, "")
        if not password:
            _fail(f"${password_env} is not set or empty")
    else:
        password = secrets.token_urlsafe(32)
    try:
        create_agent_user(name, password, target, limits=limits)
    except (ValueError, AgentUserError) as exc:
        _fail(f"cannot create agent user {name!r}: {exc}")
    if password_env is not None:
        click.echo(f"agent user {name!r} ready in vhost {target!r}")
        return
    click.echo(f"agent user {name!r} ready in vhost {target!r}; its password follows, shown only once:", err=True)
    click.echo(password)


@agent_user.command("delete")
@click.argument("name")
@click.option("--vhost", help="Default: the vhost of $REACH_BROKER_URL.")
def delete_cmd(name: str, vhost: str | None) -> None:
    """Revoke agent NAME's permissions in the vhost, and delete the user if no other vhost grants it any."""
    target = _vhost(vhost)
    try:
        delete_agent_user(name, target)
    except (ValueError, AgentUserError) as exc:
        _fail(f"cannot delete agent user {name!r}: {exc}")
    click.echo(f"agent user {name!r} removed from vhost {target!r}")


@agent_user.command("sweep-bindings")
@click.option("--vhost", help="Default: the vhost of $REACH_BROKER_URL.")
@click.option("--print", "print_only", is_flag=True, help="Only print the rabbitmqctl command.")
def sweep_cmd(vhost: str | None, print_only: bool) -> None:
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
        _fail(f"cannot sweep bindings in vhost {target!r}: {exc}")
    click.echo(f"removed {removed} exchange-to-exchange binding(s) from reach.receipts in vhost {target!r}")
