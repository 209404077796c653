"""Answers that must tell the truth, through a real fleet (issue 30, round three):

- a budget amount that would count nothing (0, -0.0, 5e-324, a vanishing share of the budget) is
  refused as VALIDATION_FAILED, also when the window is full, and never reaches the system;
- DOWNSTREAM_CONTRACT_VIOLATION advises per action kind: a write may have taken effect, a read
  changed nothing.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest

from producers.client import ReachClient
from producers.wire import ErrorCode, Receipt
from tests.fleet import Fleet, agent
from tests.integration.counting_system import CountingSystem

RUN = uuid.uuid4().hex[:6]
SPENDER = f"thin_{RUN}"

CATALOG = """\
connector:
  name: till
  endpoint: {url}
  retry: {{max_attempts: 1}}
  actions:
    - action: pay
      path: POST /items
      permission: write
      input:
        title: {{ type: string, required: true }}
        amount: {{ type: number, required: true }}
    - action: create_owned
      path: POST /items
      permission: write
      input:
        title: {{ type: string, required: true }}
      output:
        owner: {{ type: string }}
    - action: peek_owned
      path: GET /items/{{tid}}
      permission: read
      input:
        tid: {{ type: string, required: true }}
      output:
        owner: {{ type: string }}
---
agent_app:
  name: {spender}
  connector_bindings:
    - connector: till
      allowed_actions: ["*"]
      budget: {{param: amount, max: 50, per: 1d}}
"""


@pytest.fixture(scope="module")
def system() -> Iterator[CountingSystem]:
    downstream = CountingSystem().start()
    yield downstream
    downstream.stop()


@pytest.fixture(scope="module")
def fleet(system: CountingSystem) -> Iterator[Fleet]:
    with Fleet(CATALOG.format(url=system.url, spender=SPENDER), pools=["till"]) as running:
        yield running


def calls(system: CountingSystem) -> int:
    return sum(system.executions().values())


def pay(client: ReachClient, amount: float) -> Receipt:
    return client.call("till.pay", {"title": f"pay-{uuid.uuid4().hex[:8]}", "amount": amount}, timeout=30)


def test_amounts_that_count_nothing_are_refused_also_when_the_window_is_full(
    fleet: Fleet, system: CountingSystem
) -> None:
    with agent(SPENDER) as client:
        assert pay(client, 50).status == "succeeded"  # the window is full
        before = calls(system)
        for amount in (0, -0.0, 5e-324, 2.2250738585072014e-308, 1e-12):
            refused = pay(client, amount)
            assert refused.status == "rejected" and refused.error is not None, (amount, refused)
            assert refused.error.code is ErrorCode.VALIDATION_FAILED and not refused.error.retryable, amount
            assert refused.error.details[0]["field"] == "amount" and refused.error.details[0]["code"] == "min"
        # the same on the wire as JSON text: -0.0 and a subnormal literal
        for raw in ("-0.0", "5e-324", "0e0"):
            intent_id = f"raw-{uuid.uuid4().hex[:8]}"
            body = {"intent_id": intent_id, "action": "till.pay", "params": {"title": "raw-x"}}
            text = json.dumps(body).replace('"raw-x"}', f'"raw-x", "amount": {raw}}}')
            client.publish_raw(text.encode(), message_id=intent_id)
            receipt = client.wait(intent_id, timeout=30)
            assert receipt.error is not None and receipt.error.code is ErrorCode.VALIDATION_FAILED, (raw, receipt)
        over = pay(client, 1)
        assert over.error is not None and over.error.code is ErrorCode.BUDGET_EXCEEDED
    assert calls(system) == before  # nothing past the full window reached the system


def test_a_broken_answer_to_a_read_says_nothing_changed_and_to_a_write_that_it_may_have(
    fleet: Fleet, system: CountingSystem
) -> None:
    with agent(SPENDER) as client:
        read = client.call("till.peek_owned", {"tid": "IT-1"}, timeout=30)
        write = client.call("till.create_owned", {"title": f"owned-{RUN}"}, timeout=30)
    for receipt in (read, write):
        assert receipt.error is not None and receipt.error.code is ErrorCode.DOWNSTREAM_CONTRACT_VIOLATION, receipt
    assert read.error is not None and write.error is not None
    assert "may have taken effect" not in read.error.suggestion
    assert read.error.suggestion.startswith("Nothing was changed"), read.error.suggestion
    assert "may have taken effect" in write.error.suggestion
