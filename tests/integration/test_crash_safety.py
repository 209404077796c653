"""Crash safety through the real fleet: kill -9 of a pool, a broker restart, concurrent
duplicates and a poison message. Counts are exact: no intent lost, no side effect twice,
exactly one receipt per intent.

The downstream (tests/integration/counting_system.py) counts executions per title (every
intent here writes a unique title) and per Idempotency-Key, and answers each write after a
delay so that writes are in flight when a pool dies.
"""
from __future__ import annotations

import subprocess
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from kombu import Connection, Consumer, Queue

from producers.client import ReachClient
from producers.wire import Receipt
from tests.fleet import BROKER_URL, REDIS_URL, Fleet, queue_depth
from tests.integration.counting_system import CountingSystem
from workers.topology import DLQ, INTENTS_QUEUE, RECEIPTS_EXCHANGE, connector_queue

RUN = uuid.uuid4().hex[:6]
AGENT = f"crash_{RUN}"
WRITE_DELAY = 0.4  # seconds each write stays in flight at the downstream
KILL_CONCURRENCY = 6


def connector_yaml(name: str, url: str, *, header: bool = False, concurrency: int = KILL_CONCURRENCY) -> str:
    return f"""
connector:
  name: {name}
  endpoint: {url}
  pool: {{ concurrency: {concurrency} }}
{"  idempotency_header: Idempotency-Key" if header else ""}
  actions:
    - action: create_item
      description: Create an item (a side effect that must happen at most once)
      path: POST /items
      input:
        title: {{ type: string, required: true }}
      permission: write
      timeout: 5s
      idempotent: false
---"""


# connector -> (idempotency_header declared, pool threads)
CONNECTORS = {
    "crash_idem": (True, KILL_CONCURRENCY),      # kill -9 with idempotency_header
    "crash_raw": (False, KILL_CONCURRENCY),      # kill -9, plain non-idempotent write
    "crash_same_key": (False, 10),               # 20 deliveries of one key at once
    "crash_queued": (False, 4),                  # broker restart with a backlog
    "crash_bystander": (False, 2),               # a pool that must reconnect by itself
    "crash_poison": (True, 2),                   # a job that kills its pool every time
}
STARTED_WITH_FLEET = ["crash_idem", "crash_raw", "crash_same_key", "crash_queued", "crash_bystander"]


@pytest.fixture(scope="module")
def systems() -> Iterator[dict[str, CountingSystem]]:
    running = {name: CountingSystem().start() for name in CONNECTORS}
    yield running
    for system in running.values():
        system.stop()


@pytest.fixture(scope="module")
def fleet(systems: dict[str, CountingSystem]) -> Iterator[Fleet]:
    client = redis.Redis.from_url(REDIS_URL)
    for name in CONNECTORS:  # a Redis database may hold an earlier run's breaker or health state
        client.delete(f"reach:breaker:{name}", f"reach:health:{name}")
    catalog = "".join(connector_yaml(name, systems[name].url, header=header, concurrency=threads)
                      for name, (header, threads) in CONNECTORS.items())
    catalog += f"""
agent_app:
  name: {AGENT}
  connector_bindings:
""" + "".join(f"""    - connector: {name}
      allowed_actions: ["*"]
""" for name in CONNECTORS)
    with Fleet(catalog, STARTED_WITH_FLEET) as running:
        yield running


@pytest.fixture
def client(fleet: Fleet) -> Iterator[ReachClient]:
    with ReachClient(AGENT, BROKER_URL, reply_to=f"{AGENT}.{uuid.uuid4().hex[:8]}") as reach:
        yield reach


def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.02)


def gather(client: ReachClient, expected: set[str], timeout: float, grace: float = 2.0) -> list[Receipt]:
    """Every receipt for ``expected`` until all arrived (or ``timeout``), then any late extra."""
    got: list[Receipt] = []
    deadline = time.monotonic() + timeout
    while {r.intent_id for r in got} < expected and time.monotonic() < deadline:
        got.extend(client.receipts(timeout=min(1.0, max(0.05, deadline - time.monotonic()))))
    got.extend(client.receipts(timeout=grace))  # a second receipt for anything would show up here
    return got


STARTUP_CRASH = "Consumer does not have any callbacks"
startup_crashes: Counter[str] = Counter()  # see test_a_pool_started_with_a_backlog_keeps_running


def start_pool(fleet: Fleet, name: str, *, tolerate_startup_crash: bool = True, **env: str) -> bool:
    """Start ``name``'s pool and wait until Celery reports it ready. Returns False if it died on start.

    A pool started with messages waiting can die on start (a bug, pinned by its own test);
    like Kubernetes would, it is started again, so the other tests check what they claim.
    """
    for _ in range(5):
        proc = fleet.start_process(name, ["worker", name], extra_env=env or None)
        marker = f"{name}.{proc.pid}@"
        deadline = time.monotonic() + 30
        while proc.poll() is None and time.monotonic() < deadline:
            if any(marker in line and " ready." in line for line in fleet.log(name).splitlines()[-400:]):
                return True
            time.sleep(0.05)
        if proc.poll() is None:
            raise AssertionError(f"pool {name} did not become ready in 30 s; see {fleet.log_dir}")
        fleet.procs.pop(name, None)
        if not tolerate_startup_crash or STARTUP_CRASH not in fleet.log(name)[-20000:]:
            return False
        startup_crashes[name] += 1
    raise AssertionError(f"pool {name} died on start five times; see {fleet.log_dir}")


def tally(ids: dict[str, str], receipts: list[Receipt], system: CountingSystem) -> dict[str, Any]:
    """Lost intents, duplicate receipts and duplicated effects, for exact assertions."""
    per_intent = Counter(r.intent_id for r in receipts)
    executions = system.executions()
    return {
        "lost": sorted(set(ids) - set(per_intent)),
        "duplicate_receipts": sorted(i for i, n in per_intent.items() if n > 1),
        "duplicated_effects": sorted(t for t, n in executions.items() if n > 1),
        "statuses": Counter(r.error.code if r.error else r.status for r in receipts),
    }


@pytest.mark.parametrize("name, header", [("crash_idem", True), ("crash_raw", False)],
                         ids=["with_idempotency_header", "non_idempotent_write"])
def test_kill_9_of_the_pool_three_times_loses_nothing_and_duplicates_nothing(
        fleet: Fleet, systems: dict[str, CountingSystem], client: ReachClient, name: str, header: bool) -> None:
    system = systems[name]
    system.state.reset()
    system.state.delay = WRITE_DELAY
    titles = {}
    for i in range(48):
        title = f"{RUN}-{name}-{i}"
        titles[client.publish(f"{name}.create_item", {"title": title})] = title
    in_flight_at_kill = []
    for _ in range(3):
        wait_for(lambda: system.in_flight() >= KILL_CONCURRENCY, 30, f"{KILL_CONCURRENCY} writes in flight on {name}")
        in_flight_at_kill.append(system.in_flight())
        fleet.kill_process(name)
        assert start_pool(fleet, name)
    receipts = gather(client, set(titles), timeout=60)
    result = tally(titles, receipts, system)
    executions = system.executions()
    assert min(in_flight_at_kill) >= KILL_CONCURRENCY, in_flight_at_kill
    assert result["lost"] == [], result
    assert result["duplicate_receipts"] == [], result
    assert result["duplicated_effects"] == [], result
    assert len(receipts) == len(titles)
    for receipt in receipts:
        title = titles[receipt.intent_id]
        if receipt.status == "succeeded":
            assert executions[title] == 1 and receipt.data["title"] == title, (receipt, executions[title])
        else:
            # the call may have happened: the pool had sent it when it died
            assert not header, f"with idempotency_header every intent must succeed: {receipt}"
            assert receipt.status == "unknown" and receipt.error.code == "OUTCOME_UNKNOWN", receipt
            assert receipt.error.retryable is False
            assert system.requests("POST", title), f"{title} is unknown but never reached the system"
    if header:
        assert all(n == 1 for n in system.state.executions_by_key.values())
        assert len(system.state.executions_by_key) == len(titles)
