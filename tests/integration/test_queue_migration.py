"""`reach setup --migrate-queues`: a classic topology with messages in every queue becomes quorum
queues with every message kept, while an agent goes on publishing; a fleet that finds queues of
the other type refuses to start and says how to migrate; a migration refuses to run under a
consumer, and one stopped halfway is finished by running it again.

Runs on the shared broker, in a vhost of its own (the test process's vhost holds the other files'
quorum queues).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

import amqp
import pytest
from kombu import Connection, Queue

from tests.fleet import REDIS_URL, SHARED_BROKER_URL
from workers.ops.fleet import list_dead_letters
from workers.transport.migration import HOLDING_PREFIX, MigrationError, holding_queue, move_messages
from workers.transport.topology import (
    DELIVERY_LIMIT,
    DISPATCH_EXCHANGE,
    DLQ_NAME,
    INTENTS_EXCHANGE,
    INTENTS_QUEUE_NAME,
    DeadLetterBounds,
    TopologyMismatch,
    connector_queue,
    connector_queue_name,
    dead_letter_queue,
    declare_all,
    declare_queue,
    fleet_queues,
    intents_queue,
)

REPO = Path(__file__).resolve().parents[2]
RUN = uuid.uuid4().hex[:6]
CONNECTOR = f"mig_{RUN}"
CATALOG = f"""
connector:
  name: {CONNECTOR}
  endpoint: http://127.0.0.1:9
  actions:
    - action: create_item
      description: Create an item
      path: POST /items
      input:
        title: {{ type: string, required: true }}
      permission: write
"""


def rabbitmqctl(*args: str) -> str:
    return subprocess.run(["rabbitmqctl", *args], check=True, capture_output=True, text=True, timeout=60).stdout


@pytest.fixture
def vhost(tmp_path: Path) -> Iterator[str]:
    """A vhost of this test's own (deleted afterwards), on the shared broker."""
    name = f"reach-migrate-{RUN}-{uuid.uuid4().hex[:4]}"
    rabbitmqctl("add_vhost", name)
    try:
        rabbitmqctl("set_permissions", "-p", name, urlsplit(SHARED_BROKER_URL).username or "guest", ".*", ".*", ".*")
        yield name
    finally:
        subprocess.run(["rabbitmqctl", "delete_vhost", name], capture_output=True, timeout=60)


def url_of(vhost: str) -> str:
    return urlunsplit(urlsplit(SHARED_BROKER_URL)._replace(path="/" + quote(vhost, safe="")))


def reach(vhost: str, catalog_dir: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """The `reach` CLI, as an operator runs it against ``vhost``."""
    return subprocess.run(
        [sys.executable, "-m", "workers.cli", *args],
        env={
            **{k: v for k, v in os.environ.items() if not k.startswith("REACH_")},
            "REACH_BROKER_URL": url_of(vhost),
            "REACH_REDIS_URL": REDIS_URL,
            "REACH_CATALOG": str(catalog_dir),
            **env,
        },
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
    )


@pytest.fixture
def catalog_dir(tmp_path: Path) -> Path:
    (tmp_path / "catalog.yaml").write_text(CATALOG)
    return tmp_path


def publish(conn: Connection, exchange: str, routing_key: str, count: int, tag: str) -> list[str]:
    """``count`` persistent, confirmed messages with ids ``tag-n``, headers and a user_id."""
    channel = conn.channel()
    producer = conn.Producer(channel=channel)
    ids = [f"{tag}-{n:05d}" for n in range(count)]
    for message_id in ids:
        producer.publish(
            f'{{"intent_id":"{message_id}"}}'.encode(),
            exchange=exchange,
            routing_key=routing_key,
            content_type="application/json",
            content_encoding="utf-8",
            delivery_mode=2,
            headers={"agent_id": "mig_agent", "n": int(message_id[-5:])},
            message_id=message_id,
            user_id=conn.userid,
        )
    channel.close()
    return ids


def drain(conn: Connection, queue: str) -> list[amqp.Message]:
    """Every message of ``queue``, in order (acked: the queue is left empty)."""
    channel = conn.connection.channel()
    channel.auto_decode = False
    taken = []
    while (message := channel.basic_get(queue, no_ack=True)) is not None:
        taken.append(message)
    channel.close()
    return taken


def queue_types(vhost: str) -> dict[str, str]:
    lines = rabbitmqctl("list_queues", "-q", "-p", vhost, "name", "type").splitlines()
    return dict(line.split("\t")[:2] for line in lines if "\t" in line and not line.startswith("name"))


def test_a_classic_topology_with_messages_becomes_quorum_with_every_message_kept(vhost: str, catalog_dir: Path) -> None:
    with Connection(url_of(vhost), transport_options={"confirm_publish": True}) as conn:
        declare_all(conn, [CONNECTOR], queue_type="classic")
        intents = publish(conn, INTENTS_EXCHANGE.name, "intent", 1000, "intent")
        jobs = publish(conn, DISPATCH_EXCHANGE.name, connector_queue_name(CONNECTOR), 300, "job")
        letters = publish(conn, "", DLQ_NAME, 50, "letter")
    assert queue_types(vhost)[INTENTS_QUEUE_NAME] == "classic"

    # an agent goes on publishing intents all through the migration
    during: list[str] = []
    stop = threading.Event()

    def agent() -> None:
        with Connection(url_of(vhost), transport_options={"confirm_publish": True}) as conn:
            n = 0
            while not stop.is_set():
                during.extend(publish(conn, INTENTS_EXCHANGE.name, "intent", 1, f"during{n:04d}"))
                n += 1
                time.sleep(0.005)

    publisher = threading.Thread(target=agent, daemon=True)
    publisher.start()
    try:
        done = reach(vhost, catalog_dir, "setup", "--migrate-queues", "--skip-broker-policy")
    finally:
        stop.set()
        publisher.join(30)
    assert done.returncode == 0, done.stderr + done.stdout
    assert f"migrated {INTENTS_QUEUE_NAME} (quorum)" in done.stdout, done.stdout
    assert f"migrated {connector_queue_name(CONNECTOR)} (quorum)" in done.stdout, done.stdout
    assert f"migrated {DLQ_NAME} (quorum)" in done.stdout, done.stdout
    assert len(during) > 10, "the agent published too little during the migration to prove anything"

    types = queue_types(vhost)
    assert {types[q] for q in (INTENTS_QUEUE_NAME, connector_queue_name(CONNECTOR), DLQ_NAME)} == {"quorum"}, types
    assert not [q for q in types if q.startswith(HOLDING_PREFIX)], types
    with Connection(url_of(vhost)) as conn:
        # declared exactly as the fleet declares them now, and no longer as classic queues
        for queue in fleet_queues([CONNECTOR]):
            assert declare_queue(conn, queue) is None, queue.name
        with pytest.raises(TopologyMismatch) as refused:
            declare_all(conn, [CONNECTOR], queue_type="classic")
        # reach.intents, the connector's queue, the workflow runner's two and reach.dlq
        assert len(refused.value.problems) == 5

        got = drain(conn, INTENTS_QUEUE_NAME)
        ids = [m.properties["message_id"] for m in got]
        # the backlog in its order; what the agent published meanwhile, each at least once (one
        # published while two queues were bound is there twice), some of it before the backlog
        assert [i for i in ids if i.startswith("intent-")] == intents
        assert {i for i in ids if not i.startswith("intent-")} == set(during), (
            "an intent published meanwhile is missing"
        )
        assert all(n <= 2 for n in Counter(ids).values())
        sample = next(m for m in got if m.properties["message_id"] == "intent-00000")
        assert sample.body == b'{"intent_id":"intent-00000"}'
        headers = dict(sample.properties["application_headers"])
        headers.pop("x-delivery-count", None)  # (the broker adds it to every delivery from a quorum queue)
        assert headers == {"agent_id": "mig_agent", "n": 0}
        assert sample.properties["user_id"] == conn.userid
        assert sample.properties["delivery_mode"] == 2
        assert [m.properties["message_id"] for m in drain(conn, connector_queue_name(CONNECTOR))] == jobs
        assert [m.properties["message_id"] for m in drain(conn, DLQ_NAME)] == letters

    again = reach(vhost, catalog_dir, "setup", "--migrate-queues", "--skip-broker-policy")
    assert again.returncode == 0, again.stderr
    assert "no queue to migrate" in again.stdout


def test_a_fleet_on_queues_of_the_other_type_refuses_to_start_and_says_how_to_migrate(
    vhost: str, catalog_dir: Path
) -> None:
    with Connection(url_of(vhost)) as conn:
        declare_all(conn, [CONNECTOR], queue_type="classic")
        with pytest.raises(TopologyMismatch) as refused:
            declare_all(conn, [CONNECTOR], queue_type="quorum")
    text = str(refused.value)
    for name in (INTENTS_QUEUE_NAME, connector_queue_name(CONNECTOR), DLQ_NAME):
        assert f"  {name}: it is a classic queue, this fleet declares quorum queues" in text, text
    assert "reach setup --migrate-queues" in text and "REACH_QUEUE_TYPE" in text

    setup = reach(vhost, catalog_dir, "setup", "--skip-broker-policy")
    assert setup.returncode == 2, setup.stdout + setup.stderr
    assert "reach setup --migrate-queues" in setup.stderr
    # the router says the same and stops, before consuming anything
    router = reach(vhost, catalog_dir, "router")
    assert router.returncode != 0
    assert "TopologyMismatch" in router.stderr and "it is a classic queue" in router.stderr, router.stderr[-2000:]
    # a fleet that keeps classic queues on purpose says so
    assert reach(vhost, catalog_dir, "setup", "--skip-broker-policy", REACH_QUEUE_TYPE="classic").returncode == 0


def test_a_migration_refuses_to_run_while_a_consumer_reads_the_queue(vhost: str, catalog_dir: Path) -> None:
    with Connection(url_of(vhost), transport_options={"confirm_publish": True}) as conn:
        declare_all(conn, [CONNECTOR], queue_type="classic")
        publish(conn, INTENTS_EXCHANGE.name, "intent", 20, "intent")
        channel = conn.connection.channel()
        channel.basic_qos(0, 1, False)
        channel.basic_consume(INTENTS_QUEUE_NAME, callback=lambda message: None)  # a router still running
        done = reach(vhost, catalog_dir, "setup", "--migrate-queues", "--skip-broker-policy")
        assert done.returncode == 2
        assert f"{INTENTS_QUEUE_NAME} has 1 consumer(s): stop the routers and pools" in done.stderr, done.stderr
        channel.close()
    types = queue_types(vhost)
    assert types[INTENTS_QUEUE_NAME] == "classic"
    assert not [q for q in types if q.startswith(HOLDING_PREFIX)], types
    with Connection(url_of(vhost)) as conn:
        assert len(drain(conn, INTENTS_QUEUE_NAME)) == 20


def test_a_migration_stopped_halfway_is_finished_by_running_it_again(vhost: str, catalog_dir: Path) -> None:
    wanted = intents_queue("quorum")
    with Connection(url_of(vhost), transport_options={"confirm_publish": True}) as conn:
        declare_all(conn, [CONNECTOR], queue_type="classic")
        first = publish(conn, INTENTS_EXCHANGE.name, "intent", 200, "early")
        # stopped during the first move: a holding queue, bound, holds some; the old queue the rest
        holding = holding_queue(wanted)
        assert declare_queue(conn, holding) is None
        conn.default_channel.queue_unbind(INTENTS_QUEUE_NAME, INTENTS_EXCHANGE.name, "intent")
        assert move_messages(conn, INTENTS_QUEUE_NAME, holding.name, batch=50) == 200
        second = publish(conn, INTENTS_EXCHANGE.name, "intent", 30, "late")  # into the holding queue
        # ... and the connector queue was re-created and bound, its holding queue not emptied yet
        jobs = publish(conn, DISPATCH_EXCHANGE.name, connector_queue_name(CONNECTOR), 40, "job")
        job_holding = holding_queue(connector_queue(CONNECTOR, "quorum"))
        assert declare_queue(conn, job_holding) is None
        conn.default_channel.queue_unbind(
            connector_queue_name(CONNECTOR), DISPATCH_EXCHANGE.name, connector_queue_name(CONNECTOR)
        )
        assert move_messages(conn, connector_queue_name(CONNECTOR), job_holding.name) == 40
        conn.default_channel.queue_delete(connector_queue_name(CONNECTOR))
        assert declare_queue(conn, connector_queue(CONNECTOR, "quorum")) is None

    done = reach(vhost, catalog_dir, "setup", "--migrate-queues", "--skip-broker-policy")
    assert done.returncode == 0, done.stderr
    assert f"{connector_queue_name(CONNECTOR)}: finishing an interrupted migration" in done.stderr
    types = queue_types(vhost)
    assert {types[q] for q in (INTENTS_QUEUE_NAME, connector_queue_name(CONNECTOR), DLQ_NAME)} == {"quorum"}, types
    assert not [q for q in types if q.startswith(HOLDING_PREFIX)], types
    with Connection(url_of(vhost)) as conn:
        assert [m.properties["message_id"] for m in drain(conn, INTENTS_QUEUE_NAME)] == first + second
        assert [m.properties["message_id"] for m in drain(conn, connector_queue_name(CONNECTOR))] == jobs


def test_a_full_target_keeps_the_messages_it_refused_where_they_were(vhost: str) -> None:
    """Moving letters into a reach.dlq that is full: the refused ones stay in the source."""
    bounds = DeadLetterBounds(max_length=10)
    with Connection(url_of(vhost), transport_options={"confirm_publish": True}) as conn:
        assert declare_queue(conn, dead_letter_queue(bounds, "quorum")) is None
        source = Queue(f"mig-source-{RUN}", durable=True)
        source(conn.default_channel).declare()
        publish(conn, "", source.name, 30, "letter")
        with pytest.raises(MigrationError, match="refused"):
            move_messages(conn, source.name, DLQ_NAME, batch=1)  # (a quorum queue takes in a burst whole)
        kept = len(drain(conn, source.name))
        moved = len(drain(conn, DLQ_NAME))
    assert kept + moved == 30 and kept >= 19, (kept, moved)  # a quorum queue refuses once it is over its bound


def test_a_message_returned_past_the_delivery_limit_goes_to_reach_dlq_and_is_listed_without_its_params(
    vhost: str, catalog_dir: Path
) -> None:
    """The quorum queues' backstop: nothing the broker drops is lost silently, nor shown unredacted."""
    with Connection(url_of(vhost), transport_options={"confirm_publish": True}) as conn:
        declare_all(conn, [CONNECTOR])
        channel = conn.connection.channel()
        channel.basic_publish(
            amqp.Message(b'[[{"params": {"card": "4111-SECRET"}}], {}, {}]', delivery_mode=2, message_id="looping"),
            exchange=DISPATCH_EXCHANGE.name,
            routing_key=connector_queue_name(CONNECTOR),
        )
        returns = 0
        while (message := channel.basic_get(connector_queue_name(CONNECTOR), no_ack=False)) is not None:
            channel.basic_reject(message.delivery_tag, requeue=True)  # a consumer that keeps failing on it
            returns += 1
            assert returns <= DELIVERY_LIMIT + 1
        channel.close()
    assert returns == DELIVERY_LIMIT + 1  # delivered that often, then moved
    listed = reach(vhost, catalog_dir, "dlq", "list")
    assert listed.returncode == 0, listed.stderr
    (row,) = [line for line in listed.stdout.splitlines() if line.startswith("looping")]
    assert "broker: delivery_limit" in row and "not shown" in row and "SECRET" not in listed.stdout
    (letter,) = list_dead_letters(url_of(vhost))
    assert (letter.reason, letter.connector) == (
        f"broker: delivery_limit in {connector_queue_name(CONNECTOR)}",
        CONNECTOR,
    )
    assert letter.preview == "(not shown: 47 bytes as queued, params not redacted)"
