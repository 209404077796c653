"""Identity where only the broker's word counts (``REACH_REQUIRE_USER_ID=1``), against a live
fleet: a replayed router dead letter keeps the identity the broker vouched for, a replay the router
would refuse is reported as such, only the fleet's own login may publish for an agent, and an
intent refused because its agent's approvals are full is answered like every routed answer.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import amqp
import pytest
from kombu import Connection

from producers.client import ApprovalPending, ReachClient
from tests.fleet import REPO, Fleet
from tests.integration.counting_system import CountingSystem
from tests.waiting import wait_for
from workers.ops.agents import create_agent_user, delete_agent_user, vhost_of
from workers.ops.fleet import list_dead_letters
from workers.router.intake import ON_BEHALF_OF_HEADER

RUN = uuid.uuid4().hex[:6]
AGENT = f"strict_{RUN}"
OTHER = f"other_{RUN}"
SMALL = f"{AGENT}.small"
FILLER = b"filler: the agent has not read it yet"

CATALOG = """
connector:
  name: strict_{region}
  endpoint: {url}
  domain: {region}
  actions:
    - action: refund
      description: Refund an order
      path: POST /items
      permission: write
      input:
        title: {{ type: string, required: true }}
      approval: {{ required: true, approvers: [finance] }}
"""
APPROVERS = """
---
approvers:
  finance: [alice]
"""
AGENTS = """
---
agent_app:
  name: {agent}
  connector_bindings:
    - connector: strict_eu
      allowed_actions: ["*"]
    - connector: strict_us
      allowed_actions: ["*"]
"""


@pytest.fixture(scope="module")
def downstream() -> Iterator[CountingSystem]:
    system = CountingSystem().start()
    yield system
    system.stop()


@pytest.fixture(scope="module")
def fleet(downstream: CountingSystem) -> Iterator[Fleet]:
    text = "---".join(CATALOG.format(region=r, url=downstream.url) for r in ("eu", "us"))
    text += APPROVERS + "".join(AGENTS.format(agent=a) for a in (AGENT, OTHER))
    env = {"REACH_REQUIRE_USER_ID": "1", "REACH_MAX_PENDING_APPROVALS": "1"}
    with Fleet(text, [], env=env) as running:
        yield running


@pytest.fixture(scope="module")
def urls(fleet: Fleet) -> Iterator[dict[str, str]]:
    """Broker URLs of the two agents' own RabbitMQ users (least privilege, on the fleet's vhost)."""
    vhost, made = vhost_of(fleet.broker_url), {}
    parts = urlsplit(fleet.broker_url)
    try:
        for name in (AGENT, OTHER):
            password = secrets.token_urlsafe(18)
            create_agent_user(name, password, vhost)
            netloc = f"{name}:{quote(password, safe='')}@{parts.hostname}:{parts.port or 5672}"
            made[name] = urlunsplit((parts.scheme, netloc, "/" + quote(vhost, safe=""), "", ""))
        yield made
    finally:
        for name in made:
            delete_agent_user(name, vhost)


def reach(fleet: Fleet, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "workers.cli", *args],
        env=fleet.env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=90,
    )


def letters_of(fleet: Fleet, intent_id: str) -> list[Any]:
    return [letter for letter in list_dead_letters(fleet.broker_url, 1000) if letter.message_id == intent_id]


def body_of(message: Any) -> bytes:
    body = message.body
    return body.encode() if isinstance(body, str) else bytes(body)


def test_a_replayed_router_letter_keeps_the_identity_the_broker_vouched_for(fleet: Fleet, urls: dict[str, str]) -> None:
    """The agent's receipt queue refused the answer (full, reject-publish) on every try, so the
    router dead-lettered the intent; once the agent has room, the replay is answered to it."""
    intent_id = f"{RUN}-vouched"
    with Connection(fleet.broker_url, transport_options={"confirm_publish": True}) as admin:
        channel = admin.default_channel
        queue = f"receipts-{AGENT}"
        channel.queue_declare(queue, arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
        channel.queue_bind(queue, "reach.receipts", SMALL)
        channel.basic_publish(amqp.Message(FILLER), exchange="", routing_key=queue)
        with ReachClient(AGENT, urls[AGENT], user_id=AGENT) as agent:
            intent = {"intent_id": intent_id, "action": "reach.list_tools", "params": {}, "reply_to": SMALL}
            agent.publish_raw(json.dumps(intent).encode(), headers={}, message_id=intent_id)
        letter = wait_for(lambda: letters_of(fleet, intent_id), 30, "the router did not dead-letter it")[0]
        assert letter.agent == AGENT and "refused the receipt" in letter.reason
        assert body_of(channel.basic_get(queue, no_ack=True)) == FILLER  # the agent has room again

        done = reach(fleet, "dlq", "replay", "--id", intent_id)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "replayed 1 dead letter" in done.stdout
        message = wait_for(lambda: channel.basic_get(queue, no_ack=True), 20, "the replay was not answered")
        receipt = json.loads(body_of(message))
        channel.queue_delete(queue)
    assert receipt["intent_id"] == intent_id and receipt["agent_id"] == AGENT, receipt
    assert receipt["status"] == "succeeded" and receipt["data"]["tools"], receipt
    assert letters_of(fleet, intent_id) == []  # not refused and dead-lettered again


def test_a_replay_the_router_would_refuse_is_reported_and_kept(fleet: Fleet) -> None:
    """An intent nobody vouched for (no user_id) was refused and dead-lettered: replaying it cannot
    make it acceptable, so the CLI says so, exits 1, and the letter stays."""
    intent_id = f"{RUN}-unvouched"
    with ReachClient(AGENT, fleet.broker_url) as claimed:
        intent = {"intent_id": intent_id, "action": "reach.list_tools", "params": {}}
        claimed.publish_raw(json.dumps(intent).encode(), headers={"agent_id": AGENT}, message_id=intent_id)
    wait_for(lambda: letters_of(fleet, intent_id), 20, "the refused intent was not dead-lettered")
    done = reach(fleet, "dlq", "replay", "--id", intent_id)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "replayed 0 dead letter" in done.stdout and "REACH_REQUIRE_USER_ID=1" in done.stdout, done.stdout
    assert len(letters_of(fleet, intent_id)) == 1


def test_only_the_fleets_login_may_publish_for_another_agent(fleet: Fleet, urls: dict[str, str]) -> None:
    intent_id = f"{RUN}-forged"
    with ReachClient(OTHER, urls[OTHER], user_id=OTHER) as other:
        with ReachClient(AGENT, urls[AGENT], user_id=AGENT) as victim:
            intent = {"intent_id": intent_id, "action": "reach.list_tools", "params": {}}
            other.publish_raw(json.dumps(intent).encode(), headers={ON_BEHALF_OF_HEADER: AGENT}, message_id=intent_id)
            receipt = other.wait(intent_id, timeout=20)
            assert list(victim.receipts(timeout=1.0)) == []
    assert receipt.agent_id == OTHER and receipt.error is not None
    assert receipt.error.code == "PERMISSION_DENIED" and ON_BEHALF_OF_HEADER in receipt.error.message


def test_an_intent_refused_for_full_approvals_is_answered_with_its_routing(fleet: Fleet, urls: dict[str, str]) -> None:
    """REACH_MAX_PENDING_APPROVALS=1: the second refund waits for nobody and is answered
    RATE_LIMITED, carrying the routing decision like every answer to a routed intent."""
    with ReachClient(AGENT, urls[AGENT], user_id=AGENT, reply_to=f"{AGENT}.{RUN}") as agent:
        first = agent.publish("refund", {"title": "first"}, context={"domain": "eu"})
        with pytest.raises(ApprovalPending):
            agent.wait(first, timeout=20)
        second = agent.publish("refund", {"title": "second"}, context={"domain": "us"})
        receipt = agent.wait(second, timeout=20)
    assert receipt.error is not None and receipt.error.code == "RATE_LIMITED", receipt
    assert receipt.connector == "strict_us"
    assert receipt.execution.routing is not None, receipt.execution
