"""The facade's Prometheus metrics, served on REACH_METRICS_PORT like every other process's.

Labels are bounded: ``method`` is one of the MCP methods below or ``other`` (a client names the
method, so it is never used as it came), ``outcome`` one of a fixed few.
"""

from __future__ import annotations

import time
from typing import Any

from prometheus_client import Counter, Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send

# the fleet's latency buckets (workers/observability/metrics.py): 1 ms ... 60 s
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)

METHODS = frozenset(
    {
        "initialize",
        "ping",
        "server/discover",
        "tools/list",
        "tools/call",
        "notifications/initialized",
        "notifications/cancelled",
        "notifications/progress",
    }
)

# tools/call outcomes: the receipt's status, or what happened instead of a receipt
OUTCOMES = ("succeeded", "rejected", "failed", "unknown", "refused", "not_sent", "no_receipt")

REQUESTS = Counter(
    "reach_mcp_requests",
    "MCP requests and notifications answered by reach mcp, by method and outcome "
    "(ok, error; tools/call: the receipt's status, refused, not_sent, no_receipt)",
    ["method", "outcome"],
)
TOOL_CALL_SECONDS = Histogram(
    "reach_mcp_tool_call_seconds",
    "tools/call from the request to its result, the wait for the receipt included",
    buckets=_LATENCY_BUCKETS,
)
AUTH_REFUSED = Counter("reach_mcp_auth_refused", "HTTP requests refused (401) for a missing or invalid bearer token")


def method_label(method: str) -> str:
    return method if method in METHODS else "other"


def count_tool_call(outcome: str, started: float) -> None:
    """Count one finished tools/call (``started``: its ``time.perf_counter()``)."""
    REQUESTS.labels("tools/call", outcome).inc()
    TOOL_CALL_SECONDS.observe(time.perf_counter() - started)


class CountRequests:
    """Server middleware: counts every request and notification but tools/call, which the
    handler counts itself with the receipt's status. A request that raised is ``error``."""

    async def __call__(self, ctx: Any, call_next: Any) -> Any:
        try:
            result = await call_next(ctx)
        except Exception:
            REQUESTS.labels(method_label(ctx.method), "error").inc()
            raise
        if ctx.method != "tools/call":
            REQUESTS.labels(method_label(ctx.method), "ok").inc()
        return result


class CountRefusals:
    """ASGI middleware around the HTTP app: counts the 401 answers of the bearer check."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def watch(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] == 401:
                AUTH_REFUSED.inc()
            await send(message)

        await self.app(scope, receive, watch)
