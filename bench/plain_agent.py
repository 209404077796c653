"""A plain agent, written from docs/contract.md alone, as someone outside the project would write
one: pika, one publisher confirm awaited per publish, one receipt consumer on a connection of its
own. It imports nothing of agent-reach (the wire format is built here by hand); only the harness
protocol and the figures' arithmetic come from bench/agent.py, so both agents report alike.

Driven by the harness exactly as bench/agent.py is (JSON lines on stdin/stdout; its "http" command
is not offered):

    -> {"cmd": "amqp", "broker_url": ..., "exchange": ..., "routing_key": ..., "receipts_exchange": ...,
        "bind_key": "*.rfp"}
    -> {"cmd": "run", "mode": "burst"|"paced", "n": N, "rate": R, "timeout": S, "intent": {...}}
    <- {"event": "started"}, then {"event": "done", ...}
    -> {"cmd": "quit"}

What it does differently from bench/agent.py, on purpose: no pipelining of confirms (each
``basic_publish`` waits for its own), and receipts arrive on another thread (pika's
BlockingConnection is not thread-safe, so the consumer has its own connection), the way a simple
client that sends and listens at once is usually written.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent))

from agent import _emit, _steady_rate, _summary  # noqa: E402  (the harness's protocol and figures)


def _parameters(broker_url: str) -> Any:
    import pika

    parts = urlsplit(broker_url)
    vhost = unquote(parts.path[1:]) if parts.path not in ("", "/") else "/"
    credentials = pika.PlainCredentials(unquote(parts.username or "guest"), unquote(parts.password or "guest"))
    return pika.ConnectionParameters(
        host=parts.hostname or "127.0.0.1",
        port=parts.port or 5672,
        virtual_host=vhost,
        credentials=credentials,
        heartbeat=0,
        blocked_connection_timeout=60,
    )


class PlainAgent:
    def __init__(self, spec: dict[str, Any]) -> None:
        import pika

        self.pika = pika
        self.exchange = spec["exchange"]
        self.routing_key = spec["routing_key"]
        self.publisher = pika.BlockingConnection(_parameters(spec["broker_url"]))
        self.channel = self.publisher.channel()
        self.channel.confirm_delivery()  # basic_publish now returns once the broker confirmed it
        self.lock = threading.Lock()
        self.arrivals: dict[str, list[float]] = {}
        self.sent_at: dict[str, float] = {}
        self.statuses: dict[str, int] = {}
        self.codes: dict[str, int] = {}
        self.stray = 0
        self.nacked = 0
        self.listening = threading.Event()
        self.consumer_error: str | None = None
        self.consumer = threading.Thread(target=self._consume, args=(spec,), daemon=True)
        self.consumer.start()
        if not self.listening.wait(30):
            raise RuntimeError(f"the receipt consumer did not start: {self.consumer_error}")

    # -- the receipt consumer, on its own thread and connection ---------------------------------

    def _consume(self, spec: dict[str, Any]) -> None:
        try:
            self.listener = self.pika.BlockingConnection(_parameters(spec["broker_url"]))
            channel = self.listener.channel()
            queue = channel.queue_declare("", exclusive=True, auto_delete=True).method.queue
            channel.queue_bind(queue, spec["receipts_exchange"], routing_key=spec["bind_key"])
            channel.basic_consume(queue, self._on_receipt, auto_ack=True)
            self.listen_channel = channel
            self.listening.set()
            channel.start_consuming()
        except Exception as exc:  # the run reports missing receipts; the reason goes to stderr
            self.consumer_error = f"{type(exc).__name__}: {exc}"
            print(f"plain agent: receipt consumer stopped: {self.consumer_error}", file=sys.stderr)

    def _on_receipt(self, channel: Any, method: Any, properties: Any, body: bytes) -> None:
        now = time.perf_counter()
        if properties.type == "approval_pending":
            return  # a notice that the intent waits for a person; its receipt follows
        try:
            doc = json.loads(body)
        except ValueError:
            doc = {}
        intent_id = properties.correlation_id or (doc.get("intent_id") if isinstance(doc, dict) else None)
        with self.lock:
            if intent_id not in self.sent_at:
                self.stray += 1
                return
            self.arrivals.setdefault(intent_id, []).append(now)
            status = str(doc.get("status"))
            self.statuses[status] = self.statuses.get(status, 0) + 1
            error = doc.get("error")
            if isinstance(error, dict) and error.get("code"):
                self.codes[error["code"]] = self.codes.get(error["code"], 0) + 1

    # -- one phase --------------------------------------------------------------------------------

    def _publish(self, intent_id: str, body: bytes) -> None:
        properties = self.pika.BasicProperties(
            content_type="application/json", content_encoding="utf-8", delivery_mode=2, message_id=intent_id
        )
        with self.lock:
            self.sent_at[intent_id] = time.perf_counter()
        try:
            self.channel.basic_publish(self.exchange, self.routing_key, body, properties)
        except self.pika.exceptions.NackError:
            self.nacked += 1

    def run(self, cmd: dict[str, Any]) -> dict[str, Any]:
        n, mode = int(cmd["n"]), cmd["mode"]
        rate = float(cmd.get("rate") or 0)
        timeout = float(cmd.get("timeout", 60))
        spec = cmd["intent"]
        with self.lock:
            self.arrivals.clear()
            self.sent_at.clear()
            self.statuses.clear()
            self.codes.clear()
            self.stray = 0
        self.nacked = 0
        bodies = []
        for i in range(n):
            agent = spec["agents"][i % len(spec["agents"])]
            intent_id = f"{spec['id_prefix']}-{i}"
            intent = {
                "intent_id": intent_id,
                "agent_id": agent,
                "action": spec["action"],
                "params": dict(spec["params"], title=f"bench {i}"),
                "reply_to": f"{agent}.{spec['reply_suffix']}",
            }
            bodies.append((intent_id, json.dumps(intent).encode()))
        _emit({"event": "started"})
        cpu0, t0 = time.process_time(), time.perf_counter()
        for i, (intent_id, body) in enumerate(bodies):
            if mode == "paced":
                left = t0 + i / rate - time.perf_counter()
                if left > 0:
                    time.sleep(left)
            self._publish(intent_id, body)
        t_published = time.perf_counter()
        deadline = t_published + timeout
        while time.perf_counter() < deadline:
            with self.lock:
                if len(self.arrivals) >= n:
                    break
            time.sleep(0.01)
        time.sleep(float(cmd.get("grace", 0.3)))  # duplicates that trail the last receipt
        t_end = time.perf_counter()
        cpu = time.process_time() - cpu0
        with self.lock:
            firsts = {k: v[0] for k, v in self.arrivals.items()}
            latencies = [(firsts[k] - self.sent_at[k]) * 1000 for k in firsts]
            duplicates = sum(len(v) - 1 for v in self.arrivals.values())
            statuses, codes, stray = dict(self.statuses), dict(self.codes), self.stray
        last = max(firsts.values()) if firsts else t_end
        return {
            "event": "done",
            "n": n,
            "mode": mode,
            "rate": rate or None,
            "published": n,
            "unconfirmed": 0,  # each publish returned only once confirmed (or raised NackError)
            "nacked": self.nacked,
            "receipts": len(firsts),
            "missing": n - len(firsts),
            "duplicates": duplicates,
            "stray": stray,
            "statuses": statuses,
            "codes": codes,
            "publish_s": round(t_published - t0, 4),
            "confirm_s": round(t_published - t0, 4),
            "elapsed_s": round(last - t0, 4),
            "overall_rate": round(len(firsts) / (last - t0), 1) if firsts and last > t0 else None,
            "steady_rate": _steady_rate(list(firsts.values())),
            "publish_rate": round(n / (t_published - t0), 1) if t_published > t0 else None,
            "latency_ms": _summary(latencies),
            "agent_cpu_ms": round(cpu * 1000, 2),  # both threads: the process's CPU
            **({"samples_ms": [round(v, 3) for v in latencies]} if cmd.get("samples") else {}),
        }

    def close(self) -> None:
        try:
            self.publisher.close()
        except Exception:
            pass
        listener = getattr(self, "listener", None)
        if listener is not None and self.consumer.is_alive():
            try:  # the consumer's connection belongs to its thread: ask it to stop there
                listener.add_callback_threadsafe(self.listen_channel.stop_consuming)
                self.consumer.join(5)
                listener.close()
            except Exception:
                pass


def main() -> None:
    driver: PlainAgent | None = None
    for line in sys.stdin:
        if not line.strip():
            continue
        cmd = json.loads(line)
        try:
            if cmd["cmd"] == "amqp":
                if driver is not None:
                    driver.close()
                driver = PlainAgent(cmd)
                _emit({"event": "ready", "pid": os.getpid()})
            elif cmd["cmd"] == "run":
                assert driver is not None, "connect first"
                _emit(driver.run(cmd))
            elif cmd["cmd"] == "quit":
                break
            else:
                _emit({"event": "error", "error": f"the plain agent has no {cmd['cmd']!r} command"})
        except Exception as exc:
            import pika.exceptions

            lost = isinstance(exc, (OSError, pika.exceptions.AMQPConnectionError, pika.exceptions.ConnectionClosed))
            _emit({"event": "error", "error": f"{type(exc).__name__}: {exc}", "connection": lost})
    if driver is not None:
        driver.close()


if __name__ == "__main__":
    main()
