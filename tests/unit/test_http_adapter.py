"""HttpAdapter against real local HTTP servers (no mocked transport).

``Recorder`` is a tiny http.server that records what arrives (method, raw path, query, headers,
body) and answers whatever status/body/headers/delay a test sets. A second Recorder, the *sink*,
stands for "somewhere else": nothing an agent sends may ever reach it.
"""

from __future__ import annotations

import base64
import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote

import pytest

from connectors.adapters.auth import MissingSecret
from connectors.adapters.base import CallContext, Outcome
from connectors.adapters.http import HttpAdapter
from connectors.spec import ConnectorSpec
from examples.ticket_system import TicketSystem
from producers.wire import ErrorCode


@dataclass
class Seen:
    method: str
    raw_path: str
    headers: dict[str, str]
    body: bytes

    @property
    def path(self) -> str:
        return self.raw_path.partition("?")[0]

    @property
    def query(self) -> dict[str, list[str]]:
        return parse_qs(self.raw_path.partition("?")[2], keep_blank_values=True)

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Reply:
    status: int = 200
    body: Any = field(default_factory=dict)  # bytes are sent as they are, anything else as JSON
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    trickle: tuple[int, float] | None = None  # (bytes, seconds between bytes) for a slow body


class _Handler(BaseHTTPRequestHandler):
    server: Recorder
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    def _handle(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        with self.server.lock:
            self.server.seen.append(
                Seen(self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, body)
            )
            reply = self.server.reply
        if reply.delay:
            time.sleep(reply.delay)
        data = reply.body if isinstance(reply.body, bytes) else json.dumps(reply.body).encode()
        self.send_response(reply.status)
        headers = {"Content-Type": "application/json", **reply.headers}
        for name, value in headers.items():
            self.send_header(name, value)
        if reply.trickle:
            count, interval = reply.trickle
            self.send_header("Content-Length", str(count))
            self.end_headers()
            for _ in range(count):
                self.wfile.write(b" ")
                self.wfile.flush()
                time.sleep(interval)
            return
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _handle


class Recorder(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.lock = threading.Lock()
        self.seen: list[Seen] = []
        self.reply = Reply()
        threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()

    @property
    def port(self) -> int:
        return self.server_address[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def answer(self, status: int = 200, body: Any = None, **kw: Any) -> None:
        self.reply = Reply(status, {} if body is None else body, **kw)

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # the client gave up (timeouts): nothing to report

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


@pytest.fixture()
def server() -> Iterator[Recorder]:
    srv = Recorder()
    yield srv
    srv.stop()


@pytest.fixture()
def sink() -> Iterator[Recorder]:
    srv = Recorder()
    yield srv
    srv.stop()


@pytest.fixture()
def tickets() -> Iterator[TicketSystem]:
    system = TicketSystem(0).start()
    yield system
    system.stop()


def connector(endpoint: str, *actions: dict[str, Any], **extra: Any) -> ConnectorSpec:
    return ConnectorSpec.model_validate({"name": "sys", "endpoint": endpoint, "actions": list(actions), **extra})


def call(
    spec: ConnectorSpec,
    action: str,
    params: dict[str, Any] | None = None,
    ctx: CallContext | None = None,
    environ: dict[str, str] | None = None,
) -> Outcome:
    adapter = HttpAdapter(spec, environ={} if environ is None else environ)
    try:
        found = spec.action(action)
        assert found is not None
        return adapter.call(found, params or {}, ctx or CallContext("intent-1"))
    finally:
        adapter.close()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- method, path and path parameters -----------------------------------------------------------


def test_method_and_path_come_from_the_action(server: Recorder) -> None:
    spec = connector(
        server.url,
        {
            "action": "close",
            "path": "PATCH /tickets/{tid}/state",
            "permission": "write",
            "input": {"tid": {"required": True}},
        },
    )
    outcome = call(spec, "close", {"tid": "TK-0001"})
    assert outcome.ok, outcome
    (seen,) = server.seen
    assert (seen.method, seen.raw_path) == ("PATCH", "/tickets/TK-0001/state")


def test_endpoint_base_path_prefixes_the_template(server: Recorder) -> None:
    spec = connector(server.url + "/api/v2/", {"action": "get", "path": "GET /items/{id}", "input": {"id": {}}})
    assert call(spec, "get", {"id": "7"}).ok
    assert server.seen[0].raw_path == "/api/v2/items/7"


HOSTILE_SEGMENTS = [
    "../x",
    "..",
    ".",
    "...",
    "%2F",
    "%2e%2e",
    "a/b",
    "x?y=1",
    "x#f",
    "a\r\nb",
    "a\nHost: evil.com",
    "@evil.com",
    "http://evil.com/",
    "//evil.com/x",
    "@127.0.0.1:{sink}",
    "http://127.0.0.1:{sink}/",
    "//127.0.0.1:{sink}/x",
    "127.0.0.1:{sink}",
    "../../../../etc/passwd",
    "..\\..\\x",
    " x ",
    "%",
    "é/ü",
    "a;b=c",
]


@pytest.mark.parametrize("template", HOSTILE_SEGMENTS)
def test_path_parameter_stays_one_segment_whatever_it_holds(server: Recorder, sink: Recorder, template: str) -> None:
    value = template.replace("{sink}", str(sink.port))
    spec = connector(
        server.url, {"action": "get", "path": "GET /items/{id}/detail", "input": {"id": {"required": True}}}
    )
    outcome = call(spec, "get", {"id": value})
    assert outcome.sent and outcome.http_status == 200, outcome
    (seen,) = server.seen
    assert "?" not in seen.raw_path and "#" not in seen.raw_path
    parts = seen.raw_path.split("/")
    assert len(parts) == 4 and parts[:2] == ["", "items"] and parts[3] == "detail", seen.raw_path
    assert unquote(parts[2]) == value
    assert sink.seen == []


def test_path_parameter_of_a_write_stays_one_segment(server: Recorder, sink: Recorder) -> None:
    spec = connector(
        server.url, {"action": "put", "path": "PUT /items/{id}", "permission": "write", "input": {"id": {}, "name": {}}}
    )
    outcome = call(spec, "put", {"id": f"../../http://127.0.0.1:{sink.port}/", "name": "n"})
    assert outcome.ok
    assert server.seen[0].raw_path.count("/") == 2 and server.seen[0].json() == {"name": "n"}
    assert sink.seen == []


def test_ticket_system_sees_a_traversal_attempt_as_a_ticket_id(tickets: TicketSystem) -> None:
    spec = connector(tickets.url, {"action": "query_ticket", "path": "GET /tickets/{tid}", "input": {"tid": {}}})
    outcome = call(spec, "query_ticket", {"tid": "../health"})
    assert outcome.code is ErrorCode.DOWNSTREAM_NOT_FOUND
    assert "ticket ../health not found" in outcome.message
    assert [r["path"] for r in tickets.requests()] == ["/tickets/..%2Fhealth"]


# -- where params go ---------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["GET", "DELETE"])
def test_get_and_delete_params_go_to_the_query_string(server: Recorder, method: str) -> None:
    spec = connector(
        server.url,
        {
            "action": "find",
            "path": f"{method} /items",
            "input": {
                "q": {},
                "limit": {"type": "integer"},
                "active": {"type": "boolean"},
                "tags": {"type": "array", "items": {"type": "string"}},
            },
        },
    )
    assert call(spec, "find", {"q": "a&b=c", "limit": 5, "active": True, "tags": ["x", "y"]}).ok
    (seen,) = server.seen
    assert seen.method == method and seen.path == "/items"
    assert seen.query == {"q": ["a&b=c"], "limit": ["5"], "active": ["true"], "tags": ["x", "y"]}
    assert seen.body == b""


@pytest.mark.parametrize("method", ["POST", "PUT", "PATCH"])
def test_post_put_patch_params_go_to_a_json_body(server: Recorder, method: str) -> None:
    spec = connector(
        server.url,
        {
            "action": "save",
            "path": f"{method} /items",
            "permission": "write",
            "input": {"name": {}, "count": {"type": "integer"}, "ok": {"type": "boolean"}, "meta": {"type": "object"}},
        },
    )
    params = {"name": "Zoë", "count": 3, "ok": False, "meta": {"a": [1, None]}}
    assert call(spec, "save", params).ok
    (seen,) = server.seen
    assert seen.method == method and seen.raw_path == "/items"
    assert seen.headers["content-type"] == "application/json"
    assert seen.json() == params


def test_in_and_name_place_each_param_where_the_catalog_says(server: Recorder) -> None:
    spec = connector(
        server.url,
        {
            "action": "add_line",
            "path": "POST /orders/{oid}/lines",
            "permission": "write",
            "input": {
                "oid": {"required": True},
                "sku": {"name": "skuId"},
                "qty": {"type": "integer"},
                "note": {"in": "header", "name": "X-Note"},
                "page": {"type": "integer", "in": "query"},
                "dry_run": {"type": "boolean", "in": "query", "name": "dryRun"},
            },
        },
    )
    params = {"oid": "O-1", "sku": "A1", "qty": 3, "note": "gift wrap", "page": 2, "dry_run": True}
    assert call(spec, "add_line", params).ok
    (seen,) = server.seen
    assert seen.path == "/orders/O-1/lines"
    assert seen.query == {"page": ["2"], "dryRun": ["true"]}
    assert seen.headers["x-note"] == "gift wrap"
    assert seen.json() == {"skuId": "A1", "qty": 3}


def test_body_placed_param_on_a_get_is_sent_as_json(server: Recorder) -> None:
    spec = connector(
        server.url,
        {
            "action": "search",
            "path": "GET /search",
            "input": {"filter": {"type": "object", "in": "body"}, "page": {"type": "integer"}},
        },
    )
    assert call(spec, "search", {"filter": {"x": 1}, "page": 1}).ok
    (seen,) = server.seen
    assert seen.query == {"page": ["1"]} and seen.json() == {"filter": {"x": 1}}


def test_as_string_sends_booleans_and_numbers_as_text(server: Recorder) -> None:
    spec = connector(
        server.url,
        {
            "action": "set",
            "path": "POST /flags",
            "permission": "write",
            "input": {
                "enabled": {"type": "boolean", "as": "string"},
                "level": {"type": "integer", "as": "string"},
                "ratio": {"type": "number", "as": "string"},
                "plain": {"type": "boolean"},
            },
        },
    )
    assert call(spec, "set", {"enabled": True, "level": 5, "ratio": 0.5, "plain": True}).ok
    assert server.seen[0].json() == {"enabled": "true", "level": "5", "ratio": "0.5", "plain": True}


@pytest.mark.parametrize("value", ["2024-06-15T02:00:00+00:00", "2024-06-15T02:00:00Z", "2024-06-15T10:00:00+08:00"])
def test_datetime_is_converted_to_the_systems_zone_and_format(server: Recorder, value: str) -> None:
    spec = connector(
        server.url,
        {
            "action": "book",
            "path": "POST /bookings",
            "permission": "write",
            "input": {
                "start": {"type": "datetime", "format": "%Y-%m-%d %H:%M:%S", "timezone": "Asia/Shanghai"},
                "end": {"type": "datetime", "timezone": "Asia/Shanghai"},
                "raw": {"type": "datetime"},
            },
        },
    )
    assert call(spec, "book", {"start": value, "end": value, "raw": value}).ok
    assert server.seen[0].json() == {"start": "2024-06-15 10:00:00", "end": "2024-06-15T10:00:00+08:00", "raw": value}


def test_converted_datetime_and_date_in_the_query_string(server: Recorder) -> None:
    spec = connector(
        server.url,
        {
            "action": "report",
            "path": "GET /report",
            "input": {
                "since": {"type": "datetime", "format": "%Y-%m-%d %H:%M:%S", "timezone": "Asia/Shanghai"},
                "day": {"type": "date", "format": "%d/%m/%Y"},
            },
        },
    )
    assert call(spec, "report", {"since": "2024-06-15T02:00:00+00:00", "day": "2024-06-15"}).ok
    assert server.seen[0].query == {"since": ["2024-06-15 10:00:00"], "day": ["15/06/2024"]}


def test_null_as_controls_what_an_accepted_null_becomes_in_the_body(server: Recorder) -> None:
    spec = connector(
        server.url,
        {
            "action": "upd",
            "path": "PUT /x",
            "permission": "write",
            "input": {
                "empty": {"nullable": True, "null_as": ""},
                "gone": {"nullable": True, "null_as": "omit"},
                "null": {"nullable": True, "null_as": "null"},
                "plain": {"nullable": True},
            },
        },
    )
    assert call(spec, "upd", {"empty": None, "gone": None, "null": None, "plain": None}).ok
    assert server.seen[0].json() == {"empty": "", "null": None, "plain": None}


def test_null_as_in_the_query_string(server: Recorder) -> None:
    spec = connector(
        server.url,
        {
            "action": "find",
            "path": "GET /x",
            "input": {"empty": {"nullable": True, "null_as": ""}, "gone": {"nullable": True, "null_as": "omit"}},
        },
    )
    assert call(spec, "find", {"empty": None, "gone": None}).ok
    assert server.seen[0].query == {"empty": [""]}


@pytest.mark.parametrize("value", ["a\r\nX-Injected: 1", "line\nbreak", "nul\x00"])
def test_header_value_with_control_characters_is_never_sent(server: Recorder, value: str) -> None:
    spec = connector(
        server.url,
        {
            "action": "note",
            "path": "POST /notes",
            "permission": "write",
            "input": {"note": {"in": "header", "name": "X-Note"}},
        },
    )
    outcome = call(spec, "note", {"note": value})
    assert outcome.code is ErrorCode.VALIDATION_FAILED and outcome.sent is False
    assert server.seen == []


def test_non_ascii_header_value_is_refused_without_raising(server: Recorder) -> None:
    spec = connector(
        server.url,
        {
            "action": "note",
            "path": "POST /notes",
            "permission": "write",
            "input": {"note": {"in": "header", "name": "X-Note"}},
        },
    )
    outcome = call(spec, "note", {"note": "café"})
    assert outcome.code is ErrorCode.VALIDATION_FAILED and outcome.sent is False
    assert server.seen == []


# -- auth ----------------------------------------------------------------------------------------


def test_api_key_in_a_header_comes_from_the_given_environment(server: Recorder) -> None:
    spec = connector(
        server.url,
        {"action": "get", "path": "GET /x"},
        auth={"type": "api_key", "in": "header", "name": "X-API-Key", "key_env": "SYS_KEY"},
    )
    assert call(spec, "get", environ={"SYS_KEY": "k-123"}).ok
    assert server.seen[0].headers["x-api-key"] == "k-123"


def test_api_key_in_the_query_string_sits_beside_the_actions_params(server: Recorder) -> None:
    spec = connector(
        server.url,
        {"action": "get", "path": "GET /x", "input": {"q": {}}},
        auth={"type": "api_key", "in": "query", "name": "apikey", "key_env": "SYS_KEY"},
    )
    assert call(spec, "get", {"q": "hello"}, environ={"SYS_KEY": "k-123"}).ok
    assert server.seen[0].query == {"q": ["hello"], "apikey": ["k-123"]}
    assert server.seen[0].path == "/x"


def test_bearer_token_comes_from_the_given_environment(server: Recorder) -> None:
    spec = connector(server.url, {"action": "get", "path": "GET /x"}, auth={"type": "bearer", "token_env": "SYS_TOKEN"})
    assert call(spec, "get", environ={"SYS_TOKEN": "tok-9"}).ok
    assert server.seen[0].headers["authorization"] == "Bearer tok-9"


def test_basic_auth_comes_from_the_given_environment(server: Recorder) -> None:
    spec = connector(
        server.url,
        {"action": "get", "path": "GET /x"},
        auth={"type": "basic", "username_env": "SYS_USER", "password_env": "SYS_PASS"},
    )
    assert call(spec, "get", environ={"SYS_USER": "alice", "SYS_PASS": "p@ss:word"}).ok
    assert server.seen[0].headers["authorization"] == "Basic " + base64.b64encode(b"alice:p@ss:word").decode()


@pytest.mark.parametrize(
    "auth, env, missing",
    [
        ({"type": "api_key", "name": "X-API-Key", "key_env": "SYS_KEY"}, {}, "SYS_KEY"),
        ({"type": "bearer", "token_env": "SYS_TOKEN"}, {"SYS_TOKEN": ""}, "SYS_TOKEN"),
        ({"type": "basic", "username_env": "SYS_USER", "password_env": "SYS_PASS"}, {"SYS_USER": "alice"}, "SYS_PASS"),
    ],
)
def test_missing_secret_names_the_variable(
    monkeypatch: pytest.MonkeyPatch, auth: dict[str, Any], env: dict[str, str], missing: str
) -> None:
    monkeypatch.setenv(missing, "from-os-environ")  # the injected environment is the only one read
    spec = connector("http://127.0.0.1:9", {"action": "get", "path": "GET /x"}, auth=auth)
    with pytest.raises(MissingSecret, match=missing):
        HttpAdapter(spec, environ=env)


def test_no_auth_sends_no_credentials(server: Recorder) -> None:
    spec = connector(server.url, {"action": "get", "path": "GET /x"})
    assert call(spec, "get").ok
    assert "authorization" not in server.seen[0].headers


# -- answers -> outcomes -------------------------------------------------------------------------

READ = {"action": "get", "path": "GET /x", "input": {"id": {}}}


@pytest.mark.parametrize(
    "status, body, data",
    [
        (200, {"ticket_id": "TK-1", "status": "open"}, {"ticket_id": "TK-1", "status": "open"}),
        (201, {"id": 1}, {"id": 1}),
        (204, b"", {}),
        (200, [1, 2], {"result": [1, 2]}),
        (200, b"plain text", {"result": "plain text"}),
    ],
)
def test_2xx_is_ok_with_the_data(server: Recorder, status: int, body: Any, data: Any) -> None:
    server.answer(status, body)
    outcome = call(connector(server.url, READ), "get")
    assert outcome.ok and outcome.code is None
    assert outcome.data == data and outcome.http_status == status


@pytest.mark.parametrize(
    "status, body",
    [
        (400, {"detail": "priority is not valid"}),
        (422, {"detail": "priority is not valid"}),
        (422, {"message": "priority is not valid"}),
        (422, {"detail": [{"loc": ["body", "priority"], "msg": "priority is not valid"}]}),
        (400, b"priority is not valid"),
    ],
)
def test_400_and_422_pass_on_the_systems_own_message(server: Recorder, status: int, body: Any) -> None:
    server.answer(status, body)
    outcome = call(connector(server.url, READ), "get")
    assert outcome.code is ErrorCode.DOWNSTREAM_VALIDATION_FAILED
    assert "priority is not valid" in outcome.message
    assert outcome.http_status == status and outcome.sent
    assert (outcome.code.status, outcome.code.retryable) == ("failed", False)


def test_ticket_system_422_reaches_the_agent_in_its_words(tickets: TicketSystem) -> None:
    spec = connector(
        tickets.url,
        {
            "action": "create_ticket",
            "path": "POST /tickets",
            "permission": "write",
            "input": {"title": {}, "priority": {}},
        },
    )
    outcome = call(spec, "create_ticket", {"title": "printer", "priority": "urgent"})
    assert outcome.code is ErrorCode.DOWNSTREAM_VALIDATION_FAILED
    assert "priority must be one of low, medium, high" in outcome.message
    ok = call(spec, "create_ticket", {"title": "printer", "priority": "high"})
    assert ok.ok and ok.data["ticket_id"] == "TK-0001" and ok.data["priority"] == "high"


@pytest.mark.parametrize(
    "status, code, retryable",
    [
        (401, ErrorCode.DOWNSTREAM_AUTH_FAILED, False),
        (403, ErrorCode.DOWNSTREAM_AUTH_FAILED, False),
        (404, ErrorCode.DOWNSTREAM_NOT_FOUND, False),
        (409, ErrorCode.DOWNSTREAM_CONFLICT, False),
        (429, ErrorCode.DOWNSTREAM_RATE_LIMITED, True),
        (500, ErrorCode.DOWNSTREAM_ERROR, True),
        (502, ErrorCode.DOWNSTREAM_ERROR, True),
        (503, ErrorCode.DOWNSTREAM_ERROR, True),
    ],
)
def test_error_status_maps_to_its_code(server: Recorder, status: int, code: ErrorCode, retryable: bool) -> None:
    server.answer(status, {"detail": f"the system says {status}"})
    outcome = call(connector(server.url, READ), "get")
    assert outcome.ok is False and outcome.code is code
    assert (code.status, code.retryable) == ("failed", retryable)
    assert outcome.http_status == status and outcome.sent
    assert f"the system says {status}" in outcome.message
    assert outcome.suggestion


@pytest.mark.parametrize("status, code", [(429, ErrorCode.DOWNSTREAM_RATE_LIMITED), (503, ErrorCode.DOWNSTREAM_ERROR)])
def test_retry_after_is_passed_on_in_milliseconds(server: Recorder, status: int, code: ErrorCode) -> None:
    server.answer(status, {"detail": "slow down"}, headers={"Retry-After": "2"})
    outcome = call(connector(server.url, READ), "get")
    assert outcome.code is code and outcome.retry_after_ms == 2000


def test_5xx_with_a_plain_text_body_passes_the_text_on(server: Recorder) -> None:
    server.answer(502, b"Bad gateway: upstream db down", headers={"Content-Type": "text/plain"})
    outcome = call(connector(server.url, READ), "get")
    assert outcome.code is ErrorCode.DOWNSTREAM_ERROR and "upstream db down" in outcome.message


def test_connection_refused_is_unreachable_and_never_sent() -> None:
    outcome = call(connector(f"http://127.0.0.1:{closed_port()}", READ), "get")
    assert outcome.code is ErrorCode.DOWNSTREAM_UNREACHABLE
    assert outcome.sent is False
    assert (outcome.code.status, outcome.code.retryable) == ("failed", True)


def test_a_refused_write_is_unreachable_too_not_unknown() -> None:
    spec = connector(
        f"http://127.0.0.1:{closed_port()}",
        {"action": "create", "path": "POST /x", "permission": "write", "idempotent": False},
    )
    outcome = call(spec, "create")
    assert outcome.code is ErrorCode.DOWNSTREAM_UNREACHABLE and outcome.sent is False


# -- timeouts -------------------------------------------------------------------------------------


def timed(spec: ConnectorSpec, action: str, ctx: CallContext | None = None) -> tuple[Outcome, float]:
    started = time.perf_counter()
    outcome = call(spec, action, ctx=ctx)
    return outcome, time.perf_counter() - started


def test_read_timeout_on_an_idempotent_action_is_downstream_timeout(server: Recorder) -> None:
    server.answer(200, {"late": True}, delay=2.0)
    spec = connector(server.url, {"action": "get", "path": "GET /slow", "timeout": "300ms"})
    outcome, elapsed = timed(spec, "get")
    assert outcome.code is ErrorCode.DOWNSTREAM_TIMEOUT
    assert (outcome.code.status, outcome.code.retryable) == ("failed", True)
    assert elapsed < 1.5
    assert len(server.seen) == 1


def test_read_timeout_on_a_non_idempotent_write_is_outcome_unknown(server: Recorder) -> None:
    server.answer(201, {"id": 1}, delay=2.0)
    spec = connector(
        server.url,
        {"action": "create", "path": "POST /things", "permission": "write", "idempotent": False, "timeout": "300ms"},
        {"action": "find", "path": "GET /things"},
    )
    outcome, elapsed = timed(spec, "create")
    assert outcome.code is ErrorCode.OUTCOME_UNKNOWN
    assert (outcome.code.status, outcome.code.retryable) == ("unknown", False)
    assert outcome.sent is True
    assert "sys.find" in outcome.suggestion  # how to check before resending
    assert elapsed < 1.5
    assert [s.method for s in server.seen] == ["POST"]


def test_read_timeout_on_a_write_declared_idempotent_is_downstream_timeout(server: Recorder) -> None:
    server.answer(200, {}, delay=2.0)
    spec = connector(
        server.url,
        {"action": "put", "path": "PUT /things/1", "permission": "write", "idempotent": True, "timeout": "300ms"},
    )
    outcome, elapsed = timed(spec, "put")
    assert outcome.code is ErrorCode.DOWNSTREAM_TIMEOUT and elapsed < 1.5


def test_the_call_context_timeout_overrides_the_actions(server: Recorder) -> None:
    server.answer(200, {}, delay=2.0)
    spec = connector(server.url, {"action": "get", "path": "GET /slow", "timeout": "10s"})
    outcome, elapsed = timed(spec, "get", CallContext("intent-1", timeout=0.3))
    assert outcome.code is ErrorCode.DOWNSTREAM_TIMEOUT and elapsed < 1.5


def test_an_answer_within_the_timeout_is_ok(server: Recorder) -> None:
    server.answer(200, {"fine": True}, delay=0.1)
    spec = connector(server.url, {"action": "get", "path": "GET /slow", "timeout": "2s"})
    assert call(spec, "get").data == {"fine": True}


def test_a_trickling_answer_is_cut_off_at_the_actions_timeout(server: Recorder) -> None:
    server.answer(200, {}, trickle=(15, 0.1))
    spec = connector(server.url, {"action": "get", "path": "GET /slow", "timeout": "300ms"})
    outcome, elapsed = timed(spec, "get")
    assert outcome.code is ErrorCode.DOWNSTREAM_TIMEOUT
    assert elapsed < 1.0


# -- declared output, error rules, redirects, size --------------------------------------------

WITH_OUTPUT = {
    "action": "query_ticket",
    "path": "GET /tickets/{tid}",
    "input": {"tid": {}},
    "output": {"status": {"type": "enum", "values": ["open", "closed"]}},
}


@pytest.mark.parametrize(
    "body, field_code",
    [
        ({"ticket_id": "TK-1"}, ("status", "required")),
        ({"status": "pending"}, ("status", "enum")),
        ({"status": None}, ("status", "null")),
        (b"", ("status", "required")),
    ],
)
def test_missing_or_wrong_declared_output_is_a_contract_violation(
    server: Recorder, body: Any, field_code: tuple[str, str]
) -> None:
    server.answer(200, body)
    outcome = call(connector(server.url, WITH_OUTPUT), "query_ticket", {"tid": "TK-1"})
    assert outcome.code is ErrorCode.DOWNSTREAM_CONTRACT_VIOLATION
    assert (outcome.code.status, outcome.code.retryable) == ("failed", False)
    assert [(d["field"], d["code"]) for d in outcome.details] == [field_code]


def test_declared_output_present_is_ok(server: Recorder) -> None:
    server.answer(200, {"status": "closed", "extra": 1})
    assert call(connector(server.url, WITH_OUTPUT), "query_ticket", {"tid": "TK-1"}).data == {
        "status": "closed",
        "extra": 1,
    }


ERROR_RULES = {
    "action": "order",
    "path": "POST /orders",
    "permission": "write",
    "input": {"sku": {}},
    "errors": [
        {
            "status": 400,
            "field": "error.code",
            "equals": "OUT_OF_STOCK",
            "code": "DOWNSTREAM_CONFLICT",
            "message": "The item is out of stock",
            "suggestion": "Offer the customer another sku.",
        },
        {"status": 418, "code": "DOWNSTREAM_ERROR"},
    ],
}


def test_error_rule_maps_status_and_body_field_to_its_code_and_words(server: Recorder) -> None:
    server.answer(400, {"error": {"code": "OUT_OF_STOCK", "message": "E1021"}})
    outcome = call(connector(server.url, ERROR_RULES), "order", {"sku": "A1"})
    assert outcome.code is ErrorCode.DOWNSTREAM_CONFLICT
    assert outcome.message == "The item is out of stock"
    assert outcome.suggestion == "Offer the customer another sku."
    assert outcome.http_status == 400


def test_error_rule_that_does_not_match_falls_back_to_the_status(server: Recorder) -> None:
    server.answer(400, {"error": {"code": "BAD_SKU"}, "detail": "sku A1 is malformed"})
    outcome = call(connector(server.url, ERROR_RULES), "order", {"sku": "A1"})
    assert outcome.code is ErrorCode.DOWNSTREAM_VALIDATION_FAILED
    assert "sku A1 is malformed" in outcome.message


def test_error_rule_without_message_uses_the_systems_message(server: Recorder) -> None:
    server.answer(418, {"detail": "I'm a teapot"})
    outcome = call(connector(server.url, ERROR_RULES), "order", {"sku": "A1"})
    assert outcome.code is ErrorCode.DOWNSTREAM_ERROR and outcome.message == "I'm a teapot"


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_a_redirect_is_never_followed(server: Recorder, sink: Recorder, status: int) -> None:
    server.answer(status, {}, headers={"Location": f"http://127.0.0.1:{sink.port}/stolen"})
    outcome = call(connector(server.url, READ), "get", {"id": "1"})
    assert outcome.ok is False and outcome.http_status == status
    assert outcome.code is ErrorCode.DOWNSTREAM_CONTRACT_VIOLATION
    assert len(server.seen) == 1 and sink.seen == []


def test_an_oversized_answer_to_a_read_with_declared_output_is_a_contract_violation(server: Recorder) -> None:
    server.answer(200, {"status": "open", "blob": "x" * 5000})
    spec = connector(server.url, WITH_OUTPUT)
    adapter = HttpAdapter(spec, environ={}, max_response_bytes=1024)
    try:
        outcome = adapter.call(spec.actions[0], {"tid": "TK-1"}, CallContext("intent-1"))
    finally:
        adapter.close()
    assert outcome.code is ErrorCode.DOWNSTREAM_CONTRACT_VIOLATION and "1024 bytes" in outcome.message


def test_an_oversized_2xx_answer_without_declared_output_succeeds_without_its_data(server: Recorder) -> None:
    server.answer(200, {"blob": "x" * 5000})
    spec = connector(server.url, READ)
    adapter = HttpAdapter(spec, environ={}, max_response_bytes=1024)
    try:
        outcome = adapter.call(spec.actions[0], {}, CallContext("intent-1"))
    finally:
        adapter.close()
    assert outcome.ok and "1024 bytes" in outcome.data["_reach_omitted"]
    assert outcome.data["bytes"] > 1024


# -- per-intent headers -------------------------------------------------------------------------

WRITE = {"action": "create", "path": "POST /things", "permission": "write", "input": {"name": {}}}


def test_idempotency_header_carries_the_intents_key(server: Recorder) -> None:
    spec = connector(server.url, WRITE, idempotency_header="Idempotency-Key")
    ctx = CallContext("intent-1", idempotency_key="bot:key-42", traceparent="00-" + "a" * 32 + "-" + "b" * 16 + "-01")
    assert call(spec, "create", {"name": "n"}, ctx).ok
    (seen,) = server.seen
    assert seen.headers["idempotency-key"] == "bot:key-42"
    assert seen.headers["traceparent"] == ctx.traceparent


def test_no_idempotency_header_unless_the_connector_declares_one(server: Recorder) -> None:
    assert call(connector(server.url, WRITE), "create", {"name": "n"}, CallContext("i", idempotency_key="k")).ok
    assert not any("idempotency" in h for h in server.seen[0].headers)


def test_ticket_system_deduplicates_by_the_forwarded_key(tickets: TicketSystem) -> None:
    spec = connector(
        tickets.url,
        {"action": "create_ticket", "path": "POST /tickets", "permission": "write", "input": {"title": {}}},
        idempotency_header="Idempotency-Key",
    )
    ctx = CallContext("intent-1", idempotency_key="same-key")
    first = call(spec, "create_ticket", {"title": "printer"}, ctx)
    second = call(spec, "create_ticket", {"title": "printer"}, ctx)
    assert first.data == second.data and first.data["ticket_id"] == "TK-0001"
    assert [r["headers"]["idempotency-key"] for r in tickets.requests("POST")] == ["same-key", "same-key"]


@pytest.mark.parametrize("key", ["k\r\nX-Evil: 1", "clé-42"])
def test_an_unsendable_idempotency_key_is_refused_as_never_sent(server: Recorder, key: str) -> None:
    spec = connector(server.url, WRITE, idempotency_header="Idempotency-Key")
    outcome = call(spec, "create", {"name": "n"}, CallContext("intent-1", idempotency_key=key))
    assert outcome.ok is False and outcome.sent is False
    assert outcome.code is ErrorCode.VALIDATION_FAILED
    assert server.seen == []


# -- cookies ---------------------------------------------------------------------------------------


def test_a_cookie_set_by_one_answer_is_never_sent_with_a_later_call(server: Recorder) -> None:
    # one client per pool thread carries every agent's calls: a session cookie must not leak between them
    spec = connector(server.url, {"action": "get", "path": "GET /x"})
    server.answer(200, {"ok": True}, headers={"Set-Cookie": "session=agent-a-secret; Path=/"})
    adapter = HttpAdapter(spec, environ={})
    try:
        found = spec.action("get")
        assert found is not None
        for n in range(3):
            assert adapter.call(found, {}, CallContext(f"intent-{n}")).ok
    finally:
        adapter.close()
    assert len(server.seen) == 3
    assert all("cookie" not in seen.headers for seen in server.seen)
