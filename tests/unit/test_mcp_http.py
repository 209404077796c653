"""Which way the facade answers an HTTP request: JSON unless the call asks for progress, and a plain
tools/call or tools/list in the request's own task, exactly as the SDK's transport would."""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest
from starlette.types import Message, Receive, Scope, Send

from workers.mcp.http import ByProgress, local_url

MAX_BODY = 1024


class Recorder:
    """An ASGI app that keeps the body it was handed and answers 200."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        self.bodies.append(body)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})


def route(
    body: bytes, headers: dict[str, str] | None = None, method: str = "POST", chunks: int = 1, takes: bool = False
) -> tuple[str, int]:
    """Which app got the request ("direct", "plain", "streaming" or "-"), and the status answered;
    the direct way answers when ``takes``, else it declines and the request goes on."""
    plain, streaming = Recorder(), Recorder()
    offered: list[tuple[Any, bytes, str]] = []

    async def direct(decoded: Any, raw: bytes, version: str, scope: Scope, send: Send) -> bool:
        offered.append((decoded, raw, version))
        if takes:
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b""})
        return takes

    given = {"content-length": str(len(body)), **(headers or {})}
    scope = {
        "type": "http",
        "method": method,
        "headers": [(k.encode(), v.encode("latin-1")) for k, v in given.items() if v is not None],
    }
    size = max(1, -(-len(body) // chunks))
    parts = [body[i : i + size] for i in range(0, len(body), size)] or [b""]
    incoming = [{"type": "http.request", "body": p, "more_body": i < len(parts) - 1} for i, p in enumerate(parts)]
    sent: list[Message] = []

    async def receive() -> Message:
        return incoming.pop(0) if incoming else {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)

    anyio.run(ByProgress(plain, streaming, MAX_BODY, direct), scope, receive, send)
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    assert all(raw == body and decoded == json.loads(body) for decoded, raw, _ in offered)
    if takes and offered:
        return "direct", status
    for name, app in (("plain", plain), ("streaming", streaming)):
        if app.bodies:
            assert app.bodies == [body] or name == "streaming"  # handed on unchanged
            return name, status
    return "-", status


def call(**params: Any) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "t", **params}}).encode()


def test_a_call_without_a_progress_token_is_answered_as_plain_json() -> None:
    assert route(call(arguments={"a": 1}), takes=True) == ("direct", 200)
    assert route(call(arguments={"a": 1}, _meta={"idempotency_key": "k"}), chunks=3, takes=True) == ("direct", 200)
    # what the direct way leaves goes to the JSON-answering app, with the body as it came
    assert route(call(arguments={"a": 1})) == ("plain", 200)
    assert route(call(arguments={"a": 1}, _meta={"idempotency_key": "k"}), chunks=3) == ("plain", 200)


@pytest.mark.parametrize("token", ["p-1", 7])
def test_a_call_asking_for_progress_gets_the_streaming_app(token: Any) -> None:
    assert route(call(_meta={"progressToken": token}), takes=True) == ("streaming", 200)


@pytest.mark.parametrize(
    "body, headers, method",
    [
        (b"not json", None, "POST"),
        (b'[{"jsonrpc": "2.0"}]', None, "POST"),
        (b"[" * 5000 + b"]" * 5000, None, "POST"),  # too deep for the json module: not judged here
        (call(), {"content-length": None}, "POST"),  # no length: not read here
        (call(), {"content-length": "\u00b2"}, "POST"),  # a digit to str.isdigit, not to HTTP
        (call(), {"content-length": "9" * 5000}, "POST"),
        (call(), {"mcp-protocol-version": "2026-07-28"}, "POST"),  # that era answers JSON by itself
        (b"", None, "GET"),
    ],
)
def test_anything_it_cannot_judge_goes_to_the_streaming_app_which_answers_everything(
    body: bytes, headers: dict[str, str] | None, method: str
) -> None:
    assert route(body, headers, method, takes=True)[0] == "streaming"


def test_a_body_longer_than_it_said_is_refused_with_413() -> None:
    body = call(arguments={"pad": "x" * 2000})
    assert route(body, {"content-length": "100"}) == ("-", 413)


def test_the_default_url_never_names_a_wildcard_address() -> None:
    assert local_url("0.0.0.0", 8808) == "http://127.0.0.1:8808/mcp"
    assert local_url("::1", 9000) == "http://[::1]:9000/mcp"
