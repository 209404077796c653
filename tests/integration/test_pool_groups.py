"""Pool groups through the real fleet: `reach worker A B C` runs three connectors in one process,
each a bulkhead of its own. A slow connector's backlog holds only its own threads and prefetch,
one connector's breaker and pause leave the others alone, a kill -9 of the group loses nothing,
and `reach status` and the probes show each connector in the group.

The downstreams are tests/integration/counting_system.py (each counts executions per title and per
Idempotency-Key); each connector has a system of its own, as separate systems would be.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterator

import pytest
import redis

from producers.client import ReachClient
from producers.wire import Receipt
from tests.fleet import BROKER_URL, REDIS_URL, REPO, Fleet, purge, queue_depth
from tests.integration.counting_system import CountingSystem
from tests.waiting import wait_for
from workers.settings import Settings
from workers.state import keys
from workers.state.breaker import breaker_state
from workers.state.control import live_workers
from workers.transport.topology import connector_queue

RUN = uuid.uuid4().hex[:6]
AGENT = f"grp_{RUN}"
GROUP = "grp"
FAST, SLOW, FLAKY = "grp_fast", "grp_slow", "grp_flaky"
THREADS = 2  # each connector's pool.concurrency: its threads
PREFETCH = THREADS * Settings.model_fields["pool_prefetch_per_thread"].default  # what the broker hands it
CONNECTORS = (FAST, SLOW, FLAKY)


def connector_yaml(name: str, url: str) -> str:
    # flaky: its breaker opens after two failures and stays open for the whole module
    extra = "  breaker: { fail_max: 2, reset_timeout: 120s }\n  retry: { max_attempts: 1 }\n" if name == FLAKY else ""
    return f"""
connector:
  name: {name}
  endpoint: {url}
  pool: {{ concurrency: {THREADS} }}
  idempotency_header: Idempotency-Key
{extra}  actions:
    - action: create_item
      description: Create an item (a side effect that must happen at most once)
      path: POST /items
      input:
        title: {{ type: string, required: true }}
      permission: write
      timeout: 10s
      idempotent: false
---"""


@pytest.fixture(scope="module")
def systems() -> Iterator[dict[str, CountingSystem]]:
    running = {name: CountingSystem().start() for name in CONNECTORS}
    yield running
    for system in running.values():
        system.stop()


@pytest.fixture(scope="module")
def fleet(systems: dict[str, CountingSystem]) -> Iterator[Fleet]:
    client = redis.Redis.from_url(REDIS_URL)
    for name in CONNECTORS:  # the Redis database may hold an earlier run's marks
        client.delete(keys.breaker(name), keys.health(name), keys.paused(name))
    catalog = "".join(connector_yaml(name, systems[name].url) for name in CONNECTORS)
    catalog += f"\nagent_app:\n  name: {AGENT}\n  connector_bindings:\n" + "".join(
        f'    - connector: {name}\n      allowed_actions: ["*"]\n' for name in CONNECTORS
    )
    with Fleet(catalog, [], groups={GROUP: list(CONNECTORS)}) as running:
        yield running


@pytest.fixture
def client(fleet: Fleet, systems: dict[str, CountingSystem]) -> Iterator[ReachClient]:
    for system in systems.values():
        system.state.reset()
    with ReachClient(AGENT, BROKER_URL, reply_to=f"{AGENT}.{uuid.uuid4().hex[:8]}", drop_duplicates=False) as reach:
        yield reach
    purge(*(connector_queue(name).name for name in CONNECTORS))
    for system in systems.values():  # the calls in hand finish before the next test counts anew
        wait_for(system.in_flight, 15, "the calls in flight to finish", until=lambda n: n == 0)


def reach_cli(fleet: Fleet, *args: str) -> subprocess.CompletedProcess[str]:
    """The `reach` CLI as an operator runs it, with the fleet's environment."""
    return subprocess.run(
        [sys.executable, "-m", "workers.cli", *args],
        env=fleet.env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )


def arrivals(client: ReachClient, expected: set[str], timeout: float) -> dict[str, tuple[float, Receipt]]:
    """Each expected receipt with the monotonic time it arrived; stops when all came or at ``timeout``."""
    got: dict[str, tuple[float, Receipt]] = {}
    deadline = time.monotonic() + timeout
    while not expected <= set(got) and time.monotonic() < deadline:
        for receipt in client.receipts(timeout=0.2):
            got.setdefault(receipt.intent_id, (time.monotonic(), receipt))
    return got


def unacked(name: str, backlog: int) -> int:
    """Messages of a connector's queue handed to its pool and not yet acked (the rest wait as ready)."""
    return backlog - queue_depth(connector_queue(name).name)[0]


def probe(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def metric(port: int, name: str, connector: str, **labels: str) -> float | None:
    """One connector's sample of a metric on the group's /metrics (None: no such series)."""
    _, text = probe(port, "/metrics")
    wanted = [f'{k}="{v}"' for k, v in {"connector": connector, **labels}.items()]
    for line in text.splitlines():
        series, _, value = line.rpartition(" ")
        if series.startswith(name + "{") and all(w in series for w in wanted):
            return float(value)
    return None


# -- bulkheads ------------------------------------------------------------------------------------


def test_a_slow_connectors_backlog_holds_only_its_own_threads_and_prefetch(
    fleet: Fleet, systems: dict[str, CountingSystem], client: ReachClient
) -> None:
    """Ten slow writes (4 s each) wait in the group's slow queue; the broker hands the slow
    consumer exactly its prefetch (two jobs per thread), and only its two threads call. Ten fast writes then all finish, each well under one
    slow call, before the first slow one does, while the slow system has seen only the two calls
    its threads hold: with one prefetch or one thread pool for the whole process, the slow
    connector's deliveries would hold them and the fast writes would wait for slow calls to end."""
    slow_seconds = 4.0
    systems[SLOW].state.delay = slow_seconds
    backlog = 10
    slow_ids = {client.publish(f"{SLOW}.create_item", {"title": f"{RUN}-slow-{i}"}) for i in range(backlog)}
    wait_for(lambda: systems[SLOW].in_flight(), 20, "the slow calls to start", until=lambda n: n == THREADS)
    # the router may still be dispatching the last of the backlog when the first calls start
    wait_for(lambda: unacked(SLOW, backlog), 10, "the backlog in the slow queue", until=lambda n: n == PREFETCH)
    for _ in range(4):  # a delivery past the prefetch would show within this second
        assert unacked(SLOW, backlog) == PREFETCH
        time.sleep(0.25)
    port = fleet.metrics_port(GROUP)
    assert [metric(port, "reach_pool_in_flight", n) for n in CONNECTORS] == [0, THREADS, 0]
    assert [metric(port, "reach_pool_threads", n) for n in CONNECTORS] == [THREADS] * 3
    published: dict[str, float] = {}
    for i in range(10):
        published[client.publish(f"{FAST}.create_item", {"title": f"{RUN}-fast-{i}"})] = time.monotonic()
    fast_ids = set(published)
    got: dict[str, tuple[float, Receipt]] = {}
    slow_calls_when_fast_done = -1
    while not (fast_ids <= set(got) and slow_ids & set(got)) and time.monotonic() - min(published.values()) < 20:
        for receipt in client.receipts(timeout=0.2):
            got.setdefault(receipt.intent_id, (time.monotonic(), receipt))
        if slow_calls_when_fast_done < 0 and fast_ids <= set(got):
            slow_calls_when_fast_done = len(systems[SLOW].requests("POST"))
    fast = [got[i] for i in fast_ids if i in got]
    slow = [got[i] for i in slow_ids if i in got]
    assert len(fast) == 10 and all(r.status == "succeeded" for _, r in fast), fast
    assert slow, "the slow calls in hand never finished"
    latencies = sorted(got[i][0] - published[i] for i in fast_ids)
    # the figures, on failure: each fast write's publish -> receipt, against one slow call
    assert latencies[-1] < slow_seconds / 2, f"fast latencies {latencies} s beside {slow_seconds} s slow calls"
    assert max(t for t, _ in fast) < min(t for t, _ in slow), "a fast write waited for a slow one"
    assert slow_calls_when_fast_done == THREADS, "the slow system got more calls than its connector has threads"
    assert systems[FAST].executions() == Counter({f"{RUN}-fast-{i}": 1 for i in range(10)})


def test_one_connectors_breaker_opens_without_affecting_the_others(
    fleet: Fleet, systems: dict[str, CountingSystem], client: ReachClient
) -> None:
    flaky = systems[FLAKY].state
    flaky.fail_status, flaky.fail_count = 500, 100
    failed = [client.call(f"{FLAKY}.create_item", {"title": f"{RUN}-flaky-{i}"}, timeout=20) for i in range(2)]
    assert [r.error.code for r in failed if r.error] == ["DOWNSTREAM_ERROR", "DOWNSTREAM_ERROR"], failed
    states = redis.Redis.from_url(REDIS_URL)
    assert breaker_state(states, FLAKY) == "open"
    refused = client.call(f"{FLAKY}.create_item", {"title": f"{RUN}-flaky-refused"}, timeout=20)
    assert refused.error is not None and refused.error.code == "CONNECTOR_UNAVAILABLE", refused
    for name in (FAST, SLOW):
        done = client.call(f"{name}.create_item", {"title": f"{RUN}-{name}-beside-open"}, timeout=20)
        assert done.status == "succeeded", done
        assert breaker_state(states, name) == "closed"
    assert len(systems[FLAKY].requests("POST")) == 2  # the open breaker kept the third off the system


def test_pausing_one_connector_leaves_the_others_consuming(
    fleet: Fleet, systems: dict[str, CountingSystem], client: ReachClient
) -> None:
    port = fleet.metrics_port(GROUP)
    assert reach_cli(fleet, "pause", SLOW).returncode == 0
    try:
        wait_for(
            lambda: queue_depth(connector_queue(SLOW).name)[1],
            10,
            "the slow queue to lose its consumer",
            until=lambda n: n == 0,
        )
        status, detail = probe(port, "/readyz")
        assert status == 200 and f"paused (idle on purpose): {SLOW}" in detail and FAST in detail.split(";")[0]
        assert [metric(port, "reach_pool_paused", n) for n in CONNECTORS] == [0, 1, 0]
        held = [client.publish(f"{SLOW}.create_item", {"title": f"{RUN}-held-{i}"}) for i in range(3)]
        done = client.call(f"{FAST}.create_item", {"title": f"{RUN}-while-paused"}, timeout=20)
        assert done.status == "succeeded", done
        wait_for(
            lambda: queue_depth(connector_queue(SLOW).name)[0], 10, "the paused intents to wait", until=lambda n: n == 3
        )
        assert systems[SLOW].requests("POST") == []
    finally:
        assert reach_cli(fleet, "resume", SLOW).returncode == 0
    got = arrivals(client, set(held), timeout=20)
    assert sorted(r.status for _, r in got.values()) == ["succeeded"] * 3
    assert queue_depth(connector_queue(SLOW).name) == (0, 1)
    assert metric(port, "reach_pool_paused", SLOW) == 0


# -- operations -----------------------------------------------------------------------------------


def test_status_and_probes_show_every_connector_in_the_groups_one_worker(fleet: Fleet, client: ReachClient) -> None:
    port = fleet.metrics_port(GROUP)
    ok = {"outcome": "succeeded"}
    before = {n: metric(port, "reach_actions_executed_total", n, **ok) or 0 for n in (FAST, SLOW)}
    for name, count in ((FAST, 2), (SLOW, 1)):
        for i in range(count):
            done = client.call(f"{name}.create_item", {"title": f"{RUN}-status-{name}-{i}"}, timeout=20)
            assert done.status == "succeeded", done
    done = reach_cli(fleet, "status", "--json")
    assert done.returncode == 0, done.stderr
    rows = {row["connector"]: row for row in json.loads(done.stdout)}
    for name in CONNECTORS:
        assert (rows[name]["consumers"], rows[name]["workers"]) == (1, 1), rows[name]
    states = redis.Redis.from_url(REDIS_URL)
    workers = {name: live_workers(states, name) for name in CONNECTORS}
    assert {w[0]["worker"] for w in workers.values()} == {workers[FAST][0]["worker"]}  # one process for all
    assert all(w[0]["group"] == GROUP for w in workers.values())
    assert f":{fleet.procs[GROUP].pid}:" in workers[FAST][0]["worker"]
    status, detail = probe(port, "/readyz")
    assert status == 200 and detail.strip() == f"ready: consuming {FAST}, {SLOW}, {FLAKY}"
    status, alive = probe(port, "/healthz")
    assert status == 200 and alive.startswith("ok"), alive
    # one process, and each connector's figures under its own label
    executed = {n: (metric(port, "reach_actions_executed_total", n, **ok) or 0) - before[n] for n in (FAST, SLOW)}
    assert executed == {FAST: 2, SLOW: 1}
    _, text = probe(port, "/metrics")
    for name in (FAST, SLOW):
        assert f'reach_downstream_call_seconds_count{{connector="{name}"}}' in text


def test_kill_9_of_the_group_loses_nothing_and_duplicates_nothing(
    fleet: Fleet, systems: dict[str, CountingSystem], client: ReachClient
) -> None:
    """Writes in flight on two connectors of the group when it is killed, twice; it is started
    again at once (the dead process's heartbeat still lives). Both declare idempotency_header, so
    every write succeeds exactly once."""
    writes = 24
    titles: dict[str, str] = {}
    for name in (FAST, SLOW):
        systems[name].state.delay = 0.3
        for i in range(writes):
            title = f"{RUN}-kill-{name}-{i}"
            titles[client.publish(f"{name}.create_item", {"title": title})] = title
    for _ in range(2):
        for name in (FAST, SLOW):
            wait_for(lambda: systems[name].in_flight(), 30, f"writes in flight on {name}", until=lambda n: n >= THREADS)
        fleet.kill_process(GROUP)
        fleet.start_group(GROUP, list(CONNECTORS))
        for name in CONNECTORS:
            fleet.wait_consuming(connector_queue(name).name, 30)
    got = arrivals(client, set(titles), timeout=60)
    late = list(client.receipts(timeout=1.5))  # a second receipt for anything would show up here
    assert set(got) == set(titles), f"{len(set(titles) - set(got))} intents got no receipt"
    assert [r.intent_id for r in late if r.intent_id in titles] == []
    assert {r.status for _, r in got.values()} == {"succeeded"}
    for name in (FAST, SLOW):
        executions = systems[name].executions()
        mine = {t for t in titles.values() if f"-kill-{name}-" in t}
        assert {t: executions[t] for t in mine} == dict.fromkeys(mine, 1)


def test_a_warm_shutdown_finishes_every_connectors_writes_in_hand_and_leaves_the_rest_queued(
    fleet: Fleet, systems: dict[str, CountingSystem], client: ReachClient
) -> None:
    """SIGTERM while both a fast (1 s) and a slow (2.5 s) connector hold writes: the process waits
    for the slow calls too, each held write gets its one receipt before the process exits (0),
    what was never delivered stays in its queue and runs once after the restart."""
    writes = 4
    titles: dict[str, str] = {}
    for name, delay in ((FAST, 1.0), (SLOW, 2.5)):
        systems[name].state.delay = delay
        for i in range(writes):
            title = f"{RUN}-term-{name}-{i}"
            titles[client.publish(f"{name}.create_item", {"title": title})] = title
    for name in (FAST, SLOW):
        wait_for(lambda: systems[name].in_flight(), 20, f"writes in flight on {name}", until=lambda n: n == THREADS)
    proc = fleet.procs[GROUP]
    started = time.monotonic()
    fleet.stop_process(GROUP)  # SIGTERM; SIGKILL only after 20 s
    took = time.monotonic() - started
    assert proc.popen.returncode == 0 and took < 15, (proc.popen.returncode, took)
    finished = arrivals(client, set(titles), timeout=2)  # receipts already sent before the exit
    done = {name: sorted(titles[i] for i in finished if f"-term-{name}-" in titles[i]) for name in (FAST, SLOW)}
    executed = {
        name: sorted(t for t, n in systems[name].executions().items() if f"{RUN}-term-" in t and n)
        for name in (FAST, SLOW)
    }
    assert done == executed, "a write ran without its receipt, or a receipt came for a write not run"
    assert len(done[SLOW]) >= THREADS, "the slow writes in hand were not finished"
    waiting = {name: queue_depth(connector_queue(name).name)[0] for name in (FAST, SLOW)}
    assert waiting == {name: writes - len(done[name]) for name in (FAST, SLOW)}
    fleet.start_group(GROUP, list(CONNECTORS))
    for name in CONNECTORS:
        fleet.wait_consuming(connector_queue(name).name, 30)
    finished.update(arrivals(client, set(titles) - set(finished), timeout=30))
    assert {r.status for _, r in finished.values()} == {"succeeded"} and set(finished) == set(titles)
    for name in (FAST, SLOW):
        executions = systems[name].executions()
        mine = {t for t in titles.values() if f"-term-{name}-" in t}
        assert {t: executions[t] for t in mine} == dict.fromkeys(mine, 1)


def test_a_group_that_names_an_unknown_connector_does_not_start(fleet: Fleet) -> None:
    done = reach_cli(fleet, "worker", FAST, "no_such_connector")
    assert done.returncode == 2 and "no connector named 'no_such_connector'" in done.stderr
    done = reach_cli(fleet, "worker", f"{FAST}:0", SLOW)
    assert done.returncode == 2 and "from 1 to 1000" in done.stderr
