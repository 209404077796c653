"""uvicorn's httptools protocol under :class:`~workers.observability.http_guard.HttpLimits` (the
rules are described there): a module of its own so that processes without uvicorn (the router,
the pools) do not import it for their probes."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any, ClassVar

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from workers.observability.http_guard import HttpLimits
from workers.observability.metrics import HTTP_CONNECTIONS_CLOSED

_TIMEOUT_408 = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"content-length: 28\r\nconnection: close\r\n\r\nrequest not received in time"
)


def uvicorn_protocol(limits: HttpLimits, server: str) -> type[asyncio.Protocol]:
    """uvicorn's httptools protocol under ``limits``; pass it as ``uvicorn.run(http=...)``, with
    ``limit_concurrency=limits.max_connections``. ``server`` names it in the metric."""
    return type(
        f"Guarded{server.title()}Protocol",
        (_GuardedProtocol,),
        {"limits": limits, "guard_name": server, "open": Counter()},
    )


class _GuardedProtocol(HttpToolsProtocol):
    limits: ClassVar[HttpLimits]
    guard_name: ClassVar[str]
    open: ClassVar[Counter[str]]  # connections per client address, of this server (one event loop)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._timer: asyncio.TimerHandle | None = None
        self._address: str | None = None  # set while this connection is counted

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        address = self.client[0] if self.client else "-"
        if self.open[address] >= self.limits.per_client:
            HTTP_CONNECTIONS_CLOSED.labels(server=self.guard_name, reason="per_client_limit").inc()
            transport.close()
            return
        self.open[address] += 1
        self._address = address
        self._arm(self.limits.header_timeout, "header_timeout")

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self._address is not None:
            self.open[self._address] -= 1
            if self.open[self._address] <= 0:
                del self.open[self._address]
            self._address = None
        super().connection_lost(exc)

    # the parser's callbacks: a request begins, its headers end, it ends
    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._timer is None:  # the first request's deadline runs from the connection
            self._arm(self.limits.header_timeout, "header_timeout")

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()
        self._arm(self.limits.body_timeout, "body_timeout")

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()

    def _arm(self, seconds: float, reason: str) -> None:
        self._disarm()
        self._timer = self.loop.call_later(seconds, self._expired, seconds, reason)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expired(self, seconds: float, reason: str) -> None:
        self._timer = None
        if self.transport.is_closing():
            return
        if reason == "body_timeout" and self.flow.read_paused:
            self._arm(seconds, reason)  # we stopped reading (the app is busy): not the client's time
            return
        HTTP_CONNECTIONS_CLOSED.labels(server=self.guard_name, reason=reason).inc()
        if reason == "header_timeout" and (self.cycle is None or self.cycle.response_complete):
            self.transport.write(_TIMEOUT_408)  # nothing else is being answered on it
        self.transport.close()


def run(app: Any, host: str, port: int, limits: HttpLimits, server: str, **options: Any) -> None:
    """``uvicorn.run`` under ``limits`` (no WebSockets: no server of the fleet speaks them)."""
    import uvicorn

    uvicorn.run(
        app,
        host=host,
        port=port,
        http=uvicorn_protocol(limits, server),
        ws="none",
        limit_concurrency=limits.max_connections,  # past it, 503 at once rather than an unbounded queue
        **options,
    )
