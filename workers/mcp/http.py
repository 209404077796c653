"""``reach mcp --http``: the facade's MCP server over Streamable HTTP, stateless, behind bearer tokens.

Stateless: every POST stands alone (the SDK's session manager with ``stateless=True``), so any
number of replicas can serve one URL without sticky sessions. Every request must carry a bearer
token (``tokens.py``), checked by the SDK's bearer middleware; a missing or bad one is answered 401
with the resource metadata URL (RFC 9728) in ``WWW-Authenticate``, served at
``/.well-known/oauth-protected-resource<path>``. The agent is the token's, and the facade publishes
with AMQP ``user_id`` = that agent, which RabbitMQ allows only because the facade's own login has
the ``impersonator`` tag (``broker_user.py``).

A tools/call answer is one JSON body, unless the request asked for progress: only then does it
need to be an SSE stream, which costs the SDK's client and server several milliseconds more per
call. :class:`ByProgress` picks per request, from the request's own ``_meta.progressToken``:

- a plain ``tools/call`` or ``tools/list`` is answered in the request's own task
  (``exchange.py``), without the SDK's per-request transport machinery;
- any other plain request goes to a session manager answering JSON;
- a request asking for progress, and anything this cannot judge, to one answering SSE. Requests
  of the per-request protocol era (2026-07-28) always go there; it answers JSON by itself unless
  a notification is sent.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from mcp.server.auth.middleware.auth_context import AuthContextMiddleware
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser, BearerAuthBackend, RequireAuthMiddleware
from mcp.server.auth.routes import build_resource_metadata_url, create_protected_resource_routes
from mcp.server.context import ServerRequestContext
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError
from mcp.shared.inbound import MCP_PROTOCOL_VERSION_HEADER
from mcp.shared.jsonrpc_dispatcher import progress_token_from_params
from mcp_types import DEFAULT_NEGOTIATED_VERSION, INVALID_REQUEST
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from pydantic import AnyHttpUrl
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.authentication import AuthenticationMiddleware
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from connectors.catalog import Catalog
from workers.mcp import tokens
from workers.mcp.clients import AgentClients
from workers.mcp.exchange import SingleExchange
from workers.mcp.metrics import CountRefusals
from workers.mcp.server import ENVELOPE_BYTES, Facade, build_server
from workers.observability import probes, uvicorn_guard
from workers.observability.http_guard import HttpLimits
from workers.settings import Settings

log = logging.getLogger("reach.mcp")

_LOOPBACK = ("127.0.0.1", "localhost", "::1")
# answers a plain request (its parsed body, the body, its protocol version) and says so, or leaves it
Direct = Callable[[Any, bytes, str, Scope, Send], Awaitable[bool]]


def agent_from_token(ctx: ServerRequestContext[Any, Any]) -> str:
    """The agent of the bearer token the HTTP request carried (checked by the SDK's middleware)."""
    user = ctx.request.scope.get("user") if ctx.request is not None else None
    if not isinstance(user, AuthenticatedUser):  # the route refuses these with 401 before we get here
        raise MCPError(INVALID_REQUEST, "not authenticated")
    return user.access_token.client_id


def local_url(host: str, port: int) -> str:
    """The MCP URL when REACH_MCP_URL is unset: this host and port, path /mcp."""
    shown = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    return f"http://{'[' + shown + ']' if ':' in shown else shown}:{port}/mcp"


class ByProgress:
    """Hands a request to the JSON-answering way unless it asks for progress notifications.

    The body is read here (at most ``max_body`` bytes, as its Content-Length says) and handed on
    unchanged; anything this cannot judge (no Content-Length, not JSON, another protocol era,
    not a POST) goes to the SSE app, which answers every request correctly, only slower. A plain
    request is first offered to ``direct`` (``SingleExchange.answer``), then to the ``plain`` app.
    """

    def __init__(self, plain: ASGIApp, streaming: ASGIApp, max_body: int, direct: Direct | None = None) -> None:
        self.plain, self.streaming, self.max_body, self.direct = plain, streaming, max_body, direct

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = dict(scope.get("headers") or [])
        version = headers.get(MCP_PROTOCOL_VERSION_HEADER.lower().encode(), b"").decode("latin-1")
        length = headers.get(b"content-length", b"").decode("latin-1")
        if (
            scope["type"] != "http"
            or scope["method"] != "POST"
            or (version and version not in HANDSHAKE_PROTOCOL_VERSIONS)
            or not (length.isascii() and length.isdigit() and len(length) <= 12)
            or int(length) > self.max_body
        ):
            await self.streaming(scope, receive, send)
            return
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            body += message.get("body", b"")
            if len(body) > self.max_body:
                await Response("Request body too large", status_code=413)(scope, receive, send)
                return
            if not message.get("more_body", False):
                break
        try:
            request = json.loads(body)
        except (ValueError, RecursionError):
            request = None
        wants_progress = not isinstance(request, dict) or progress_token_from_params(request.get("params")) is not None
        if not wants_progress and self.direct is not None:
            if await self.direct(request, bytes(body), version or DEFAULT_NEGOTIATED_VERSION, scope, send):
                return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": bytes(body), "more_body": False}

        await (self.streaming if wants_progress else self.plain)(scope, replay, send)


def http_app(settings: Settings, catalog: Catalog, host: str, port: int) -> ASGIApp:
    """The ASGI app of ``reach mcp --http``.

    Raises:
        tokens.TokenConfigError: No way to authenticate agents is configured, or it is broken.
    """
    url = settings.mcp_url or local_url(host, port)
    parts = urlsplit(url)
    key = settings.mcp_jwt_key.get_secret_value() if settings.mcp_jwt_key is not None else None
    verifier = tokens.verifier(url, settings.mcp_tokens_file, key, settings.mcp_jwt_algorithm, settings.mcp_issuer_url)
    clients = AgentClients(settings.broker_url, per_agent=settings.mcp_clients_per_agent, set_user_id=True)
    facade = Facade(catalog, clients, settings, agent_from_token)
    server = build_server(facade)
    max_body = settings.max_intent_bytes + ENVELOPE_BYTES
    # as the SDK does for a server on a loopback address: refuse other Host and Origin headers
    # (DNS rebinding); a server on another address is reached through names only its operator knows
    security = (
        TransportSecuritySettings(
            allowed_hosts=["127.0.0.1:*", "localhost:*", "[::1]:*"],
            allowed_origins=["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"],
        )
        if host in _LOOPBACK
        else None
    )
    managers = [
        StreamableHTTPSessionManager(
            server,
            stateless=True,
            json_response=json_response,
            security_settings=security,
            max_request_body_size=max_body,
        )
        for json_response in (True, False)
    ]
    plain, streaming = (StreamableHTTPASGIApp(manager) for manager in managers)
    exchange = SingleExchange(server, security)
    resource = AnyHttpUrl(url)
    # without an authorization server of its own, the facade names its own origin
    issuer = AnyHttpUrl(settings.mcp_issuer_url or urlunsplit((parts.scheme, parts.netloc, "", "", "")))

    @asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        async with managers[0].run(), managers[1].run(), server.lifespan(server) as state, facade.running():
            exchange.lifespan_state = state
            yield

    app = Starlette(
        routes=[
            Route(
                parts.path or "/",
                endpoint=RequireAuthMiddleware(
                    ByProgress(plain, streaming, max_body, exchange.answer), [], build_resource_metadata_url(resource)
                ),
            ),
            *create_protected_resource_routes(resource, [issuer]),
        ],
        middleware=[
            Middleware(AuthenticationMiddleware, backend=BearerAuthBackend(verifier, resource_server_url=resource)),
            Middleware(AuthContextMiddleware),
        ],
        lifespan=lifespan,
    )
    return CountRefusals(app)


def run_http(settings: Settings, catalog: Catalog, host: str, port: int) -> None:
    """Serve until SIGTERM or SIGINT; in-flight calls finish first (each within REACH_MCP_WAIT).

    Raises:
        tokens.TokenConfigError: As :func:`http_app`.
    """
    app = http_app(settings, catalog, host, port)
    limits = HttpLimits.from_settings(settings)
    probes.serve(settings.metrics_port, limits=limits)
    log.info("MCP over Streamable HTTP on %s:%d (%s)", host, port, settings.mcp_url or local_url(host, port))
    uvicorn_guard.run(
        app, host, port, limits, "mcp", log_level=settings.log_level.lower(), access_log=False, lifespan="on"
    )
