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
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

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
from workers.transport.rabbitmqctl import (
    PASSWORD_PLACEHOLDER as PASSWORD_PLACEHOLDER,
)
from workers.transport.rabbitmqctl import (
    SERVER_NAMED_QUEUE,
    Rabbitmqctl,
    RabbitmqctlError,
    add_user_command,
    failure,
)
from workers.transport.rabbitmqctl import vhost_of as vhost_of
from workers.transport.topology import (
    AGENT_REPLIES_EXCHANGE,
    INTENTS_EXCHANGE,
    INTENTS_QUEUE,
    RECEIPTS_EXCHANGE,
    agent_queue,
)

AgentUserError = RabbitmqctlError  # the name this module's callers catch


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
        configure=f"^{SERVER_NAMED_QUEUE}$",
        write=f"^({re.escape(INTENTS_EXCHANGE.name)}|{SERVER_NAMED_QUEUE}|{replies})$",
        read=f"^({re.escape(RECEIPTS_EXCHANGE.name)}|{SERVER_NAMED_QUEUE}|{re.escape(agent_queue(agent).name)})$",
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
    return [
        add_user_command(agent, password_stdin),
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
    _, set_limits, *grants = rabbitmqctl_commands(agent, vhost, limits=limits)
    ctl = Rabbitmqctl(rabbitmqctl)
    ctl.set_user(agent, password)
    ctl.run(set_limits[1:])
    apply_broker_policy(vhost, rabbitmqctl=ctl.prefix)
    for command in grants:
        ctl.run(command[1:])


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
    ctl = Rabbitmqctl(rabbitmqctl)
    changed: list[str] = []
    current = None if policy is not None else _operator_policy(ctl, vhost)
    if current is None:
        policy = policy or AgentQueuePolicy()
        ctl.run(policy_command(vhost, policy)[1:])
        current = policy.definition()
        changed.append("policy")
    limits = _vhost_limits(ctl, vhost)
    if max_queues is not None or "max-queues" not in limits:
        limits["max-queues"] = DEFAULT_VHOST_MAX_QUEUES if max_queues is None else max_queues
        ctl.run(vhost_limits_command(vhost, limits)[1:])
        changed.append("max-queues")
    return BrokerBounds(current, int(limits["max-queues"]), tuple(changed))


def _operator_policy(ctl: Rabbitmqctl, vhost: str) -> dict[str, Any] | None:
    listed = ctl.run(["list_operator_policies", f"--vhost={vhost}", "--silent", "--formatter", "json"])
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


def _vhost_limits(ctl: Rabbitmqctl, vhost: str) -> dict[str, Any]:
    listed = ctl.run(["list_vhost_limits", f"--vhost={vhost}", "--silent"])
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
    result = Rabbitmqctl(rabbitmqctl).run(sweep_bindings_command(vhost)[1:])
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
    ctl = Rabbitmqctl(rabbitmqctl)
    listed = ctl.run(["list_user_permissions", "--silent", "--formatter", "json", "--", agent], check=False)
    if listed.returncode != 0:
        if "no_such_user" in listed.stderr + listed.stdout:
            raise AgentUserError(f"there is no broker user named {agent!r}")
        raise failure(["list_user_permissions"], listed)
    try:
        elsewhere = [p for p in json.loads(listed.stdout or "[]") if p.get("vhost") != vhost]
    except (ValueError, AttributeError) as exc:
        raise AgentUserError(
            f"unexpected output of rabbitmqctl list_user_permissions: {listed.stdout[:500]!r}"
        ) from exc
    if elsewhere:
        ctl.run(["clear_topic_permissions", f"--vhost={vhost}", "--", agent])
        ctl.run(["clear_permissions", f"--vhost={vhost}", "--", agent])
    else:
        ctl.run(["delete_user", "--", agent])
