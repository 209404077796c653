"""A value budget and an intent id used again after the pools forgot its outcome, in a real fleet.

Within REACH_IDEMPOTENCY_TTL a repeated intent is answered from the pool's ledger and counted once.
Past it the pool would run it again; were the repeat still taken as "counted already", an agent
could spend its budget again and again by resending an old intent a day later. The fleet here keeps
outcomes and receipts for 2 s so the test can wait that out.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest

from producers.wire import ErrorCode
from tests.fleet import Fleet, agent
from tests.integration.counting_system import CountingSystem

CATALOG = """\
connector:
  name: shop
  endpoint: {url}
  retry: {{max_attempts: 1}}
  actions:
    - action: pay
      path: POST /items
      permission: write
      input:
        title: {{ type: string, required: true }}
        amount: {{ type: integer, required: true }}
---
agent_app:
  name: resender
  connector_bindings:
    - connector: shop
      allowed_actions: [pay]
      budget: {{param: amount, max: 150, per: 7d}}
"""


@pytest.fixture(scope="module")
def system() -> Iterator[CountingSystem]:
    downstream = CountingSystem().start()
    yield downstream
    downstream.stop()


@pytest.fixture(scope="module")
def fleet(system: CountingSystem) -> Iterator[Fleet]:
    with Fleet(
        CATALOG.format(url=system.url), pools=["shop"], env={"REACH_IDEMPOTENCY_TTL": "2s", "REACH_RECEIPT_TTL": "2s"}
    ) as running:
        yield running


def test_an_old_intent_sent_again_after_its_outcome_is_forgotten_is_refused_not_run_uncounted(
    fleet: Fleet, system: CountingSystem
) -> None:
    title = f"resent-{uuid.uuid4().hex[:8]}"
    intent_id = uuid.uuid4().hex
    with agent("resender") as client:
        first = client.wait(client.publish("shop.pay", {"title": title, "amount": 100}, intent_id=intent_id), 30)
        assert first.status == "succeeded", first
        time.sleep(2.5)  # the fleet forgets the outcome and the receipt; the 7-day window still holds the 100
        late = client.wait(client.publish("shop.pay", {"title": title, "amount": 100}, intent_id=intent_id), 30)
    assert late.status == "rejected" and late.error is not None, late
    assert late.error.code is ErrorCode.INVALID_INTENT and "new intent_id" in (late.error.suggestion or "")
    assert system.executions()[title] == 1
