#!/usr/bin/env python
"""Fairness under a flood (issue "hostile input", item 10): does one agent's flood delay another?

    .venv/bin/python bench/fairness.py              # 3 repetitions, ~5 minutes
    .venv/bin/python bench/fairness.py --reps 1 --flood 1500

Agent B (``bench_agent``) sends one valid intent every 50 ms and times each receipt (publish ->
receipt at B). Meanwhile agent A (``flood_agent``) publishes, as fast as the broker confirms:

    none     nothing (B's baseline)
    valid    3,000 valid intents; A's binding is limited to 10/s, so nearly all are answered
             RATE_LIMITED by the router itself
    invalid  3,000 unparsable bodies carrying an ``agent_id`` header (INVALID_INTENT, dead letters)

B's figures count the intents B sent between A's first publish and A's last receipt. Each
repetition runs both routers on the same machine state, one after the other:

    fifo     REACH_ROUTER_FAIR=0, REACH_ROUTER_PREFETCH=32 — the router before fair lanes
    fair     the defaults: a lane per sender, prefetch 2,000, REACH_ROUTER_HOLD_BYTES 64 MiB

Everything on 127.0.0.1 in a RabbitMQ vhost and a redis-server of the run's own (bench/common.py);
results in bench/results/fairness.json, medians over the repetitions on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

import catalogs  # noqa: E402
from common import (
    PYTHON,
    RESULTS,
    Procs,
    Vhost,
    calibrate,
    ensure_services,
    fmt,
    loadavg,
    log,
    median,  # noqa: E402
    percentile,
    queue_state,
    scan_log,
    start_downstream,
    start_private_redis,
    table,
    tmpdir,
)
from reachfleet import ReachFleet  # noqa: E402

FLOODER = "flood_agent"
PROBE = catalogs.AGENT
PROBE_KEY = f"{PROBE}.fair"
MODES = {
    "fifo": {"REACH_ROUTER_FAIR": "0", "REACH_ROUTER_PREFETCH": "32"},
    "fair": {},
    # not run by default: how much a prefetch past the whole flood adds (--modes fifo,fair,fair-p5000)
    "fair-p5000": {"REACH_ROUTER_PREFETCH": "5000"},
}
SCENARIOS = ("none", "valid", "invalid")


def catalog(endpoint: str) -> str:
    flood_binding = f"""\
agent_app:
  name: {FLOODER}
  connector_bindings:
    - connector: {catalogs.FAST}
      allowed_actions: [create_ticket]
      rate_limit: 10/sec
      audit_level: full
"""
    return "---\n".join(
        [
            catalogs._connector(catalogs.FAST, endpoint, catalogs.CREATE_TICKET.format(timeout="5s")),
            catalogs._agent(PROBE, [(catalogs.FAST, ["create_ticket"])]),
            flood_binding,
        ]
    )


# -- AMQP, plain py-amqp (as an agent in any language would publish) -----------------------------


def _connect(broker_url: str) -> Any:
    import amqp

    parts = urlsplit(broker_url)
    conn = amqp.Connection(
        host=f"{parts.hostname or '127.0.0.1'}:{parts.port or 5672}",
        userid=unquote(parts.username or "guest"),
        password=unquote(parts.password or "guest"),
        virtual_host=unquote(parts.path[1:]) if parts.path not in ("", "/") else "/",
        connect_timeout=10,
        heartbeat=0,
    )
    conn.connect()
    return conn


def _drain(conn: Any, timeout: float) -> None:
    try:
        conn.drain_events(timeout=max(timeout, 0.0001))
    except TimeoutError:
        pass


def flood_child(broker_url: str, kind: str, n: int, timeout: float) -> None:
    """A's process: publish ``n`` intents (confirmed, 256 in flight), then wait for their receipts.
    Prints one JSON line: wall times of the first publish, the last confirm and the last receipt."""
    import amqp

    conn = _connect(broker_url)
    ch = conn.channel()
    ch.auto_decode = False
    queue, _, _ = ch.queue_declare("", exclusive=True, auto_delete=True)
    ch.queue_bind(queue, exchange="reach.receipts", routing_key=FLOODER)
    got = {"n": 0, "last": 0.0}

    def on_receipt(_message: Any) -> None:
        got["n"] += 1
        got["last"] = time.time()

    ch.basic_consume(queue, callback=on_receipt, no_ack=True)
    ch.confirm_select()
    pending: set[int] = set()

    def on_ack(tag: int, multiple: bool) -> None:
        if multiple:
            pending.difference_update({t for t in pending if t <= tag})
        else:
            pending.discard(tag)

    ch.events["basic_ack"].add(on_ack)
    ch.events["basic_nack"].add(on_ack)
    run = uuid.uuid4().hex[:8]
    bodies = []
    for i in range(n):
        intent_id = f"flood-{run}-{i}"
        if kind == "valid":
            doc = {
                "intent_id": intent_id,
                "agent_id": FLOODER,
                "action": "create_ticket",
                "params": dict(catalogs.PARAMS, title=f"flood {i}"),
            }
            bodies.append((intent_id, json.dumps(doc, separators=(",", ":")).encode(), {}))
        else:
            bodies.append(
                (
                    intent_id,
                    b'{"action": "create_ticket", "params": {"title": ' + str(i).encode(),
                    {"agent_id": FLOODER},
                )
            )
    print(json.dumps({"event": "ready"}), flush=True)
    sys.stdin.readline()  # go
    t0 = time.time()
    for tag, (intent_id, body, headers) in enumerate(bodies, start=1):
        while len(pending) >= 256:
            _drain(conn, 1.0)
        ch.basic_publish(
            amqp.Message(
                body,
                content_type="application/json",
                content_encoding="utf-8",
                delivery_mode=2,
                message_id=intent_id,
                application_headers=headers,
            ),
            exchange="reach.intents",
            routing_key="intent",
        )
        pending.add(tag)
    deadline = time.time() + timeout
    while pending and time.time() < deadline:
        _drain(conn, 0.5)
    confirmed = time.time()
    while got["n"] < n and time.time() < deadline:
        _drain(conn, 0.5)
    print(
        json.dumps(
            {
                "event": "done",
                "start": t0,
                "confirmed": confirmed,
                "end": got["last"] or time.time(),
                "receipts": got["n"],
            }
        ),
        flush=True,
    )
    conn.close()


class Probe:
    """Agent B, in this process: one valid intent every ``interval`` seconds, receipts timed."""

    def __init__(self, broker_url: str) -> None:
        import amqp

        self.amqp = amqp
        self.conn = _connect(broker_url)
        self.ch = self.conn.channel()
        self.ch.auto_decode = False
        queue, _, _ = self.ch.queue_declare("", exclusive=True, auto_delete=True)
        self.ch.queue_bind(queue, exchange="reach.receipts", routing_key=PROBE_KEY)
        self.ch.basic_consume(queue, callback=self._on_receipt, no_ack=True)
        self.sent: dict[str, tuple[float, float]] = {}  # intent id -> (wall, perf_counter)
        self.latency_ms: dict[str, float] = {}
        self.to_router_ms: dict[str, float] = {}
        self.statuses: dict[str, int] = {}
        self.seq = 0

    def _on_receipt(self, message: Any) -> None:
        now = time.perf_counter()
        intent_id = message.properties.get("correlation_id")
        intent_id = intent_id.decode() if isinstance(intent_id, bytes) else intent_id
        if intent_id in self.sent and intent_id not in self.latency_ms:
            self.latency_ms[intent_id] = (now - self.sent[intent_id][1]) * 1000
            doc = json.loads(message.body)
            status = str(doc.get("status"))
            self.statuses[status] = self.statuses.get(status, 0) + 1
            try:  # publish -> the router took it (the receipt's received_at; one machine's clock)
                received = datetime.fromisoformat(str(doc["execution"]["received_at"]).replace("Z", "+00:00"))
                self.to_router_ms[intent_id] = round((received.timestamp() - self.sent[intent_id][0]) * 1000, 1)
            except (KeyError, TypeError, ValueError):
                pass

    def send_one(self) -> None:
        self.seq += 1
        intent_id = f"probe-{uuid.uuid4().hex[:8]}-{self.seq}"
        doc = {
            "intent_id": intent_id,
            "agent_id": PROBE,
            "action": "create_ticket",
            "params": dict(catalogs.PARAMS, title=f"probe {self.seq}"),
            "reply_to": PROBE_KEY,
        }
        self.sent[intent_id] = (time.time(), time.perf_counter())
        self.ch.basic_publish(
            self.amqp.Message(
                json.dumps(doc).encode(), content_type="application/json", delivery_mode=2, message_id=intent_id
            ),
            exchange="reach.intents",
            routing_key="intent",
        )

    def pace(self, interval: float, until: Any) -> None:
        """Send every ``interval`` s while ``until()`` is false, receipts read in between."""
        t0 = time.perf_counter()
        i = 0
        while not until():
            due = t0 + i * interval
            while (left := due - time.perf_counter()) > 0:
                _drain(self.conn, left)
            self.send_one()
            i += 1

    def settle(self, timeout: float) -> None:
        deadline = time.time() + timeout
        while len(self.latency_ms) < len(self.sent) and time.time() < deadline:
            _drain(self.conn, 0.2)

    def reset(self) -> None:
        self.sent.clear()
        self.latency_ms.clear()
        self.to_router_ms.clear()
        self.statuses.clear()

    def figures(self, start: float, end: float, timeout_ms: float) -> dict[str, Any]:
        chosen = [k for k, (wall, _) in self.sent.items() if start <= wall <= end]
        lat = [self.latency_ms.get(k, timeout_ms) for k in chosen]  # a lost receipt counts as the timeout
        return {
            "n": len(chosen),
            "missing": sum(1 for k in chosen if k not in self.latency_ms),
            "p50": percentile(lat, 50),
            "p95": percentile(lat, 95),
            "max": round(max(lat), 1) if lat else None,
            "statuses": dict(self.statuses),
            # (s after A's first publish, ms, of which ms before the router took it): where in
            # the flood the slow ones were, and whether they waited in the broker or the router
            "samples": [
                (round(self.sent[k][0] - start, 3), round(ms, 1), self.to_router_ms.get(k))
                for k, ms in zip(chosen, lat)
            ],
        }


def run_scenario(procs: Procs, broker_url: str, probe: Probe, scenario: str, flood_n: int) -> dict[str, Any]:
    probe.reset()
    if scenario == "none":
        t_end = time.time() + 4.0
        start = time.time()
        probe.pace(0.05, lambda: time.time() > t_end)
        probe.settle(30)
        return {**probe.figures(start, t_end, 30_000), "flood_s": None}
    child = procs.start(
        f"flood-{scenario}-{uuid.uuid4().hex[:4]}",
        [PYTHON, __file__, "--flood-child", scenario, "--flood", str(flood_n), "--broker", broker_url],
        stdout_pipe=True,
    )
    assert child.popen.stdout is not None and child.popen.stdin is not None
    ready = json.loads(child.popen.stdout.readline() or b"{}")
    assert ready.get("event") == "ready", child.log_text()[-2000:]
    # B runs alone for a second, then A floods; B goes on until A has all its receipts, plus a second
    probe_start = time.time()
    go_at = probe_start + 1.0
    state: dict[str, Any] = {"go": False, "done": None}
    os.set_blocking(child.popen.stdout.fileno(), False)
    buffer = b""

    def until() -> bool:
        nonlocal buffer
        now = time.time()
        if not state["go"] and now >= go_at:
            child.popen.stdin.write(b"go\n")  # type: ignore[union-attr]
            child.popen.stdin.flush()  # type: ignore[union-attr]
            state["go"] = True
        if state["go"] and state["done"] is None:
            chunk = child.popen.stdout.read()  # type: ignore[union-attr]
            if chunk:
                buffer += chunk
                if b"\n" in buffer:
                    state["done"] = json.loads(buffer.split(b"\n")[0])
                    state["stop_at"] = now + 1.0
        if state["done"] is not None and now >= state["stop_at"]:
            return True
        return now - probe_start > 180

    probe.pace(0.05, until)
    probe.settle(30)
    procs.stop(child.name, grace=5)
    done = state["done"] or {}
    if not done:
        raise RuntimeError(f"flood {scenario} did not finish: {child.log_text()[-2000:]}")
    figures = probe.figures(done["start"], done["end"], 30_000)
    return {
        **figures,
        "flood_s": round(done["end"] - done["start"], 2),
        "flood_receipts": done["receipts"],
        "flood_publish_s": round(done["confirmed"] - done["start"], 2),
    }


def wait_idle(broker_url: str, timeout: float = 120.0) -> None:
    t0 = time.time()
    while time.time() - t0 < timeout:
        ready, _ = queue_state(broker_url, "reach.intents")
        if ready == 0:
            time.sleep(1.0)
            return
        time.sleep(0.2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--flood", type=int, default=3000)
    parser.add_argument("--modes", default="fifo,fair")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--flood-child", choices=("valid", "invalid"), help=argparse.SUPPRESS)
    parser.add_argument("--broker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.flood_child:
        flood_child(args.broker, args.flood_child, args.flood, timeout=180)
        return
    modes = args.modes.split(",")
    scenarios = args.scenarios.split(",")
    shared_broker, _ = ensure_services()
    work = tmpdir("reach-fairness-")
    procs = Procs(work)
    vhost = Vhost(shared_broker, f"reach-fair-{uuid.uuid4().hex[:8]}").create()
    started = time.strftime("%Y-%m-%dT%H:%M:%S")
    meta = {
        "started": started,
        "nproc": os.cpu_count(),
        "load_start": loadavg(),
        "calibration_ms_start": calibrate(),
        "flood": args.flood,
        "reps": args.reps,
        "modes": {m: MODES[m] for m in modes},
    }
    results: dict[str, dict[str, list[dict[str, Any]]]] = {m: {s: [] for s in scenarios} for m in modes}
    logs: dict[str, Any] = {}
    try:
        redis_url, _ = start_private_redis(procs)
        endpoint, _ = start_downstream(procs)
        catalog_dir = catalogs.write(work / "catalog", catalog(endpoint))
        for rep in range(args.reps):
            for mode in modes if rep % 2 == 0 else list(reversed(modes)):
                fleet = ReachFleet(procs, catalog_dir, vhost.url, redis_url, prefix=f"{mode}{rep}")
                fleet.env.update(MODES[mode])
                fleet.start_pool(catalogs.FAST)
                fleet.start_router()
                fleet.wait_consuming("reach.intents")
                fleet.wait_consuming(f"reach.connector.{catalogs.FAST}")
                probe = Probe(vhost.url)
                try:
                    probe.pace(0.02, lambda: probe.seq >= 100)  # warm-up
                    probe.settle(30)
                    for scenario in scenarios:
                        wait_idle(vhost.url)
                        figures = run_scenario(procs, vhost.url, probe, scenario, args.flood)
                        results[mode][scenario].append(figures)
                        log(
                            f"rep {rep + 1} {mode:4} {scenario:7}: B p50 {figures['p50']} p95 {figures['p95']} "
                            f"max {figures['max']} ms (n {figures['n']}, missing {figures['missing']}); "
                            f"flood {figures.get('flood_s')} s"
                        )
                finally:
                    probe.conn.close()
                    logs[f"{mode}{rep}"] = scan_log(procs.items[f"{mode}{rep}-router"].log_text())
                    fleet.stop_all()
    finally:
        procs.stop_all()
        vhost.delete()
    meta.update(load_end=loadavg(), calibration_ms_end=calibrate())
    summary = {
        m: {s: {k: median([r[k] for r in results[m][s]]) for k in ("p50", "p95", "max", "flood_s")} for s in scenarios}
        for m in modes
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "fairness.json").write_text(
        json.dumps({"meta": meta, "summary": summary, "runs": results, "router_logs": logs}, indent=1)
    )
    rows = [
        [
            f"{m} / {s}",
            fmt(summary[m][s]["p50"]),
            fmt(summary[m][s]["p95"]),
            fmt(summary[m][s]["max"]),
            fmt(summary[m][s]["flood_s"], 2),
            " / ".join(fmt(r["p95"]) or "-" for r in results[m][s]),
        ]
        for m in modes
        for s in scenarios
    ]
    print(
        f"B's receipt latency (ms), medians of {args.reps}; flood of {args.flood}; load {meta['load_start']} -> "
        f"{meta['load_end']}, calibration {meta['calibration_ms_start']} -> {meta['calibration_ms_end']} ms"
    )
    print(table(["router / flood", "p50", "p95", "max", "flood s", "p95 of each rep"], rows))


if __name__ == "__main__":
    main()
