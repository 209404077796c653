"""``reach beat`` sweeps agents' exchange-to-exchange bindings on its own (REACH_BINDING_SWEEP_SECONDS),
so one an agent made lasts at most an interval; where rabbitmqctl cannot be run, the beat goes on
probing and says so (a warning and ``reach_binding_sweeps_total{outcome="failed"}``). Before, nothing
scheduled the sweep: the bindings stayed until an operator ran ``reach agent-user sweep-bindings``."""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator

import httpx
import pytest
from kombu import Connection

from tests.fleet import BROKER_URL, Fleet
from tests.waiting import wait_for
from workers.ops.agents import vhost_of
from workers.transport.topology import INTENTS_EXCHANGE, RECEIPTS_EXCHANGE, declare_all

INTERVAL = 3
KEY = f"sweep_{uuid.uuid4().hex[:8]}.nobody"  # no receipt is ever routed with it
VHOST = vhost_of(BROKER_URL)


@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    with Connection(BROKER_URL) as conn:
        declare_all(conn, [])
    running = Fleet("", [])
    try:
        running.start_process("beat", ["beat"], {"REACH_BINDING_SWEEP_SECONDS": str(INTERVAL)})
        running.start_process(
            "beat_without_rabbitmqctl",
            ["beat"],
            {"REACH_BINDING_SWEEP_SECONDS": "1", "REACH_RABBITMQCTL": "/nonexistent/rabbitmqctl"},
        )
        yield running
    finally:
        running.stop()


def exchange_bindings() -> list[str]:
    listed = subprocess.run(
        [
            "rabbitmqctl", "list_bindings", "--vhost", VHOST, "--silent", "--formatter", "json",
            "source_name", "destination_kind", "routing_key",
        ],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    return [
        b["routing_key"]
        for b in json.loads(listed.stdout or "[]")
        if b["source_name"] == RECEIPTS_EXCHANGE.name and b["destination_kind"] == "exchange"
    ]


def sweeps(fleet: Fleet, name: str, outcome: str) -> float:
    try:
        text = httpx.get(f"http://127.0.0.1:{fleet.metrics_port(name)}/metrics", timeout=5).text
    except httpx.TransportError:
        return 0.0
    prefix = f'reach_binding_sweeps_total{{outcome="{outcome}"}} '
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefix))


def test_the_beat_removes_an_exchange_binding_within_its_interval(fleet: Fleet) -> None:
    wait_for(lambda: sweeps(fleet, "beat", "swept") >= 1, INTERVAL + 60, "the beat never swept")
    with Connection(BROKER_URL) as conn:
        conn.default_channel.exchange_bind(INTENTS_EXCHANGE.name, RECEIPTS_EXCHANGE.name, KEY)
    assert KEY in exchange_bindings()
    # the next sweep starts at most one interval later; rabbitmqctl itself takes a few seconds
    wait_for(lambda: KEY not in exchange_bindings(), 2 * INTERVAL + 60, "the binding outlived the sweeps")
    assert fleet.procs["beat"].poll() is None


def test_a_beat_that_cannot_run_rabbitmqctl_warns_counts_and_goes_on_probing(fleet: Fleet) -> None:
    name = "beat_without_rabbitmqctl"
    wait_for(lambda: sweeps(fleet, name, "failed") >= 2, 30, "no failed sweep was counted")
    assert fleet.procs[name].poll() is None, fleet.log(name)[-1500:]
    assert httpx.get(f"http://127.0.0.1:{fleet.metrics_port(name)}/healthz", timeout=5).status_code == 200
    assert "agents' exchange bindings not swept" in fleet.log(name)
    assert sweeps(fleet, name, "swept") == 0
