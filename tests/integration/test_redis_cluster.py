"""The fleet on a real Redis Cluster: three masters (each with a replica) on this machine, started
by the fixture (tests/integration/redis_topologies.py). Agents whose keys live on three different
nodes each get exactly one receipt per intent; the ledger, rate limits and breakers work across
nodes; the ledger's scripts run on one node each (Redis Cluster refuses a script whose keys are in
different slots, and redis-py refuses it before sending)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator

import pytest
import redis

from tests.fleet import REPO, Fleet, agent
from tests.integration.counting_system import CountingSystem
from tests.integration.redis_topologies import (
    FLAKY_CONNECTOR,
    WRITE_CONNECTOR,
    LocalCluster,
    fleet_catalog,
    gather,
)
from workers.observability.audit import Audit, trace_agents
from workers.settings import Settings
from workers.state import keys
from workers.state.client import connect_redis
from workers.state.ledger import _CLAIM, Heartbeat, Ledger, params_hash

RUN = uuid.uuid4().hex[:6]


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(masters=3, replicas=1) as running:
        yield running


def agents_on_every_node(cluster: LocalCluster) -> list[str]:
    """One agent name per master: their keys (tagged {agent}) live on three different nodes."""
    client = cluster.client()
    chosen: dict[str, str] = {}
    for i in range(200):
        name = f"cl{i}_{RUN}"
        chosen.setdefault(client.get_node_from_key("{" + name + "}").name, name)
        if len(chosen) == 3:
            return sorted(chosen.values())
    raise AssertionError("no three agents on three nodes")


@pytest.fixture(scope="module")
def systems() -> Iterator[dict[str, CountingSystem]]:
    running = {WRITE_CONNECTOR: CountingSystem().start(), FLAKY_CONNECTOR: CountingSystem().start()}
    yield running
    for system in running.values():
        system.stop()


@pytest.fixture(scope="module")
def agents(cluster: LocalCluster) -> list[str]:
    return agents_on_every_node(cluster)


@pytest.fixture(scope="module")
def fleet(cluster: LocalCluster, systems: dict[str, CountingSystem], agents: list[str]) -> Iterator[Fleet]:
    catalog = fleet_catalog(systems[WRITE_CONNECTOR].url, systems[FLAKY_CONNECTOR].url, agents, f"limited_{RUN}")
    with Fleet(catalog, [WRITE_CONNECTOR, FLAKY_CONNECTOR], redis_url=cluster.url) as running:
        yield running


def test_agents_on_three_nodes_get_one_receipt_per_intent_and_each_write_runs_once(
    cluster: LocalCluster, fleet: Fleet, systems: dict[str, CountingSystem], agents: list[str]
) -> None:
    system = systems[WRITE_CONNECTOR]
    system.state.reset()
    titles: dict[str, str] = {}
    sent: dict[str, set[str]] = {}
    clients = [agent(name) for name in agents]
    try:
        for client in clients:
            for i in range(20):
                title = f"{client.agent_id}-{i}"
                intent_id = client.publish(f"{WRITE_CONNECTOR}.create_item", {"title": title})
                titles[intent_id] = title
                sent.setdefault(client.agent_id, set()).add(intent_id)
        receipts = [r for client in clients for r in gather(client, sent[client.agent_id])]
    finally:
        for client in clients:
            client.close()
    per_intent = Counter(r.intent_id for r in receipts)
    assert set(per_intent) == set(titles) and set(per_intent.values()) == {1}, per_intent
    assert all(r.status == "succeeded" for r in receipts), [r.error for r in receipts if r.error]
    assert system.executions() == Counter({title: 1 for title in titles.values()})
    # the receipts are kept, each on its agent's node: three nodes
    store = cluster.client()
    stored = {r.intent_id: store.get(keys.receipt(r.agent_id, r.intent_id)) for r in receipts}
    assert all(stored.values())
    assert len({store.get_node_from_key(keys.receipt(r.agent_id, r.intent_id)).name for r in receipts}) == 3
    # every master's share of the ledger waited for its replica (REACH_REDIS_WAIT_REPLICAS=1, the default)
    waits = [
        node.redis_connection.info("commandstats").get("cmdstat_wait", {}).get("calls", 0)
        for node in store.get_primaries()
    ]
    assert all(calls > 0 for calls in waits), waits


def test_one_idempotency_key_sent_ten_times_at_once_executes_once(
    fleet: Fleet, systems: dict[str, CountingSystem], agents: list[str]
) -> None:
    system = systems[WRITE_CONNECTOR]
    system.state.reset()
    system.state.delay = 0.3  # the duplicates arrive while the first is in flight
    key, params = f"{RUN}-order-1", {"title": f"{RUN}-same-key"}
    with agent(agents[0]) as client:
        ids = {client.publish(f"{WRITE_CONNECTOR}.create_item", params, idempotency_key=key) for _ in range(10)}
        receipts = gather(client, ids, timeout=30)
    assert sorted(r.intent_id for r in receipts) == sorted(ids)
    assert system.executions() == Counter({params["title"]: 1})
    assert all(r.status == "succeeded" for r in receipts), [r.error for r in receipts if r.error]
    assert sum(1 for r in receipts if r.execution.deduplicated) == 9


def test_a_binding_rate_limit_holds(fleet: Fleet, systems: dict[str, CountingSystem]) -> None:
    systems[WRITE_CONNECTOR].state.reset()
    with agent(f"limited_{RUN}") as client:
        ids = [client.publish(f"{WRITE_CONNECTOR}.create_item", {"title": f"{RUN}-rl-{i}"}) for i in range(6)]
        receipts = [client.wait(i, timeout=20) for i in ids]
    assert sum(r.success for r in receipts) == 3
    assert {r.error.code for r in receipts if r.error} == {"RATE_LIMITED"}
    assert len(systems[WRITE_CONNECTOR].requests("POST")) == 3


def test_the_breaker_opens_for_every_process_and_reach_status_sees_it(
    cluster: LocalCluster, fleet: Fleet, systems: dict[str, CountingSystem], agents: list[str]
) -> None:
    system = systems[FLAKY_CONNECTOR]
    system.state.reset()
    system.state.fail_status, system.state.fail_count = 503, 1000
    with agent(agents[1]) as client:
        first = [client.call(f"{FLAKY_CONNECTOR}.create_item", {"title": f"{RUN}-b{i}"}, timeout=20) for i in range(3)]
        later = client.call(f"{FLAKY_CONNECTOR}.create_item", {"title": f"{RUN}-b-later"}, timeout=20)
    assert [r.error.code for r in first if r.error] == ["DOWNSTREAM_ERROR"] * 3
    assert later.error is not None and later.error.code == "CONNECTOR_UNAVAILABLE", later
    assert len(system.requests("POST")) == 3  # the open breaker kept the fourth away
    assert cluster.client().hget(keys.breaker(FLAKY_CONNECTOR), "state") == b"open"
    done = subprocess.run(
        [sys.executable, "-m", "workers.cli", "status", "--json"],
        env=fleet.env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    rows = {row["connector"]: row for row in json.loads(done.stdout)}
    assert rows[FLAKY_CONNECTOR]["breaker"] == "open" and rows[WRITE_CONNECTOR]["breaker"] == "closed"


def test_a_record_is_judged_by_a_heartbeat_on_another_node(cluster: LocalCluster) -> None:
    """The holder's heartbeat (untagged) and the record (the agent's tag) are on different nodes;
    the judge reads both in one round trip."""
    client = connect_redis(Settings(redis_url=cluster.url))
    dead_beat, live_beat = Heartbeat(client, ttl_seconds=0.3).start(), Heartbeat(client).start()
    dead, live = Ledger(client, dead_beat, 3600), Ledger(client, live_beat, 3600)
    nodes = cluster.client()
    heartbeats = {nodes.get_node_from_key(keys.alive(beat.worker_id)).name for beat in (dead_beat, live_beat)}
    record = next(
        key
        for key in (keys.idempotency(f"judge{i}", "c", "create", uuid.uuid4().hex) for i in range(100))
        if nodes.get_node_from_key(key).name not in heartbeats
    )
    h = params_hash({"n": 1})
    assert dead.claim(record, h, "i-1", "a-1").state == "claimed"
    assert live.claim(record, h, "i-2", "a-2").state == "in_progress"
    dead.mark_sending(record)
    dead_beat._stop.set()  # the holder "dies": its heartbeat is no longer renewed
    time.sleep(1.0)  # over three times the heartbeat's ttl: a renewal already under way has expired too
    orphaned = live.claim(record, h, "i-1", "a-3")
    assert orphaned.state == "orphaned" and orphaned.holder_intent == "i-1" and live.was_sending(record)
    assert live.take_over(record, "i-1", "a-3") and live.claim(record, h, "i-9", "a-4").state == "in_progress"
    live_beat.stop()


def test_a_claim_sent_twice_is_still_one_claim_and_a_cross_slot_script_is_refused(cluster: LocalCluster) -> None:
    """A command redis-py sends again after its answer was lost (a failover) finds its own claim."""
    client = cluster.client()
    record = keys.idempotency("twice_agent", "c", "create", uuid.uuid4().hex)
    gone = keys.abandoned(record, "a-1")
    args = [params_hash({}), "worker-1", "i-1", 60_000, "a-1", "nonce-1"]
    assert client.eval(_CLAIM, 2, record, gone, *args)[0] == b"claimed"
    assert client.eval(_CLAIM, 2, record, gone, *args)[0] == b"claimed"  # the same command again
    other = [*args[:5], "nonce-2"]
    assert client.eval(_CLAIM, 2, record, gone, *other)[0] == b"holder"  # any other claim sees a holder
    with pytest.raises(redis.RedisClusterException, match="same key slot|same slot"):
        client.eval(_CLAIM, 2, record, keys.breaker("c"), *args)


def test_reach_trace_finds_an_intent_whatever_node_its_agent_is_on(cluster: LocalCluster, agents: list[str]) -> None:
    client = connect_redis(Settings(redis_url=cluster.url))
    intent_id = f"trace-{RUN}"
    for name in agents:
        Audit(client, "test").events(intent_id, [("received", {"agent": name})])
    assert trace_agents(client, intent_id) == sorted(agents)
