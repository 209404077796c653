"""Injection corpus for the request builder: whatever an agent puts in a path, query or header
param, no request leaves for another host, port or path (checked with a listening sink)."""

from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import parse_qs, unquote

import pytest

from connectors.adapters.base import CallContext
from connectors.adapters.http import HttpAdapter
from connectors.schema import ParamValidator
from connectors.spec import ConnectorSpec
from tests.unit.test_http_adapter import Recorder

SINK_PLACEHOLDER = "SINKPORT"
CORPUS = [
    "..",
    ".",
    "../",
    "../../admin",
    "..%2f",
    "%2e%2e",
    "%2e%2e%2f",
    "%252e%252e",
    "%2F",
    "/",
    "a/b",
    "//evil.example/x",
    "..\\..\\win",
    "x?admin=1",
    "x#frag",
    "x;jsessionid=1",
    "a\r\nX-Injected: 1",
    "a\nb",
    "@evil.example",
    "user:pw@127.0.0.1:SINKPORT",
    "http://127.0.0.1:SINKPORT/",
    "//127.0.0.1:SINKPORT/x",
    "127.0.0.1:SINKPORT",
    "[::1]:SINKPORT",
    "0x7f000001",
    "2130706433",
    "\u2025",
    "\uff0e\uff0e\uff0f",
    "\u2215etc\u2215passwd",
    "\u202egnp.exe",
    "\x00",
    "%00",
    "é",
    "\U0001f642",
    " ",
    "%20",
    "\t",
    "a&b=c",
    "=",
    "+",
    "%",
]


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[Recorder, Recorder]]:
    target, sink = Recorder(), Recorder()
    yield target, sink
    target.stop()
    sink.stop()


def connector(url: str) -> ConnectorSpec:
    return ConnectorSpec.model_validate(
        {
            "name": "items",
            "endpoint": url + "/api",
            "idempotency_header": "Idempotency-Key",
            "actions": [
                {
                    "action": "get_item",
                    "path": "GET /items/{id}/detail",
                    "input": {
                        "id": {"type": "string", "required": True},
                        "q": {"type": "string"},
                        "note": {"type": "string", "in": "header", "name": "X-Note"},
                    },
                }
            ],
        }
    )


def _values(sink: Recorder) -> list[str]:
    return [v.replace(SINK_PLACEHOLDER, str(sink.port)) for v in CORPUS]


@pytest.mark.parametrize("place", ["path", "query", "header"])
def test_no_request_leaves_the_endpoint_or_template(servers: tuple[Recorder, Recorder], place: str) -> None:
    target, sink = servers
    spec = connector(target.url)
    action = spec.actions[0]
    validator = ParamValidator(action)
    adapter = HttpAdapter(spec)
    sent, refused = 0, 0
    try:
        for value in _values(sink):
            target.seen.clear()
            params = {"id": "item-1", "q": "ok", "note": "ok"}
            params[{"path": "id", "query": "q", "header": "note"}[place]] = value
            cleaned, problems = validator.validate(params)
            if problems:
                refused += 1
                continue
            outcome = adapter.call(action, cleaned, CallContext(intent_id="i", idempotency_key="key-1"))
            if not outcome.ok and not outcome.sent:
                refused += 1
                assert target.seen == []
                continue
            sent += 1
            (request,) = target.seen
            path, _, query = request.raw_path.partition("?")
            segments = path.split("/")
            # exactly /api/items/<one segment>/detail
            assert segments[:3] == ["", "api", "items"] and segments[4:] == ["detail"] and len(segments) == 5, (
                request.raw_path
            )
            assert "#" not in request.raw_path
            if place == "path":
                assert unquote(segments[3]) == value
            if place == "query":
                assert parse_qs(query, keep_blank_values=True) == {"q": [value]}
            if place == "header":
                assert request.headers["x-note"] == value
                assert "x-injected" not in request.headers
    finally:
        adapter.close()
    assert sink.seen == [], "a request reached another port"
    assert sent + refused == len(CORPUS)
    if place == "header":
        # CR, LF, NUL, TAB and non-ASCII can never be header values: refused before sending
        assert refused >= 8
    else:
        assert refused == 0  # path and query values are encoded, never refused
