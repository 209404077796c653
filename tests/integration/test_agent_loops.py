"""Several agent-to-agent loops at once between the same two agents (issue 30): without a bound they
take every handler thread of both agents, every call times out and the breakers open for everyone.
Through a real fleet, the loop guard lets one chain loop between a pair at a time (it runs to the
hop limit on the agents' default four threads each); the others are refused at once, before they
take a thread, the breakers stay closed and another agent is still served."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import redis

from connectors.adapters.agent import MAX_AGENT_HOPS
from producers.serve import AgentServer, Request
from producers.wire import Receipt
from tests.fleet import BROKER_URL, REDIS_URL, Fleet, agent
from workers.state import keys

RUN = uuid.uuid4().hex[:6]
A, B, BYSTANDER = f"ring_a_{RUN}", f"ring_b_{RUN}", f"by_{RUN}"
LOOPS = 3

CATALOG = f"""
connector:
  name: to_a
  type: agent
  agent: {A}
  retry: {{max_attempts: 1}}
  breaker: {{fail_max: 3, reset_timeout: 30s}}
  actions:
    - {{action: relay, permission: write, timeout: 8s, input: {{n: {{type: integer, required: true}}}}}}
---
connector:
  name: to_b
  type: agent
  agent: {B}
  retry: {{max_attempts: 1}}
  breaker: {{fail_max: 3, reset_timeout: 30s}}
  actions:
    - {{action: relay, permission: write, timeout: 8s, input: {{n: {{type: integer, required: true}}}}}}
    - {{action: echo, timeout: 8s, input: {{text: {{type: string, required: true}}}}}}
---
agent_app:
  name: {A}
  connector_bindings:
    - {{connector: to_b, allowed_actions: [relay]}}
---
agent_app:
  name: {B}
  connector_bindings:
    - {{connector: to_a, allowed_actions: [relay]}}
---
agent_app:
  name: {BYSTANDER}
  connector_bindings:
    - {{connector: to_b, allowed_actions: [echo]}}
"""


@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    redis.Redis.from_url(REDIS_URL).delete(keys.breaker("to_a"), keys.breaker("to_b"))
    with Fleet(CATALOG, ["to_a", "to_b"]) as running:
        yield running


def relay_to(other: str) -> Callable[[dict[str, Any], Request], Any]:
    def relay(params: dict[str, Any], request: Request) -> dict[str, Any]:
        inner = request.call(f"{other}.relay", {"n": params["n"] + 1})
        why = inner.error.details[0]["code"] if inner.error is not None and inner.error.details else None
        code = inner.error.code.value if inner.error is not None else None
        return {"hops": request.hops, "status": inner.status, "code": code, "why": why, "inner": inner.data}

    return relay


def chain(receipt: Receipt) -> list[tuple[int, str, str | None, str | None]]:
    level, levels = receipt.data, []
    while level is not None:
        levels.append((level["hops"], level["status"], level["code"], level["why"]))
        level = level["inner"]
    return levels


def test_three_loops_at_once_leave_both_agents_serving_and_the_breakers_closed(fleet: Fleet) -> None:
    def start(n: int) -> Receipt:
        with agent(A) as starter:  # a client per thread
            return starter.call("to_b.relay", {"n": n}, timeout=90)

    # AgentServer's default concurrency (4 threads) holds one chain to the hop limit, not three
    with (
        AgentServer(A, BROKER_URL, {"relay": relay_to("to_b")}),
        AgentServer(B, BROKER_URL, {"relay": relay_to("to_a"), "echo": lambda p, r: {"text": p["text"]}}),
        ThreadPoolExecutor(LOOPS) as pool,
    ):
        receipts = list(pool.map(start, range(LOOPS)))
        with agent(BYSTANDER) as calm:
            served = calm.call("to_b.echo", {"text": "still here"}, timeout=30)
    assert all(r.status == "succeeded" for r in receipts), receipts
    chains = sorted((chain(r) for r in receipts), key=len)
    deep, refused = chains[-1], chains[:-1]
    assert [h for h, *_ in deep] == list(range(1, MAX_AGENT_HOPS + 1)), deep  # one chain ran to the hop limit
    assert deep[-1][1:] == ("failed", "DOWNSTREAM_VALIDATION_FAILED", "max")
    for levels in refused:  # the others were refused when they first looped back
        assert levels == [(1, "failed", "DOWNSTREAM_VALIDATION_FAILED", "agent_loops")], levels
    client = redis.Redis.from_url(REDIS_URL)
    for name in ("to_a", "to_b"):
        assert client.hget(keys.breaker(name), "state") in (None, b"closed"), name
    assert served.status == "succeeded" and served.data == {"text": "still here"}, served
