"""The conformance kit's fixtures for the built-in types (connectors/adapters/kit.py): a fake
system of each kind, on 127.0.0.1, that answers as the kit's script says."""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from connectors.adapters.kit import Downstream, Fixture, KitContext, Received, Reply, json_answer

KIT_SECRET = "kit-secret-5f1c9a7e2b"  # the fake system's credential; must never reach a receipt or a log
IDEMPOTENCY_HEADER = "Idempotency-Key"


def closed_port() -> int:
    """A port on 127.0.0.1 where nothing listens (connection refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


class HttpServer:
    """A threaded HTTP server whose every request is answered by ``respond``; stops on close."""

    def __init__(self, respond: Any) -> None:
        self.closing = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass  # the kit reads the script's record, not the server's log

            def _any(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(min(length, 1 << 20)).decode("utf-8", "replace")
                received = Received(self.headers.get(IDEMPOTENCY_HEADER), f"{self.path}\n{body}")
                status, content_type, payload = respond(received, self.headers)
                if status == 0:  # hang: hold the connection without answering
                    outer.closing.wait(payload)
                    self.close_connection = True
                    return
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                try:
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the adapter stopped reading an answer too large: what the row wants

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _any

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True, name="kit-downstream").start()

    def close(self) -> None:
        self.closing.set()
        self.server.shutdown()
        self.server.server_close()


def json_reply(reply: Reply) -> tuple[int, str, Any]:
    """A Reply as an HTTP/JSON answer: (status, content type, body); status 0 is a hang of
    ``body`` seconds."""
    if reply.kind == "hang":
        return 0, "", reply.seconds
    if reply.kind == "fail":
        return 503, "application/json", json.dumps({"error": reply.message}).encode()
    return 200, "application/json", json_answer(reply)


def http_fixture(downstream: Downstream, context: KitContext) -> Fixture:
    """The http type: bearer auth with the kit's secret, an Idempotency-Key header on request."""

    def respond(received: Received, headers: Any) -> tuple[int, str, Any]:
        if headers.get("Authorization") != f"Bearer {KIT_SECRET}":
            return 401, "application/json", b'{"error": "who are you?"}'
        return json_reply(downstream.handle(received))

    server = HttpServer(respond)

    def connector(reachable: bool, idempotency: bool) -> dict[str, Any]:
        port = server.port if reachable else closed_port()
        doc: dict[str, Any] = {
            "name": "kit",
            "type": "http",
            "endpoint": f"http://127.0.0.1:{port}",
            "auth": {"type": "bearer", "token_env": "KIT_TOKEN"},
            "actions": [
                {
                    "action": "kit_read",
                    "description": "Read something from the kit's fake system.",
                    "path": "GET /read",
                    "input": {"q": {"type": "string", "in": "query"}},
                },
                {
                    "action": "kit_write",
                    "description": "Write something to the kit's fake system.",
                    "path": "POST /write",
                    "permission": "write",
                    "input": {"q": {"type": "string"}},
                },
            ],
        }
        if idempotency:
            doc["idempotency_header"] = IDEMPOTENCY_HEADER
        return doc

    return Fixture(connector=connector, close=server.close, secret=KIT_SECRET, environ={"KIT_TOKEN": KIT_SECRET})


def wait_listening(port: int, seconds: float = 10.0) -> None:
    """Until something accepts connections on 127.0.0.1:``port``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
