"""A small ticket system: the 'real business system' behind the demo and the tests.

Stdlib only. POST /tickets creates a ticket (422 on a bad priority or a missing title),
GET /tickets/{id} reads one, GET /health answers 200. Every request is recorded so tests can
count what reached the system; POST /_control changes behaviour (delay, fail_status/fail_count).

    python -m workers.ops.demo_assets.ticket_system [PORT]   # prints its URL, serves until killed
    python examples/ticket_system.py [PORT]                  # the same, from a checkout
"""

from __future__ import annotations

import argparse
import json
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

PRIORITIES = ("low", "medium", "high")


class TicketState:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        self.tickets: dict[str, dict[str, Any]] = {}
        self.requests: list[dict[str, Any]] = []
        self.by_key: dict[str, dict[str, Any]] = {}
        self.delay = 0.0
        self.fail_status = 0
        self.fail_count = 0


class _Handler(BaseHTTPRequestHandler):
    server: TicketSystem
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def log_message(self, *args: Any) -> None:
        pass

    def _send(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _read_body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            return json.loads(raw) if raw else None
        except ValueError:
            return {"__raw__": raw.decode(errors="replace")}

    def _record(self, body: Any) -> bool:
        """Record the request; apply injected delay/failure. True when a failure was sent."""
        st = self.server.state
        with st.lock:
            st.requests.append(
                {
                    "method": self.command,
                    "path": self.path,
                    "body": body,
                    "t": time.time(),
                    "headers": {k.lower(): v for k, v in self.headers.items()},
                }
            )
            delay = st.delay
            fail = st.fail_status if st.fail_count > 0 else 0
            if fail:
                st.fail_count -= 1
        if delay:
            time.sleep(delay)
        if fail:
            self._send(fail, {"detail": f"injected failure {fail}"})
            return True
        return False

    def do_GET(self) -> None:  # noqa: N802
        path = urllib.parse.urlsplit(self.path).path
        st = self.server.state
        if path == "/health":
            return self._send(200, {"ok": True})
        if path == "/_stats":
            with st.lock:
                return self._send(200, {"requests": st.requests, "tickets": len(st.tickets)})
        if self._record(None):
            return
        if path.startswith("/tickets/") and path.count("/") == 2:
            tid = urllib.parse.unquote(path[len("/tickets/") :])
            with st.lock:
                ticket = st.tickets.get(tid)
            if ticket is None:
                return self._send(404, {"detail": f"ticket {tid} not found"})
            return self._send(200, ticket)
        return self._send(404, {"detail": "no such route"})

    def do_POST(self) -> None:  # noqa: N802
        path = urllib.parse.urlsplit(self.path).path
        st = self.server.state
        body = self._read_body()
        if path == "/_control":
            with st.lock:
                if isinstance(body, dict) and body.get("reset"):
                    st.reset()
                for key in ("delay", "fail_status", "fail_count"):
                    if isinstance(body, dict) and key in body:
                        setattr(st, key, body[key])
            return self._send(200, {"ok": True})
        if self._record(body):
            return
        if path != "/tickets":
            return self._send(404, {"detail": "no such route"})
        if not isinstance(body, dict) or not isinstance(body.get("title"), str) or not body["title"]:
            return self._send(422, {"detail": "title is required"})
        if body.get("priority", "medium") not in PRIORITIES:
            return self._send(422, {"detail": f"priority must be one of {', '.join(PRIORITIES)}"})
        idempotency_key = self.headers.get("Idempotency-Key")
        with st.lock:
            if idempotency_key and idempotency_key in st.by_key:
                return self._send(201, st.by_key[idempotency_key])
            tid = f"TK-{len(st.tickets) + 1:04d}"
            ticket = {
                "ticket_id": tid,
                "title": body["title"],
                "description": body.get("description", ""),
                "priority": body.get("priority", "medium"),
                "status": "open",
            }
            st.tickets[tid] = ticket
            if idempotency_key:
                st.by_key[idempotency_key] = ticket
        return self._send(201, ticket)


class TicketSystem(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, port: int = 0, host: str = "127.0.0.1") -> None:
        super().__init__((host, port), _Handler)
        self.state = TicketState()
        self._thread = threading.Thread(target=self.serve_forever, daemon=True, name="ticket-system")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def start(self) -> TicketSystem:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.shutdown()
        self.server_close()

    def requests(self, method: str | None = None) -> list[dict[str, Any]]:
        with self.state.lock:
            return [r for r in self.state.requests if method is None or r["method"] == method]


def main(argv: list[str] | None = None) -> None:
    """Serve on 127.0.0.1 until interrupted, after printing the URL (the first line of output)."""
    parser = argparse.ArgumentParser(
        prog="ticket_system.py",
        description="The demo's ticket system: POST /tickets, GET /tickets/{id}, GET /health on 127.0.0.1. "
        "Prints its URL, then serves until interrupted.",
    )
    parser.add_argument(
        "port", nargs="?", type=int, default=8000, help="port to listen on (default: 8000; 0: any free one)"
    )
    args = parser.parse_args(argv)
    system = TicketSystem(args.port).start()
    print(system.url, flush=True)
    try:
        system._thread.join()
    except KeyboardInterrupt:
        system.stop()


if __name__ == "__main__":
    main()
