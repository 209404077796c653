"""`reach setup` on a fresh broker declares the workflow runner's queues (issue 32): reach.workflows
(runs the router starts) and reach.workflows.receipts (its steps' receipts), quorum queues unless
REACH_QUEUE_TYPE=classic, bound as the router and the runner use them, so a run started before any
runner is up waits in its queue instead of being dropped; and classic ones are migrated with the rest.

Each test runs on the shared broker, in a vhost of its own that nothing else has declared into.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

import pytest
from kombu import Connection

from tests.fleet import REDIS_URL, SHARED_BROKER_URL
from workers.transport.topology import (
    DISPATCH_EXCHANGE,
    RECEIPTS_EXCHANGE,
    WORKFLOW_RECEIPTS_QUEUE_NAME,
    WORKFLOW_REPLY_KEY,
    WORKFLOWS_QUEUE_NAME,
    declare_queue,
    workflow_receipts_queue,
    workflows_queue,
)

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
RUN = uuid.uuid4().hex[:6]


def rabbitmqctl(*args: str) -> str:
    return subprocess.run(["rabbitmqctl", *args], check=True, capture_output=True, text=True, timeout=60).stdout


@pytest.fixture
def vhost() -> Iterator[str]:
    name = f"reach-setup-wf-{RUN}-{uuid.uuid4().hex[:4]}"
    rabbitmqctl("add_vhost", name)
    try:
        rabbitmqctl("set_permissions", "-p", name, urlsplit(SHARED_BROKER_URL).username or "guest", ".*", ".*", ".*")
        yield name
    finally:
        subprocess.run(["rabbitmqctl", "delete_vhost", name], capture_output=True, timeout=60)


def url_of(vhost: str) -> str:
    return urlunsplit(urlsplit(SHARED_BROKER_URL)._replace(path="/" + quote(vhost, safe="")))


def setup(vhost: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`reach setup` as an operator runs it against ``vhost``, without a catalog."""
    return subprocess.run(
        [sys.executable, "-m", "workers.cli", "setup", "--skip-broker-policy", *args],
        env={
            **{k: v for k, v in os.environ.items() if not k.startswith("REACH_")},
            "REACH_BROKER_URL": url_of(vhost),
            "REACH_REDIS_URL": REDIS_URL,
            "REACH_CATALOG": str(REPO / "no-such-catalog"),
            **env,
        },
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
    )


def queues(vhost: str) -> dict[str, dict[str, object]]:
    listed = json.loads(rabbitmqctl("list_queues", "-p", vhost, "name", "type", "--formatter", "json"))
    return {str(q["name"]): q for q in listed}


def ready(vhost: str, queue: str) -> int:
    """Messages ready in ``queue``, as the broker counts them now (rabbitmqctl's count lags)."""
    with Connection(url_of(vhost)) as conn:
        channel = conn.channel()
        try:
            return int(channel.queue_declare(queue, passive=True).message_count)
        finally:
            channel.close()


def bindings(vhost: str) -> set[tuple[str, str, str]]:
    listed = json.loads(
        rabbitmqctl(
            "list_bindings", "-p", vhost, "source_name", "destination_name", "routing_key", "--formatter", "json"
        )
    )
    return {(str(b["source_name"]), str(b["destination_name"]), str(b["routing_key"])) for b in listed}


def test_setup_on_a_fresh_broker_declares_the_runners_queues_as_quorum_queues_before_any_runner(vhost: str) -> None:
    assert WORKFLOWS_QUEUE_NAME not in queues(vhost)
    done = setup(vhost)
    assert done.returncode == 0, done.stderr + done.stdout
    assert WORKFLOWS_QUEUE_NAME in done.stdout and WORKFLOW_RECEIPTS_QUEUE_NAME in done.stdout, done.stdout
    found = queues(vhost)
    assert found[WORKFLOWS_QUEUE_NAME]["type"] == "quorum"
    assert found[WORKFLOW_RECEIPTS_QUEUE_NAME]["type"] == "quorum"
    assert {
        (DISPATCH_EXCHANGE.name, WORKFLOWS_QUEUE_NAME, WORKFLOWS_QUEUE_NAME),
        (RECEIPTS_EXCHANGE.name, WORKFLOW_RECEIPTS_QUEUE_NAME, WORKFLOW_REPLY_KEY),
    } <= bindings(vhost)
    # exactly as the runner declares them when it starts: it will consume them as they are
    with Connection(url_of(vhost)) as conn:
        assert declare_queue(conn, workflows_queue("quorum")) is None
        assert declare_queue(conn, workflow_receipts_queue("quorum")) is None
        # a run's start published now (no runner yet) waits in reach.workflows, confirmed
        with Connection(url_of(vhost), transport_options={"confirm_publish": True}) as publisher:
            producer = publisher.Producer()
            producer.publish(b"{}", exchange=DISPATCH_EXCHANGE.name, routing_key=WORKFLOWS_QUEUE_NAME, mandatory=True)
            producer.publish(b"{}", exchange=RECEIPTS_EXCHANGE.name, routing_key=WORKFLOW_REPLY_KEY, mandatory=True)
    assert ready(vhost, WORKFLOWS_QUEUE_NAME) == 1
    assert ready(vhost, WORKFLOW_RECEIPTS_QUEUE_NAME) == 1
    # idempotent
    again = setup(vhost)
    assert again.returncode == 0, again.stderr
    assert ready(vhost, WORKFLOWS_QUEUE_NAME) == 1


def test_a_classic_fleet_gets_classic_runner_queues_and_a_migration_makes_them_quorum_with_messages_kept(
    vhost: str,
) -> None:
    assert setup(vhost, REACH_QUEUE_TYPE="classic").returncode == 0
    assert {queues(vhost)[q]["type"] for q in (WORKFLOWS_QUEUE_NAME, WORKFLOW_RECEIPTS_QUEUE_NAME)} == {"classic"}
    with Connection(url_of(vhost), transport_options={"confirm_publish": True}) as conn:
        conn.Producer().publish(b"{}", exchange=DISPATCH_EXCHANGE.name, routing_key=WORKFLOWS_QUEUE_NAME)
    # quorum now: refused, naming the runner's queues, until they are migrated
    refused = setup(vhost)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert f"{WORKFLOWS_QUEUE_NAME}: it is a classic queue" in refused.stderr, refused.stderr
    assert f"{WORKFLOW_RECEIPTS_QUEUE_NAME}: it is a classic queue" in refused.stderr
    migrated = setup(vhost, "--migrate-queues")
    assert migrated.returncode == 0, migrated.stderr + migrated.stdout
    assert f"migrated {WORKFLOWS_QUEUE_NAME} (quorum): 1 message(s) kept" in migrated.stdout, migrated.stdout
    found = queues(vhost)
    assert {found[q]["type"] for q in (WORKFLOWS_QUEUE_NAME, WORKFLOW_RECEIPTS_QUEUE_NAME)} == {"quorum"}
    assert ready(vhost, WORKFLOWS_QUEUE_NAME) == 1
    assert (RECEIPTS_EXCHANGE.name, WORKFLOW_RECEIPTS_QUEUE_NAME, WORKFLOW_REPLY_KEY) in bindings(vhost)
