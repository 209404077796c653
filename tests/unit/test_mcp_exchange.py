"""A plain tools/call or tools/list answered in the request's own task answers exactly as the SDK's
stateless JSON transport does, and leaves it every request it does not take."""

from __future__ import annotations

import json
from typing import Any

import anyio
import httpx
import mcp_types as types
import pytest
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError
from starlette.types import Message, Receive, Scope, Send

from workers.mcp.exchange import SingleExchange

LOOPBACK = TransportSecuritySettings(allowed_hosts=["127.0.0.1:*"], allowed_origins=["http://127.0.0.1:*"])
DECLINED = 599


async def list_tools(ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None) -> Any:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
    return types.ListToolsResult(tools=[types.Tool(name="echo", input_schema=schema)])


async def call_tool(ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams) -> Any:
    if params.name == "boom":
        raise RuntimeError("a secret the caller must not see")
    if params.name == "refuse":
        raise MCPError(types.INVALID_PARAMS, "refused by the handler")
    assert ctx.request is not None  # the HTTP request reaches the handler, as the bearer token's agent does
    seen = {"probe": ctx.request.headers.get("x-probe"), "args": params.arguments, "meta": ctx.meta}
    return types.CallToolResult(content=[types.TextContent(type="text", text=json.dumps(seen, default=str))])


def make_server() -> Server[Any]:
    return Server("t", on_list_tools=list_tools, on_call_tool=call_tool)


def exchange_app(exchange: SingleExchange) -> Any:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        body = b""
        while True:
            message: Message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        headers = dict(scope["headers"])
        version = headers.get(b"mcp-protocol-version", b"2025-03-26").decode()
        try:
            decoded = json.loads(body)
        except ValueError:
            decoded = None
        if not await exchange.answer(decoded, body, version, scope, send):
            await send({"type": "http.response.start", "status": DECLINED, "headers": []})
            await send({"type": "http.response.body", "body": b""})

    return app


HEADERS = {
    "content-type": "application/json",
    "accept": "application/json, text/event-stream",
    "host": "127.0.0.1:8808",
    "x-probe": "p1",
}


def exchange_pair(requests: list[tuple[Any, dict[str, str]]]) -> list[tuple[httpx.Response, httpx.Response]]:
    """Each request answered by the SDK's stateless JSON transport and by SingleExchange."""

    async def run() -> list[tuple[httpx.Response, httpx.Response]]:
        server = make_server()
        manager = StreamableHTTPSessionManager(server, stateless=True, json_response=True, security_settings=LOOPBACK)
        exchange = SingleExchange(server, LOOPBACK)
        answers = []
        async with manager.run(), server.lifespan(server) as state:
            exchange.lifespan_state = state
            sdk = httpx.AsyncClient(transport=httpx.ASGITransport(manager.handle_request), base_url="http://127.0.0.1")
            ours = httpx.AsyncClient(transport=httpx.ASGITransport(exchange_app(exchange)), base_url="http://127.0.0.1")
            async with sdk, ours:
                for body, extra in requests:
                    content = body if isinstance(body, bytes) else json.dumps(body).encode()
                    headers = {**HEADERS, **extra}
                    answers.append(
                        (
                            await sdk.post("/mcp", content=content, headers=headers),
                            await ours.post("/mcp", content=content, headers=headers),
                        )
                    )
        return answers

    return anyio.run(run)


def request(method: str, params: Any = None, id_: Any = 1) -> dict[str, Any]:
    doc: dict[str, Any] = {"jsonrpc": "2.0", "id": id_, "method": method}
    if params is not None:
        doc["params"] = params
    return doc


TAKEN = [
    request("tools/list", {}),
    request("tools/list", id_="a-string-id"),
    request("tools/list", {"cursor": "c"}),
    request("tools/call", {"name": "echo", "arguments": {"n": 1}, "_meta": {"idempotency_key": "k-1"}}),
    request("tools/call", {"name": "echo"}),
    request("tools/call", {"name": "refuse", "arguments": {}}),
    request("tools/call", {"arguments": {}}),  # no name: params invalid
    request("tools/call", {"name": "echo", "arguments": [1, 2]}),
    request("tools/call"),
]


@pytest.mark.parametrize("body", TAKEN, ids=range(len(TAKEN)))
def test_a_plain_request_is_answered_as_the_sdk_transport_answers_it(body: dict[str, Any]) -> None:
    [(sdk, ours)] = exchange_pair([(body, {})])
    assert ours.status_code == sdk.status_code == 200
    assert ours.headers["content-type"] == sdk.headers["content-type"] == "application/json"
    assert ours.json() == sdk.json()


def test_a_handler_that_raises_is_an_internal_error_whose_text_stays_inside() -> None:
    # (the SDK's transport passes the text on with code 0; the facade's own handlers never raise)
    [(_, ours)] = exchange_pair([(request("tools/call", {"name": "boom", "arguments": {}}), {})])
    assert ours.status_code == 200 and "secret" not in ours.text
    assert ours.json()["error"] == {"code": types.INTERNAL_ERROR, "message": "Internal server error"}


def test_the_handler_sees_the_http_request_and_the_meta() -> None:
    [(_, ours)] = exchange_pair([(request("tools/call", {"name": "echo", "_meta": {"traceparent": "t"}}), {})])
    seen = json.loads(ours.json()["result"]["content"][0]["text"])
    assert seen["probe"] == "p1" and seen["meta"]["traceparent"] == "t"


LEFT = [
    (request("initialize", {}), {}),  # only tools/call and tools/list are taken
    (request("ping"), {}),
    ({"jsonrpc": "2.0", "method": "tools/list"}, {}),  # a notification
    (request("tools/list", id_=None), {}),
    (request("tools/list", id_=[1]), {}),
    ({**request("tools/list"), "jsonrpc": "1.0"}, {}),
    ([request("tools/list")], {}),  # a batch
    (b"not json", {}),
    (request("tools/list"), {"accept": "text/event-stream"}),
    (request("tools/list"), {"content-type": "text/plain"}),
    (request("tools/list"), {"host": "evil.example:80"}),  # DNS rebinding protection holds
    (request("tools/list"), {"origin": "http://evil.example"}),
]


@pytest.mark.parametrize("body, headers", LEFT, ids=range(len(LEFT)))
def test_anything_else_is_left_to_the_sdk_transport(body: Any, headers: dict[str, str]) -> None:
    [(sdk, ours)] = exchange_pair([(body, headers)])
    assert ours.status_code == DECLINED, ours.text
    assert sdk.status_code != DECLINED
