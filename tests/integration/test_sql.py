"""The sql connector through a real fleet (router + pools on RabbitMQ and Redis) against a real
PostgreSQL: receipts for success and for a routine's own error, retries only where they are safe
(counted in the database), the idempotency ledger, the breaker, and kill -9 of a pool with writes
in flight — every intent one receipt, no effect twice (rows per title), unknowns said as such."""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from collections.abc import Iterator

import pytest
import redis

from producers.client import ReachClient
from producers.wire import Receipt
from tests.fleet import BROKER_URL, REDIS_URL, Fleet, purge
from tests.integration.faultproxy import FaultProxy
from tests.integration.postgres import SHOP_SCHEMA, PostgresServer, serve
from tests.integration.test_crash_safety import gather, start_pool
from tests.waiting import wait_for
from workers.state import keys
from workers.transport.topology import connector_queue

RUN = uuid.uuid4().hex[:6]
AGENT = f"sql_{RUN}"
CRASH_THREADS = 6
CRASH_WRITES = 48


def action(name: str, routine: str, inputs: str, *, write: bool, idempotent: bool | None = None) -> str:
    """One action's YAML; ``routine`` is ``procedure: ...`` or ``function: ...``."""
    lines = [
        f"    - action: {name}",
        f"      {routine}",
        f"      input: {{ {inputs} }}",
        f"      permission: {'write' if write else 'read'}",
        "      timeout: 5s",
    ]
    if idempotent is not None:
        lines.append(f"      idempotent: {str(idempotent).lower()}")
    return "\n".join(lines) + "\n"


TITLE = "title: { type: string, required: true }"
ORDER = "customer: { type: string, required: true }, amount: { type: number, required: true }, " + TITLE
CATALOG = (
    """
connector:
  name: shop_sql
  type: sql
  dsn_env: SHOP_DSN
  pool: { concurrency: 4 }
  retry: { max_attempts: 3, initial_backoff: 50ms, max_backoff: 200ms }
  actions:
"""
    + action("place_order", "procedure: shop.place_order", ORDER, write=True, idempotent=False)
    + action("order_total", "function: shop.order_total", "customer: { type: string, required: true }", write=False)
    + action("add_item", "procedure: shop.add_item", TITLE, write=True, idempotent=False)
    + action("add_item_flaky", "procedure: shop.add_item_flaky", TITLE, write=True, idempotent=False)
    + """---
connector:
  name: shop_flaky
  type: sql
  dsn_env: SHOP_PROXY_DSN
  pool: { concurrency: 2 }
  breaker: { fail_max: 2, reset_timeout: 30s }
  retry: { max_attempts: 3, initial_backoff: 50ms, max_backoff: 200ms }
  actions:
"""
    + action("add_item", "procedure: shop.add_item", TITLE, write=True, idempotent=False)
    + action("add_item_safely", "procedure: shop.add_item", TITLE, write=True, idempotent=True)
    + f"""---
connector:
  name: shop_crash
  type: sql
  dsn_env: SHOP_DSN
  pool: {{ concurrency: {CRASH_THREADS} }}
  actions:
"""
    + action("add_item_slowly", "procedure: shop.add_item_slowly", TITLE, write=True, idempotent=False)
    + f"""---
agent_app:
  name: {AGENT}
  connector_bindings:
    - connector: shop_sql
      allowed_actions: ["*"]
    - connector: shop_flaky
      allowed_actions: ["*"]
    - connector: shop_crash
      allowed_actions: ["*"]
"""
)
CONNECTORS = ("shop_sql", "shop_flaky", "shop_crash")


@pytest.fixture(scope="module")
def pg() -> Iterator[PostgresServer]:
    yield from serve(SHOP_SCHEMA, "shop")


@pytest.fixture(scope="module")
def proxy(pg: PostgresServer) -> Iterator[FaultProxy]:
    running = FaultProxy(pg.port).start()
    yield running
    running.stop()


@pytest.fixture(scope="module")
def fleet(pg: PostgresServer, proxy: FaultProxy) -> Iterator[Fleet]:
    client = redis.Redis.from_url(REDIS_URL)
    for name in CONNECTORS:  # an earlier run's breaker or health marks in this Redis database
        client.delete(keys.breaker(name), keys.health(name), keys.paused(name))
    env = {"SHOP_DSN": pg.dsn, "SHOP_PROXY_DSN": pg.url(port=proxy.port)}
    with Fleet(CATALOG, list(CONNECTORS), env=env) as running:
        yield running


@pytest.fixture
def reach(fleet: Fleet) -> Iterator[ReachClient]:
    with ReachClient(AGENT, BROKER_URL, reply_to=f"{AGENT}.{uuid.uuid4().hex[:8]}", drop_duplicates=False) as client:
        yield client


def rows(pg: PostgresServer, title: str) -> int:
    return int(pg.scalar("SELECT count(*) FROM shop.items WHERE title = %s", (title,)))


def executions(pg: PostgresServer) -> int:
    """Calls of shop.add_item so far, committed or not (a sequence is not rolled back)."""
    return int(pg.scalar("SELECT last_value + (CASE WHEN is_called THEN 0 ELSE -1 END) FROM shop.item_calls"))


def test_a_procedure_call_gets_a_succeeded_receipt_with_its_inout_values(
    reach: ReachClient, pg: PostgresServer
) -> None:
    placed = reach.call("shop_sql.place_order", {"customer": f"ada-{RUN}", "amount": 12.5, "title": f"{RUN}-order"})
    assert placed.status == "succeeded" and placed.execution.attempts == 1, placed
    order_id = placed.data["order_id"]
    assert pg.scalar("SELECT title FROM shop.orders WHERE id = %s", (order_id,)) == f"{RUN}-order"
    total = reach.call("shop_sql.order_total", {"customer": f"ada-{RUN}"})
    assert total.status == "succeeded" and total.data == {"result": 12.5}, total


def test_a_routines_raise_exception_is_a_failed_receipt_with_its_message(
    reach: ReachClient, pg: PostgresServer
) -> None:
    receipt = reach.call("shop_sql.place_order", {"customer": "ada", "amount": -3, "title": f"{RUN}-negative"})
    assert receipt.status == "failed" and receipt.error is not None, receipt
    assert receipt.error.code == "DOWNSTREAM_VALIDATION_FAILED" and receipt.error.retryable is False
    assert receipt.error.message == "amount must be positive, got -3"
    assert receipt.error.suggestion == "Send an amount greater than 0."
    assert receipt.execution.attempts == 1
    assert pg.scalar("SELECT count(*) FROM shop.orders WHERE title = %s", (f"{RUN}-negative",)) == 0


def test_a_rolled_back_serialization_failure_is_retried_even_for_a_non_idempotent_write(
    reach: ReachClient, pg: PostgresServer
) -> None:
    pg.run_sql("SELECT setval('shop.flaky_calls', 2)")  # the next call fails, the one after succeeds
    before = executions(pg)
    receipt = reach.call("shop_sql.add_item_flaky", {"title": f"{RUN}-flaky"})
    assert receipt.status == "succeeded" and receipt.execution.attempts == 2, receipt
    assert rows(pg, f"{RUN}-flaky") == 1 and executions(pg) == before + 1
    assert pg.scalar("SELECT last_value FROM shop.flaky_calls") == 4  # called twice


def test_a_lost_commit_is_retried_only_where_repeating_is_safe(
    reach: ReachClient, pg: PostgresServer, proxy: FaultProxy
) -> None:
    breaker = redis.Redis.from_url(REDIS_URL)
    proxy.reset_on(rb"COMMIT")  # every COMMIT of shop_flaky is lost on the way
    try:
        before = executions(pg)
        unsafe = reach.call("shop_flaky.add_item", {"title": f"{RUN}-unsafe"})
        after_unsafe = executions(pg)
        breaker.delete(keys.breaker("shop_flaky"))  # its failures (fail_max 2) are not this test's subject
        safe = reach.call("shop_flaky.add_item_safely", {"title": f"{RUN}-safe"})
    finally:
        proxy.reset_on(None)
        breaker.delete(keys.breaker("shop_flaky"))
    assert unsafe.status == "unknown" and unsafe.error is not None and unsafe.error.code == "OUTCOME_UNKNOWN", unsafe
    assert unsafe.error.retryable is False and unsafe.execution.attempts == 1 and after_unsafe == before + 1
    assert safe.status == "failed" and safe.error is not None and safe.error.code == "DOWNSTREAM_ERROR", safe
    assert safe.error.retryable is True and safe.execution.attempts >= 2
    assert executions(pg) == after_unsafe + safe.execution.attempts  # one execution per attempt
    assert rows(pg, f"{RUN}-unsafe") == 0 and rows(pg, f"{RUN}-safe") == 0  # no COMMIT ever arrived


def test_the_same_idempotency_key_twice_executes_once(reach: ReachClient, pg: PostgresServer) -> None:
    title, key = f"{RUN}-once", f"{RUN}-key-1"
    before = executions(pg)
    first = reach.call("shop_sql.add_item", {"title": title}, idempotency_key=key)
    second = reach.call("shop_sql.add_item", {"title": title}, idempotency_key=key)
    assert first.status == second.status == "succeeded", (first, second)
    assert not first.execution.deduplicated and second.execution.deduplicated
    assert second.data == first.data and second.intent_id != first.intent_id
    assert rows(pg, title) == 1 and executions(pg) == before + 1


def test_the_breaker_opens_when_the_database_is_unreachable(reach: ReachClient, proxy: FaultProxy) -> None:
    client = redis.Redis.from_url(REDIS_URL)
    proxy.set("refuse")
    try:
        failed = reach.call("shop_flaky.add_item", {"title": f"{RUN}-refused"})
        assert failed.status == "failed" and failed.error is not None, failed
        assert failed.error.code == "DOWNSTREAM_UNREACHABLE" and failed.error.retryable
        assert failed.execution.attempts == 2  # fail_max 2: the breaker opened before a third attempt
        rejected = reach.call("shop_flaky.add_item", {"title": f"{RUN}-while-open"})
        assert rejected.status == "rejected" and rejected.error is not None, rejected
        assert rejected.error.code == "CONNECTOR_UNAVAILABLE" and rejected.error.retryable
    finally:
        proxy.set("pass")
        client.delete(keys.breaker("shop_flaky"))


# -- kill -9 with writes in flight ------------------------------------------------------------------


def in_flight(pg: PostgresServer) -> int:
    """shop_crash's transactions sleeping in shop.add_item_slowly right now."""
    return int(
        pg.scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'agent-reach shop_crash'"
            " AND wait_event = 'PgSleep'"
        )
    )


def test_kill_9_of_the_pool_with_writes_in_flight_loses_nothing_and_duplicates_nothing(
    fleet: Fleet, reach: ReachClient, pg: PostgresServer
) -> None:
    name = "shop_crash"
    purge(connector_queue(name).name)
    titles = {
        reach.publish(f"{name}.add_item_slowly", {"title": f"{RUN}-crash-{i}"}): f"{RUN}-crash-{i}"
        for i in range(CRASH_WRITES)
    }
    failures: list[BaseException] = []

    def three_kills() -> None:
        try:
            for _ in range(3):
                wait_for(lambda: in_flight(pg) >= CRASH_THREADS, 30, f"{CRASH_THREADS} writes in flight")
                fleet.kill_process(name)
                assert start_pool(fleet, name)  # at once: the dead worker's heartbeat still lives
        except BaseException as exc:  # re-raised in the test's thread
            failures.append(exc)

    killer = threading.Thread(target=three_kills)
    killer.start()
    killer.join(120)
    if failures:
        raise failures[0]
    receipts = [r for r in gather(reach, set(titles)) if r.intent_id in titles]
    written = pg.run_sql(
        "SELECT title, count(*)::int, min(id) FROM shop.items WHERE title LIKE %s GROUP BY title", (f"{RUN}-crash-%",)
    )
    counts = {title: n for title, n, _ in written}
    row_ids = {title: row_id for title, _, row_id in written}
    per_intent: dict[str, list[Receipt]] = {}
    for receipt in receipts:
        per_intent.setdefault(receipt.intent_id, []).append(receipt)
    assert set(per_intent) == set(titles), f"{len(set(titles) - set(per_intent))} intents without a receipt"
    assert [i for i, got in per_intent.items() if len(got) > 1] == []  # exactly one receipt each
    assert [t for t, n in counts.items() if n > 1] == []  # no effect twice
    outcomes = Counter(r.error.code if r.error else r.status for r in receipts)
    for intent_id, (receipt,) in per_intent.items():
        title = titles[intent_id]
        if receipt.status == "succeeded":
            assert counts.get(title) == 1 and receipt.data == {"item_id": row_ids[title]}, receipt
        else:  # only where the pool died with the call sent: honest about not knowing
            assert receipt.status == "unknown" and receipt.error is not None, receipt
            assert receipt.error.code == "OUTCOME_UNKNOWN" and not receipt.error.retryable and receipt.error.suggestion
    assert outcomes["OUTCOME_UNKNOWN"] >= CRASH_THREADS, outcomes  # the writes in flight at a kill
    assert outcomes["succeeded"] >= CRASH_WRITES - 4 * CRASH_THREADS, outcomes
