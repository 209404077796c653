"""Operations through a running fleet: Prometheus metrics scraped by a real Prometheus server,
the Grafana dashboard's queries, W3C trace context and spans, the audit trail, `reach status`,
pause/resume, dead letters and the probes.

One fleet for the module: the router, a pool for ``ops_tickets`` and ``reach beat`` run with
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
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest
import redis
from kombu import Connection
from prometheus_client.parser import text_string_to_metric_families

from examples.ticket_system import TicketSystem
from producers.client import ReachClient
from producers.wire import Receipt
from tests.fleet import BROKER_URL, REDIS_URL, REPO, Fleet, agent, free_port, purge, queue_depth
from tests.integration.prometheus_server import PrometheusServer, ensure_installed, promtool_check_metrics
from tests.waiting import wait_for
from workers.observability.audit import params_digest
from workers.observability.redaction import REDACTED, REDACTED_HEADER
from workers.ops.fleet import list_dead_letters
from workers.state import keys
from workers.transport.topology import DEFAULT_EXCHANGE, DLQ, INTENTS_EXCHANGE, connector_queue

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
        [sys.executable, "-m", "workers.ops.cli", *args],
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


# --------------------------------------------------------------------------- metrics


def test_prometheus_counts_exactly_the_traffic_sent(
    fleet: Fleet, prometheus: PrometheusServer, tickets: TicketSystem, client: ReachClient
) -> None:
    before = settled(fleet, prometheus)
    ids: list[str] = []
    ids += [client.publish(CREATE, ticket_params()) for _ in range(7)]
    ids += [client.publish(CREATE, {"description": "no title"}) for _ in range(3)]  # VALIDATION_FAILED
    ids += [client.publish(QUERY, {"tid": "TK-9999"})]  # DOWNSTREAM_NOT_FOUND
    with agent("ops_reader") as reader:
        denied = [reader.publish(CREATE, ticket_params()) for _ in range(2)]  # PERMISSION_DENIED
        receipts = {**wait_receipts(client, ids), **wait_receipts(reader, denied)}
    codes = sorted((r.error.code if r.error else "ok") for r in receipts.values())
    assert codes == sorted(
        ["ok"] * 7 + ["VALIDATION_FAILED"] * 3 + ["DOWNSTREAM_NOT_FOUND"] + ["PERMISSION_DENIED"] * 2
    )

    expected = {
        "received": {("native",): 13},
        "rejected": {("VALIDATION_FAILED",): 3, ("PERMISSION_DENIED",): 2},
        "dispatched": {(TRACED,): 8},
        "executed": {("create_ticket", "succeeded"): 7, ("query_ticket", "DOWNSTREAM_NOT_FOUND"): 1},
        "receipts": {("succeeded",): 7, ("rejected",): 5, ("failed",): 1},
        "latency_count": {(TRACED,): 8},
        "downstream_count": {(TRACED,): 8},
        "queue_wait_count": {(TRACED,): 8},
    }

    def counted() -> dict[str, dict[Key, float]]:
        return {name: delta(now, before[name]) for name, now in settled(fleet, prometheus).items()}

    deadline = time.time() + 20
    while (got := counted()) != expected and time.time() < deadline:
        time.sleep(0.5)
    assert got == expected
    # the histogram counts every executed intent, no more
    executed = prometheus.query(f'sum(reach_actions_executed_total{{connector="{TRACED}"}})')[0]["value"][1]
    latency = prometheus.query(f'sum(reach_intent_latency_seconds_count{{connector="{TRACED}"}})')[0]["value"][1]
    assert executed == latency
    assert len(tickets.requests()) == 8  # 7 POST + 1 GET: rejections never reached the system
    depth = prometheus.query(f'reach_queue_depth{{connector="{TRACED}"}}')
    assert [float(row["value"][1]) for row in depth] == [0.0]
    assert {row["metric"]["connector"] for row in prometheus.query("reach_queue_depth")} == set(POOLS)

    # bounded labels: only the documented label names, and no intent id or trace id as a value
    used = set(receipts) | {r.execution.trace_id for r in receipts.values()}
    series = prometheus.api("series", **{"match[]": '{__name__=~"reach_.+"}'})
    assert series
    for labels in series:
        assert set(labels) <= ALLOWED_LABELS, labels
        values = {v for k, v in labels.items() if k not in ("__name__", "instance", "job")}
        assert not values & used, labels
        assert not any(HEX_ID.match(v) for v in values), labels


def test_promtool_check_metrics_passes_on_every_endpoint(fleet: Fleet, prometheus_installed: None) -> None:
    scrapes = direct_scrape(fleet)
    assert set(scrapes) == {"router", *POOLS, "beat"}
    for name, body in scrapes.items():
        checked = promtool_check_metrics(body)
        assert checked.returncode == 0 and not checked.stdout.strip() and not checked.stderr.strip(), (
            f"{name}: {checked.stdout!r} {checked.stderr!r}"
        )
    names = {f.name for body in scrapes.values() for f in text_string_to_metric_families(body.decode())}
    documented = {
        "reach_intents_received",
        "reach_intents_rejected",
        "reach_intents_dispatched",
        "reach_actions_executed",
        "reach_receipts_published",
        "reach_downstream_call_seconds",
        "reach_queue_wait_seconds",
        "reach_intent_latency_seconds",
        "reach_breaker_state",
        "reach_connector_health",
        "reach_queue_depth",
        "reach_queue_consumers",
        "reach_dead_letters",
        "reach_dead_letters_dropped",
        "reach_messages_dropped",
        "reach_approval_notices_lost",
        "reach_approvals_parked",
        "reach_approvals_pending",
        "reach_approvals_expiring_soon",
        "reach_approval_resends_held",
        "reach_http_connections_closed",
        "reach_pool_threads",
        "reach_pool_in_flight",
        "reach_pool_paused",
    }
    # counters and histograms appear once they have a child; the gauges are there from the start
    assert {"reach_breaker_state", "reach_connector_health", "reach_queue_depth", "reach_queue_consumers"} <= names
    # prometheus_client also serves a `<counter or histogram>_created` gauge family for each of them
    ours = {n.removesuffix("_created") for n in names if n.startswith("reach_")}
    assert ours <= documented | {"reach_retries"}


def test_dashboard_panels_have_unique_ids_and_do_not_overlap() -> None:
    doc = json.loads(DASHBOARD.read_text())
    panels = doc["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    boxes = []
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["w"] > 0 and grid["x"] + grid["w"] <= 24 and grid["h"] > 0, panel["title"]
        for other, (x, y, w, h) in boxes:
            apart = grid["x"] >= x + w or x >= grid["x"] + grid["w"] or grid["y"] >= y + h or y >= grid["y"] + grid["h"]
            assert apart, f"{panel['title']} overlaps {other}"
        boxes.append((panel["title"], (grid["x"], grid["y"], grid["w"], grid["h"])))
    for panel in panels:
        for target in panel.get("targets", []):
            assert target["expr"].strip() and target["refId"], panel["title"]


def test_every_dashboard_expression_returns_data_from_prometheus(
    fleet: Fleet, prometheus: PrometheusServer, tickets: TicketSystem, client: ReachClient
) -> None:
    doc = json.loads(DASHBOARD.read_text())
    assert doc["schemaVersion"] >= 36
    variables = {v["name"]: v for v in doc["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    connector_var = variables["connector"]
    assert connector_var["type"] == "query"
    query = connector_var["query"]["query"] if isinstance(connector_var["query"], dict) else connector_var["query"]
    assert query == "label_values(reach_queue_depth, connector)"
    panels = [p for p in doc["panels"] if p["type"] != "row"]
    titles = {p["title"] for p in panels}
    assert {
        "Throughput",
        "Rejections by code",
        "End-to-end latency p50 / p95 / p99",
        "Downstream call p99",
        "Queue wait p99",
        "Queue depth",
        "Consumers",
        "Breaker state",
        "Connector health",
        "Retries",
        "Actions by outcome",
        "Pool saturation",
        "Paused",
        "Dead letters",
    } <= titles
    for panel in panels:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"], panel["title"]

    # traffic that gives every panel a sample: a success, a rejection and a retried read
    tid = client.call(CREATE, ticket_params(), timeout=20).data["ticket_id"]
    assert client.call(CREATE, {"title": "no description"}, timeout=20).error.code == "VALIDATION_FAILED"
    tickets.state.fail_status, tickets.state.fail_count = 503, 1
    assert client.call(QUERY, {"tid": tid}, timeout=20).execution.attempts == 2
    # and for *Dead letters*: junk the router keeps until its sender is past its invalid allowance
    # (REACH_AGENT_INVALID_RATE, 20/s: then it keeps none), and a message on a pool's queue that is not a job
    purge(DLQ.name)
    flooder = f"ops_junk_{RUN}"  # not in the catalog: its allowance is its own, and no other test's
    junk_ids = [f"junk-flood-{n}-{RUN}" for n in range(60)]
    with agent(flooder) as junk_client:
        # no confirm per message: the 60 go out at once, faster than any box refills the allowance
        # (each still gets its receipt below, or the test fails)
        with Connection(BROKER_URL) as conn:
            producer = conn.Producer()
            for junk_id in junk_ids:
                producer.publish(
                    b"{junk",
                    exchange=INTENTS_EXCHANGE,
                    routing_key="intent",
                    message_id=junk_id,
                    headers={"agent_id": flooder},
                    content_type="application/json",
                    content_encoding="binary",
                )
            producer.publish(
                b"not a job",
                exchange=DEFAULT_EXCHANGE,
                routing_key=connector_queue(TRACED).name,
                message_id=f"nojob-{RUN}",
                content_type="application/json",
                content_encoding="binary",
            )
        codes = [r.error.code for r in wait_receipts(junk_client, junk_ids).values() if r.error]
    kept = codes.count("INVALID_INTENT")
    assert len(codes) == 60 and kept >= 20 and codes.count("RATE_LIMITED") == 60 - kept > 0, codes
    # the router's letters come after their receipts: once all are there none is left to arrive later
    wait_for(dlq_depth, 20, f"reach.dlq did not get {kept} + 1 dead letters", until=lambda n: n == kept + 1)
    purge(DLQ.name)
    # the pool counts the letter it wrote, as the router counts its own
    wait_for(
        lambda: direct_sum(direct_scrape(fleet, (TRACED,)), "reach_dead_letters_total", ("kept",)).get(("full",), 0),
        10,
        f"{TRACED} did not count the dead letter it wrote",
    )

    used = {m for p in panels for t in p["targets"] for m in re.findall(r"\b(reach_[a-z_]+)", t["expr"])}
    exposed = wait_for(
        lambda: set(prometheus.api("label/__name__/values")),
        10,
        f"the dashboard uses metric names the fleet does not expose: {sorted(used)}",
        every=0.5,
        until=lambda names: used <= names,
    )
    deadline = time.time() + 20
    for panel in panels:
        for target in panel["targets"]:
            expr = target["expr"].replace("$connector", TRACED).replace("$__rate_interval", "1m")
            for metric in re.findall(r"\b(reach_[a-z_]+)", expr):
                assert metric in exposed, f"{panel['title']}: {metric} is not exposed by the fleet"
            while not (rows := prometheus.query(expr)) and time.time() < deadline:
                time.sleep(0.5)  # rate() needs two scrapes of a new series
            assert rows, f"{panel['title']}: {expr} returned no data"
            if "$connector" in target["expr"]:
                assert {r["metric"].get("connector") for r in rows} == {TRACED}, (panel["title"], rows)

    # the value mappings cover every value the gauges can take
    mapped = {
        p["title"]: p["fieldConfig"]["defaults"]["mappings"][0]["options"]
        for p in panels
        if p["title"] in ("Breaker state", "Connector health")
    }
    assert {k: v["text"] for k, v in mapped["Breaker state"].items()} == {"0": "closed", "1": "half-open", "2": "open"}
    assert {k: v["text"] for k, v in mapped["Connector health"].items()} == {"1": "up", "0": "down", "-1": "unknown"}
    assert prometheus.values(f'reach_breaker_state{{connector="{TRACED}"}}', "connector") == {TRACED: 0.0}
    assert prometheus.values(f'reach_connector_health{{connector="{TRACED}"}}', "connector") == {TRACED: 1.0}


# --------------------------------------------------------------------------- tracing


@pytest.mark.parametrize("connector", POOLS)
def test_traceparent_is_continued_in_receipt_audit_and_every_downstream_attempt(
    fleet: Fleet, systems: dict[str, TicketSystem], client: ReachClient, connector: str
) -> None:
    system = systems[connector]
    system.state.reset()
    system.state.fail_status, system.state.fail_count = 503, 2
    traceparent, trace_id, _ = new_traceparent()
    receipt = client.call(f"{connector}.query_ticket", {"tid": "TK-0777"}, traceparent=traceparent, timeout=20)
    assert receipt.execution.trace_id == trace_id
    assert receipt.execution.attempts == 3 and receipt.error.code == "DOWNSTREAM_NOT_FOUND"
    sent = downstream_traceparents(system, "/tickets/TK-0777")
    assert [t for t, _ in sent] == [trace_id] * 3
    events = wait_for(
        lambda: audit_events(fleet, receipt.intent_id), 10, "audit lines missing", until=lambda found: len(found) >= 6
    )
    assert [e["stage"] for e in events] == ["received", "dispatched", "attempt", "attempt", "attempt", "receipt"]
    assert {e["trace_id"] for e in events} == {trace_id}


@pytest.mark.parametrize(
    "connector",
    [
        TRACED,
        PLAIN,
    ],
)
def test_each_downstream_attempt_is_a_new_span_of_the_same_trace(
    fleet: Fleet, systems: dict[str, TicketSystem], client: ReachClient, connector: str
) -> None:
    system = systems[connector]
    system.state.reset()
    system.state.fail_status, system.state.fail_count = 503, 2
    traceparent, trace_id, agent_span = new_traceparent()
    receipt = client.call(f"{connector}.query_ticket", {"tid": "TK-0778"}, traceparent=traceparent, timeout=20)
    assert receipt.execution.attempts == 3
    sent = downstream_traceparents(system, "/tickets/TK-0778")
    span_ids = [s for _, s in sent]
    assert len(sent) == 3 and len(set(span_ids)) == 3, sent
    assert agent_span not in span_ids  # each attempt is a child span, not the agent's own


@pytest.mark.parametrize("connector", POOLS)
def test_intent_without_traceparent_gets_a_fresh_trace_also_sent_downstream(
    fleet: Fleet, systems: dict[str, TicketSystem], client: ReachClient, connector: str
) -> None:
    system = systems[connector]
    system.state.reset()
    receipt = client.call(f"{connector}.query_ticket", {"tid": "TK-0779"}, timeout=20)
    trace_id = receipt.execution.trace_id
    assert re.fullmatch(r"[0-9a-f]{32}", trace_id) and trace_id != "0" * 32
    assert [t for t, _ in downstream_traceparents(system, "/tickets/TK-0779")] == [trace_id]
    events = wait_for(
        lambda: audit_events(fleet, receipt.intent_id), 10, "audit lines missing", until=lambda found: len(found) >= 4
    )
    assert {e["trace_id"] for e in events} == {trace_id}
    other = client.call(f"{connector}.query_ticket", {"tid": "TK-0779"}, timeout=20)
    assert other.execution.trace_id != trace_id  # a new trace per intent


def test_traceparent_amqp_header_is_continued(fleet: Fleet, tickets: TicketSystem, client: ReachClient) -> None:
    traceparent, trace_id, _ = new_traceparent()
    intent_id = f"hdr-{uuid.uuid4().hex[:10]}"
    body = {"intent_id": intent_id, "agent_id": "ops_agent", "action": QUERY, "params": {"tid": "TK-0780"}}
    client.publish_raw(
        json.dumps(body).encode(), headers={"agent_id": "ops_agent", "traceparent": traceparent}, message_id=intent_id
    )
    receipt = client.wait(intent_id, timeout=20)
    assert receipt.execution.trace_id == trace_id
    assert [t for t, _ in downstream_traceparents(tickets, "/tickets/TK-0780")] == [trace_id]


def test_console_exporter_emits_route_queue_wait_and_downstream_spans_on_the_trace(
    fleet: Fleet, tickets: TicketSystem, plain: TicketSystem, client: ReachClient
) -> None:
    traceparent, trace_id, _ = new_traceparent()
    receipt = client.call(CREATE, ticket_params(), traceparent=traceparent, timeout=20)
    assert receipt.success

    def on_trace(name: str) -> list[dict[str, Any]]:
        return [s for s in spans(fleet, name) if s["context"]["trace_id"] == f"0x{trace_id}"]

    pool_spans = wait_for(lambda: on_trace(TRACED), 10, "no pool spans", until=lambda found: len(found) >= 2)
    router_spans = wait_for(lambda: on_trace("router"), 10, "no router span")
    assert sorted(s["name"] for s in pool_spans) == ["reach.downstream_call", "reach.queue_wait"]
    assert [s["name"] for s in router_spans] == ["reach.route"]
    assert router_spans[0]["attributes"]["reach.connector"] == TRACED
    # the downstream's parent is the downstream_call span
    (call,) = [s for s in pool_spans if s["name"] == "reach.downstream_call"]
    ((_, sent_span),) = downstream_traceparents(tickets, "/tickets")
    assert call["context"]["span_id"] == f"0x{sent_span}"
    # without an SDK nothing is recorded: the plain pool prints no spans at all
    assert client.call(f"{PLAIN}.query_ticket", {"tid": "TK-1"}, traceparent=traceparent, timeout=20).error
    assert spans(fleet, PLAIN) == []


# --------------------------------------------------------------------------- audit


def test_one_audit_line_per_stage_with_a_redacted_params_digest(
    fleet: Fleet, tickets: TicketSystem, client: ReachClient
) -> None:
    traceparent, trace_id, _ = new_traceparent()
    params = ticket_params(phone=SECRET)
    receipt = client.call(CREATE, params, traceparent=traceparent, timeout=20)
    assert receipt.success
    assert tickets.requests("POST")[0]["body"]["phone"] == SECRET  # the value was real, and went downstream
    events = wait_for(
        lambda: audit_events(fleet, receipt.intent_id), 10, "audit lines missing", until=lambda found: len(found) >= 4
    )
    assert [e["stage"] for e in events] == ["received", "dispatched", "attempt", "receipt"]
    for event in events:
        assert (event["agent"], event["action"], event["connector"], event["trace_id"]) == (
            "ops_agent",
            "create_ticket",
            TRACED,
            trace_id,
        ), event
    received, dispatched, attempt, final = events
    assert received["process"] == dispatched["process"] == "router" and received["format"] == "native"
    assert attempt["process"] == final["process"] == f"pool:{TRACED}"
    assert dispatched["param_keys"] == ["description", "phone", "title"]
    assert dispatched["params_digest"] == params_digest(dict(params, phone=REDACTED))
    assert attempt["outcome"] == "ok" and attempt["http_status"] == 201 and attempt["downstream_ms"] > 0
    assert final["status"] == "succeeded" and final["latency_ms"] > 0 and final["attempts"] == 1
    # the digest is taken after redaction: another phone number gives the same digest
    again = client.call(CREATE, dict(params, phone="+1-555-0100"), timeout=20)
    other = wait_for(
        lambda: [e for e in audit_events(fleet, again.intent_id) if e["stage"] == "dispatched"],
        10,
        "no dispatched line",
    )
    assert other[0]["params_digest"] == dispatched["params_digest"]

    assert SECRET not in "\n".join(log_lines(fleet, "router", *POOLS, "beat"))
    assert SECRET not in all_redis_text()


def test_an_answered_intent_leaves_its_receipt_and_sent_mark_but_no_delivery_count(
    fleet: Fleet, tickets: TicketSystem, client: ReachClient
) -> None:
    """The delivery counter only matters until the receipt is out: kept for 24 h it was a fifth
    of the keys the fleet stores per intent."""
    receipt = client.call(CREATE, ticket_params(), timeout=20)
    assert receipt.success
    store = redis.Redis.from_url(REDIS_URL)
    agent = receipt.agent_id
    # the sent mark is written once the broker confirmed the receipt, just after the agent has it
    wait_for(lambda: store.exists(keys.sent(agent, receipt.intent_id)), 10, "no sent mark")
    assert store.exists(keys.receipt(agent, receipt.intent_id)) == 1
    assert store.exists(keys.deliveries(agent, receipt.intent_id)) == 0, "the delivery count outlived the receipt"


def test_rejected_intent_audit_lines_received_rejected_receipt(
    fleet: Fleet, tickets: TicketSystem, client: ReachClient
) -> None:
    traceparent, trace_id, _ = new_traceparent()
    receipt = client.call(CREATE, {"description": "no title", "phone": SECRET}, traceparent=traceparent, timeout=20)
    assert receipt.error.code == "VALIDATION_FAILED"
    events = wait_for(
        lambda: audit_events(fleet, receipt.intent_id), 10, "audit lines missing", until=lambda found: len(found) >= 3
    )
    assert [e["stage"] for e in events] == ["received", "rejected", "receipt"]
    assert all(
        e["process"] == "router"
        and e["trace_id"] == trace_id
        and e["agent"] == "ops_agent"
        and e["action"] == "create_ticket"
        and e["connector"] == TRACED
        for e in events
    ), events
    assert events[1]["code"] == "VALIDATION_FAILED"
    assert events[2]["status"] == "rejected" and events[2]["code"] == "VALIDATION_FAILED" and "latency_ms" in events[2]
    assert tickets.requests() == []
    assert SECRET not in "\n".join(log_lines(fleet, "router", *POOLS, "beat"))
    assert SECRET not in all_redis_text()


def test_rejected_intent_audit_line_has_a_redacted_params_digest(
    fleet: Fleet, tickets: TicketSystem, client: ReachClient
) -> None:
    params = {"description": "no title", "phone": SECRET}
    receipt = client.call(CREATE, params, timeout=20)
    events = wait_for(
        lambda: audit_events(fleet, receipt.intent_id), 10, "audit lines missing", until=lambda found: len(found) >= 3
    )
    (rejected,) = [e for e in events if e["stage"] == "rejected"]
    assert rejected["params_digest"] == params_digest(dict(params, phone=REDACTED))


def test_reach_trace_prints_the_stages_in_order_with_timings(
    fleet: Fleet, tickets: TicketSystem, client: ReachClient
) -> None:
    tickets.state.fail_status, tickets.state.fail_count = 503, 1
    receipt = client.call(QUERY, {"tid": "TK-0404"}, timeout=20)
    assert receipt.execution.attempts == 2
    done = wait_for(
        lambda: reach(fleet, "trace", receipt.intent_id),
        10,
        "reach trace never showed five stages",
        until=lambda run: run.stdout.count("\n") >= 5,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    parsed = parse_trace(done.stdout)
    stages = [stage for _, stage, _ in parsed]
    offsets = [offset for offset, _, _ in parsed]
    assert stages == ["received", "dispatched", "attempt", "attempt", "receipt"]
    assert offsets[0] == 0.0 and offsets == sorted(offsets), offsets
    assert f"trace_id={receipt.execution.trace_id}" in lines[0]
    assert "outcome=DOWNSTREAM_ERROR" in lines[2] and "attempt=2" in lines[3]
    assert "status=failed" in lines[4] and "code=DOWNSTREAM_NOT_FOUND" in lines[4]

    assert "agent ops_agent" in done.stderr  # found without --agent, and named
    chosen = reach(fleet, "trace", receipt.intent_id, "--agent", "ops_agent")
    assert chosen.returncode == 0 and chosen.stdout == done.stdout, chosen.stderr
    elsewhere = reach(fleet, "trace", receipt.intent_id, "--agent", "ops_reader")
    assert elsewhere.returncode == 1 and "no stages recorded" in elsewhere.stderr

    unknown = reach(fleet, "trace", f"never-{RUN}")
    assert unknown.returncode == 1 and "no stages recorded" in unknown.stderr


def test_reach_trace_of_an_intent_id_two_agents_used_names_both_and_each_has_its_own(
    fleet: Fleet, tickets: TicketSystem
) -> None:
    intent_id = f"shared-{RUN}"
    for agent_id, tid in (("ops_agent", "TK-0201"), ("ops_reader", "TK-0202")):
        with agent(agent_id) as reach_client:
            reach_client.publish(QUERY, {"tid": tid}, intent_id=intent_id)
            assert reach_client.wait(intent_id, timeout=20).agent_id == agent_id
    both = wait_for(
        lambda: reach(fleet, "trace", intent_id),
        10,
        "reach trace never saw both agents",
        until=lambda run: "ops_reader" in run.stderr,
    )
    assert both.returncode == 1 and "ops_agent, ops_reader" in both.stderr and "--agent" in both.stderr
    for agent_id, _tid in (("ops_agent", "TK-0201"), ("ops_reader", "TK-0202")):
        mine = wait_for(
            lambda: reach(fleet, "trace", intent_id, "--agent", agent_id),
            10,
            "no receipt stage",
            until=lambda run: "receipt" in run.stdout,
        )
        assert mine.returncode == 0, mine.stderr
        assert {f"agent={agent_id}"} == {
            word for line in mine.stdout.splitlines() for word in line.split() if word.startswith("agent=")
        }


def test_audit_level_summary_writes_only_the_receipt_and_none_writes_nothing(
    fleet: Fleet, tickets: TicketSystem
) -> None:
    seen: dict[str, list[str]] = {}
    for agent_id in ("ops_summary", "ops_silent"):
        with agent(agent_id) as reach_client:
            ok = reach_client.call(CREATE, ticket_params(), timeout=20)
            rejected = reach_client.call(CREATE, {"description": "no title"}, timeout=20)
        assert ok.success and rejected.error.code == "VALIDATION_FAILED"
        seen[agent_id] = [ok.intent_id, rejected.intent_id]
    time.sleep(1.0)  # any stray line would be written by now
    for intent_id in seen["ops_summary"]:
        events = wait_for(lambda: audit_events(fleet, intent_id), 10, "no receipt line under audit_level summary")
        assert [e["stage"] for e in events] == ["receipt"]
        assert [e["stage"] for e in json_trace("ops_summary", intent_id)] == ["receipt"]
    for intent_id in seen["ops_silent"]:
        assert audit_events(fleet, intent_id) == []
        assert json_trace("ops_silent", intent_id) == []
        assert reach(fleet, "trace", intent_id).returncode == 1
    summary = reach(fleet, "trace", seen["ops_summary"][0])
    assert summary.returncode == 0 and [stage for _, stage, _ in parse_trace(summary.stdout)] == ["receipt"]


def parse_trace(output: str) -> list[tuple[float, str, str]]:
    """`reach trace` lines: ``+<ms since the first stage> ms  <stage> <key=value ...>``."""
    parsed = []
    for line in output.splitlines():
        match = re.match(r"^\+\s*(-?[0-9.]+) ms\s+(\w+)\s*(.*)$", line)
        assert match, f"not a trace line: {line!r}"
        parsed.append((float(match.group(1)), match.group(2), match.group(3)))
    return parsed


def json_trace(agent_id: str, intent_id: str) -> list[dict[str, Any]]:
    return [json.loads(raw) for raw in redis.Redis.from_url(REDIS_URL).lrange(keys.trace(agent_id, intent_id), 0, -1)]


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


# --------------------------------------------------------------------------- dead letters


def dlq_depth() -> int:
    return queue_depth(DLQ.name)[0]


def publish_dead_letter(body: bytes, message_id: str, headers: dict[str, Any]) -> None:
    with Connection(BROKER_URL, transport_options={"confirm_publish": True}) as conn:
        conn.Producer().publish(
            body,
            exchange=DEFAULT_EXCHANGE,
            routing_key=DLQ.name,
            content_type="application/json",
            content_encoding="utf-8",
            delivery_mode=2,
            message_id=message_id,
            headers=headers,
        )


def publish_intent(body: bytes, message_id: str | None, headers: dict[str, Any]) -> None:
    with Connection(BROKER_URL, transport_options={"confirm_publish": True}) as conn:
        conn.Producer().publish(
            body,
            exchange=INTENTS_EXCHANGE,
            routing_key="intent",
            content_type="application/json",
            content_encoding="binary",
            delivery_mode=2,
            message_id=message_id,
            headers=headers,
        )


def test_dlq_list_shows_reason_agent_time_and_a_redacted_preview_without_removing(
    fleet: Fleet, tickets: TicketSystem, client: ReachClient
) -> None:
    purge(DLQ.name)
    not_json, wrong_shape, anonymous = (f"junk-{n}-{uuid.uuid4().hex[:8]}" for n in ("a", "b", "c"))
    publish_intent(b"{not json", not_json, {"agent_id": "ops_agent"})
    shaped = {"action": CREATE, "params": {"title": "t", "description": "d", "phone": SECRET}, "bogus": 1}
    publish_intent(json.dumps(shaped).encode(), wrong_shape, {"agent_id": "ops_agent"})
    publish_intent(b"garbage", anonymous, {})
    for intent_id in (not_json, wrong_shape):
        assert client.wait(intent_id, timeout=20).error.code == "INVALID_INTENT"
    wait_for(lambda: dlq_depth() == 3, 10, "the junk did not reach reach.dlq")

    listed = reach(fleet, "dlq", "list")
    assert listed.returncode == 0, listed.stderr
    # listing removes nothing (a quorum queue takes the returned letters back a moment after the CLI exits)
    wait_for(lambda: dlq_depth() == 3, 10, "`reach dlq list` removed dead letters")
    header, _, *rows = listed.stdout.splitlines()
    assert header.split() == ["message", "id", "received", "agent", "connector", "reason", "preview"]
    by_id = {row.split()[0]: row for row in rows}
    assert set(by_id) == {not_json, wrong_shape, anonymous}
    year = str(datetime.now().year)
    for message_id in (not_json, wrong_shape):
        assert "ops_agent" in by_id[message_id] and year in by_id[message_id]
    # unparsable bodies are kept without their content: the preview says so, with the size
    assert "JSON" in by_id[not_json] and "{not json" not in by_id[not_json] and "not kept: 9 bytes" in by_id[not_json]
    assert "bogus" in by_id[wrong_shape] and "garbage" not in by_id[anonymous] and "not kept: 7" in by_id[anonymous]
    assert SECRET not in listed.stdout
    # the table cuts the preview to its column; the full preview the CLI prints from is redacted too
    previews = {letter.message_id: letter.preview for letter in list_dead_letters(BROKER_URL)}
    assert f'"phone":"{REDACTED}"' in previews[wrong_shape] and SECRET not in "".join(previews.values())
    # a quorum queue takes returned messages back a moment after the channel has closed
    wait_for(lambda: dlq_depth() == 3, 10, "listing in-process removed dead letters")
    assert reach(fleet, "dlq", "list").stdout == listed.stdout  # and again: same letters, same order
    assert tickets.requests() == []
    wait_for(lambda: dlq_depth() == 3, 10, "the listed letters did not return before the next test purges")


@pytest.mark.parametrize("shape", ["router", "pool"])
def test_dlq_replay_of_an_executed_intent_does_not_execute_it_twice(
    fleet: Fleet, tickets: TicketSystem, client: ReachClient, shape: str
) -> None:
    purge(DLQ.name)
    intent_id = f"replay-{shape}-{uuid.uuid4().hex[:8]}"
    intent = {"intent_id": intent_id, "agent_id": "ops_agent", "action": CREATE, "params": ticket_params()}
    body = json.dumps(intent).encode()
    publish_intent(body, intent_id, {"agent_id": "ops_agent"})
    first = client.wait(intent_id, timeout=20)
    assert first.success and len(tickets.requests("POST")) == 1

    # as the router dead-letters an intent / as a pool dead-letters a job
    headers = {
        "x-reach-reason": "simulated",
        "x-reach-intent-id": intent_id,
        "x-reach-agent-id": "ops_agent",
        "x-reach-received-at": datetime.now().astimezone().isoformat(),
    }
    if shape == "pool":
        now = time.time()
        body = json.dumps(
            {
                "v": 1,
                **intent,
                "connector": TRACED,
                "action": "create_ticket",
                "idempotency_key": intent_id,
                "reply_to": "ops_agent",
                "deadline": None,
                "trace_id": first.execution.trace_id,
                "traceparent": None,
                "format": "native",
                "received_at": now,
                "dispatched_at": now,
            }
        ).encode()
        headers["x-reach-connector"] = TRACED
    publish_dead_letter(body, intent_id, headers)
    bystander = f"junk-{uuid.uuid4().hex[:8]}"
    publish_dead_letter(b"{junk", bystander, {"x-reach-reason": "not JSON", "x-reach-agent-id": "ops_agent"})
    wait_for(lambda: dlq_depth() == 2, 10, "the dead letters are not there")

    missing = reach(fleet, "dlq", "replay", "--id", f"nothing-{RUN}")
    assert missing.returncode == 1 and "not found" in missing.stdout
    # it took both and returned them unacked: a quorum queue has them back a moment later
    wait_for(lambda: dlq_depth() == 2, 10, "a replay that found nothing removed dead letters")

    replayed = reach(fleet, "dlq", "replay", "--id", intent_id)
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    assert "replayed 1 dead letter" in replayed.stdout
    wait_for(lambda: dlq_depth() == 1, 10, "the bystander did not return to reach.dlq")  # only that one left the queue
    again = client.wait(intent_id, timeout=20)
    assert again.success and again.execution.deduplicated is True
    assert again.data == first.data
    time.sleep(0.5)
    assert len(tickets.requests("POST")) == 1  # the idempotency key was kept: no second ticket
    assert dlq_depth() == 1
    assert [line.split()[0] for line in reach(fleet, "dlq", "list").stdout.splitlines()[2:]] == [bystander]
    wait_for(lambda: dlq_depth() == 1, 10, "the listed letter did not return before the next test purges")


def pool_letter(intent_id: str, connector: str, params: dict[str, Any]) -> tuple[bytes, dict[str, Any]]:
    """(body, headers) of a job dead-lettered by ``connector``'s pool, as ``PoolRuntime._dead_letter``
    writes it (the params as given: already redacted or not)."""
    now = time.time()
    job = {
        "v": 1,
        "intent_id": intent_id,
        "agent_id": "ops_agent",
        "connector": connector,
        "action": "create_ticket",
        "params": params,
        "idempotency_key": intent_id,
        "reply_to": "ops_agent",
        "deadline": None,
        "trace_id": uuid.uuid4().hex,
        "traceparent": None,
        "format": "native",
        "received_at": now,
        "dispatched_at": now,
    }
    headers = {
        "x-reach-reason": "delivered 6 times without finishing (a worker died each time)",
        "x-reach-intent-id": intent_id,
        "x-reach-agent-id": "ops_agent",
        "x-reach-connector": connector,
    }
    return json.dumps(job).encode(), headers


@pytest.mark.parametrize("written", ["with_header", "before_the_header"])
def test_dlq_replay_keeps_a_letter_whose_sensitive_params_were_redacted(
    fleet: Fleet, tickets: TicketSystem, client: ReachClient, written: str
) -> None:
    purge(DLQ.name)
    redacted_id, clean_id = (f"replay-{n}-{uuid.uuid4().hex[:8]}" for n in ("redacted", "clean"))
    body, headers = pool_letter(redacted_id, TRACED, ticket_params(phone=REDACTED))
    if written == "with_header":
        headers[REDACTED_HEADER] = "true"  # as pools mark it now; older letters only have the marker
    publish_dead_letter(body, redacted_id, headers)
    clean_body, clean_headers = pool_letter(clean_id, TRACED, ticket_params())
    publish_dead_letter(clean_body, clean_id, clean_headers)
    wait_for(lambda: dlq_depth() == 2, 10, "the dead letters are not there")

    done = reach(fleet, "dlq", "replay")
    assert done.returncode == 1, done.stdout + done.stderr
    assert (
        f"not replayed {redacted_id}: its sensitive params were redacted when it was dead-lettered; "
        "ask the agent to send the intent again"
    ) in done.stdout
    assert "replayed 1 dead letter(s); 1 kept in reach.dlq" in done.stdout and "not found" not in done.stdout
    # the other letter was replayed as before
    assert client.wait(clean_id, timeout=20).success
    # the redacted one stays (returned unacked: a quorum queue has it back a moment later), and asking
    # for it by id says the same, not "not found"
    wait_for(lambda: dlq_depth() == 1, 10, "the kept letter did not return to reach.dlq")
    assert [letter.message_id for letter in list_dead_letters(BROKER_URL)] == [redacted_id]
    wait_for(lambda: dlq_depth() == 1, 10, "listing in-process removed the kept letter")
    by_id = reach(fleet, "dlq", "replay", "--id", redacted_id)
    assert by_id.returncode == 1 and f"not replayed {redacted_id}:" in by_id.stdout
    assert "replayed 0 dead letter(s); 1 kept in reach.dlq" in by_id.stdout and "not found" not in by_id.stdout
    wait_for(lambda: dlq_depth() == 1, 10, "the replay by id did not return the kept letter")
    assert [letter.message_id for letter in list_dead_letters(BROKER_URL)] == [redacted_id]
    assert [r for r in client.receipts(timeout=1.0) if r.intent_id == redacted_id] == []
    assert len(tickets.requests("POST")) == 1  # only the clean letter's ticket
    assert all(REDACTED not in json.dumps(r, default=str) for r in tickets.requests())


def test_dlq_replay_sends_a_pool_job_as_the_router_does_and_it_runs_once(
    fleet: Fleet, plain: TicketSystem, client: ReachClient
) -> None:
    purge(DLQ.name)
    queue = connector_queue(PLAIN).name
    intent_id, raw_id = f"replay-wire-{uuid.uuid4().hex[:8]}", f"raw-{uuid.uuid4().hex[:8]}"
    params = ticket_params()
    body, headers = pool_letter(intent_id, PLAIN, params)
    publish_dead_letter(body, intent_id, headers)
    # a message that is not a job, as a pool dead-letters it (x-reach-queue, no x-reach-connector)
    raw = json.dumps([[json.loads(body)], {}, {}]).encode()
    publish_dead_letter(raw, raw_id, {"x-reach-reason": "not a reach.execute message", "x-reach-queue": queue})
    wait_for(lambda: dlq_depth() == 2, 10, "the dead letters are not there")
    try:
        assert reach(fleet, "pause", PLAIN).returncode == 0
        wait_for(lambda: queue_depth(queue)[1] == 0, 5, "the pool kept consuming after `reach pause`")
        done = reach(fleet, "dlq", "replay", "--id", intent_id, "--id", raw_id)
        assert done.returncode == 1, done.stdout + done.stderr
        # each once: the copy the router dead-letters again while the replay runs is left alone,
        # and the replay says the router refused it again instead of counting it as replayed
        assert "replayed 1 dead letter(s); 1 refused again by the router" in done.stdout
        assert f"not replayed {raw_id}: sent back, and refused again: INVALID_INTENT" in done.stdout
        # the job waits in the paused queue; the other went to the router, which dead-letters it again
        wait_for(lambda: queue_depth(queue) == (1, 0), 10, "the replayed job is not in the connector queue")
        wait_for(dlq_depth, 20, "the router did not dead-letter the replayed non-job again", until=lambda n: n == 1)
        assert [letter.message_id for letter in list_dead_letters(BROKER_URL)] == [raw_id]
        time.sleep(0.5)
        assert queue_depth(queue) == (1, 0)  # the non-job was never sent to the pool
        with Connection(BROKER_URL) as conn:
            channel = conn.channel()
            channel.auto_decode = False
            message = channel.basic_get(queue, no_ack=False)
            assert message is not None
            props, wire_headers = message.properties, message.properties["application_headers"]
            assert message.delivery_info["exchange"] == "reach.dispatch"
            assert props["delivery_mode"] == 2 and props["content_type"] == "application/json"
            assert wire_headers["task"] == "reach.execute" and wire_headers["id"].startswith(f"{intent_id}:")
            # protocol 2 as the router builds it: the params are in the body only
            assert wire_headers["argsrepr"] == "(job)" and wire_headers["kwargsrepr"] == "{}"
            assert params["title"] not in json.dumps(wire_headers, default=str)
            (job,), kwargs, _ = json.loads(message.body)
            assert job == json.loads(body) and kwargs == {}
            channel.close()  # unacked: back to the queue for the pool (a quorum queue: a moment later)
        wait_for(lambda: queue_depth(queue) == (1, 0), 10, "the job taken unacked did not return to the paused queue")
    finally:
        assert reach(fleet, "resume", PLAIN).returncode == 0
    receipt = client.wait(intent_id, timeout=30)
    assert receipt.success and not receipt.execution.deduplicated
    posts = plain.requests("POST")
    assert len(posts) == 1 and params["title"] in json.dumps(posts[0], default=str)
    assert [r for r in client.receipts(timeout=1.0) if r.intent_id == intent_id] == []  # exactly one receipt
    assert len(plain.requests("POST")) == 1


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
