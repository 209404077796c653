r"""The bounds the broker keeps on what agents leave behind, because permissions cannot express them.

An agent's configure permission on ``^amq\.gen-.*$`` (see :mod:`workers.ops.agents`) is all it needs for
its receipt queue, but RabbitMQ checks ``queue.declare`` against the queue *name* only: there is no
permission for durable, exclusive or auto-delete. The same right therefore lets an agent declare
durable, non-exclusive server-named queues and bind them, and those outlive its connection. The
broker refuses client-chosen ``amq.*`` names and server-named quorum queues and streams, so such a
queue is always a classic ``amq.gen-*`` queue. Refusing "durable" outright would take a plugin or a
proxy in front of the broker; instead the fleet has the broker bound what such a queue can cost::

    operator policy reach-agent-queues, pattern ^amq\.gen-, apply-to queues
        {"expires": 60000, "max-length": 10000}
        a queue nobody consumes (no consumer, no get, no redeclare) for ``expires`` ms is deleted
        with its bindings, exclusive or not; at ``max-length`` the oldest message is dropped, so a
        full queue never refuses the fleet's receipt publishes. An agent's own ``x-expires`` or
        ``x-max-length`` can only lower these (the broker uses the smaller), and agents hold no
        ``policymaker`` tag. An *operator* policy because only one regular policy applies to a
        queue: an operator's HA or lazy-queue policy on ``.*`` with a higher priority would
        silently replace a regular one, while operator policies apply alongside regular ones.
    user limits, per agent user           {"max-connections": 8, "max-channels": 16}
    vhost limit                           {"max-queues": 10000}
        RabbitMQ has no per-user queue limit (``set_user_limits`` knows only max-connections and
        max-channels), so the number of queues an agent keeps alive while connected is bounded
        for the vhost as a whole. Well-behaved agents use one exclusive queue per connection.

Exchange-to-exchange bindings cannot be forbidden by permissions: ``exchange.bind`` needs write on
the destination and read on the source, exactly the rights an agent needs to publish intents
(write on ``reach.intents``, and its answers on ``reach.agent-replies``) and to bind its receipt
queue (read on ``reach.receipts``); RabbitMQ's checks do not see the kind of the destination, and
its topic permission on the source is the same one a queue binding passes. Such a binding of an
agent's, from ``reach.receipts`` to an exchange, outlives every connection (both exchanges are
durable) and has no limit. The fleet makes none (every binding it declares ends at a queue), so
:func:`sweep_bindings_command` removes all of them; ``reach agent-user sweep-bindings`` runs it
(an operator runs it on a schedule: the bound is what agents can bind between two sweeps)::

    exchange-to-exchange bindings from reach.receipts      removed by each sweep

This module only builds the commands (rabbitmqctl, and the management-API requests for a broker
where rabbitmqctl cannot be run); :func:`workers.ops.agents.apply_broker_policy` runs them.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

AGENT_QUEUE_POLICY = "reach-agent-queues"
AGENT_QUEUE_PATTERN = r"^amq\.gen-"
AGENT_QUEUE_POLICY_PRIORITY = 10
DEFAULT_VHOST_MAX_QUEUES = 10_000
NO_LIMIT = -1  # RabbitMQ's value for "no limit"


@dataclass(frozen=True)
class AgentQueuePolicy:
    """What an agent's server-named queue may cost: its idle lifetime and its length."""

    expires_ms: int = 60_000
    max_length: int = 10_000

    def __post_init__(self) -> None:
        if not isinstance(self.expires_ms, int) or self.expires_ms < 1:
            raise ValueError(f"expires_ms must be a positive number of milliseconds, not {self.expires_ms!r}")
        if not isinstance(self.max_length, int) or self.max_length < 1:
            raise ValueError(f"max_length must be a positive number of messages, not {self.max_length!r}")

    def definition(self) -> dict[str, int]:
        return {"expires": self.expires_ms, "max-length": self.max_length}


@dataclass(frozen=True)
class AgentLimits:
    """Per-user limits of an agent's broker user (they hold in every vhost)."""

    max_connections: int = 8
    max_channels: int = 16  # the Python client uses one channel per connection

    def __post_init__(self) -> None:
        for name in ("max_connections", "max_channels"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be at least 1, not {value!r}")

    def definition(self) -> dict[str, int]:
        return {"max-connections": self.max_connections, "max-channels": self.max_channels}


def check_max_queues(max_queues: int) -> None:
    """Raise ValueError unless ``max_queues`` is a usable vhost queue limit (-1: no limit)."""
    if not isinstance(max_queues, int) or (max_queues < 1 and max_queues != NO_LIMIT):
        raise ValueError(f"max_queues must be at least 1, or {NO_LIMIT} for no limit, not {max_queues!r}")


def policy_command(vhost: str, policy: AgentQueuePolicy) -> list[str]:
    """``rabbitmqctl set_operator_policy`` for the agents' queues in ``vhost`` (replaces an older one)."""
    return [
        "rabbitmqctl",
        "set_operator_policy",
        f"--vhost={vhost}",
        "--apply-to",
        "queues",
        "--priority",
        str(AGENT_QUEUE_POLICY_PRIORITY),
        "--",
        AGENT_QUEUE_POLICY,
        AGENT_QUEUE_PATTERN,
        _json(policy.definition()),
    ]


def user_limits_command(agent: str, limits: AgentLimits) -> list[str]:
    """``rabbitmqctl set_user_limits``; it sets the keys given and keeps the user's other limits."""
    return ["rabbitmqctl", "set_user_limits", "--", agent, _json(limits.definition())]


def vhost_limits_command(vhost: str, limits: dict[str, Any]) -> list[str]:
    """``rabbitmqctl set_vhost_limits``; unlike user limits it *replaces* all the vhost's limits."""
    return ["rabbitmqctl", "set_vhost_limits", f"--vhost={vhost}", _json(limits)]


RECEIPTS_SOURCE = "reach.receipts"  # workers.transport.topology.RECEIPTS_EXCHANGE (the only one agents may read)


def _erlang_binary(text: str) -> str:
    """``text`` as an Erlang binary expression built from its bytes: nothing in it is ever parsed
    as Erlang (a vhost may hold quotes or backslashes)."""
    return "list_to_binary([" + ",".join(str(b) for b in text.encode("utf-8")) + "])"


def sweep_bindings_command(vhost: str, source: str = RECEIPTS_SOURCE) -> list[str]:
    """``rabbitmqctl eval`` that removes every binding from exchange ``source`` to an exchange in
    ``vhost`` and prints how many it removed. Bindings to queues (agents' receipt queues) stay.

    rabbitmqctl has no command to remove a binding, and its JSON listing loses array arguments (so
    an ``exchange.unbind`` could not always name the binding); the broker's own ``rabbit_binding``
    removes them exactly (checked against RabbitMQ 3.10 by tests/integration/test_agent_bindings.py).
    """
    expression = (
        f"Src = rabbit_misc:r({_erlang_binary(vhost)}, exchange, {_erlang_binary(source)}), "
        "Gone = [B || B = {binding, _, _, {resource, _, exchange, _}, _} <- rabbit_binding:list_for_source(Src)], "
        '[rabbit_binding:remove(B, <<"reach-sweep">>) || B <- Gone], '
        "length(Gone)."
    )
    return ["rabbitmqctl", "eval", expression]


def management_api_requests(
    vhost: str, policy: AgentQueuePolicy, max_queues: int, base_url: str = "http://BROKER:15672"
) -> list[str]:
    """The same as :func:`policy_command` and the vhost queue limit, as curl calls to the management API.

    Setting one vhost limit over the API keeps the others. Operator policies need a user with the
    ``administrator`` tag.
    """
    target = quote(vhost, safe="")
    body = {
        "pattern": AGENT_QUEUE_PATTERN,
        "apply-to": "queues",
        "priority": AGENT_QUEUE_POLICY_PRIORITY,
        "definition": policy.definition(),
    }
    curl = ["curl", "-fsS", "-u", "ADMIN:PASSWORD", "-X", "PUT", "-H", "content-type: application/json"]
    return [
        shlex.join([*curl, f"{base_url}/api/operator-policies/{target}/{AGENT_QUEUE_POLICY}", "-d", _json(body)]),
        shlex.join([*curl, f"{base_url}/api/vhost-limits/{target}/max-queues", "-d", _json({"value": max_queues})]),
    ]


def _json(value: Any) -> str:
    return json.dumps(value, separators=(", ", ": "))
