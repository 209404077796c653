"""Exchange-to-exchange bindings an agent makes (issue 30): permissions cannot refuse them, so the
sweep removes them, and only them, on the live broker. Before, they stayed for ever, uncapped."""

from __future__ import annotations

import json
import secrets
import subprocess
import time
import uuid
from collections.abc import Iterator
from urllib.parse import urlsplit

import amqp
import pytest
from kombu import Connection

from tests.fleet import BROKER_URL
from workers.ops.agents import create_agent_user, delete_agent_user, sweep_agent_bindings, vhost_of
from workers.transport.topology import AGENT_REPLIES_EXCHANGE, INTENTS_EXCHANGE, RECEIPTS_EXCHANGE, declare_all

AGENT = f"binder_{uuid.uuid4().hex[:8]}"
VHOST = vhost_of(BROKER_URL)


@pytest.fixture(scope="module")
def password() -> Iterator[str]:
    with Connection(BROKER_URL) as conn:
        declare_all(conn, [])
    secret = secrets.token_urlsafe(24)
    create_agent_user(AGENT, secret, VHOST)
    try:
        yield secret
    finally:
        delete_agent_user(AGENT, VHOST)


def bindings() -> list[dict[str, object]]:
    listed = subprocess.run(
        [
            "rabbitmqctl", "list_bindings", "--vhost", VHOST, "--silent", "--formatter", "json",
            "source_name", "destination_name", "destination_kind", "routing_key",
        ],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    return [b for b in json.loads(listed.stdout or "[]") if b["source_name"] == RECEIPTS_EXCHANGE.name]


def test_an_agents_exchange_bindings_are_swept_and_its_queue_binding_stays(password: str) -> None:
    parts = urlsplit(BROKER_URL)
    conn = amqp.Connection(
        f"{parts.hostname}:{parts.port or 5672}", userid=AGENT, password=password, virtual_host=VHOST
    )
    conn.connect()
    try:
        channel = conn.channel()
        queue = channel.queue_declare("", exclusive=True).queue
        channel.queue_bind(queue, RECEIPTS_EXCHANGE.name, AGENT)
        # what the agent's own rights allow: receipts bound into the intents and agent-replies exchanges
        for n in range(20):
            channel.exchange_bind(INTENTS_EXCHANGE.name, RECEIPTS_EXCHANGE.name, f"{AGENT}.x{n}")
        channel.exchange_bind(AGENT_REPLIES_EXCHANGE.name, RECEIPTS_EXCHANGE.name, AGENT, arguments={"x-a": [1, "a"]})
        made = [b for b in bindings() if b["destination_kind"] == "exchange"]
        assert len(made) == 21

        assert sweep_agent_bindings(VHOST) == 21
        left = bindings()
        assert [b for b in left if b["destination_kind"] == "exchange"] == []
        assert [(b["destination_name"], b["routing_key"]) for b in left if b["destination_name"] == queue] == [
            (queue, AGENT)
        ]
        # receipts still reach the agent's queue
        with Connection(BROKER_URL) as fleet:
            fleet.default_channel.basic_publish(amqp.Message(b"{}"), RECEIPTS_EXCHANGE.name, AGENT)
        assert _received(channel, queue)
    finally:
        conn.close()


def _received(channel: amqp.Channel, queue: str) -> bool:
    for _ in range(50):
        if channel.basic_get(queue, no_ack=True) is not None:
            return True
        time.sleep(0.1)
    return False
