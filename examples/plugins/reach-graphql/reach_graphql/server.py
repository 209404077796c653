"""A GraphQL server over HTTP on graphql-core, on 127.0.0.1, threaded: the kit's fake system and
the tests' real one. Each POST is executed against ``schema``; ``before`` may answer instead
(a hang, a raw document) from the request's body and headers."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from graphql import GraphQLSchema, graphql_sync

# (status, body) to send, or a float: hold the request that many seconds and close; None: execute
Early = tuple[int, bytes] | float | None
Before = Callable[[bytes, Any], Early]


class GraphqlServer:
    """Serves ``schema`` at ``url`` until ``close``; ``root(body, headers)`` gives each request's root value."""

    def __init__(
        self,
        schema: GraphQLSchema,
        root: Callable[[bytes, Any], Any] = lambda body, headers: None,
        before: Before = lambda body, headers: None,
        token: str | None = None,
    ) -> None:
        self.closing = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _send(self, status: int, payload: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                try:
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client stopped reading (an answer too large for it)

            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(min(int(self.headers.get("Content-Length") or 0), 1 << 20))
                if token is not None and self.headers.get("Authorization") != f"Bearer {token}":
                    self._send(401, b'{"errors": [{"message": "who are you?"}]}')
                    return
                request = json.loads(body or b"{}")
                if request.get("query") != "{ __typename }":
                    early = before(body, self.headers)
                    if isinstance(early, float):
                        outer.closing.wait(early)
                        self.close_connection = True
                        return
                    if early is not None:
                        self._send(*early)
                        return
                result = graphql_sync(
                    schema,
                    request.get("query", ""),
                    root_value=root(body, self.headers),
                    variable_values=request.get("variables"),
                )
                self._send(200, json.dumps(result.formatted).encode())

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/graphql"
        threading.Thread(target=self.server.serve_forever, daemon=True, name="graphql-server").start()

    def close(self) -> None:
        self.closing.set()
        self.server.shutdown()
        self.server.server_close()
