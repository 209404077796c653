"""Receipts the broker refuses, and the trace they leave, against a live fleet (router, one pool,
a counting downstream).

An agent may bound its own receipt queue with ``overflow: reject-publish``; while it is full, the
broker nacks every receipt routed to it. Round two's pool dead-lettered such a job at the first
nack and its receipt was never published. ``reach trace`` without ``--agent`` scanned the whole
keyspace; it reads the intent id's index now. A stage written again (the same receipt for a
redelivered job) is kept once.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import amqp
import pytest
import redis
from kombu import Connection

from tests.fleet import REPO, Fleet
from tests.integration.counting_system import CountingSystem
from tests.waiting import wait_for
from workers.observability.audit import Audit, read_trace, trace_agents
from workers.ops.fleet import list_dead_letters
from workers.state import keys

RUN = uuid.uuid4().hex[:6]
AGENT = f"nacked_{RUN}"
CONNECTOR = "nacking"
ACTION = f"{CONNECTOR}.create_item"
SMALL = f"{AGENT}.small"  # the reply_to whose queue holds one message and refuses the next
FILLER = b"filler: the agent has not read it yet"


@pytest.fixture(scope="module")
def downstream() -> Iterator[CountingSystem]:
    system = CountingSystem().start()
    yield system
    system.stop()


@pytest.fixture(scope="module")
def fleet(downstream: CountingSystem) -> Iterator[Fleet]:
    with Fleet(downstream.catalog(CONNECTOR, AGENT), [CONNECTOR]) as running:
        yield running


@pytest.fixture(scope="module")
def store(fleet: Fleet) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(fleet.redis_url)
    yield client
    client.close()


class FullQueue:
    """The agent's own receipt queue for ``SMALL``: one message at most, the rest refused (nack)."""

    def __init__(self, fleet: Fleet) -> None:
        self.conn = Connection(fleet.broker_url, transport_options={"confirm_publish": True})
        self.name = f"receipts-{AGENT}-{uuid.uuid4().hex[:6]}"
        channel = self.conn.default_channel
        channel.queue_declare(
            self.name, durable=False, auto_delete=False, arguments={"x-max-length": 1, "x-overflow": "reject-publish"}
        )
        channel.queue_bind(self.name, "reach.receipts", SMALL)
        channel.basic_publish(amqp.Message(FILLER), exchange="", routing_key=self.name)

    def read(self) -> bytes | None:
        """Take one message out (the agent reads it): room for one more."""
        message = self.conn.default_channel.basic_get(self.name, no_ack=True)
        if message is None:
            return None
        body = message.body
        return body.encode() if isinstance(body, str) else bytes(body)  # py-amqp decodes JSON bodies

    def close(self) -> None:
        self.conn.default_channel.queue_delete(self.name)
        self.conn.release()


def send(fleet: Fleet, intent_id: str, title: str) -> None:
    body = {"intent_id": intent_id, "agent_id": AGENT, "action": ACTION, "params": {"title": title}, "reply_to": SMALL}
    with Connection(fleet.broker_url, transport_options={"confirm_publish": True}) as conn:
        conn.default_channel.basic_publish(
            amqp.Message(json.dumps(body).encode(), message_id=intent_id, content_type="application/json"),
            exchange="reach.intents",
            routing_key="intent",
        )


def nacked_lines(fleet: Fleet, intent_id: str) -> list[str]:
    return [line for line in fleet.log_lines(CONNECTOR) if "nacked receipt" in line and intent_id in line]


def letters_of(fleet: Fleet, intent_id: str) -> list[Any]:
    return [letter for letter in list_dead_letters(fleet.broker_url, 1000) if letter.message_id == intent_id]


def test_a_receipt_the_broker_nacks_is_published_again_once_there_is_room(
    fleet: Fleet, downstream: CountingSystem, store: redis.Redis
) -> None:
    intent_id = f"{RUN}-nacked-once"
    queue = FullQueue(fleet)
    try:
        send(fleet, intent_id, intent_id)
        # the pool's first publish was refused: it says so and tries again after a pause
        wait_for(lambda: nacked_lines(fleet, intent_id), 20, "the pool never retried a nacked receipt")
        assert queue.read() == FILLER  # the agent reads what waited: room for the receipt
        body = wait_for(queue.read, 10, "the nacked receipt never arrived")
    finally:
        queue.close()
    receipt = json.loads(body)
    assert receipt["intent_id"] == intent_id and receipt["status"] == "succeeded"
    assert downstream.executions()[intent_id] == 1
    assert letters_of(fleet, intent_id) == []  # nothing dead-lettered, the job acked once answered
    assert store.exists(keys.sent(AGENT, intent_id))
    assert [e["stage"] for e in read_trace(store, AGENT, intent_id)].count("receipt") == 1


def test_a_receipt_refused_on_every_try_stays_stored_and_its_job_is_kept(
    fleet: Fleet, downstream: CountingSystem, store: redis.Redis
) -> None:
    intent_id = f"{RUN}-nacked-always"
    queue = FullQueue(fleet)
    try:
        send(fleet, intent_id, intent_id)
        letter = wait_for(lambda: letters_of(fleet, intent_id), 30, "the job was not dead-lettered")[0]
    finally:
        queue.close()
    assert "refused the receipt" in letter.reason and letter.connector == CONNECTOR
    assert len(nacked_lines(fleet, intent_id)) >= 2  # retried before it gave up
    stored = json.loads(store.get(keys.receipt(AGENT, intent_id)) or b"{}")
    assert stored.get("status") == "succeeded"  # the outcome is not lost: stored for lookups and replay
    assert downstream.executions()[intent_id] == 1


def test_reach_trace_finds_an_intent_by_its_index_without_scanning(fleet: Fleet, store: redis.Redis) -> None:
    intent_id = f"{RUN}-traced"
    with Connection(fleet.broker_url) as conn:
        channel = conn.default_channel
        name = f"traced-{RUN}"
        channel.queue_declare(name, auto_delete=True)
        channel.queue_bind(name, "reach.receipts", SMALL)
        send(fleet, intent_id, intent_id)
        wait_for(lambda: channel.basic_get(name, no_ack=True), 20, "no receipt")

    class NoScan(redis.Redis):
        def scan(self, *args: Any, **kwargs: Any) -> Any:
            raise AssertionError("reach trace scanned the keyspace")

    assert trace_agents(NoScan.from_url(fleet.redis_url), intent_id) == [AGENT]
    done = subprocess.run(
        [sys.executable, "-m", "workers.cli", "trace", intent_id],
        env=fleet.env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert f"agent {AGENT}" in done.stderr
    shown = [line.split(" ms ", 1)[1].split()[0] for line in done.stdout.splitlines()]
    assert shown == ["received", "dispatched", "attempt", "receipt"]
    assert trace_agents(store, f"{RUN}-never-sent") == []


def test_a_stage_written_again_by_a_redelivery_is_kept_once(fleet: Fleet, store: redis.Redis) -> None:
    """A job whose receipt publish failed is redelivered (perhaps to another pool process), which
    publishes the stored receipt again and writes its receipt stage again: the trace keeps one."""
    intent_id = f"{RUN}-redelivered"
    stage = {"agent": AGENT, "action": "create_item", "connector": CONNECTOR, "trace_id": "t" * 32}
    receipt = {**stage, "status": "succeeded", "attempts": 1, "latency_ms": 12.5}
    first, second = Audit(store, "pool:a:1"), Audit(store, "pool:b:2")
    first.events(intent_id, [("attempt", {**stage, "attempt": 1, "outcome": "ok"}), ("receipt", dict(receipt))])
    second.events(intent_id, [("receipt", dict(receipt))])  # the redelivery's
    second.events(intent_id, [("receipt", {**receipt, "latency_ms": 99.0})])  # another answer: kept
    stages = read_trace(store, AGENT, intent_id)
    assert [e["stage"] for e in stages] == ["attempt", "receipt", "receipt"]
    assert [e["latency_ms"] for e in stages[1:]] == [12.5, 99.0]
