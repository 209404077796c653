"""Every HTTP server of the fleet against slow and half-open clients.

A client that connects and sends half a request header, or a body one byte a minute, holds a
connection (and under uvicorn a place in ``limit_concurrency``) for as long as it likes: uvicorn's
``timeout_keep_alive`` runs only between requests, and ASGI middleware sees a request only once
its headers are complete. So the guard sits at the protocol, below the app:

- the request line and headers must arrive within ``header_timeout`` of the connection (or of
  the first byte of the next request on a kept-alive one): else 408 and the connection closed;
- the body within ``body_timeout`` of the headers (time the server itself stopped reading, while
  the app is busy, does not count): else the connection is closed;
- at most ``per_client`` connections from one address: one more is closed at once, so a single
  host cannot fill ``max_connections`` and the rest are served meanwhile.

:func:`workers.observability.uvicorn_guard.uvicorn_protocol` is uvicorn's httptools protocol with
these rules (``reach mcp --http``, ``reach console``); :class:`GuardedHTTPServer` and :class:`GuardedHandler` are the standard
library's threading server with them (``/metrics`` and the probes). Each refusal is counted in
``reach_http_connections_closed{server, reason}``.
"""

from __future__ import annotations

import io
import logging
import socket
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from workers.observability.metrics import HTTP_CONNECTIONS_CLOSED
from workers.settings import Settings

log = logging.getLogger("reach.http")


@dataclass(frozen=True)
class HttpLimits:
    """How long a request may take to arrive, and how many connections may be open."""

    header_timeout: float = 10.0
    body_timeout: float = 30.0
    max_connections: int = 1024
    per_client: int = 64

    @classmethod
    def from_settings(cls, settings: Settings) -> HttpLimits:
        return cls(
            float(settings.http_header_timeout_seconds),
            float(settings.http_body_timeout_seconds),
            settings.http_max_connections,
            settings.http_max_connections_per_client,
        )

    def at_most(self, max_connections: int, per_client: int) -> HttpLimits:
        """These limits, with the connection counts capped (a small server's own bounds)."""
        return HttpLimits(
            self.header_timeout,
            self.body_timeout,
            min(self.max_connections, max_connections),
            min(self.per_client, per_client),
        )


class GuardedHTTPServer(ThreadingHTTPServer):
    """The standard library's threading HTTP server under ``limits``: a connection past
    ``max_connections`` or ``per_client`` is closed before it gets a thread. Use it with a
    :class:`GuardedHandler`."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: type[GuardedHandler], limits: HttpLimits, name: str) -> None:
        super().__init__(address, handler)
        self.limits = limits
        self.name = name
        self._lock = threading.Lock()
        self._open: Counter[str] = Counter()

    def process_request(self, request: Any, client_address: Any) -> None:
        address = str(client_address[0]) if client_address else "-"
        with self._lock:
            reason = (
                "max_connections"
                if self._open.total() >= self.limits.max_connections
                else "per_client_limit"
                if self._open[address] >= self.limits.per_client
                else None
            )
            if reason is None:
                self._open[address] += 1
        if reason is not None:
            HTTP_CONNECTIONS_CLOSED.labels(server=self.name, reason=reason).inc()
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:  # no thread was started: it will not give its place back
            self._release(address)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._release(str(client_address[0]) if client_address else "-")

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away (reset, broken pipe) or ran out of time is the client's doing:
        nothing is written for it. The standard library prints a traceback to stderr per connection,
        so anyone who can reach the port could fill the process's log at their own connection rate
        (``per_client`` bounds connections at once, not their rate). Anything else is a bug: logged."""
        if isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            return
        address = client_address[0] if client_address else "-"
        log.error("%s server failed on a request from %s", self.name, address, exc_info=True)

    def _release(self, address: str) -> None:
        with self._lock:
            self._open[address] -= 1
            if self._open[address] <= 0:
                del self._open[address]


class GuardedHandler(BaseHTTPRequestHandler):
    """Reads the request within the server's ``header_timeout`` in all (not per read, which a
    client sending a byte at a time would outlast), then writes within ``body_timeout``."""

    server: GuardedHTTPServer

    def setup(self) -> None:
        super().setup()
        self.rfile.close()  # the socket's own reader, replaced by one that keeps the deadline
        deadline = time.monotonic() + self.server.limits.header_timeout
        self.rfile = io.BufferedReader(_ReadBefore(self.connection, deadline, self.server.name))

    def parse_request(self) -> bool:
        parsed = super().parse_request()
        # read: from here on the socket's timeout bounds each write to a client that stopped reading
        self.connection.settimeout(self.server.limits.body_timeout)
        return parsed


class _ReadBefore(io.RawIOBase):
    """A socket's reads, each given only the time left before ``deadline``."""

    def __init__(self, sock: socket.socket, deadline: float, server: str) -> None:
        self._sock, self._deadline, self._server = sock, deadline, server

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        left = self._deadline - time.monotonic()
        try:
            if left <= 0:
                raise TimeoutError("request not received in time")
            self._sock.settimeout(left)
            return self._sock.recv_into(buffer)
        except TimeoutError:
            HTTP_CONNECTIONS_CLOSED.labels(server=self._server, reason="header_timeout").inc()
            raise
