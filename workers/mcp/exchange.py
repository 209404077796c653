"""A plain ``tools/call`` or ``tools/list`` over HTTP, answered in the request's own task.

The SDK's stateless Streamable HTTP transport builds, for every POST, a transport, a JSON-RPC
dispatcher and a task group, and hands the request and its answer through memory streams
between three tasks. A request that asks for no progress needs none of that: it is one JSON-RPC
request in and one JSON body out. :class:`SingleExchange` answers such a request through the
SDK's own ``serve_one`` (the entry its 2026-07-28 single-exchange transport uses): the same
handlers, server middleware, params validation and result serialization as the transport, minus
the machinery, which cost as much CPU per call as everything else the facade does.

Only the good case is taken here: a well-formed request of the handshake era, with the headers
the transport demands (Content-Type and Accept for JSON, Host and Origin on a loopback server).
Everything else is left to the SDK's transport, which answers it (or refuses it) as it always has.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio
from mcp.server.connection import Connection
from mcp.server.lowlevel import Server
from mcp.server.runner import serve_one
from mcp.server.streamable_http import check_accept_headers
from mcp.server.transport_security import TransportSecurityMiddleware, TransportSecuritySettings
from mcp.shared.dispatcher import CallOptions
from mcp.shared.exceptions import NoBackChannelError
from mcp.shared.jsonrpc_dispatcher import handler_exception_to_error_data
from mcp.shared.message import MessageMetadata, ServerMessageMetadata
from mcp.shared.transport_context import TransportContext
from mcp_types import INTERNAL_ERROR, ErrorData, JSONRPCError, JSONRPCRequest, JSONRPCResponse, RequestId
from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Message, Scope, Send

log = logging.getLogger("reach.mcp")

METHODS = frozenset({"tools/call", "tools/list"})


@dataclass
class _Exchange:
    """The dispatch context of one such request: no back channel, and no progress to report (a
    request with a progressToken never comes here)."""

    transport: TransportContext
    request_id: RequestId
    message_metadata: MessageMetadata
    cancel_requested: anyio.Event = field(default_factory=anyio.Event)
    can_send_request: bool = False

    async def send_raw_request(
        self, method: str, params: Mapping[str, Any] | None, opts: CallOptions | None = None
    ) -> dict[str, Any]:
        raise NoBackChannelError(method)

    async def notify(self, method: str, params: Mapping[str, Any] | None, opts: CallOptions | None = None) -> None:
        return None

    async def progress(self, progress: float, total: float | None = None, message: str | None = None) -> None:
        return None


class SingleExchange:
    """Answers the plain requests of :data:`METHODS` as one JSON body; hands back all others."""

    def __init__(self, server: Server[Any], security: TransportSecuritySettings | None) -> None:
        self.server = server
        self.security = TransportSecurityMiddleware(security)
        self.lifespan_state: Any = None  # the server's lifespan state, set once the app has started

    async def answer(self, decoded: Any, body: bytes, version: str, scope: Scope, send: Send) -> bool:
        """Answer the request if it is one of ours; False, with nothing sent, if it is not.

        Args:
            decoded: The parsed body; the caller has seen that it asks for no progress.
            body: The body as it came, for anyone who reads it again from the request.
            version: The request's protocol version (handshake era), or the default when it sent none.
        """
        if not isinstance(decoded, dict) or decoded.get("method") not in METHODS or "id" not in decoded:
            return False

        async def receive() -> Message:
            return {"type": "http.request", "body": body, "more_body": False}

        request = Request(scope, receive)
        content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if (
            content_type != "application/json"
            or not check_accept_headers(request)[0]
            or await self.security.validate_request(request, is_post=True) is not None
        ):
            return False
        try:
            req = JSONRPCRequest.model_validate(decoded)
        except ValidationError:
            return False
        context = _Exchange(
            transport=TransportContext(kind="streamable-http", can_send_request=False, headers=request.headers),
            request_id=req.id,
            message_metadata=ServerMessageMetadata(request_context=request),
        )
        try:
            result = await serve_one(
                self.server,
                context,
                req.method,
                req.params,
                connection=Connection.from_envelope(version, None, None),
                lifespan_state=self.lifespan_state,
            )
        except Exception as exc:
            error = handler_exception_to_error_data(exc)
            if error is None:  # as the SDK's dispatcher, but without the exception's text
                log.exception("the %s handler raised", req.method)
                error = ErrorData(code=INTERNAL_ERROR, message="Internal server error")
            reply: JSONRPCResponse | JSONRPCError = JSONRPCError(jsonrpc="2.0", id=req.id, error=error)
        else:
            reply = JSONRPCResponse(jsonrpc="2.0", id=req.id, result=result)
        response = Response(reply.model_dump_json(by_alias=True, exclude_unset=True), media_type="application/json")
        await response(scope, receive, send)
        return True
