"""The AMQP topology of design.md section 1, declared by every process on start."""
from __future__ import annotations

from collections.abc import Iterable

from kombu import Connection, Exchange, Queue

INTENTS_EXCHANGE = Exchange("reach.intents", "direct", durable=True)
INTENTS_QUEUE = Queue("reach.intents", INTENTS_EXCHANGE, routing_key="intent", durable=True)
RECEIPTS_EXCHANGE = Exchange("reach.receipts", "topic", durable=True)
# router -> pools only; agents get no permission on it (Celery also refuses to route through "")
DISPATCH_EXCHANGE = Exchange("reach.dispatch", "direct", durable=True)
# the default exchange routes by queue name; kombu skips binding when the exchange name is ""
DEFAULT_EXCHANGE = Exchange("", "direct")
DLQ = Queue("reach.dlq", DEFAULT_EXCHANGE, routing_key="reach.dlq", durable=True)

CONNECTOR_QUEUE_PREFIX = "reach.connector."


def connector_queue_name(connector: str) -> str:
    """Also the routing key on reach.dispatch (cheap: the router asks once per intent)."""
    return CONNECTOR_QUEUE_PREFIX + connector


def connector_queue(connector: str) -> Queue:
    name = connector_queue_name(connector)
    return Queue(name, DISPATCH_EXCHANGE, routing_key=name, durable=True)


def declare_all(connection: Connection, connectors: Iterable[str]) -> list[str]:
    """Declare every exchange and queue (idempotent); returns the queue names."""
    channel = connection.channel()
    try:
        INTENTS_EXCHANGE.declare(channel=channel)
        RECEIPTS_EXCHANGE.declare(channel=channel)
        DISPATCH_EXCHANGE.declare(channel=channel)
        queues = [INTENTS_QUEUE, DLQ, *(connector_queue(c) for c in connectors)]
        for queue in queues:
            queue.bind(channel).declare()
        return [q.name for q in queues]
    finally:
        channel.close()
