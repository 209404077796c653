"""Quorum queues on a real three-node RabbitMQ cluster: while writes are in flight, the node leading
the connector's queue is stopped, then the node leading reach.intents, and the fleet still keeps
its promises — every confirmed intent gets one receipt, nothing is lost, no write takes effect twice.

The cluster is started by the fixture (tests/integration/rabbit_cluster.py: three nodes on free
ports of this machine, clustered with rabbitmqctl); a cluster that cannot be started fails the
test. The router and the pool get all three nodes' URLs and connect to node 1 first, so the second
stop takes their connections too: they reconnect to another node, and what they had not settled
comes back to them. The agent's client is connected to node 3, which is never stopped: its
receipt queue is exclusive (classic) and lives on that node (a client that loses its node loses
the receipts sent until it is bound again; ReachClient's docstring). Each node is started again
before the next is stopped, so every queue keeps a majority.

Duplicates that reach the client are the documented window (a receipt published again after a
confirm was lost with a node; ReachClient drops it): they are counted and reported, never a
second receipt with another outcome, and never a second execution downstream.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from kombu import Connection

from producers.client import ReachClient, ReachError
from producers.wire import Receipt
from tests.fleet import REDIS_URL, Fleet
from tests.integration.counting_system import CountingSystem
from tests.integration.rabbit_cluster import ClusterError, Node, RabbitCluster
from tests.waiting import wait_for
from workers.transport.topology import (
    INTENTS_QUEUE_NAME,
    connector_queue,
    connector_queue_name,
    declare_all,
    declare_queue,
)

RUN = uuid.uuid4().hex[:6]
AGENT = f"quorum_{RUN}"
CONNECTOR = f"quorum_{RUN}"
VHOST = f"reach-quorum-{RUN}"
INTENTS = 300
# seconds each write takes at the downstream: slow until both nodes were stopped, so that a backlog
# waits and writes are in flight at each stop, then quick for the rest
WRITE_DELAY, DRAIN_DELAY = 0.5, 0.02
THREADS = 4
# the intents go out in three parts: a backlog before the connector queue's leader is stopped,
# another before reach.intents' leader is stopped, and the rest while that node stops
BURST = 125
PACE = 0.1  # seconds between the last part's publishes


def catalog(url: str) -> str:
    return f"""
connector:
  name: {CONNECTOR}
  endpoint: {url}
  pool: {{ concurrency: {THREADS} }}
  actions:
    - action: create_item
      description: Create an item (a write that must take effect once)
      path: POST /items
      input:
        title: {{ type: string, required: true }}
      permission: write
      timeout: 10s
      idempotent: false
---
agent_app:
  name: {AGENT}
  connector_bindings:
    - connector: {CONNECTOR}
      allowed_actions: [create_item]
"""


@pytest.fixture(scope="module")
def cluster() -> Iterator[RabbitCluster]:
    try:
        running = RabbitCluster(3).start()
    except (ClusterError, OSError, TimeoutError) as exc:
        pytest.fail(f"the three-node RabbitMQ cluster could not be started: {exc}")
    with running:
        yield running


@pytest.fixture(scope="module")
def system() -> Iterator[CountingSystem]:
    running = CountingSystem().start()
    yield running
    running.stop()


@pytest.fixture(scope="module")
def fleet(cluster: RabbitCluster, system: CountingSystem) -> Iterator[Fleet]:
    """The router and the pool on the cluster, with every node's URL, node 1 first."""
    first, second, _ = cluster.nodes
    cluster.add_vhost(VHOST)
    # a quorum queue's first leader is the node of the connection that declares it: reach.intents
    # on node 1, the connector's queue on node 2, neither on node 3 (the client's)
    with Connection(first.url(VHOST)) as conn:
        declare_all(conn, [])
    with Connection(second.url(VHOST)) as conn:
        assert declare_queue(conn, connector_queue(CONNECTOR)) is None
    with Fleet(catalog(system.url), [CONNECTOR], broker_url=cluster.urls(VHOST), redis_url=REDIS_URL) as running:
        yield running


@dataclass
class Stop:
    """One node stopped under load, and what it cost."""

    queue: str
    node: str
    in_flight: int  # intents published and not yet answered when it was stopped
    began: float  # time.monotonic() of the stop command
    stop_seconds: float = 0.0  # rabbitmqctl stop until the node's process exited
    new_leader: str = ""
    election_seconds: float = 0.0  # from the stop command until another node led the queue
    receipt_gap_seconds: float = 0.0  # longest time without a receipt around the stop


@dataclass
class Run:
    prefix: str = field(default_factory=lambda: uuid.uuid4().hex[:8])  # of its intent ids and titles
    published: list[str] = field(default_factory=list)  # confirmed by the broker
    refused: list[tuple[str, str]] = field(default_factory=list)  # publishes that raised
    receipts: list[tuple[float, Receipt]] = field(default_factory=list)  # (arrival, receipt)
    stops: list[Stop] = field(default_factory=list)
    chaos_error: BaseException | None = None

    def answered(self) -> set[str]:
        return {r.intent_id for _, r in self.receipts}

    def in_flight(self) -> int:
        return len(set(self.published) - self.answered())


def collect(client: ReachClient, run: Run, seconds: float) -> None:
    """Take in receipts for about ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return
        for receipt in client.receipts(timeout=remaining):
            run.receipts.append((time.monotonic(), receipt))
            if time.monotonic() >= deadline:
                return


def publish(client: ReachClient, run: Run, count: int, pace: float = 0.0) -> None:
    """Publish the next ``count`` intents (each a write of its own title), taking in receipts between."""
    for _ in range(count):
        intent_id = f"{run.prefix}-{len(run.published) + len(run.refused):04d}"
        try:
            client.publish("create_item", {"title": intent_id}, intent_id=intent_id)
            run.published.append(intent_id)
        except ReachError as exc:
            run.refused.append((intent_id, str(exc)))
        collect(client, run, pace)


def stop_leader(cluster: RabbitCluster, queue: str, run: Run, leader: Node) -> Stop:
    """Stop ``leader``, the node leading ``queue``, wait for another node to lead it and for the
    stopped one to be down, then start it again."""
    # leaders may have moved since (an election when a node was slow to answer): put it back, so
    # that the client's node is never the one stopped
    cluster.move_leader(queue, leader, VHOST)
    stop = Stop(queue, leader.short, run.in_flight(), began=time.monotonic())
    stopper = threading.Thread(target=cluster.stop, args=(leader,), daemon=True)
    stopper.start()
    stop.new_leader = cluster.wait_leader_elsewhere(queue, leader, VHOST).short
    stop.election_seconds = time.monotonic() - stop.began
    stopper.join(120)
    stop.stop_seconds = time.monotonic() - stop.began
    run.stops.append(stop)
    cluster.start_node(leader)
    wait_for(lambda: leader.name in cluster.running_nodes(), 60, f"{leader.name} back in the cluster", every=0.5)
    return stop


def measure_gaps(run: Run) -> None:
    """For each stop, the longest time without a receipt from the stop on, while intents waited."""
    times = sorted(t for t, _ in run.receipts)
    for stop in run.stops:
        after = [t for t in times if t >= stop.began]
        window = [stop.began, *after[: max(1, stop.in_flight)]]
        stop.receipt_gap_seconds = max((b - a for a, b in zip(window, window[1:])), default=0.0)


def where_lost(cluster: RabbitCluster, fleet: Fleet, lost: list[str]) -> str:
    """What the fleet's logs say of each lost intent (its audit stages, other lines naming it) and
    what the queues hold now: enough to tell a broker that lost a confirmed message from a process
    that dropped one."""
    names = ["router", CONNECTOR]
    lines = [line for name in names for line in fleet.log_lines(name)]
    found = []
    for intent_id in lost[:10]:
        stages = []
        others = []
        for line in lines:
            if intent_id not in line:
                continue
            if line.startswith("{") and '"reach.audit"' in line:
                try:
                    doc = json.loads(line)
                except ValueError:
                    continue
                stages.append(f"{doc.get('process')}:{doc.get('stage')}")
            else:
                others.append(line[:300])
        found.append(f"{intent_id}: stages {stages or 'none'}" + (f"; lines {others[:3]}" if others else ""))
    try:
        queues = cluster.ctl(
            cluster.any_running(),
            "list_queues",
            "-p",
            VHOST,
            "name",
            "messages_ready",
            "messages_unacknowledged",
            "consumers",
            "leader",
        )
    except ClusterError as exc:
        queues = str(exc)
    troubles = [line[:300] for line in lines if " WARNING " in line or " ERROR " in line][-20:]
    return "\n".join(
        [*found, "queues now:", queues.strip(), "the fleet's warnings and errors:", *troubles, f"logs: {fleet.log_dir}"]
    )


def stops_under_load(
    cluster: RabbitCluster, system: CountingSystem, fleet: Fleet, rounds: int, burst: int, tail: int
) -> str:
    """``rounds`` times: a backlog of ``burst`` writes, the connector queue's leader (node 2)
    stopped and started again, another ``burst``, then reach.intents' leader (node 1, where the
    router and the pool are connected) stopped while ``tail`` more are published. The client stays
    on node 3. Asserts every promise; returns the report."""
    first, second, spare = cluster.nodes
    run = Run()
    go = threading.Event()  # the test's thread: stop the next leader now
    done = threading.Event()  # the chaos thread: that stop is over (the node runs again)
    plan = [(connector_queue_name(CONNECTOR), second), (INTENTS_QUEUE_NAME, first)] * rounds

    def chaos() -> None:
        try:
            for queue, leader in plan:
                go.wait(600)
                go.clear()
                stop_leader(cluster, queue, run, leader)
                done.set()
        except BaseException as exc:  # noqa: BLE001 - reported by the test's thread
            run.chaos_error = exc
            done.set()

    system.state.delay = WRITE_DELAY
    with ReachClient(AGENT, cluster.urls(VHOST, order=[spare, first, second]), connect_timeout=30) as client:
        stopper = threading.Thread(target=chaos, name="chaos", daemon=True)
        stopper.start()
        started = time.monotonic()
        for _ in range(rounds):
            publish(client, run, burst)
            go.set()  # the connector queue's leader
            while not done.is_set():
                collect(client, run, 0.5)
            done.clear()
            publish(client, run, burst)
            go.set()  # reach.intents' leader, while more intents are published
            publish(client, run, tail, PACE)
            while not done.is_set():
                collect(client, run, 0.5)  # (receipts are timed as they are taken in)
            done.clear()
        stopper.join(60)
        system.state.delay = DRAIN_DELAY
        deadline = time.monotonic() + 300
        while not set(run.published) <= run.answered() and time.monotonic() < deadline:
            collect(client, run, 1.0)
        collect(client, run, 3.0)  # a second receipt for anything would show up now
        elapsed = time.monotonic() - started
        duplicates_dropped = client.duplicate_receipts
        client_reconnects = client.reconnects
    fleet.check_alive()

    assert run.chaos_error is None, f"stopping the nodes failed: {run.chaos_error!r}"
    measure_gaps(run)
    per_intent = Counter(r.intent_id for _, r in run.receipts)
    executions = {title: n for title, n in system.executions().items() if title.startswith(run.prefix)}
    lost = sorted(set(run.published) - set(per_intent))
    repeated = sorted(i for i, n in per_intent.items() if n > 1)
    twice_done = sorted(title for title, n in executions.items() if n > 1)
    not_ok = [(r.intent_id, r.status, r.error.code if r.error else None) for _, r in run.receipts if not r.success]
    report = (
        f"{len(run.published)} intents confirmed, {len(run.refused)} publishes refused, all answered after "
        f"{elapsed:.1f} s: lost {len(lost)}, second receipts {len(repeated)}, executed twice {len(twice_done)}, "
        f"repeated receipts dropped by the client {duplicates_dropped}, client reconnects {client_reconnects}. "
        + " ".join(
            f"[{s.queue} led by {s.node}, {s.in_flight} in flight: {s.new_leader} leads after "
            f"{s.election_seconds:.1f} s, {s.node} down after {s.stop_seconds:.1f} s, longest wait for a "
            f"receipt {s.receipt_gap_seconds:.1f} s]"
            for s in run.stops
        )
    )
    print("\n" + report)
    assert [s.queue for s in run.stops] == [queue for queue, _ in plan], report
    assert all(s.in_flight > 0 for s in run.stops), f"a node was stopped with nothing in flight: {report}"
    # the client stays on node 3: every publish is confirmed, those during an election later
    assert run.refused == [], report
    assert len(run.published) == rounds * (2 * burst + tail), report
    assert lost == [], f"{report}; lost: {lost[:10]}\n{where_lost(cluster, fleet, lost)}"
    assert repeated == [], f"{report}; second receipts: {repeated[:10]}"
    assert set(per_intent) == set(run.published), report
    assert not_ok == [], f"{report}; not succeeded: {not_ok[:10]}"
    assert twice_done == [], f"{report}; executed twice: {twice_done[:10]}"
    assert sum(executions.values()) == len(run.published), report
    return report


def test_stopping_the_nodes_that_lead_the_queues_under_load_loses_and_repeats_nothing(
    cluster: RabbitCluster, system: CountingSystem, fleet: Fleet
) -> None:
    first, second, _ = cluster.nodes
    assert cluster.leader(INTENTS_QUEUE_NAME, VHOST) is first
    assert cluster.leader(connector_queue_name(CONNECTOR), VHOST) is second
    stops_under_load(cluster, system, fleet, rounds=1, burst=BURST, tail=INTENTS - 2 * BURST)


@pytest.mark.soak
def test_three_rounds_of_stops_under_a_longer_load_lose_and_repeat_nothing(
    cluster: RabbitCluster, system: CountingSystem, fleet: Fleet
) -> None:
    stops_under_load(cluster, system, fleet, rounds=3, burst=400, tail=200)


def test_a_client_whose_node_stops_goes_on_from_another_node(
    cluster: RabbitCluster, system: CountingSystem, fleet: Fleet
) -> None:
    """ReachClient: the node it is connected to stops; its next publish goes to another node (a new
    receipt queue bound first) and is answered once."""
    own = cluster.nodes[1]
    others = [node for node in cluster.nodes if node is not own]
    with ReachClient(AGENT, cluster.urls(VHOST, order=[own, *others]), connect_timeout=30) as client:
        before = client.call("create_item", {"title": f"{RUN}-before"}, timeout=60)
        assert before.success, before
        cluster.stop(own)
        try:
            began = time.monotonic()
            after = client.call("create_item", {"title": f"{RUN}-after"}, timeout=60)
            answered_in = time.monotonic() - began
        finally:
            cluster.start_node(own)
        assert after.success, after
        assert client.reconnects == 1
        print(f"\nthe client's node stopped: the next call was answered from another node in {answered_in:.2f} s")
    assert system.executions()[f"{RUN}-after"] == 1
    fleet.check_alive()
