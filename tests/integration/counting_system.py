"""The one fake downstream of the tests and the benchmarks: it counts what it *did*, not only what
it was asked.

Stdlib only. ``POST`` to any path (``/items`` in the tests, ``/tickets`` in the benchmarks) creates
an item from ``{"title": ...}`` and answers ``201 {"item_id", "title", "status"}``: every title and
every ``Idempotency-Key`` has an execution count, so a test can prove that no payload took effect
twice. A request carrying a key already executed answers the stored item without executing again
(checked after the delay, under the lock, so concurrent duplicates are deduplicated too).
``GET /items/{id}`` (any other GET) is an idempotent read, ``GET /health`` answers
``health_status``, ``GET /_stats`` the calls answered so far (``{"requests": n, "slow": m}``).
A path under ``/slow/`` answers after ``slow_seconds`` (a system that takes its time), give or take up
to ``slow_jitter``.

Faults are set on ``state``: ``delay`` (seconds before answering, so writes are in flight),
``fail_status``/``fail_count`` (answer that status, with ``Retry-After: retry_after`` when set,
instead of executing), and ``on_request`` (called with each recorded request before the delay,
e.g. to kill a pool while its request is in flight). ``in_flight`` counts requests being served.

In process (tests): ``CountingSystem().start()``; as a process of its own (bench/downstream.py):
``python tests/integration/counting_system.py [PORT] [--slow SECONDS] [--slow-jitter SECONDS]`` prints ``READY <port>``.
"""

from __future__ import annotations

import json
import random
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class CountingState:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.executions_by_title: Counter[str] = Counter()
        self.executions_by_key: Counter[str] = Counter()
        self.items_by_key: dict[str, dict[str, Any]] = {}
        self.items = 0
        self.in_flight = 0
        self.delay = 0.0
        self.fail_status = 0
        self.fail_count = 0
        self.retry_after: str | None = None
        self.health_status = 200
        self.slow_seconds = 2.0
        self.slow_jitter = 0.0  # each /slow/ call takes slow_seconds +- up to this (uniform)
        self.keep_requests = True  # False in a benchmark: only the counts are kept
        self.answered = self.slow_answered = 0
        self.on_request: Callable[[dict[str, Any]], None] | None = None


class _Handler(BaseHTTPRequestHandler):
    server: CountingSystem
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def log_message(self, *args: Any) -> None:
        pass

    def _send(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)
        except OSError:
            self.close_connection = True  # the caller is gone (killed, timed out, reset): the effect stays

    def _serve(self, body: Any) -> None:
        st = self.server.state
        path = urllib.parse.urlsplit(self.path).path
        title = body.get("title") if isinstance(body, dict) else None
        key = self.headers.get("Idempotency-Key")
        record = {"method": self.command, "path": path, "title": title, "key": key, "t": time.time(), "body": body}
        with st.lock:
            if st.keep_requests:
                st.requests.append(record)
            st.in_flight += 1
            hook, delay = st.on_request, st.delay
            if path.startswith("/slow/"):
                delay += st.slow_seconds + (random.uniform(-st.slow_jitter, st.slow_jitter) if st.slow_jitter else 0.0)
            fail = st.fail_status if st.fail_count > 0 else 0
            if fail:
                st.fail_count -= 1
            retry_after = st.retry_after
        try:
            if hook is not None:
                hook(record)
            if delay:
                time.sleep(delay)
            if fail:
                return self._send(
                    fail, {"detail": f"injected failure {fail}"}, {"Retry-After": retry_after} if retry_after else None
                )
            if self.command == "GET":
                return self._send(200, {"item_id": path.rsplit("/", 1)[-1], "status": "open"})
            if not isinstance(title, str) or not title:
                return self._send(422, {"detail": "title is required"})
            with st.lock:
                if key and key in st.items_by_key:
                    item = st.items_by_key[key]
                else:
                    st.items += 1
                    item = {"item_id": f"IT-{st.items:05d}", "title": title, "status": "open"}
                    st.executions_by_title[title] += 1
                    if key:
                        st.executions_by_key[key] += 1
                        st.items_by_key[key] = item
            return self._send(201, item)
        finally:
            with st.lock:
                st.in_flight -= 1
                st.answered += 1
                st.slow_answered += path.startswith("/slow/")

    def do_GET(self) -> None:  # noqa: N802
        path = urllib.parse.urlsplit(self.path).path
        if path == "/health":
            status = self.server.state.health_status
            return self._send(status, {"ok": status == 200})
        if path == "/_stats":
            st = self.server.state
            with st.lock:
                stats = {"requests": st.answered, "slow": st.slow_answered}
            return self._send(200, stats)
        self._serve(None)

    def do_POST(self) -> None:  # noqa: N802
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        self._serve(body)


class CountingSystem(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128

    def __init__(self, port: int = 0) -> None:
        super().__init__(("127.0.0.1", port), _Handler)
        self.state = CountingState()
        self._thread = threading.Thread(target=self.serve_forever, daemon=True, name="counting-system")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A caller killed mid-request is what these tests do on purpose: no traceback for it."""
        import sys

        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)

    def start(self) -> CountingSystem:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.shutdown()
        self.server_close()

    def requests(self, method: str | None = None, title: str | None = None) -> list[dict[str, Any]]:
        with self.state.lock:
            return [
                r
                for r in self.state.requests
                if (method is None or r["method"] == method) and (title is None or r["title"] == title)
            ]

    def executions(self) -> Counter[str]:
        """Executions per title (the side effects that really happened)."""
        with self.state.lock:
            return Counter(self.state.executions_by_title)

    def in_flight(self) -> int:
        with self.state.lock:
            return self.state.in_flight

    def catalog(self, connector: str, agent: str) -> str:
        """A catalog of one connector on this system, a pool of 2 threads and one write action,
        ``create_item`` (``title``), that ``agent`` may call."""
        return f"""
connector:
  name: {connector}
  endpoint: {self.url}
  pool: {{ concurrency: 2 }}
  actions:
    - action: create_item
      path: POST /items
      input:
        title: {{ type: string, required: true }}
      permission: write
      timeout: 5s
---
agent_app:
  name: {agent}
  connector_bindings:
    - connector: {connector}
      allowed_actions: ["*"]
"""


def main(argv: list[str] | None = None) -> None:
    """Serve on PORT (0: any free one) until killed; ``--slow S`` sets the /slow/ delay."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(description="the fake downstream of the tests and the benchmarks")
    parser.add_argument("port", nargs="?", type=int, default=0)
    parser.add_argument("--slow", type=float, default=2.0, help="seconds a call under /slow/ takes")
    parser.add_argument("--slow-jitter", type=float, default=0.0, help="+- this many seconds, uniform, per slow call")
    args = parser.parse_args(argv)
    system = CountingSystem(args.port)
    system.state.slow_seconds = args.slow
    system.state.slow_jitter = min(args.slow_jitter, args.slow)
    system.state.keep_requests = False
    print(f"READY {system.port}", flush=True)
    sys.stdout.flush()
    try:
        system.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
