"""A value the database driver refuses before sending it is the agent's input, not the system's
health (issue 30, item 5): through a real fleet against a real PostgreSQL, intents whose params
hold a NUL get VALIDATION_FAILED receipts at once (rejected, not retryable, one attempt), the
routine is never called, the breaker stays closed, and another agent is still served."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import redis

from producers.client import ReachClient
from tests.fleet import BROKER_URL, REDIS_URL, Fleet
from tests.integration.postgres import SHOP_SCHEMA, PostgresServer, serve
from workers.state import keys

RUN = uuid.uuid4().hex[:6]
HOSTILE, BYSTANDER = f"nul_{RUN}", f"calm_{RUN}"
CONNECTOR = "shop_nul"

CATALOG = f"""
connector:
  name: {CONNECTOR}
  type: sql
  dsn_env: SHOP_DSN
  pool: {{ concurrency: 2 }}
  breaker: {{ fail_max: 2, reset_timeout: 30s }}
  retry: {{ max_attempts: 3, initial_backoff: 50ms, max_backoff: 100ms }}
  actions:
    - action: add_item
      procedure: shop.add_item
      input: {{ title: {{ type: string, required: true }} }}
      permission: write
      idempotent: false
      timeout: 5s
---
agent_app:
  name: {HOSTILE}
  connector_bindings:
    - {{ connector: {CONNECTOR}, allowed_actions: ["*"] }}
---
agent_app:
  name: {BYSTANDER}
  connector_bindings:
    - {{ connector: {CONNECTOR}, allowed_actions: ["*"] }}
"""


@pytest.fixture(scope="module")
def pg() -> Iterator[PostgresServer]:
    yield from serve(SHOP_SCHEMA, "shop")


@pytest.fixture(scope="module")
def fleet(pg: PostgresServer) -> Iterator[Fleet]:
    redis.Redis.from_url(REDIS_URL).delete(keys.breaker(CONNECTOR), keys.health(CONNECTOR))
    with Fleet(CATALOG, [CONNECTOR], env={"SHOP_DSN": pg.dsn}) as running:
        yield running


def client(agent: str) -> ReachClient:
    return ReachClient(agent, BROKER_URL, reply_to=f"{agent}.{uuid.uuid4().hex[:8]}", drop_duplicates=False)


def executions(pg: PostgresServer) -> int:
    """Calls of shop.add_item so far, committed or not (a sequence is not rolled back)."""
    return int(pg.scalar("SELECT last_value + (CASE WHEN is_called THEN 0 ELSE -1 END) FROM shop.item_calls"))


def test_nul_in_a_param_is_refused_as_the_agents_input_and_never_opens_the_breaker(
    fleet: Fleet, pg: PostgresServer
) -> None:
    before = executions(pg)
    with client(HOSTILE) as hostile:
        receipts = [hostile.call(f"{CONNECTOR}.add_item", {"title": f"a\x00b-{n}"}, timeout=30) for n in range(2)]
    for receipt in receipts:
        assert receipt.status == "rejected" and receipt.error is not None, receipt
        assert receipt.error.code == "VALIDATION_FAILED" and not receipt.error.retryable, receipt
        assert "NUL" in receipt.error.message and receipt.execution.attempts == 1, receipt
    assert executions(pg) == before  # the routine never ran
    state = redis.Redis.from_url(REDIS_URL).hget(keys.breaker(CONNECTOR), "state")
    assert state in (None, b"closed"), state
    with client(BYSTANDER) as calm:
        served = calm.call(f"{CONNECTOR}.add_item", {"title": f"plain-{RUN}"}, timeout=30)
    assert served.status == "succeeded", served
    assert executions(pg) == before + 1
