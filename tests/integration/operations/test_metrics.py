"""Prometheus metrics through a running fleet: counted by a real Prometheus server, checked by promtool, and the Grafana dashboard's queries."""

from __future__ import annotations

import json
import re
import time

from kombu import Connection
from prometheus_client.parser import text_string_to_metric_families

from examples.ticket_system import TicketSystem
from producers.client import ReachClient
from tests.fleet import BROKER_URL, REPO, Fleet, agent, purge
from tests.integration.operations.support import (
    ALLOWED_LABELS,
    CREATE,
    DASHBOARD,
    HEX_ID,
    POOLS,
    QUERY,
    RUN,
    TRACED,
    Key,
    delta,
    direct_scrape,
    direct_sum,
    dlq_depth,
    settled,
    ticket_params,
    wait_receipts,
)
from tests.integration.prometheus_server import PrometheusServer, promtool_check_metrics
from tests.waiting import wait_for
from workers.transport.topology import DEFAULT_EXCHANGE, DLQ, INTENTS_EXCHANGE, connector_queue

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
        "reach_binding_sweeps",
        "reach_workflow_runs_started",
        "reach_workflow_runs",
        "reach_workflow_step_seconds",
        "reach_workflow_undos_failed",
        "reach_workflow_runs_in_flight",
    }
    # counters and histograms appear once they have a child; the gauges are there from the start
    assert {"reach_breaker_state", "reach_connector_health", "reach_queue_depth", "reach_queue_consumers"} <= names
    # prometheus_client also serves a `<counter or histogram>_created` gauge family for each of them
    ours = {n.removesuffix("_created") for n in names if n.startswith("reach_")}
    assert ours <= documented | {"reach_retries"}
    # and an operator finds each of them in the operations guide
    guide = (REPO / "docs" / "operations.md").read_text()
    assert not {name for name in documented if name not in guide}


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
