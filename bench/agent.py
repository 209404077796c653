"""The benchmark's agent: one process that publishes intents (or makes the direct HTTP calls) and
times every answer. Driven by the harness over stdin/stdout, one JSON object per line:

    -> {"cmd": "amqp", "broker_url": ..., "exchange": ..., "routing_key": ..., "receipts_exchange": ...,
        "bind_key": "*.r1"}                      connect, confirm mode, bind an exclusive receipt queue
    -> {"cmd": "http", "url": ...}               one httpx client (keep-alive) for the direct variant
    -> {"cmd": "run", "mode": "burst"|"paced", "n": N, "rate": R, "timeout": S, "intent": {...}}
    <- {"event": "started"}                      right before the first publish (the harness samples CPU)
    <- {"event": "done", ...figures...}
    -> {"cmd": "quit"}

AMQP side: plain py-amqp, publisher confirms pipelined (up to ``window`` unconfirmed, acks
handled as they arrive), persistent JSON messages exactly as an agent in any language would
send them. Latency is publish -> receipt delivered to this process (time.perf_counter()).
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any
from urllib.parse import unquote, urlsplit

# the agent's own CPU, all threads (py-amqp and httpx run on this one)
_cpu = time.process_time


def _emit(doc: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(doc) + "\n")
    sys.stdout.flush()


def _summary(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p90": None, "p99": None, "max": None, "mean": None}
    s = sorted(values)

    def pct(p: float) -> float:
        # nearest-rank percentile
        k = max(0, min(len(s) - 1, int(round(p / 100 * len(s) + 0.5)) - 1))
        return round(s[k], 3)

    return {"p50": pct(50), "p90": pct(90), "p99": pct(99), "max": round(s[-1], 3), "mean": round(sum(s) / len(s), 3)}


def _steady_rate(times: list[float]) -> float | None:
    """Receipts per second between the 10th and the 90th percentile arrival (warm-up and tail cut)."""
    if len(times) < 20:
        return None
    s = sorted(times)
    lo, hi = int(len(s) * 0.1), int(len(s) * 0.9)
    span = s[hi] - s[lo]
    return round((hi - lo) / span, 1) if span > 0 else None


class AmqpAgent:
    def __init__(self, spec: dict[str, Any]) -> None:
        import amqp

        parts = urlsplit(spec["broker_url"])
        vhost = unquote(parts.path[1:]) if parts.path not in ("", "/") else "/"
        self.conn = amqp.Connection(
            host=f"{parts.hostname or '127.0.0.1'}:{parts.port or 5672}",
            userid=unquote(parts.username or "guest"),
            password=unquote(parts.password or "guest"),
            virtual_host=vhost,
            connect_timeout=10,
            heartbeat=0,
        )
        self.conn.connect()
        self.amqp = amqp
        self.ch = self.conn.channel()
        self.ch.auto_decode = False
        self.ch.confirm_select()
        self.pending: set[int] = set()
        self.next_tag = 1
        self.nacked = 0
        self.ch.events["basic_ack"].add(self._on_ack)
        self.ch.events["basic_nack"].add(self._on_nack)
        self.exchange = spec["exchange"]
        self.routing_key = spec["routing_key"]
        queue, _, _ = self.ch.queue_declare("", exclusive=True, auto_delete=True)
        self.ch.queue_bind(queue, exchange=spec["receipts_exchange"], routing_key=spec["bind_key"])
        self.ch.basic_consume(queue, callback=self._on_receipt, no_ack=True)
        self.arrivals: dict[str, list[float]] = {}
        self.statuses: dict[str, int] = {}
        self.codes: dict[str, int] = {}
        self.stray = 0
        self.sent_at: dict[str, float] = {}
        self.sent_wall: dict[str, float] = {}
        self.arrived_wall: dict[str, float] = {}
        self.execution: dict[str, dict[str, Any]] = {}

    # -- callbacks, run inside drain_events -------------------------------------------------

    def _on_ack(self, tag: int, multiple: bool) -> None:
        if multiple:
            self.pending = {t for t in self.pending if t > tag}
        else:
            self.pending.discard(tag)

    def _on_nack(self, tag: int, multiple: bool) -> None:
        before = len(self.pending)
        self._on_ack(tag, multiple)
        self.nacked += before - len(self.pending)

    def _on_receipt(self, message: Any) -> None:
        now = time.perf_counter()
        if message.properties.get("type") == "approval_pending":
            return  # an approval notice (producers.wire.ApprovalNotice), not a receipt: one follows
        intent_id = message.properties.get("correlation_id")
        if isinstance(intent_id, bytes):
            intent_id = intent_id.decode()
        try:
            doc = json.loads(message.body)
        except ValueError:
            doc = {}
        if not intent_id:
            intent_id = doc.get("intent_id")
        if intent_id not in self.sent_at:
            self.stray += 1
            return
        if intent_id not in self.arrivals:
            self.arrived_wall[intent_id] = time.time()
            execution = doc.get("execution")
            if isinstance(execution, dict) and execution.get("received_at"):
                self.execution[intent_id] = execution
        self.arrivals.setdefault(intent_id, []).append(now)
        status = str(doc.get("status"))
        self.statuses[status] = self.statuses.get(status, 0) + 1
        error = doc.get("error")
        if isinstance(error, dict) and error.get("code"):
            self.codes[error["code"]] = self.codes.get(error["code"], 0) + 1

    # -- loop ---------------------------------------------------------------------------------

    def _drain(self, timeout: float) -> None:
        try:
            self.conn.drain_events(timeout=max(timeout, 0.0001))
        except TimeoutError:
            pass

    def _publish(self, intent_id: str, body: bytes) -> None:
        msg = self.amqp.Message(
            body, content_type="application/json", content_encoding="utf-8", delivery_mode=2, message_id=intent_id
        )
        self.sent_at[intent_id] = time.perf_counter()
        self.sent_wall[intent_id] = time.time()
        self.ch.basic_publish(msg, exchange=self.exchange, routing_key=self.routing_key)
        self.pending.add(self.next_tag)
        self.next_tag += 1

    def run(self, cmd: dict[str, Any]) -> dict[str, Any]:
        n, mode = int(cmd["n"]), cmd["mode"]
        rate = float(cmd.get("rate") or 0)
        window = int(cmd.get("window", 256))
        timeout = float(cmd.get("timeout", 60))
        wait_receipts = bool(cmd.get("wait_receipts", True))
        spec = cmd["intent"]
        agents = spec["agents"]
        prefix = spec["id_prefix"]
        suffix = spec["reply_suffix"]
        self.arrivals.clear()
        self.statuses.clear()
        self.codes.clear()
        self.sent_at.clear()
        self.sent_wall.clear()
        self.arrived_wall.clear()
        self.execution.clear()
        self.stray = 0
        self.nacked = 0
        # bodies built up front: the agent's per-intent work in the measured window is the publish
        bodies = []
        for i in range(n):
            agent = agents[i % len(agents)]
            intent_id = f"{prefix}-{i}"
            doc = {
                "intent_id": intent_id,
                "agent_id": agent,
                "action": spec["action"],
                "params": dict(spec["params"], title=f"bench {i}"),
                "reply_to": f"{agent}.{suffix}",
            }
            bodies.append((intent_id, json.dumps(doc, separators=(",", ":")).encode()))
        _emit({"event": "started"})
        cpu0, t0 = _cpu(), time.perf_counter()
        for i, (intent_id, body) in enumerate(bodies):
            if mode == "paced":
                due = t0 + i / rate
                while True:
                    left = due - time.perf_counter()
                    if left <= 0:
                        break
                    self._drain(left)
            while len(self.pending) >= window:
                self._drain(1.0)
            self._publish(intent_id, body)
        t_published = time.perf_counter()
        deadline = t_published + timeout
        while self.pending and time.perf_counter() < deadline:
            self._drain(0.5)
        t_confirmed = time.perf_counter()
        if wait_receipts:
            while len(self.arrivals) < n and time.perf_counter() < deadline:
                self._drain(min(0.5, deadline - time.perf_counter()))
            # a short grace period to catch duplicates that trail the last receipt
            grace_end = time.perf_counter() + float(cmd.get("grace", 0.3))
            while time.perf_counter() < grace_end:
                self._drain(grace_end - time.perf_counter())
        t_end = time.perf_counter()
        cpu = _cpu() - cpu0
        firsts = {k: v[0] for k, v in self.arrivals.items()}
        latencies = [(firsts[k] - self.sent_at[k]) * 1000 for k in firsts]
        arrival_times = list(firsts.values())
        last = max(arrival_times) if arrival_times else t_end
        duplicates = sum(len(v) - 1 for v in self.arrivals.values())
        return {
            "event": "done",
            "n": n,
            "mode": mode,
            "rate": rate or None,
            "published": len(self.sent_at),
            "unconfirmed": len(self.pending),
            "nacked": self.nacked,
            "receipts": len(firsts),
            "missing": n - len(firsts) if wait_receipts else None,
            "duplicates": duplicates,
            "stray": self.stray,
            "statuses": dict(self.statuses),
            "codes": dict(self.codes),
            "publish_s": round(t_published - t0, 4),
            "confirm_s": round(t_confirmed - t0, 4),
            "elapsed_s": round((last if firsts else t_end) - t0, 4),
            "overall_rate": round(len(firsts) / (last - t0), 1) if firsts and last > t0 else None,
            "steady_rate": _steady_rate(arrival_times),
            "publish_rate": round(n / (t_published - t0), 1) if t_published > t0 else None,
            "latency_ms": _summary(latencies),
            # the slowest intents: latency ms, sent at (s into the phase; a stall shows as a cluster),
            # and where the fleet says the time went (its receipt's queue_ms, downstream_ms, latency_ms)
            "slowest": sorted(
                (
                    (
                        round((firsts[k] - self.sent_at[k]) * 1000, 2),
                        round(self.sent_at[k] - t0, 3),
                        *[(self.execution.get(k) or {}).get(f) for f in ("queue_ms", "downstream_ms", "latency_ms")],
                    )
                    for k in firsts
                ),
                reverse=True,
            )[:8],
            "stages_ms": self._stages(),
            "agent_cpu_ms": round(cpu * 1000, 2),
            # every latency, when asked: percentiles over several phases pooled (bench/isolation.py)
            **({"samples_ms": [round(v, 3) for v in latencies]} if cmd.get("samples") else {}),
            # (s into the phase it was sent, latency ms) per intent in the order sent: latency over
            # time, for sliding windows (bench/recovery.py)
            **(
                {
                    "timeline": sorted(
                        (round(self.sent_at[k] - t0, 4), round((firsts[k] - self.sent_at[k]) * 1000, 3)) for k in firsts
                    )
                }
                if cmd.get("timeline")
                else {}
            ),
        }

    def _stages(self) -> dict[str, Any] | None:
        """Where the time went, from the receipts' own execution fields (the fleet's receipts):
        publish -> router read it, router -> receipt built (of which: waiting in the connector
        queue, calling the system), receipt built -> delivered here. Wall clocks of one machine;
        the receipt's ISO times have millisecond resolution."""
        from datetime import datetime

        if not self.execution:
            return None
        stages: dict[str, list[float]] = {
            "to_router": [],
            "in_fleet": [],
            "queue": [],
            "downstream": [],
            "to_agent": [],
        }
        for intent_id, ex in self.execution.items():
            try:
                received = datetime.fromisoformat(str(ex["received_at"]).replace("Z", "+00:00")).timestamp()
                finished = datetime.fromisoformat(str(ex["finished_at"]).replace("Z", "+00:00")).timestamp()
            except (KeyError, ValueError):
                continue
            stages["to_router"].append((received - self.sent_wall[intent_id]) * 1000)
            stages["to_agent"].append((self.arrived_wall[intent_id] - finished) * 1000)
            if ex.get("latency_ms") is not None:
                stages["in_fleet"].append(float(ex["latency_ms"]))
            if ex.get("queue_ms") is not None:
                stages["queue"].append(float(ex["queue_ms"]))
            if ex.get("downstream_ms") is not None:
                stages["downstream"].append(float(ex["downstream_ms"]))
        return {k: _summary(v) for k, v in stages.items() if v}


class HttpAgent:
    """The floor: the same HTTP call, made directly with one httpx client (keep-alive)."""

    def __init__(self, spec: dict[str, Any]) -> None:
        import httpx

        self.client = httpx.Client(
            timeout=10.0, trust_env=False, limits=httpx.Limits(max_connections=1, max_keepalive_connections=1)
        )
        self.url = spec["url"]

    def run(self, cmd: dict[str, Any]) -> dict[str, Any]:
        n, mode = int(cmd["n"]), cmd["mode"]
        rate = float(cmd.get("rate") or 0)
        params = cmd["intent"]["params"]
        payloads = [json.dumps(dict(params, title=f"bench {i}"), separators=(",", ":")).encode() for i in range(n)]
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        latencies: list[float] = []
        done: list[float] = []
        errors = 0
        _emit({"event": "started"})
        cpu0, t0 = _cpu(), time.perf_counter()
        for i, body in enumerate(payloads):
            if mode == "paced":
                left = t0 + i / rate - time.perf_counter()
                if left > 0:
                    time.sleep(left)
            start = time.perf_counter()
            response = self.client.post(self.url, content=body, headers=headers)
            response.json()
            end = time.perf_counter()
            if response.status_code >= 400:
                errors += 1
            latencies.append((end - start) * 1000)
            done.append(end)
        t_end = time.perf_counter()
        cpu = _cpu() - cpu0
        return {
            "event": "done",
            "n": n,
            "mode": mode,
            "rate": rate or None,
            "receipts": n - errors,
            "missing": errors,
            "duplicates": 0,
            "statuses": {"succeeded": n - errors},
            "codes": {},
            "elapsed_s": round(t_end - t0, 4),
            "overall_rate": round(n / (t_end - t0), 1),
            "steady_rate": _steady_rate(done),
            "latency_ms": _summary(latencies),
            "agent_cpu_ms": round(cpu * 1000, 2),
        }


def _is_connection_error(exc: BaseException) -> bool:
    try:
        import amqp.exceptions as ae
    except ImportError:  # pragma: no cover
        return isinstance(exc, OSError)
    return isinstance(exc, (OSError, ae.ConnectionError, ae.RecoverableConnectionError, ae.ConnectionForced))


def main() -> None:
    driver: Any = None
    for line in sys.stdin:
        if not line.strip():
            continue
        cmd = json.loads(line)
        try:
            if cmd["cmd"] == "amqp":
                driver = AmqpAgent(cmd)
                _emit({"event": "ready", "pid": os.getpid()})
            elif cmd["cmd"] == "http":
                driver = HttpAgent(cmd)
                _emit({"event": "ready", "pid": os.getpid()})
            elif cmd["cmd"] == "run":
                _emit(driver.run(cmd))
            elif cmd["cmd"] == "quit":
                break
        except Exception as exc:  # the harness reports it (and reconnects when the broker went away)
            _emit({"event": "error", "error": f"{type(exc).__name__}: {exc}", "connection": _is_connection_error(exc)})
    if isinstance(driver, AmqpAgent):
        try:
            driver.conn.close()
        except Exception:
            pass


if __name__ == "__main__":
    main()
