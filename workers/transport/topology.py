"""The AMQP topology of docs/contract.md section 1, declared by every process on start.

Queue types (``REACH_QUEUE_TYPE``): ``quorum``, the default, replicates reach.intents, every
reach.connector.*, reach.agent.* and reach.dlq over the nodes of a cluster (Raft: a queue lives
while most of its nodes do); ``classic`` keeps each queue on one node, for development. Agents'
receipt queues (amq.gen-*, exclusive, auto-delete) are always classic: a quorum queue cannot be
exclusive.

Every process declares the same arguments, because RabbitMQ refuses (PRECONDITION_FAILED) a
declaration whose type or x-arguments differ from the queue's, and cannot change them in place:
:class:`TopologyMismatch` says so, and ``reach setup --migrate-queues``
(``workers.transport.migration``) re-creates the queues with their messages kept.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from amqp.exceptions import PreconditionFailed
from kombu import Connection, Exchange, Queue

from connectors.spec import ConnectorSpec
from producers.serve import AGENT_REPLIES_EXCHANGE_NAME, AGENTS_EXCHANGE_NAME, agent_queue_name
from producers.wire import INTENT_ROUTING_KEY, INTENTS_EXCHANGE_NAME, RECEIPTS_EXCHANGE_NAME

log = logging.getLogger("reach.topology")

QueueType = Literal["quorum", "classic"]
DEFAULT_QUEUE_TYPE: QueueType = "quorum"

INTENTS_QUEUE_NAME = "reach.intents"
DLQ_NAME = "reach.dlq"

# The broker's own backstop on the quorum work queues: a message returned more often than this
# (requeued, or held by a consumer whose connection died) goes to reach.dlq, x-death reason
# "delivery_limit", instead of once more to a consumer. The fleet counts first: the router's
# RetryCounts and the pools' Redis delivery counter stop a message after REACH_MAX_DELIVERIES (at
# most 100) deliveries and answer it. What only the broker sees is left for this limit: a message
# that kills its router every time, and a pool's requeues while Redis is away (one a second per job
# it holds, so about three minutes of outage). One number for every process, whatever its settings:
# the broker refuses a declaration with another.
DELIVERY_LIMIT = 200
# reach.dlq has no consumer, but `reach dlq list` and `replay` take letters and leave the ones they
# keep unacked, which the broker counts as returns. RabbitMQ 3.x sets no limit by default (and
# reads a negative one as 0); 4.x defaults to 20, which would drop a letter after 20 listings.
DEAD_LETTER_DELIVERY_LIMIT = 1_000_000

INTENTS_EXCHANGE = Exchange(INTENTS_EXCHANGE_NAME, "direct", durable=True)
RECEIPTS_EXCHANGE = Exchange(RECEIPTS_EXCHANGE_NAME, "topic", durable=True)
# router -> pools only; agents get no permission on it (Celery also refuses to route through "")
DISPATCH_EXCHANGE = Exchange("reach.dispatch", "direct", durable=True)
# the default exchange routes by queue name; kombu skips binding when the exchange name is ""
DEFAULT_EXCHANGE = Exchange("", "direct")
# connectors of type agent: pools -> the answering agent's queue, and its answers back to the pools
AGENTS_EXCHANGE = Exchange(AGENTS_EXCHANGE_NAME, "direct", durable=True)
AGENT_REPLIES_EXCHANGE = Exchange(AGENT_REPLIES_EXCHANGE_NAME, "topic", durable=True)


def queue_arguments(queue_type: QueueType = DEFAULT_QUEUE_TYPE) -> dict[str, Any]:
    """The x-arguments of a work queue (reach.intents, reach.connector.*, reach.agent.*).

    Classic queues keep the arguments they always had (none), so a classic fleet's queues stay valid.
    """
    if queue_type == "classic":
        return {}
    return {
        "x-queue-type": "quorum",
        "x-delivery-limit": DELIVERY_LIMIT,
        # what the limit takes is kept for operators, not dropped
        "x-dead-letter-exchange": DEFAULT_EXCHANGE.name,
        "x-dead-letter-routing-key": DLQ_NAME,
    }


def intents_queue(queue_type: QueueType = DEFAULT_QUEUE_TYPE) -> Queue:
    return Queue(
        INTENTS_QUEUE_NAME,
        INTENTS_EXCHANGE,
        routing_key=INTENT_ROUTING_KEY,
        durable=True,
        queue_arguments=queue_arguments(queue_type),
    )


INTENTS_QUEUE = intents_queue()
DLQ = Queue(DLQ_NAME, DEFAULT_EXCHANGE, routing_key=DLQ_NAME, durable=True)  # its name; declare with bounds


@dataclass(frozen=True)
class DeadLetterBounds:
    """reach.dlq keeps at most this much (REACH_DLQ_MAX_LENGTH, REACH_DLQ_MAX_BYTES, REACH_DLQ_TTL).
    When full, the broker refuses new letters (the publisher gets a nack and counts the drop in
    reach_dead_letters_dropped_total); letters older than the TTL are removed by the broker.
    Quorum queues (RabbitMQ 3.10+) support all four; they refuse only once a queue is over a bound,
    so a full quorum reach.dlq may hold a little more: the letters published at that moment."""

    max_length: int = 10_000
    max_bytes: int = 256 * 1024 * 1024
    ttl_seconds: int = 7 * 24 * 3600

    def arguments(self, queue_type: QueueType = DEFAULT_QUEUE_TYPE) -> dict[str, Any]:
        bounds: dict[str, Any] = {
            "x-max-length": self.max_length,
            "x-max-length-bytes": self.max_bytes,
            "x-message-ttl": self.ttl_seconds * 1000,
            "x-overflow": "reject-publish",
        }
        if queue_type == "quorum":
            bounds.update({"x-queue-type": "quorum", "x-delivery-limit": DEAD_LETTER_DELIVERY_LIMIT})
        return bounds

    def policy_command(self, vhost: str = "/") -> str:
        """The same bounds as a policy, for a reach.dlq declared without them."""
        definition = {
            "max-length": self.max_length,
            "max-length-bytes": self.max_bytes,
            "message-ttl": self.ttl_seconds * 1000,
            "overflow": "reject-publish",
        }
        return (
            f"rabbitmqctl set_policy -p {vhost} --apply-to queues reach-dlq-bounds '^reach\\.dlq$' "
            f"'{json.dumps(definition)}'"
        )


def dead_letter_queue(bounds: DeadLetterBounds, queue_type: QueueType = DEFAULT_QUEUE_TYPE) -> Queue:
    return Queue(
        DLQ_NAME, DEFAULT_EXCHANGE, routing_key=DLQ_NAME, durable=True, queue_arguments=bounds.arguments(queue_type)
    )


CONNECTOR_QUEUE_PREFIX = "reach.connector."


def connector_queue_name(connector: str) -> str:
    """Also the routing key on reach.dispatch (cheap: the router asks once per intent)."""
    return CONNECTOR_QUEUE_PREFIX + connector


def connector_queue(connector: str, queue_type: QueueType = DEFAULT_QUEUE_TYPE) -> Queue:
    name = connector_queue_name(connector)
    return Queue(name, DISPATCH_EXCHANGE, routing_key=name, durable=True, queue_arguments=queue_arguments(queue_type))


# Workflows (workers/workflows/): the runner's start jobs come on reach.dispatch as a connector's
# do; the receipts of the step intents it sends come under a routing key no agent can bind or
# name as its reply_to (agent names hold no "-", and agents may bind only their own names). Step
# intents carry the run's id and the owner they are sent for; the router takes both only from the
# fleet's own broker login.
WORKFLOWS_QUEUE_NAME = "reach.workflows"
WORKFLOW_REPLY_KEY = "reach-workflows"
WORKFLOW_RECEIPTS_QUEUE_NAME = "reach.workflows.receipts"
ON_BEHALF_OF_HEADER = "x-reach-on-behalf-of"
RUN_ID_HEADER = "x-reach-run-id"
# a start job's ``connector`` (its ``action`` is the workflow's name): no connector can be named so,
# and the dispatcher sends such a job to reach.workflows, never to a pool
WORKFLOW_JOB_CONNECTOR = "(workflow)"


def workflows_queue(queue_type: QueueType = DEFAULT_QUEUE_TYPE) -> Queue:
    """Where the router sends the start of each workflow run (only the runner reads it)."""
    name = WORKFLOWS_QUEUE_NAME
    return Queue(name, DISPATCH_EXCHANGE, routing_key=name, durable=True, queue_arguments=queue_arguments(queue_type))


def workflow_receipts_queue(queue_type: QueueType = DEFAULT_QUEUE_TYPE) -> Queue:
    """The receipts (and approval notices) of the runner's step intents."""
    return Queue(
        WORKFLOW_RECEIPTS_QUEUE_NAME,
        RECEIPTS_EXCHANGE,
        routing_key=WORKFLOW_REPLY_KEY,
        durable=True,
        queue_arguments=queue_arguments(queue_type),
    )


def agent_queue(agent: str, queue_type: QueueType = DEFAULT_QUEUE_TYPE) -> Queue:
    """Where the pools of the connectors that ``agent`` answers send it requests; only it may read."""
    return Queue(
        agent_queue_name(agent),
        AGENTS_EXCHANGE,
        routing_key=agent,
        durable=True,
        queue_arguments=queue_arguments(queue_type),
    )


def typed(queue: Queue, queue_type: QueueType) -> Queue:
    """``queue`` (one of the fleet's work queues) with the arguments of ``queue_type``."""
    return Queue(
        queue.name,
        queue.exchange,
        routing_key=queue.routing_key,
        durable=True,
        queue_arguments=queue_arguments(queue_type),
    )


def fleet_queues(
    connectors: Iterable[str] | Mapping[str, ConnectorSpec],
    dead_letters: DeadLetterBounds | None = None,
    queue_type: QueueType = DEFAULT_QUEUE_TYPE,
) -> list[Queue]:
    """Every queue the fleet declares, as it declares it: reach.intents, the connectors' queues,
    the request queues of the agents that answer connectors (given the specs, not only names), the
    workflow runner's two queues, and reach.dlq last.

    The runner's queues are here, not only in the runner, so that ``reach setup`` and every process
    declare them with the fleet's queue type: a run an agent starts before any runner is up waits in
    reach.workflows, and ``reach setup --migrate-queues`` migrates them with the rest."""
    agents = (
        sorted({c.agent for c in connectors.values() if c.type == "agent" and c.agent})
        if isinstance(connectors, Mapping)
        else []
    )
    return [
        intents_queue(queue_type),
        *(connector_queue(c, queue_type) for c in connectors),
        *(agent_queue(a, queue_type) for a in agents),
        workflows_queue(queue_type),
        workflow_receipts_queue(queue_type),
        dead_letter_queue(dead_letters or DeadLetterBounds(), queue_type),
    ]


class TopologyMismatch(RuntimeError):
    """Queues exist with another type or other arguments than this fleet declares.

    Attributes:
        problems: (queue name, the broker's words) for each.
    """

    def __init__(self, problems: list[tuple[str, str]], queue_type: QueueType) -> None:
        self.problems = problems
        lines = [f"  {name}: {why}" for name, why in problems]
        super().__init__(
            f"{len(problems)} queue(s) exist with another type or other arguments than this fleet declares "
            f"(REACH_QUEUE_TYPE={queue_type}):\n"
            + "\n".join(lines)
            + "\nRabbitMQ cannot change them in place. Stop the routers and pools, then run "
            "`reach setup --migrate-queues` (messages are kept; docs/operations.md, 'Queue types'), "
            "or set REACH_QUEUE_TYPE to the type the queues have."
        )


# the broker names the first argument that differs; these two differ between the types
_TYPE_ARGS = re.compile(r"inequivalent arg 'x-(queue-type|delivery-limit)'")


def _other(queue_type: QueueType) -> QueueType:
    return "classic" if queue_type == "quorum" else "quorum"


def _refusal(connection: Connection, probe: Queue, queue_type: QueueType) -> str | None:
    """Why a queue was refused, said plainly when it is ``probe`` (the fleet's queue as the other
    type declares it: a declaration equal to an existing queue changes nothing); None if not."""
    if declare_queue(connection, probe) is None:
        return f"it is a {_other(queue_type)} queue, this fleet declares {queue_type} queues"
    return None


def declare_all(
    connection: Connection,
    connectors: Iterable[str] | Mapping[str, ConnectorSpec],
    dead_letters: DeadLetterBounds | None = None,
    queue_type: QueueType = DEFAULT_QUEUE_TYPE,
) -> list[str]:
    """Declare every exchange and queue (idempotent); returns the queue names. Given the connector
    specs (not only names), the request queues of the agents that answer connectors too.

    Raises:
        TopologyMismatch: a work queue, or reach.dlq's type, differs from what this fleet declares.
            (reach.dlq with other bounds is kept as it is, with a warning naming the policy to set.)
    """
    channel = connection.channel()
    try:
        for exchange in (
            INTENTS_EXCHANGE,
            RECEIPTS_EXCHANGE,
            DISPATCH_EXCHANGE,
            AGENTS_EXCHANGE,
            AGENT_REPLIES_EXCHANGE,
        ):
            exchange.declare(channel=channel)
    finally:
        channel.close()
    bounds = dead_letters or DeadLetterBounds()
    *work, dlq = fleet_queues(connectors, bounds, queue_type)
    problems: list[tuple[str, str]] = []
    other = _other(queue_type)
    for queue in work:
        refused = declare_queue(connection, queue)
        if refused is not None:
            plainly = _refusal(connection, typed(queue, other), queue_type)
            problems.append((queue.name, plainly or f"it exists with other arguments ({refused})"))
    refused = declare_queue(connection, dlq)
    plainly = _refusal(connection, dead_letter_queue(bounds, other), queue_type) if refused else None
    if refused is not None and (plainly or _TYPE_ARGS.search(refused)):
        problems.append(
            (dlq.name, plainly or f"it is a {other} queue, this fleet declares {queue_type} queues ({refused})")
        )
    elif refused is not None:
        # declared earlier with other bounds (or none): the broker keeps the queue as it is; a
        # policy applies the bounds without re-creating it
        log.warning(
            "reach.dlq exists with other arguments (%s); to bound it, run: %s "
            "(or re-create it, letters kept, with `reach setup --migrate-queues`)",
            refused,
            bounds.policy_command(connection.virtual_host or "/"),
        )
    if problems:
        raise TopologyMismatch(problems, queue_type)
    return [work[0].name, dlq.name, *(q.name for q in work[1:])]


def declare_queue(connection: Connection, queue: Queue) -> str | None:
    """Declare ``queue`` and its binding on a channel of its own; the broker's reason if it refused
    because the queue exists with another type or arguments (PRECONDITION_FAILED), else None."""
    channel = connection.channel()
    try:
        queue.bind(channel).declare()
    except PreconditionFailed as exc:
        return str(getattr(exc, "reply_text", "") or exc)
    finally:
        try:
            channel.close()
        except Exception:
            pass  # the broker closed it with the 406
    return None
