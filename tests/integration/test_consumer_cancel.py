"""Consumer cancel notifications (issue 19), against a live fleet: the router, one pool and a
counting downstream.

The broker cancels a consumer when its queue is deleted (``reach setup --migrate-queues``, an
operator). What these tests found really happens:

- py-amqp raises ``ConsumerCancelled`` on the consumer's loop; Celery takes it for a lost
  connection, connects again and declares its own queue again (the router reach.intents, a pool
  its connector queue; nothing else declares them after start) and consumes it, in the same
  process, within about 0.1 s of the delete.
- Until then the queue does not exist. An intent an agent sends then is refused at publish
  (ReachClient publishes with ``mandatory``). A job the router dispatches then comes back to it
  (the router publishes jobs ``mandatory``, ``workers.transport.dispatch``): the router declares the
  connector's queue again and publishes the job once more, and the job waits there for its pool.
- A cancel that comes in the first ~0.1 s after a consumer (re)started is read by Celery's
  ``celery.worker.loops._quick_drain``, which swallows every exception without an ``errno``; the
  consumer's cancel callback (``workers.transport.base_consumer``) raises it again from the event
  loop's next callback, so the process reconnects as it does for any other cancel.

To keep the window between the delete and the re-declare open, a test freezes the router with
SIGSTOP (it reads nothing, so it cannot see the cancel) and continues it afterwards, or stops the
pool and starts it again.
"""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from amqp.exceptions import NotFound
from kombu import Connection

from producers.client import ReachClient, ReachError
from tests.fleet import Fleet, agent
from tests.integration.counting_system import CountingSystem
from tests.waiting import wait_for
from workers.ops.local_fleet import Proc
from workers.transport.topology import INTENTS_QUEUE_NAME, connector_queue_name

RUN = uuid.uuid4().hex[:6]
AGENT = f"canceller_{RUN}"
CONNECTOR = "cancelled"
ACTION = f"{CONNECTOR}.create_item"
POOL_QUEUE = connector_queue_name(CONNECTOR)
BACK_WITHIN = 20.0  # s for a deleted queue to exist again with a consumer (about 0.1 s when it works)
LOST_AFTER = 10.0  # s without a receipt after which an intent counts as lost (a round trip takes ms)
GRACE = 1.0  # s listening for a second receipt of an intent that was answered


class Broker:
    """The test's own connection to the fleet's vhost, to delete queues and look at them quickly."""

    def __init__(self, url: str) -> None:
        self._connection = Connection(url)
        self._connection.connect()

    def delete(self, queue: str) -> None:
        channel = self._connection.channel()
        try:
            channel.queue_delete(queue)
        finally:
            channel.close()

    def consumers(self, queue: str) -> int | None:
        """The queue's consumers; None while it does not exist."""
        channel = self._connection.channel()
        try:
            return int(channel.queue_declare(queue, passive=True).consumer_count)
        except NotFound:
            return None  # the broker closed the channel with the 404
        finally:
            if channel.is_open:
                channel.close()

    def close(self) -> None:
        self._connection.release()


@pytest.fixture(scope="module")
def downstream() -> Iterator[CountingSystem]:
    system = CountingSystem().start()
    yield system
    system.stop()


@pytest.fixture
def fleet(downstream: CountingSystem) -> Iterator[Fleet]:
    """A fleet of its own per test: the tests delete its queues, and some leave it broken."""
    with Fleet(downstream.catalog(CONNECTOR, AGENT), [CONNECTOR]) as running:
        # one intent through first: then both consumers' loops are past Celery's first drain
        # (see the module docstring), so a cancel now is one the fleet is meant to handle
        with agent(AGENT, running.broker_url) as client:
            assert client.call(ACTION, {"title": f"{RUN}-warm-up"}, timeout=20).status == "succeeded"
        downstream.state.reset()
        yield running


@pytest.fixture
def broker(fleet: Fleet) -> Iterator[Broker]:
    connection = Broker(fleet.broker_url)
    yield connection
    connection.close()


@pytest.fixture
def client(fleet: Fleet) -> Iterator[ReachClient]:
    with agent(AGENT, fleet.broker_url) as reach:
        yield reach


@contextmanager
def stopped(proc: Proc) -> Iterator[None]:
    """``proc`` (a process this test started) stopped with SIGSTOP: it reads nothing from the broker
    meanwhile, so it cannot notice a cancel, nor declare its queue again."""
    os.killpg(proc.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.killpg(proc.pid, signal.SIGCONT)


def served_once(client: ReachClient, downstream: CountingSystem, title: str) -> None:
    """An intent now gets exactly one receipt, succeeded, and reaches the downstream once."""
    receipt = client.call(ACTION, {"title": title}, timeout=20)
    assert receipt.status == "succeeded", receipt
    again = [r for r in client.receipts(timeout=GRACE) if r.intent_id == receipt.intent_id]
    assert again == [], again
    assert len(downstream.requests("POST", title)) == 1 and downstream.executions()[title] == 1


@pytest.mark.parametrize("process, queue", [(CONNECTOR, POOL_QUEUE), ("router", INTENTS_QUEUE_NAME)])
def test_a_deleted_queue_is_declared_again_by_its_consumer_which_serves_the_next_intent(
    fleet: Fleet, broker: Broker, client: ReachClient, downstream: CountingSystem, process: str, queue: str
) -> None:
    pid = fleet.procs[process].pid
    assert broker.consumers(queue) == 1
    broker.delete(queue)
    # only the consumer itself, reconnected, declares the queue again: it must be back with it
    wait_for(lambda: broker.consumers(queue), BACK_WITHIN, f"{queue} never existed again with a consumer", every=0.02)
    served_once(client, downstream, f"{RUN}-after-{queue}")
    fleet.check_alive()
    assert fleet.procs[process].pid == pid, f"{process} was restarted, not reconnected"


def test_an_intent_sent_while_the_intents_queue_is_gone_is_refused_to_its_agent(
    fleet: Fleet, broker: Broker, client: ReachClient, downstream: CountingSystem
) -> None:
    pid = fleet.procs["router"].pid
    title = f"{RUN}-while-intents-gone"
    with stopped(fleet.procs["router"]):
        broker.delete(INTENTS_QUEUE_NAME)
        with pytest.raises(ReachError, match="not routed"):
            client.publish(ACTION, {"title": title})
    wait_for(lambda: broker.consumers(INTENTS_QUEUE_NAME), BACK_WITHIN, "reach.intents never came back", every=0.02)
    served_once(client, downstream, f"{RUN}-after-intents-gone")
    assert downstream.requests("POST", title) == []
    fleet.check_alive()
    assert fleet.procs["router"].pid == pid


def test_a_job_dispatched_while_its_connector_queue_is_gone_waits_for_its_pool_in_the_queue_declared_again(
    fleet: Fleet, broker: Broker, client: ReachClient, downstream: CountingSystem
) -> None:
    title = f"{RUN}-while-pool-queue-gone"
    fleet.stop_process(CONNECTOR)  # its pool is down (deploying, crashed) when its queue is deleted
    broker.delete(POOL_QUEUE)
    assert broker.consumers(POOL_QUEUE) is None
    intent_id = client.publish(ACTION, {"title": title})
    wait_for(lambda: "dispatched" in fleet.stages(AGENT, intent_id), 20, "the router never dispatched the intent")
    # the job came back to the router, which declared the queue again and published it there
    assert broker.consumers(POOL_QUEUE) == 0
    assert f"{POOL_QUEUE} is missing" in fleet.log("router")
    fleet.start_process(CONNECTOR, ["worker", CONNECTOR])
    receipt = client.wait(intent_id, timeout=LOST_AFTER)
    assert receipt.status == "succeeded", receipt
    assert downstream.executions()[title] == 1


def test_a_queue_deleted_again_right_after_its_consumer_came_back_is_declared_again(
    fleet: Fleet, broker: Broker, client: ReachClient, downstream: CountingSystem
) -> None:
    broker.delete(POOL_QUEUE)
    wait_for(lambda: broker.consumers(POOL_QUEUE), BACK_WITHIN, f"{POOL_QUEUE} never came back", every=0.002)
    broker.delete(POOL_QUEUE)  # the pool's loop has only just started again
    wait_for(
        lambda: broker.consumers(POOL_QUEUE),
        BACK_WITHIN,
        f"{POOL_QUEUE} deleted a second time never existed again with a consumer",
        every=0.02,
    )
    served_once(client, downstream, f"{RUN}-after-two-deletes")
    # both cancels were seen (the second one, nearly always, inside Celery's first drain)
    assert fleet.log(CONNECTOR).count("the broker cancelled consumer") >= 2
