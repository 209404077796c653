"""The AMQP topology of docs/contract.md section 1, declared by every process on start."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from amqp.exceptions import PreconditionFailed
from kombu import Connection, Exchange, Queue

from connectors.spec import ConnectorSpec
from producers.serve import AGENT_REPLIES_EXCHANGE_NAME, AGENTS_EXCHANGE_NAME, agent_queue_name
from producers.wire import INTENT_ROUTING_KEY, INTENTS_EXCHANGE_NAME, RECEIPTS_EXCHANGE_NAME

log = logging.getLogger("reach.topology")

INTENTS_EXCHANGE = Exchange(INTENTS_EXCHANGE_NAME, "direct", durable=True)
INTENTS_QUEUE = Queue("reach.intents", INTENTS_EXCHANGE, routing_key=INTENT_ROUTING_KEY, durable=True)
RECEIPTS_EXCHANGE = Exchange(RECEIPTS_EXCHANGE_NAME, "topic", durable=True)
# router -> pools only; agents get no permission on it (Celery also refuses to route through "")
DISPATCH_EXCHANGE = Exchange("reach.dispatch", "direct", durable=True)
# the default exchange routes by queue name; kombu skips binding when the exchange name is ""
DEFAULT_EXCHANGE = Exchange("", "direct")
DLQ = Queue("reach.dlq", DEFAULT_EXCHANGE, routing_key="reach.dlq", durable=True)  # its name; declare with bounds
# connectors of type agent: pools -> the answering agent's queue, and its answers back to the pools
AGENTS_EXCHANGE = Exchange(AGENTS_EXCHANGE_NAME, "direct", durable=True)
AGENT_REPLIES_EXCHANGE = Exchange(AGENT_REPLIES_EXCHANGE_NAME, "topic", durable=True)


@dataclass(frozen=True)
class DeadLetterBounds:
    """reach.dlq keeps at most this much (REACH_DLQ_MAX_LENGTH, REACH_DLQ_MAX_BYTES, REACH_DLQ_TTL).
    When full, the broker refuses new letters (the publisher gets a nack and counts the drop in
    reach_dead_letters_dropped_total); letters older than the TTL are removed by the broker."""

    max_length: int = 10_000
    max_bytes: int = 256 * 1024 * 1024
    ttl_seconds: int = 7 * 24 * 3600

    def arguments(self) -> dict[str, object]:
        return {
            "x-max-length": self.max_length,
            "x-max-length-bytes": self.max_bytes,
            "x-message-ttl": self.ttl_seconds * 1000,
            "x-overflow": "reject-publish",
        }

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


def dead_letter_queue(bounds: DeadLetterBounds) -> Queue:
    return Queue(DLQ.name, DEFAULT_EXCHANGE, routing_key=DLQ.name, durable=True, queue_arguments=bounds.arguments())


CONNECTOR_QUEUE_PREFIX = "reach.connector."


def connector_queue_name(connector: str) -> str:
    """Also the routing key on reach.dispatch (cheap: the router asks once per intent)."""
    return CONNECTOR_QUEUE_PREFIX + connector


def connector_queue(connector: str) -> Queue:
    name = connector_queue_name(connector)
    return Queue(name, DISPATCH_EXCHANGE, routing_key=name, durable=True)


def agent_queue(agent: str) -> Queue:
    """Where the pools of the connectors that ``agent`` answers send it requests; only it may read."""
    return Queue(agent_queue_name(agent), AGENTS_EXCHANGE, routing_key=agent, durable=True)


def declare_all(
    connection: Connection,
    connectors: Iterable[str] | Mapping[str, ConnectorSpec],
    dead_letters: DeadLetterBounds | None = None,
) -> list[str]:
    """Declare every exchange and queue (idempotent); returns the queue names. Given the connector
    specs (not only names), the request queues of the agents that answer connectors too."""
    agents = (
        sorted({c.agent for c in connectors.values() if c.type == "agent" and c.agent})
        if isinstance(connectors, Mapping)
        else []
    )
    channel = connection.channel()
    try:
        INTENTS_EXCHANGE.declare(channel=channel)
        RECEIPTS_EXCHANGE.declare(channel=channel)
        DISPATCH_EXCHANGE.declare(channel=channel)
        AGENTS_EXCHANGE.declare(channel=channel)
        AGENT_REPLIES_EXCHANGE.declare(channel=channel)
        queues = [INTENTS_QUEUE, *(connector_queue(c) for c in connectors), *(agent_queue(a) for a in agents)]
        for queue in queues:
            queue.bind(channel).declare()
    finally:
        channel.close()
    _declare_dead_letters(connection, dead_letters or DeadLetterBounds())
    return [INTENTS_QUEUE.name, DLQ.name, *(q.name for q in queues[1:])]


def _declare_dead_letters(connection: Connection, bounds: DeadLetterBounds) -> None:
    channel = connection.channel()
    try:
        dead_letter_queue(bounds).bind(channel).declare()
    except PreconditionFailed as exc:
        # declared earlier with other bounds (or none): the broker keeps the queue as it is; a
        # policy applies the bounds without re-creating it
        log.warning(
            "reach.dlq exists with other arguments (%s); to bound it, run: %s",
            exc,
            bounds.policy_command(connection.virtual_host or "/"),
        )
    finally:
        try:
            channel.close()
        except Exception:
            pass  # the broker closed it with the 406
