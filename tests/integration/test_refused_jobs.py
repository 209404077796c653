"""A job, or an agent's intent, the broker nacks: against a live fleet (the router, one pool and a
counting downstream), and for ReachClient against reach.intents alone.

RabbitMQ nacks a publish when a queue fails to take it; a quorum queue does so while its leader
stops and another is elected (test_quorum_cluster.py found the router dead-lettering such intents
without a receipt). The fleet declares connector queues without a length bound, so the router
takes a nack for a passing failure: it publishes the job again after a pause, a few times, and
answers CONNECTOR_UNAVAILABLE (retryable, the intent ran nowhere) only if every try was nacked.

Here the broker really nacks: with the pool stopped, the connector's queue holds one message and a
policy bounds it to 0 with ``overflow: reject-publish``. A quorum queue (the fleet's default type)
refuses a message only while it is *over* its bound, so the queue takes nothing until the filler is
taken out, and then exactly one message (a classic queue bounded to 0 would never take one). reach.intents is made to
refuse the same way for the client's tests: ReachClient publishes a nacked intent again after the
same pauses, and raises ReachError only if every try was nacked.
"""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from urllib.parse import quote, unquote, urlsplit, urlunsplit

import amqp
import pytest
from kombu import Connection

from producers.client import ReachError
from producers.wire import NACK_PAUSES_SECONDS, ErrorCode
from tests.fleet import BROKER_URL, Fleet, agent
from tests.integration.counting_system import CountingSystem
from tests.waiting import wait_for
from workers.mcp.clients import AgentClients, Call, Undelivered
from workers.transport.topology import INTENTS_QUEUE_NAME, connector_queue_name, declare_all

RUN = uuid.uuid4().hex[:6]
AGENT = f"refused_{RUN}"
CONNECTOR = "refusing"
ACTION = f"{CONNECTOR}.create_item"
QUEUE = connector_queue_name(CONNECTOR)
POLICY = f"reach-test-refuse-{RUN}"
FILLER = b"filler: holds the queue over its bound of 0"
NACKED = "the broker nacked the job of intent"


@pytest.fixture(scope="module")
def downstream() -> Iterator[CountingSystem]:
    system = CountingSystem().start()
    yield system
    system.stop()


@pytest.fixture(scope="module")
def fleet(downstream: CountingSystem) -> Iterator[Fleet]:
    with Fleet(downstream.catalog(CONNECTOR, AGENT), [CONNECTOR]) as running:
        yield running


class Refusal:
    """The connector's queue refuses every message: its pool stopped, one message in it, and a
    policy bounding it to 0 (on the fleet's vhost). Leaving, the policy is cleared, the filler
    taken out and the pool started again."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.vhost = unquote(urlsplit(fleet.broker_url).path[1:]) or "/"

    def _ctl(self, *args: str) -> None:
        subprocess.run(["rabbitmqctl", "-q", *args], check=True, capture_output=True, timeout=60)

    def __enter__(self) -> Refusal:
        self.fleet.stop_process(CONNECTOR)
        with Connection(self.fleet.broker_url, transport_options={"confirm_publish": True}) as conn:
            conn.default_channel.basic_publish(amqp.Message(FILLER), exchange="", routing_key=QUEUE)
        pattern = "^" + QUEUE.replace(".", r"\.") + "$"
        definition = json.dumps({"max-length": 0, "overflow": "reject-publish"})
        self._ctl(
            "set_policy", "-p", self.vhost, "--apply-to", "queues", "--priority", "100", POLICY, pattern, definition
        )
        time.sleep(1.0)  # a policy reaches the queue's process shortly after the command returns
        return self

    def lift(self) -> None:
        """The queue takes one message again: the filler is taken out (at once, unlike a policy change)."""
        with Connection(self.fleet.broker_url) as conn:
            channel = conn.default_channel
            while (message := channel.basic_get(QUEUE, no_ack=False)) is not None:
                if message.body == FILLER:
                    channel.basic_ack(message.delivery_tag)
                else:  # a job that got in: left for the pool
                    channel.basic_reject(message.delivery_tag, requeue=True)
                    return

    def __exit__(self, *exc: object) -> None:
        self._ctl("clear_policy", "-p", self.vhost, POLICY)
        self.lift()
        self.fleet.start_process(CONNECTOR, ["worker", CONNECTOR])
        self.fleet.wait_consuming(QUEUE)


def nacks_of(fleet: Fleet, intent_id: str) -> int:
    return sum(1 for line in fleet.log_lines("router") if NACKED in line and intent_id in line)


def test_a_job_nacked_on_every_try_is_answered_connector_unavailable_and_runs_nowhere(
    fleet: Fleet, downstream: CountingSystem
) -> None:
    intent_id = f"{RUN}-always"
    with agent(AGENT, fleet.broker_url) as client:
        with Refusal(fleet):
            began = time.monotonic()
            receipt = client.call(ACTION, {"title": intent_id}, intent_id=intent_id, timeout=30)
            took = time.monotonic() - began
        assert list(client.receipts(timeout=1.0)) == []  # one receipt
        assert receipt.status == "rejected", receipt
        assert receipt.error is not None and receipt.error.code == ErrorCode.CONNECTOR_UNAVAILABLE
        assert receipt.error.retryable and receipt.error.retry_after_ms
        assert "refused to queue" in receipt.error.message
        assert took >= sum(NACK_PAUSES_SECONDS)  # every try was made before the answer
        assert nacks_of(fleet, intent_id) == len(NACK_PAUSES_SECONDS)
        expected = ["received", "rejected", "receipt"]  # (written after the receipt went out)
        wait_for(lambda: fleet.stages(AGENT, intent_id), 10, "the audit stages", until=lambda got: got == expected)
        # the fleet goes on: once the queue takes messages again, the next intent runs
        again = client.call(ACTION, {"title": f"{RUN}-after"}, timeout=30)
        assert again.status == "succeeded", again
    assert downstream.executions().get(intent_id, 0) == 0
    fleet.check_alive()


def test_a_job_nacked_while_the_queue_recovers_runs_once(fleet: Fleet, downstream: CountingSystem) -> None:
    """The queue refuses, then takes messages again within the router's tries (as a quorum queue
    does once its new leader is elected): the intent runs once and is answered once."""
    intent_id = f"{RUN}-recovers"
    with agent(AGENT, fleet.broker_url) as client:
        with Refusal(fleet) as refusal:
            client.publish(ACTION, {"title": intent_id}, intent_id=intent_id)
            wait_for(lambda: nacks_of(fleet, intent_id) >= 1, 20, "the router's first nack")
            refusal.lift()
            # the router's next try is taken: the job waits in the queue for its pool
            wait_for(lambda: "dispatched" in fleet.stages(AGENT, intent_id), 20, "the job was never queued")
        receipt = client.wait(intent_id, timeout=30.0)  # the pool is back
        more = list(client.receipts(timeout=1.0))  # a second receipt would show up now
    assert receipt.status == "succeeded", receipt
    assert more == []
    assert downstream.executions()[intent_id] == 1
    assert 1 <= nacks_of(fleet, intent_id) < len(NACK_PAUSES_SECONDS)
    fleet.check_alive()


# -- an agent's intent nacked: ReachClient publishes it again ------------------------------------


@pytest.fixture
def bare_vhost() -> Iterator[str]:
    """A vhost of the test's own with the fleet's exchanges and reach.intents, and nothing reading it."""
    name = f"reach-test-nack-{RUN}"
    base = urlsplit(BROKER_URL)
    subprocess.run(["rabbitmqctl", "-q", "add_vhost", name], check=True, capture_output=True, timeout=60)
    try:
        subprocess.run(
            ["rabbitmqctl", "-q", "set_permissions", "-p", name, base.username or "guest", ".*", ".*", ".*"],
            check=True,
            capture_output=True,
            timeout=60,
        )
        url = urlunsplit(base._replace(path="/" + quote(name, safe="")))
        with Connection(url) as conn:
            declare_all(conn, [])
        yield url
    finally:
        subprocess.run(["rabbitmqctl", "-q", "delete_vhost", name], capture_output=True, timeout=60)


def refuse_intents(url: str) -> None:
    """reach.intents holds one message and may hold none: every publish to it is nacked."""
    vhost = unquote(urlsplit(url).path[1:])
    with Connection(url, transport_options={"confirm_publish": True}) as conn:
        conn.default_channel.basic_publish(amqp.Message(FILLER), exchange="", routing_key=INTENTS_QUEUE_NAME)
    definition = json.dumps({"max-length": 0, "overflow": "reject-publish"})
    subprocess.run(
        [
            "rabbitmqctl",
            "-q",
            "set_policy",
            "-p",
            vhost,
            "--apply-to",
            "queues",
            POLICY,
            r"^reach\.intents$",
            definition,
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    time.sleep(1.0)


def take_filler(url: str) -> bytes | None:
    """The message at the head of reach.intents, taken out (the filler, if nothing got in first)."""
    with Connection(url) as conn:
        message = conn.default_channel.basic_get(INTENTS_QUEUE_NAME, no_ack=True)
        return None if message is None else bytes(message.body)


def test_an_intent_nacked_on_every_try_is_refused_to_the_agent(bare_vhost: str) -> None:
    refuse_intents(bare_vhost)
    with agent(AGENT, bare_vhost) as client:
        began = time.monotonic()
        with pytest.raises(ReachError, match=rf"refused .* \(nack\) on {len(NACK_PAUSES_SECONDS) + 1} tries"):
            client.publish(ACTION, {"title": "never queued"})
        assert time.monotonic() - began >= sum(NACK_PAUSES_SECONDS)


def test_an_intent_nacked_while_the_queue_recovers_is_queued_once(
    bare_vhost: str, caplog: pytest.LogCaptureFixture
) -> None:
    refuse_intents(bare_vhost)
    caplog.set_level(logging.INFO, logger="producers.client")
    with agent(AGENT, bare_vhost) as client:
        taken: list[bytes | None] = []
        timer = threading.Timer(0.4, lambda: taken.append(take_filler(bare_vhost)))  # after a nack or two
        timer.start()
        intent_id = client.publish(ACTION, {"title": "queued once"})
        timer.join()
    assert taken == [FILLER]
    with Connection(bare_vhost) as conn:
        bodies = []
        while (message := conn.default_channel.basic_get(INTENTS_QUEUE_NAME, no_ack=True)) is not None:
            bodies.append(json.loads(message.body))
    assert [body["intent_id"] for body in bodies] == [intent_id]
    assert any("the broker nacked" in r.getMessage() for r in caplog.records)  # it was refused first


def test_the_mcp_facade_publishes_a_nacked_intent_again_and_then_says_it_was_not_sent(bare_vhost: str) -> None:
    """The facade's broker link (workers/mcp/clients.py) answers a nack as ReachClient does."""
    refuse_intents(bare_vhost)

    async def call(title: str) -> tuple[Undelivered, float]:
        clients = AgentClients(bare_vhost, per_agent=1, set_user_id=False)
        began = time.monotonic()
        try:
            with pytest.raises(Undelivered) as raised:
                await clients.call(Call(AGENT, ACTION, {"title": title}, uuid.uuid4().hex, None, None, wait=20))
        finally:
            await clients.aclose()
        return raised.value, time.monotonic() - began

    error, took = asyncio.run(call("never queued"))
    assert error.published is False
    assert f"(nack) on {len(NACK_PAUSES_SECONDS) + 1} tries" in str(error)
    assert took >= sum(NACK_PAUSES_SECONDS)
