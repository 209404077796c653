"""`reach status`, pause and resume, and the probes, against a running fleet."""

from __future__ import annotations

import time

import pytest

from examples.ticket_system import TicketSystem
from producers.client import ReachClient
from tests.fleet import Fleet, free_port, queue_depth
from tests.integration.operations.support import (
    PLAIN,
    POOLS,
    TRACED,
    probe,
    prom_sum,
    reach,
    status_rows,
    ticket_params,
    wait_receipts,
)
from tests.integration.prometheus_server import PrometheusServer
from tests.waiting import wait_for
from workers.transport.topology import connector_queue

# --------------------------------------------------------------------------- status and control


def test_status_shows_depth_consumers_in_flight_breaker_health_paused_and_last_error(
    fleet: Fleet, plain: TicketSystem, client: ReachClient
) -> None:
    assert client.call(f"{PLAIN}.query_ticket", {"tid": "TK-0000"}, timeout=20).error.code == "DOWNSTREAM_NOT_FOUND"
    plain.state.delay = 3.0
    slow = client.publish(f"{PLAIN}.create_ticket", ticket_params())
    rows = wait_for(
        lambda: status_rows(fleet),
        6,
        "status never showed the intent in flight",
        until=lambda found: found[PLAIN]["in_flight"] == 1,
    )
    plain_row, tickets_row = rows[PLAIN], rows[TRACED]
    assert set(plain_row) == {
        "connector",
        "queue_depth",
        "consumers",
        "in_flight",
        "workers",
        "breaker",
        "health",
        "paused",
        "last_error",
    }
    assert (plain_row["queue_depth"], plain_row["consumers"]) == (0, 1) and plain_row["workers"] >= 1
    assert (plain_row["breaker"], plain_row["health"], plain_row["paused"]) == ("closed", "up", False)
    assert plain_row["last_error"].startswith("DOWNSTREAM_NOT_FOUND ") and "ago" in plain_row["last_error"]
    assert (tickets_row["consumers"], tickets_row["in_flight"], tickets_row["paused"]) == (1, 0, False)
    table = reach(fleet, "status")
    assert table.returncode == 0, table.stderr
    header, rule, *body = table.stdout.splitlines()
    assert header.split() == [
        "connector",
        "queued",
        "consumers",
        "in-flight",
        "workers",
        "breaker",
        "health",
        "paused",
        "last",
        "error",
    ]
    cells = next(line for line in body if line.startswith(PLAIN)).split()
    assert [cells[i] for i in (0, 1, 2, 5, 6, 7)] == [PLAIN, "0", "1", "closed", "up", "no"]
    assert cells[8] == "DOWNSTREAM_NOT_FOUND"
    plain.state.delay = 0.0
    assert client.wait(slow, timeout=20).success


@pytest.mark.parametrize("broken", ["REACH_BROKER_URL", "REACH_REDIS_URL"])
def test_status_exits_2_when_the_broker_or_redis_cannot_be_reached(fleet: Fleet, broken: str) -> None:
    port = free_port()  # nothing listens there
    url = f"amqp://guest:guest@127.0.0.1:{port}//" if broken == "REACH_BROKER_URL" else f"redis://127.0.0.1:{port}/0"
    started = time.monotonic()
    for args in (["status"], ["status", "--json"]):
        done = reach(fleet, *args, env={broken: url})
        assert done.returncode == 2, (done.stdout, done.stderr)
        assert "cannot read the fleet's state" in done.stderr and done.stdout == ""
    assert time.monotonic() - started < 30


def restart_pool(fleet: Fleet, prometheus: PrometheusServer | None, name: str) -> None:
    fleet.stop_process(name)
    untraced = {"OTEL_TRACES_EXPORTER": "none"} if name == PLAIN else None
    fleet.start_process(name, ["worker", name], extra_env=untraced)
    wait_for(lambda: probe(fleet.metrics_port(name), "/readyz")[0] == 200, 30, f"{name} did not come back")
    if prometheus is not None:
        prometheus.set_targets("reach-pool", [fleet.metrics_port(p) for p in POOLS])


def test_pause_holds_intents_in_the_queue_and_resume_processes_every_one(
    fleet: Fleet, prometheus: PrometheusServer, plain: TicketSystem, client: ReachClient
) -> None:
    queue = connector_queue(PLAIN).name
    try:
        done = reach(fleet, "pause", PLAIN)
        assert done.returncode == 0, done.stderr
        paused_at = time.monotonic()
        wait_for(lambda: queue_depth(queue)[1] == 0, 5, "the pool kept consuming after `reach pause`")
        assert time.monotonic() - paused_at < 2.5
        rejected_before = prom_sum(prometheus, "reach_intents_rejected_total", ("code",))
        ids = [client.publish(f"{PLAIN}.create_ticket", ticket_params()) for _ in range(10)]
        wait_for(lambda: queue_depth(queue) == (10, 0), 10, "the intents did not wait in the paused queue")
        time.sleep(1.5)
        assert queue_depth(queue) == (10, 0)
        assert plain.requests() == []
        assert list(client.receipts(timeout=0.5)) == []  # nothing answered, nothing rejected
        rows = status_rows(fleet)
        assert rows[PLAIN]["paused"] is True and rows[PLAIN]["queue_depth"] == 10 and rows[PLAIN]["consumers"] == 0
        assert rows[TRACED]["paused"] is False and rows[TRACED]["consumers"] == 1
        table = reach(fleet, "status").stdout
        assert next(line for line in table.splitlines() if line.startswith(PLAIN)).split()[7] == "yes"
        # a paused pool is alive and ready: it is idle on purpose, and a rollout must not stall on it
        port = fleet.metrics_port(PLAIN)
        assert probe(port, "/healthz")[0] == 200 and probe(port, "/readyz")[0] == 200
        wait_for(
            lambda: prom_sum(prometheus, "reach_queue_depth", ("connector",)).get((PLAIN,)) == 10,
            10,
            "Prometheus never saw the paused queue's depth",
        )
        assert prom_sum(prometheus, "reach_queue_consumers", ("connector",))[(PLAIN,)] == 0
        assert prom_sum(prometheus, "reach_intents_rejected_total", ("code",)) == rejected_before
    finally:
        resumed = reach(fleet, "resume", PLAIN)
    assert resumed.returncode == 0, resumed.stderr
    receipts = wait_receipts(client, ids, timeout=30)
    assert all(r.success for r in receipts.values())
    assert len(plain.requests("POST")) == 10
    assert list(client.receipts(timeout=1.0)) == []  # exactly one receipt each
    assert queue_depth(queue) == (0, 1)
    assert status_rows(fleet)[PLAIN]["paused"] is False


def test_pool_restarted_while_paused_stays_paused(
    fleet: Fleet, prometheus: PrometheusServer, plain: TicketSystem, client: ReachClient
) -> None:
    queue = connector_queue(PLAIN).name
    try:
        assert reach(fleet, "pause", PLAIN).returncode == 0
        wait_for(lambda: queue_depth(queue)[1] == 0, 5, "the pool kept consuming after `reach pause`")
        ids = [client.publish(f"{PLAIN}.create_ticket", ticket_params()) for _ in range(3)]
        wait_for(lambda: queue_depth(queue) == (3, 0), 10, "the intents did not wait in the paused queue")
        restart_pool(fleet, prometheus, PLAIN)
        wait_for(lambda: status_rows(fleet)[PLAIN]["workers"] >= 1, 10, "the new pool never reported itself")
        time.sleep(2.0)
        assert plain.requests() == [], "intents were executed by a pool started while paused"
        assert queue_depth(queue) == (3, 0)
        assert status_rows(fleet)[PLAIN]["paused"] is True
    finally:
        assert reach(fleet, "resume", PLAIN).returncode == 0
    receipts = wait_receipts(client, ids, timeout=30)
    assert all(r.success for r in receipts.values()) and len(plain.requests("POST")) == 3


def test_pause_of_an_unknown_connector_is_a_usage_error(fleet: Fleet) -> None:
    done = reach(fleet, "pause", "no_such_connector")
    assert done.returncode == 2 and "no connector named" in done.stderr


# --------------------------------------------------------------------------- probes


def test_probes_answer_on_router_pools_and_beat(fleet: Fleet) -> None:
    for name in ("router", *POOLS, "beat"):
        port = fleet.metrics_port(name)
        status, body, _ = probe(port, "/healthz")
        assert status == 200 and body.startswith(b"ok"), (name, status, body)
        status, body, _ = probe(port, "/readyz")
        assert status == 200 and body.startswith(b"ready"), (name, status, body)
        status, body, content_type = probe(port, "/metrics")
        assert status == 200 and content_type.startswith("text/plain") and b"# TYPE" in body, name
        assert probe(port, "/nope")[0] == 404
        assert probe(port, "/healthz?verbose=1")[0] == 200
