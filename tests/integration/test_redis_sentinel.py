"""The fleet on a Sentinel-watched Redis (one master, one replica, one sentinel, started by the
fixture: tests/integration/redis_topologies.py), through a kill -9 of the master and the failover
that follows: every intent gets exactly one receipt, no write runs twice, and the fleet carries on
on the promoted replica by itself. Before it, the usual behaviours on this topology (the ledger,
rate limits, breakers), and what REACH_REDIS_WAIT_REPLICAS guarantees: a ledger write is on the
replica when the pool goes on."""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Iterator

import pytest
import redis

from tests.fleet import Fleet, agent
from tests.integration.counting_system import CountingSystem
from tests.integration.redis_topologies import (
    FLAKY_CONNECTOR,
    WRITE_CONNECTOR,
    LocalSentinel,
    fleet_catalog,
    gather,
)
from tests.waiting import wait_for
from workers.settings import Settings
from workers.state import keys
from workers.state.client import connect_redis
from workers.state.ledger import Heartbeat, Ledger, params_hash

RUN = uuid.uuid4().hex[:6]
AGENT, LIMITED = f"sen_{RUN}", f"sen_limited_{RUN}"
REPLICA_DELAY = 0.3  # seconds the replica of the WAIT test lags behind its master


@pytest.fixture(scope="module")
def sentinel() -> Iterator[LocalSentinel]:
    with LocalSentinel() as running:
        yield running


@pytest.fixture(scope="module")
def systems() -> Iterator[dict[str, CountingSystem]]:
    running = {WRITE_CONNECTOR: CountingSystem().start(), FLAKY_CONNECTOR: CountingSystem().start()}
    yield running
    for system in running.values():
        system.stop()


@pytest.fixture(scope="module")
def fleet(sentinel: LocalSentinel, systems: dict[str, CountingSystem]) -> Iterator[Fleet]:
    catalog = fleet_catalog(systems[WRITE_CONNECTOR].url, systems[FLAKY_CONNECTOR].url, [AGENT], LIMITED)
    with Fleet(catalog, [WRITE_CONNECTOR, FLAKY_CONNECTOR], redis_url=sentinel.url) as running:
        yield running


@pytest.mark.parametrize("replicas", [1, 0])
def test_a_ledger_write_is_on_the_replica_when_the_pool_goes_on_unless_waiting_is_off(replicas: int) -> None:
    with LocalSentinel(replica_delay=REPLICA_DELAY, sentinel=False) as lagging:  # (see LocalSentinel)
        settings = Settings(redis_url=lagging.master_url, redis_wait_replicas=replicas, redis_wait_timeout_ms=5000)
        client = connect_redis(settings)
        beat = Heartbeat(client).start()
        record = keys.idempotency(AGENT, WRITE_CONNECTOR, "create_item", uuid.uuid4().hex)
        started = time.monotonic()
        assert Ledger(client, beat, 3600).claim(record, params_hash({}), "i-1", "a-1").state == "claimed"
        took = time.monotonic() - started
        on_replica = redis.Redis(port=lagging.replica_port).exists(record)
        beat.stop()
    if replicas:
        assert on_replica and took >= REPLICA_DELAY
    else:  # what a failover at this moment would lose
        assert not on_replica and took < REPLICA_DELAY


def test_one_receipt_per_intent_dedupe_rate_limit_and_breaker(fleet: Fleet, systems: dict[str, CountingSystem]) -> None:
    system = systems[WRITE_CONNECTOR]
    system.state.reset()
    with agent(AGENT) as client:
        titles = {client.publish(f"{WRITE_CONNECTOR}.create_item", {"title": f"{RUN}-{i}"}): i for i in range(20)}
        key = f"{RUN}-order"
        same = {client.publish(f"{WRITE_CONNECTOR}.create_item", {"title": f"{RUN}-key"}, idempotency_key=key)}
        receipts = gather(client, set(titles) | same)
        second = client.publish(f"{WRITE_CONNECTOR}.create_item", {"title": f"{RUN}-key"}, idempotency_key=key)
        receipts += gather(client, {second}, timeout=20)
    assert Counter(r.intent_id for r in receipts) == Counter(set(titles) | same | {second})
    assert all(r.success for r in receipts), [r.error for r in receipts if r.error]
    assert [r.execution.deduplicated for r in receipts if r.intent_id == second] == [True]
    assert system.executions()[f"{RUN}-key"] == 1 and max(system.executions().values()) == 1
    with agent(LIMITED) as client:
        limited = [
            client.call(f"{WRITE_CONNECTOR}.create_item", {"title": f"{RUN}-rl{i}"}, timeout=20) for i in range(5)
        ]
    assert [r.success for r in limited] == [True] * 3 + [False] * 2
    assert {r.error.code for r in limited if r.error} == {"RATE_LIMITED"}
    flaky = systems[FLAKY_CONNECTOR]
    flaky.state.reset()
    flaky.state.fail_status, flaky.state.fail_count = 503, 1000
    with agent(AGENT) as client:
        codes = [
            client.call(f"{FLAKY_CONNECTOR}.create_item", {"title": f"{RUN}-b{i}"}, timeout=20).error.code  # type: ignore[union-attr]
            for i in range(4)
        ]
    assert codes == ["DOWNSTREAM_ERROR"] * 3 + ["CONNECTOR_UNAVAILABLE"]
    assert len(flaky.requests("POST")) == 3


def test_kill_9_of_the_master_during_a_burst_loses_nothing_duplicates_nothing_and_the_fleet_carries_on(
    sentinel: LocalSentinel, fleet: Fleet, systems: dict[str, CountingSystem]
) -> None:
    burst_through_a_failover(sentinel, fleet, systems[WRITE_CONNECTOR], writes=60)


@pytest.mark.soak
def test_soak_300_writes_through_a_failover_that_outlasts_redis_pys_retries(systems: dict[str, CountingSystem]) -> None:
    """Sentinel waits 5 s before it fails over (its default is 30): redis-py's retries run out,
    the pools give their attempts up and the jobs come back after the failover."""
    catalog = fleet_catalog(systems[WRITE_CONNECTOR].url, systems[FLAKY_CONNECTOR].url, [AGENT], LIMITED)
    with LocalSentinel(down_after_ms=5000) as slow:
        with Fleet(catalog, [WRITE_CONNECTOR], redis_url=slow.url) as running:
            burst_through_a_failover(slow, running, systems[WRITE_CONNECTOR], writes=300)


def burst_through_a_failover(sentinel: LocalSentinel, fleet: Fleet, system: CountingSystem, writes: int) -> None:
    system.state.reset()
    system.state.delay = 0.2  # writes stay in flight while the master dies
    with agent(AGENT) as client:
        titles = {client.publish(f"{WRITE_CONNECTOR}.create_item", {"title": f"{RUN}-f{i}"}): i for i in range(writes)}
        wait_for(
            lambda: system.in_flight() >= 8 and len(system.requests("POST")) >= writes // 4, 60, "a burst in flight"
        )
        sentinel.kill_master()
        took = sentinel.wait_failover()
        receipts = [r for r in gather(client, set(titles), timeout=180, grace=3) if r.intent_id in titles]
        system.state.delay = 0.0
        after = client.call(f"{WRITE_CONNECTOR}.create_item", {"title": f"{RUN}-after"}, timeout=30)
        key = f"{RUN}-after-key"
        again = [
            client.call(f"{WRITE_CONNECTOR}.create_item", {"title": f"{RUN}-ak"}, idempotency_key=key, timeout=30)
            for _ in range(2)
        ]
    per_intent = Counter(r.intent_id for r in receipts)
    assert set(per_intent) == set(titles) and set(per_intent.values()) == {1}, (took, per_intent)
    executions = system.executions()
    assert [t for t, n in executions.items() if n > 1] == [], "a write ran twice"
    for receipt in receipts:  # a write either succeeded once, or is answered unknown: never repeated
        title = f"{RUN}-f{titles[receipt.intent_id]}"
        if receipt.success:
            assert executions[title] == 1, receipt
        else:
            assert receipt.error is not None and receipt.error.code == "OUTCOME_UNKNOWN", receipt
    assert after.success, after  # the fleet carries on on the promoted replica
    assert all(r.success for r in again) and again[1].execution.deduplicated, again
    assert executions[f"{RUN}-ak"] == 1 and sentinel.master()[1] == sentinel.replica_port
