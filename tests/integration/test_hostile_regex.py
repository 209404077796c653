"""Hostile input, round three, item 1, against a running fleet: a field pattern copied from a
vendor's document no longer lets one short string stall the router, and a message that keeps
coming back undecided is answered and dead-lettered after REACH_MAX_DELIVERIES deliveries.

Before RE2, ``^([a-zA-Z0-9]+\\s?)*$`` cost the router 7.9 s of CPU on 28 characters and 130 s on
32; the router missed its heartbeats, the broker redelivered the intent, and it was decided again.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import amqp
import pytest
import redis

from producers.client import ReachClient
from tests.fleet import REDIS_URL, Fleet, agent, purge
from tests.integration.counting_system import CountingSystem
from tests.integration.hostile_gen import ReceiptTap, connection_params, cpu_seconds, peek_queue
from workers.state.redeliveries import Redeliveries

RUN = uuid.uuid4().hex[:6]
HOSTILE, BYSTANDER = f"rx_{RUN}", f"rb_{RUN}"
MAX_DELIVERIES = 3
# as vendors write them (the first is from a public OpenAPI document): each backtracks exponentially
# on Python's re when the value almost matches
PATTERNS = {
    "words": r"^([a-zA-Z0-9]+\s?)*$",
    "nested": r"^(a+)+$",
    "email": r"^([a-z0-9]+([-_.][a-z0-9]+)*)+@example\.com$",
}

CATALOG = (
    """
connector:
  name: regex_sys
  endpoint: {url}
  actions:
    - action: find
      path: GET /items
      input:
"""
    + "".join(f"        {name}: {{ type: string, pattern: '{p}' }}\n" for name, p in PATTERNS.items())
    + """      permission: read
      idempotent: true
"""
    + "".join(
        f"""---
agent_app:
  name: {name}
  connector_bindings:
    - connector: regex_sys
      allowed_actions: ["*"]
"""
        for name in (HOSTILE, BYSTANDER)
    )
)


@pytest.fixture(scope="module")
def system() -> Iterator[CountingSystem]:
    downstream = CountingSystem().start()
    yield downstream
    downstream.stop()


@pytest.fixture(scope="module")
def fleet(system: CountingSystem) -> Iterator[Fleet]:
    env = {"REACH_MAX_DELIVERIES": str(MAX_DELIVERIES)}
    with Fleet(CATALOG.replace("{url}", system.url), ["regex_sys"], env=env) as running:
        yield running


@pytest.fixture(scope="module")
def tap(fleet: Fleet) -> Iterator[ReceiptTap]:
    receipts = ReceiptTap(fleet.broker_url)
    yield receipts
    receipts.close()


def bystander_served(fleet: Fleet) -> None:
    with agent(BYSTANDER, fleet.broker_url) as client:
        receipt = client.call("regex_sys.find", {"words": "hello world"}, timeout=10)
    assert receipt.status == "succeeded", receipt


def test_catastrophic_patterns_answer_hostile_values_at_once_and_the_router_keeps_serving(
    fleet: Fleet, system: CountingSystem
) -> None:
    router = fleet.procs["router"]
    cpu_before = cpu_seconds(router.pid)
    values = {
        "words": ["a" * 28 + "!", "a" * 32 + "!", "ab " * 20_000 + "!"],
        "nested": ["a" * 40 + "b", "a" * 100_000 + "!"],
        "email": ["a" * 40 + "@example.org", "a-" * 5_000 + "!@example.com"],
    }
    sent = [(field, value) for field, vs in values.items() for value in vs]

    def send(item: tuple[str, str]) -> tuple[str, float, object]:
        field, value = item
        started = time.monotonic()
        with agent(HOSTILE, fleet.broker_url) as client:
            receipt = client.call("regex_sys.find", {field: value}, timeout=20)
        return field, time.monotonic() - started, receipt

    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(send, sent))
    for field, _seconds, receipt in answers:
        error = getattr(receipt, "error", None)
        assert error is not None and error.code.value == "VALIDATION_FAILED", receipt
        assert [d.get("field") for d in error.details] == [field], error.details
    assert system.requests() == []  # nothing refused reached the system
    bystander_served(fleet)
    assert len(system.requests()) == 1
    assert router.poll() is None, fleet.log("router")[-2000:]
    # Python's re spent minutes on the 32-character value alone; RE2 is linear in the input
    assert cpu_seconds(router.pid) - cpu_before < 20, "the router spent its CPU on patterns"


def test_a_message_redelivered_past_the_limit_is_answered_and_dead_lettered_not_decided_again(
    fleet: Fleet, tap: ReceiptTap, system: CountingSystem
) -> None:
    """The broker hands the intent back as if the routers that held it had died deciding it
    (returns counted by the quorum queue's x-delivery-count); the next router answers it."""
    fleet.kill_process("router")
    purge("reach.intents", "reach.dlq", broker_url=fleet.broker_url)
    intent_id = f"undecided-{RUN}"
    body = json.dumps({"intent_id": intent_id, "action": "regex_sys.find", "params": {"words": "fine"}})
    with ReachClient(HOSTILE, fleet.broker_url, drop_duplicates=False) as client:
        client.publish_raw(body.encode(), message_id=intent_id)
    conn = amqp.Connection(**connection_params(fleet.broker_url))
    conn.connect()
    try:
        channel = conn.channel()
        for _ in range(MAX_DELIVERIES):  # each return counts as a delivery that ended undecided
            message = None
            for _ in range(50):
                message = channel.basic_get("reach.intents", no_ack=False)
                if message is not None:
                    break
                time.sleep(0.1)
            assert message is not None, "the intent never reached reach.intents"
            channel.basic_reject(message.delivery_tag, requeue=True)
    finally:
        conn.close()
    before = len(system.requests())
    fleet.start_process("router", ["router"])
    got = tap.wait_for(intent_id, 60)
    assert len(got) == 1, got
    error = got[0].error
    assert error.get("code") == "INVALID_INTENT" and error.get("retryable") is False, got[0].doc
    assert f"delivered {MAX_DELIVERIES + 1} times without a decision" in error.get("message", ""), error
    assert len(system.requests()) == before  # not decided again, so never dispatched
    letters = [
        letter
        for letter in peek_queue(fleet.broker_url, "reach.dlq")
        if letter.properties.get("message_id") == intent_id or intent_id.encode() in letter.body
    ]
    assert letters, "the undecided intent is not in reach.dlq"
    tap.drain(1.0)
    assert len(tap.for_intent(intent_id)) == 1  # exactly one receipt
    bystander_served(fleet)


def test_redeliveries_are_counted_per_sender_and_message_across_routers() -> None:
    client = redis.Redis.from_url(REDIS_URL)
    counter = Redeliveries(client, ttl_seconds=60)
    body = f'{{"action": "x", "n": "{uuid.uuid4().hex}"}}'.encode()
    assert [counter.count(body, "m1", HOSTILE) for _ in range(3)] == [2, 3, 4]
    # the same bytes from another sender, or with another message id, are another message
    assert counter.count(body, "m1", BYSTANDER) == 2
    assert counter.count(body, "m2", HOSTILE) == 2
    # a user_id that is no agent name (could break the key's namespace) files under no agent
    assert counter.count(body, "m1", "{evil}:x") == 2
