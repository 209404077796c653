"""A parked intent survives a Redis crash when Redis persists (AOF): the fleet runs on a Redis of
this test's own (tests/integration/redis_topologies.py ``LocalRedis``: ``appendonly yes``,
``appendfsync always``), an intent is parked, Redis is killed with kill -9 (no SHUTDOWN, no last
save: only what the append-only file holds comes back), stays down a few seconds while the fleet
runs on, and is started again from the same directory. The approval is still pending, is approved
through ``reach approvals approve``, and the parked payload runs once with one receipt.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
import redis
from click.testing import CliRunner

from producers.client import ReachClient
from tests.fleet import Fleet
from tests.integration.counting_system import CountingSystem
from tests.integration.redis_topologies import LocalRedis, gather
from tests.integration.test_approvals import no_receipt, parked
from workers.cli import main as reach_cli
from workers.ops import approval_decisions as approvals

AGENT = "persisted_bot"
CONNECTOR = "persisted_shop"
DOWN_SECONDS = 3.0  # long enough for the routers' sweep (every second) and the pools to hit the outage


def catalog(url: str) -> str:
    return f"""
connector:
  name: {CONNECTOR}
  endpoint: {url}
  idempotency_header: Idempotency-Key
  actions:
    - action: refund
      description: Refund an order
      path: POST /items
      permission: write
      input:
        title: {{ type: string, required: true }}
        amount: {{ type: number, required: true }}
      approval: {{ when: "amount > 500", approvers: [finance], expires: 10m }}
---
approvers:
  finance: [alice]
---
agent_app:
  name: {AGENT}
  connector_bindings:
    - connector: {CONNECTOR}
      allowed_actions: ["*"]
"""


@pytest.fixture
def server() -> Iterator[LocalRedis]:
    with LocalRedis() as running:
        yield running


@pytest.fixture
def system() -> Iterator[CountingSystem]:
    running = CountingSystem().start()
    yield running
    running.stop()


@pytest.fixture
def fleet(server: LocalRedis, system: CountingSystem) -> Iterator[Fleet]:
    with Fleet(catalog(system.url), [CONNECTOR], redis_url=server.url) as running:
        yield running


def test_a_parked_intent_survives_a_redis_crash_with_persistence_on(
    server: LocalRedis, system: CountingSystem, fleet: Fleet
) -> None:
    with ReachClient(
        AGENT, fleet.broker_url, reply_to=f"{AGENT}.{uuid.uuid4().hex[:8]}", drop_duplicates=False
    ) as client:
        intent = client.publish("refund", {"title": "big-persisted", "amount": 900})
        notice = parked(client, intent)

        server.kill()  # kill -9: appendfsync always had every write on disk before Redis answered it
        time.sleep(DOWN_SECONDS)
        fleet.check_alive()
        server.start()  # same port, same directory: the append-only file is read back
        fleet.check_alive()

        store = redis.Redis.from_url(server.url)
        kept = approvals.get_approval(store, notice.approval_id)
        assert kept is not None and (kept.state, kept.intent_id) == ("pending", intent), kept
        no_receipt(client, intent)
        assert system.requests(title="big-persisted") == []

        env = {"REACH_REDIS_URL": server.url, "REACH_BROKER_URL": fleet.broker_url}
        done = CliRunner().invoke(
            reach_cli,
            ["approvals", "approve", notice.approval_id, "--as", "alice", "--hash", kept.payload_hash],
            env=env,
        )
        assert done.exit_code == 0 and done.stdout.startswith("approved:"), done.output

        receipts = [r for r in gather(client, {intent}, timeout=30, grace=2.0) if r.intent_id == intent]
        assert len(receipts) == 1 and receipts[0].success, receipts
        assert [c["body"] for c in system.requests(title="big-persisted")] == [
            {"title": "big-persisted", "amount": 900}
        ]
        assert system.executions()["big-persisted"] == 1

        # the router came through the outage too: it routes (and parks) as before
        small = client.publish("refund", {"title": "small-after", "amount": 10})
        assert client.wait(small, timeout=20).success
        again = client.publish("refund", {"title": "big-after", "amount": 1000})
        assert parked(client, again).intent_id == again
        fleet.check_alive()
