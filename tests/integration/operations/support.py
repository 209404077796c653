"""What the operations tests share (tests/integration/operations/test_*.py): Prometheus metrics scraped by a real Prometheus server,
the Grafana dashboard's queries, W3C trace context and spans, the audit trail, `reach status`,
pause/resume, dead letters and the probes.

One fleet per test module: the router, a pool for ``ops_tickets`` and ``reach beat`` run with
``OTEL_TRACES_EXPORTER=console`` (spans are JSON lines on stdout); the pool for ``ops_plain``
runs without an OpenTelemetry SDK, the way most fleets run. Each connector calls its own
``examples.ticket_system.TicketSystem``. A Prometheus server (the Debian package's binary, our
own process and config) scrapes the router, both pools and beat every second.

Counts asked of Prometheus are differences from a baseline taken once Prometheus agrees with
a direct scrape, so the tests do not depend on each other or on the fleet's start-up probe.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from examples.ticket_system import TicketSystem
from producers.client import ReachClient
from producers.wire import Receipt
from tests.fleet import REDIS_URL, REPO, Fleet, agent, purge, queue_depth
from tests.integration.prometheus_server import PrometheusServer, ensure_installed
from tests.waiting import wait_for
from workers.state import keys
from workers.transport.topology import DLQ, connector_queue

RUN = uuid.uuid4().hex[:8]
SECRET = f"+1-555-0199-{RUN}"  # the value of a `sensitive: true` param: must never be kept anywhere
DASHBOARD = REPO / "examples" / "grafana" / "agent-reach-dashboard.json"

CATALOG = """
connector:
  name: ops_tickets
  endpoint: {tickets}
  health: {{ path: GET /health, interval: 1s }}
  breaker: {{ fail_max: 50, reset_timeout: 5s }}
  retry: {{ max_attempts: 3, initial_backoff: 20ms, max_backoff: 100ms }}
  actions:
    - action: create_ticket
      description: Create a new ticket
      path: POST /tickets
      input:
        title: {{ type: string, required: true }}
        description: {{ type: string, required: true }}
        phone: {{ type: string, sensitive: true, description: The reporter's phone number }}
      permission: write
      idempotent: false
    - action: query_ticket
      description: Get a ticket by its id
      path: GET /tickets/{{tid}}
      input:
        tid: {{ type: string, required: true }}
      permission: read
      idempotent: true
---
connector:
  name: ops_plain
  endpoint: {plain}
  health: {{ path: GET /health, interval: 1s }}
  breaker: {{ fail_max: 50, reset_timeout: 5s }}
  retry: {{ max_attempts: 3, initial_backoff: 20ms, max_backoff: 100ms }}
  actions:
    - action: create_ticket
      path: POST /tickets
      input:
        title: {{ type: string, required: true }}
        description: {{ type: string, required: true }}
      permission: write
    - action: query_ticket
      path: GET /tickets/{{tid}}
      input:
        tid: {{ type: string, required: true }}
      permission: read
      idempotent: true
---
agent_app:
  name: ops_agent
  connector_bindings:
    - connector: ops_tickets
      allowed_actions: ["*"]
    - connector: ops_plain
      allowed_actions: ["*"]
---
agent_app:
  name: ops_reader
  connector_bindings:
    - connector: ops_tickets
      allowed_actions: [query_ticket]
---
agent_app:
  name: ops_summary
  connector_bindings:
    - connector: ops_tickets
      allowed_actions: ["*"]
      audit_level: summary
---
agent_app:
  name: ops_silent
  connector_bindings:
    - connector: ops_tickets
      allowed_actions: ["*"]
      audit_level: none
"""

TRACED, PLAIN = "ops_tickets", "ops_plain"  # pool with the console span exporter / without any SDK
POOLS = (TRACED, PLAIN)
CREATE, QUERY = f"{TRACED}.create_ticket", f"{TRACED}.query_ticket"
ALLOWED_LABELS = {"__name__", "job", "instance", "connector", "action", "code", "outcome", "format", "status", "le"}
ALLOWED_LABELS |= {"kept", "reason"}  # the dead-letter counters' (bounded: docs/operations.md, Metrics)
HEX_ID = re.compile(r"^[0-9a-f]{16,}$")


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="session")
def prometheus_installed() -> None:
    ensure_installed()


@pytest.fixture(scope="module")
def systems() -> Iterator[dict[str, TicketSystem]]:
    running = {TRACED: TicketSystem().start(), PLAIN: TicketSystem().start()}
    yield running
    for system in running.values():
        system.stop()


@pytest.fixture(scope="module")
def fleet(systems: dict[str, TicketSystem]) -> Iterator[Fleet]:
    running = Fleet(
        CATALOG.format(tickets=systems[TRACED].url, plain=systems[PLAIN].url),
        [TRACED],
        env={"OTEL_TRACES_EXPORTER": "console"},
    )
    control = redis.Redis.from_url(REDIS_URL)
    control.delete(*(keys.paused(c) for c in POOLS))
    try:
        running.start()
        purge(connector_queue(PLAIN).name)
        running.start_process(PLAIN, ["worker", PLAIN], extra_env={"OTEL_TRACES_EXPORTER": "none"})
        running.wait_consuming(connector_queue(PLAIN).name)
        running.start_process("beat", ["beat"])
        wait_for(lambda: probe(running.metrics_port("beat"), "/readyz")[0] == 200, 30, "beat did not get ready")
        wait_for(
            lambda: all(probe(running.metrics_port(n), "/readyz")[0] == 200 for n in ("router", *POOLS)),
            30,
            "router and pools did not get ready",
        )
        yield running
    finally:
        control.delete(*(keys.paused(c) for c in POOLS))
        running.stop()


@pytest.fixture(scope="module")
def prometheus(prometheus_installed: None, fleet: Fleet) -> Iterator[PrometheusServer]:
    server = PrometheusServer(
        {
            "reach-router": [fleet.metrics_port("router")],
            "reach-pool": [fleet.metrics_port(p) for p in POOLS],
            "reach-beat": [fleet.metrics_port("beat")],
        }
    )
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.fixture
def tickets(systems: dict[str, TicketSystem], fleet: Fleet) -> TicketSystem:
    systems[TRACED].state.reset()
    return systems[TRACED]


@pytest.fixture
def plain(systems: dict[str, TicketSystem], fleet: Fleet) -> TicketSystem:
    systems[PLAIN].state.reset()
    return systems[PLAIN]


@pytest.fixture
def client(fleet: Fleet) -> Iterator[ReachClient]:
    with agent("ops_agent") as reach:
        yield reach


# --------------------------------------------------------------------------- helpers


def probe(port: int, path: str) -> tuple[int, bytes, str]:
    """(status, body, content type) of GET http://127.0.0.1:port/path; 0 when nothing answers."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, response.read(), response.headers.get("Content-Type", "")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), exc.headers.get("Content-Type", "")
    except OSError:
        return 0, b"", ""


def reach(
    fleet: Fleet, *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """Run the `reach` CLI as an operator would, with the fleet's environment."""
    return subprocess.run(
        [sys.executable, "-m", "workers.cli", *args],
        env=dict(fleet.env, **(env or {})),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def status_rows(fleet: Fleet) -> dict[str, dict[str, Any]]:
    done = reach(fleet, "status", "--json")
    assert done.returncode == 0, done.stderr
    return {row["connector"]: row for row in json.loads(done.stdout)}


def log_lines(fleet: Fleet, *names: str) -> list[str]:
    """The complete lines of the processes' logs, one process after another."""
    return [line for name in names for line in fleet.log_lines(name)]


def audit_events(fleet: Fleet, intent_id: str) -> list[dict[str, Any]]:
    """The audit lines about one intent on the stdout of the router and the pools, by time."""
    found = []
    for line in log_lines(fleet, "router", *POOLS):
        if line.startswith("{") and '"reach.audit"' in line and intent_id in line:
            doc = json.loads(line)
            if doc.get("event") == "reach.audit" and doc.get("intent_id") == intent_id:
                found.append(doc)
    return sorted(found, key=lambda d: d["ts"])


def spans(fleet: Fleet, name: str) -> list[dict[str, Any]]:
    """The console exporter's spans (one JSON object per line, starting with {"name")."""
    return [json.loads(line) for line in log_lines(fleet, name) if line.startswith('{"name"')]


def new_traceparent() -> tuple[str, str, str]:
    trace_id, span_id = uuid.uuid4().hex, uuid.uuid4().hex[:16]
    return f"00-{trace_id}-{span_id}-01", trace_id, span_id


def downstream_traceparents(system: TicketSystem, path: str) -> list[tuple[str, str]]:
    """(trace id, span id) of the traceparent header of each request to ``path``."""
    found = []
    for request in system.requests():
        if request["path"] == path:
            header = request["headers"].get("traceparent", "")
            match = re.fullmatch(r"00-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}", header)
            assert match, f"no valid traceparent sent downstream: {header!r}"
            found.append((match.group(1), match.group(2)))
    return found


def ticket_params(**extra: Any) -> dict[str, Any]:
    return {"title": f"printer {uuid.uuid4().hex[:6]}", "description": "on fire", **extra}


def all_redis_text() -> str:
    """Every key and value in this run's Redis database, as text (to prove a value was never kept)."""
    client = redis.Redis.from_url(REDIS_URL)
    keys = list(client.scan_iter(count=1000))
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.type(key)
    kinds = pipe.execute()
    read = {
        b"string": lambda p, k: p.get(k),
        b"list": lambda p, k: p.lrange(k, 0, -1),
        b"hash": lambda p, k: p.hgetall(k),
        b"set": lambda p, k: p.smembers(k),
        b"zset": lambda p, k: p.zrange(k, 0, -1),
    }
    pipe = client.pipeline(transaction=False)
    for key, kind in zip(keys, kinds):
        read.get(kind, lambda p, k: p.exists(k))(pipe, key)
    return "\n".join(f"{key!r} {value!r}" for key, value in zip(keys, pipe.execute()))


def wait_receipts(reach_client: ReachClient, ids: list[str], timeout: float = 30) -> dict[str, Receipt]:
    return {intent_id: reach_client.wait(intent_id, timeout=timeout) for intent_id in ids}


# ----- metrics: the same aggregate from Prometheus and from a direct scrape

Key = tuple[str, ...]


def direct_scrape(fleet: Fleet, names: tuple[str, ...] = ("router", *POOLS, "beat")) -> dict[str, bytes]:
    out = {}
    for name in names:
        status, body, _ = probe(fleet.metrics_port(name), "/metrics")
        assert status == 200, f"{name} /metrics answered {status}"
        out[name] = body
    return out


def direct_sum(
    scrapes: dict[str, bytes], sample: str, by: tuple[str, ...], match: dict[str, str] | None = None
) -> dict[Key, float]:
    totals: dict[Key, float] = {}
    for body in scrapes.values():
        for family in text_string_to_metric_families(body.decode()):
            for s in family.samples:
                if s.name != sample or any(s.labels.get(k) != v for k, v in (match or {}).items()):
                    continue
                key = tuple(s.labels.get(label, "") for label in by)
                totals[key] = totals.get(key, 0.0) + s.value
    return totals


def prom_sum(
    prom: PrometheusServer, sample: str, by: tuple[str, ...], match: dict[str, str] | None = None
) -> dict[Key, float]:
    selector = ",".join(f'{k}="{v}"' for k, v in (match or {}).items())
    expr = f"sum by ({', '.join(by)}) ({sample}{{{selector}}})"
    return {tuple(row["metric"].get(label, "") for label in by): float(row["value"][1]) for row in prom.query(expr)}


# the aggregates the metrics test asserts on: (sample name, by labels, label match)
TRACKED: dict[str, tuple[str, tuple[str, ...], dict[str, str]]] = {
    "received": ("reach_intents_received_total", ("format",), {}),
    "rejected": ("reach_intents_rejected_total", ("code",), {}),
    "dispatched": ("reach_intents_dispatched_total", ("connector",), {}),
    "executed": ("reach_actions_executed_total", ("action", "outcome"), {"connector": TRACED}),
    "receipts": ("reach_receipts_published_total", ("status",), {}),
    "latency_count": ("reach_intent_latency_seconds_count", ("connector",), {"connector": TRACED}),
    "downstream_count": ("reach_downstream_call_seconds_count", ("connector",), {"connector": TRACED}),
    "queue_wait_count": ("reach_queue_wait_seconds_count", ("connector",), {"connector": TRACED}),
}


def settled(fleet: Fleet, prom: PrometheusServer, timeout: float = 20) -> dict[str, dict[Key, float]]:
    """Prometheus's view of TRACKED once it equals what the processes serve right now."""

    def agree() -> dict[str, dict[Key, float]] | None:
        scrapes = direct_scrape(fleet, ("router", *POOLS))
        seen = {name: prom_sum(prom, *spec) for name, spec in TRACKED.items()}
        same = all(seen[name] == direct_sum(scrapes, *spec) for name, spec in TRACKED.items())
        return seen if same else None

    return wait_for(agree, timeout, "Prometheus never caught up with the fleet's /metrics", every=0.5)


def delta(after: dict[Key, float], before: dict[Key, float]) -> dict[Key, float]:
    keys = set(after) | set(before)
    return {k: after.get(k, 0.0) - before.get(k, 0.0) for k in keys if after.get(k, 0.0) != before.get(k, 0.0)}


def dlq_depth() -> int:
    return queue_depth(DLQ.name)[0]
