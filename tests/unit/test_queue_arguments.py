"""The arguments the fleet declares its queues with (quorum or classic), the broker's delivery limit
against the fleet's own count, and the pieces that make Celery and the client fit a cluster."""

from __future__ import annotations

import yaml

from connectors.spec import ConnectorSpec
from producers.client_settings import broker_urls
from workers.ops.agents import vhost_of
from workers.ops.fleet import redact_url
from workers.settings import Settings
from workers.transport.app import create_app
from workers.transport.base_consumer import ReachConsumer
from workers.transport.migration import HOLDING_PREFIX, holding_queue
from workers.transport.topology import (
    DEAD_LETTER_DELIVERY_LIMIT,
    DELIVERY_LIMIT,
    DLQ_NAME,
    DeadLetterBounds,
    TopologyMismatch,
    connector_queue,
    fleet_queues,
    intents_queue,
    queue_arguments,
)

ACTION = "actions: [{action: ping, description: Ping, path: GET /ping, permission: read}]"


def spec(doc: str) -> ConnectorSpec:
    return ConnectorSpec.model_validate(yaml.safe_load(doc.replace("actions: []", ACTION))["connector"])


def test_quorum_work_queues_carry_the_delivery_limit_and_dead_letter_to_reach_dlq() -> None:
    assert queue_arguments("quorum") == {
        "x-queue-type": "quorum",
        "x-delivery-limit": DELIVERY_LIMIT,
        "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": DLQ_NAME,
    }
    assert intents_queue().queue_arguments == queue_arguments("quorum")  # quorum is the default
    assert connector_queue("crm").queue_arguments["x-queue-type"] == "quorum"


def test_classic_queues_keep_the_arguments_they_always_had() -> None:
    assert queue_arguments("classic") == {}
    queues = fleet_queues(["crm"], DeadLetterBounds(), "classic")
    assert [q.queue_arguments for q in queues[:-1]] == [{}, {}, {}, {}]
    assert "x-queue-type" not in queues[-1].queue_arguments


def test_the_brokers_limit_stays_a_backstop_above_the_fleets_own_count() -> None:
    """A pool answers a job on its REACH_MAX_DELIVERIES + 1st delivery; the router gives up after
    REACH_MAX_DELIVERIES. The broker must not drop what the fleet would still answer, with room for
    returns the fleet cannot count (a router that crashes, requeues while Redis is away)."""
    highest = next(m.le for m in Settings.model_fields["max_deliveries"].metadata if hasattr(m, "le"))
    assert 2 * highest <= DELIVERY_LIMIT  # (workers/settings.py says so)
    assert Settings().max_deliveries + 1 < DELIVERY_LIMIT


def test_reach_dlq_keeps_its_bounds_as_a_quorum_queue_with_a_limit_no_listing_reaches() -> None:
    bounds = DeadLetterBounds(max_length=7, max_bytes=4096, ttl_seconds=60)
    assert bounds.arguments("quorum") == {
        "x-queue-type": "quorum",
        "x-max-length": 7,
        "x-max-length-bytes": 4096,
        "x-message-ttl": 60_000,
        "x-overflow": "reject-publish",
        "x-delivery-limit": DEAD_LETTER_DELIVERY_LIMIT,
    }
    assert DEAD_LETTER_DELIVERY_LIMIT > 0  # RabbitMQ 3.x reads a negative limit as 0
    assert "x-dead-letter-exchange" not in bounds.arguments("quorum")  # nothing goes past reach.dlq


def test_fleet_queues_are_intents_connectors_answering_agents_the_workflow_runners_and_reach_dlq_last() -> None:
    connectors = {
        "crm": spec("connector: {name: crm, endpoint: 'http://crm', actions: []}"),
        "helper": spec(
            "connector: {name: helper, type: agent, agent: helper_bot, "
            "actions: [{action: ask, description: Ask it, permission: read}]}"
        ),
    }
    names = [q.name for q in fleet_queues(connectors)]
    assert names == [
        "reach.intents",
        "reach.connector.crm",
        "reach.connector.helper",
        "reach.agent.helper_bot",
        "reach.workflows",
        "reach.workflows.receipts",
        DLQ_NAME,
    ]


def test_the_workflow_runners_queues_are_declared_like_every_work_queue() -> None:
    """`reach setup` and every process declare them (issue 32), with the fleet's queue type, so a
    fresh broker has them before a runner starts and a migration takes them along."""
    for queue_type in ("quorum", "classic"):
        by_name = {q.name: q for q in fleet_queues([], DeadLetterBounds(), queue_type)}
        starts, receipts = by_name["reach.workflows"], by_name["reach.workflows.receipts"]
        assert starts.queue_arguments == receipts.queue_arguments == queue_arguments(queue_type)
        assert (starts.exchange.name, starts.routing_key) == ("reach.dispatch", "reach.workflows")
        # the runner's steps' receipts: a routing key no agent can name as its reply_to
        assert (receipts.exchange.name, receipts.routing_key) == ("reach.receipts", "reach-workflows")
        assert starts.durable and receipts.durable


def test_a_holding_queue_has_the_binding_and_type_of_its_queue_but_no_bounds_or_limit() -> None:
    holding = holding_queue(connector_queue("crm", "quorum"))
    assert holding.name == HOLDING_PREFIX + "reach.connector.crm"
    assert (holding.exchange.name, holding.routing_key) == ("reach.dispatch", "reach.connector.crm")
    assert holding.queue_arguments == {"x-queue-type": "quorum"}
    assert holding_queue(connector_queue("crm", "classic")).queue_arguments == {}


def test_the_mismatch_names_every_queue_and_both_ways_out() -> None:
    text = str(
        TopologyMismatch([("reach.intents", "it is a classic queue, this fleet declares quorum queues")], "quorum")
    )
    assert "reach.intents: it is a classic queue" in text
    assert "reach setup --migrate-queues" in text and "REACH_QUEUE_TYPE" in text


def test_celery_gets_the_queues_with_the_configured_type_and_no_delayed_delivery() -> None:
    app = create_app(Settings(queue_type="quorum"), [connector_queue("crm", "classic")])
    (queue,) = app.conf.task_queues
    assert queue.queue_arguments["x-queue-type"] == "quorum"
    assert create_app(Settings(queue_type="classic"), [intents_queue()]).conf.task_queues[0].queue_arguments == {}
    assert not [s for s in ReachConsumer.Blueprint.default_steps if "delayed_delivery" in s]
    assert any(s.endswith(":Tasks") for s in ReachConsumer.Blueprint.default_steps)


def test_a_cluster_url_lists_its_nodes_and_each_password_is_redacted() -> None:
    url = "amqp://u:secret1@n1:5672/vh;amqp://u:secret2@n2:5672/vh ; amqp://u:secret3@n3:5672/vh"
    assert broker_urls(url) == [
        "amqp://u:secret1@n1:5672/vh",
        "amqp://u:secret2@n2:5672/vh",
        "amqp://u:secret3@n3:5672/vh",
    ]
    assert broker_urls("amqp://a//") == ["amqp://a//"]
    assert vhost_of(url) == "vh"
    assert "secret" not in redact_url(url) and redact_url(url).count("***") == 3
