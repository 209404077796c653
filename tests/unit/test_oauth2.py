"""OAuth2 client credentials against a real local token endpoint and API."""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs

import pytest

from connectors.adapters.auth import MissingSecret
from connectors.adapters.base import CallContext
from connectors.adapters.http import HttpAdapter
from connectors.spec import ConnectorSpec


class AuthServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.lock = threading.Lock()
        self.token_requests: list[dict[str, Any]] = []
        self.valid: set[str] = set()
        self.expires_in = 3600
        threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: AuthServer
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    def _send(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:  # noqa: N802
        length = int(self.headers.get("Content-Length") or 0)
        form = parse_qs(self.rfile.read(length).decode())
        basic = base64.b64decode(self.headers.get("Authorization", "Basic ").split(" ", 1)[1] or b"").decode()
        with self.server.lock:
            token = f"tok-{len(self.server.token_requests) + 1}"
            self.server.token_requests.append({"form": form, "basic": basic})
            self.server.valid = {token}
        if basic != "client-1:s3cret":
            return self._send(401, {"error": "invalid_client"})
        self._send(200, {"access_token": token, "token_type": "bearer", "expires_in": self.server.expires_in})

    def do_GET(self) -> None:  # noqa: N802
        token = self.headers.get("Authorization", "").removeprefix("Bearer ")
        with self.server.lock:
            ok = token in self.server.valid
        self._send(200, {"token": token}) if ok else self._send(401, {"detail": "token expired"})


@pytest.fixture
def server() -> Iterator[AuthServer]:
    srv = AuthServer()
    yield srv
    srv.shutdown()
    srv.server_close()


ENV = {"CRM_CLIENT_ID": "client-1", "CRM_CLIENT_SECRET": "s3cret"}


def adapter(server: AuthServer, env: dict[str, str] = ENV) -> tuple[HttpAdapter, ConnectorSpec]:
    spec = ConnectorSpec.model_validate(
        {
            "name": "crm",
            "endpoint": server.url,
            "auth": {
                "type": "oauth2_client_credentials",
                "token_url": server.url + "/token",
                "client_id_env": "CRM_CLIENT_ID",
                "client_secret_env": "CRM_CLIENT_SECRET",
                "scope": "tickets",
            },
            "actions": [{"action": "me", "path": "GET /me"}],
        }
    )
    return HttpAdapter(spec, environ=env), spec


def call(a: HttpAdapter, spec: ConnectorSpec) -> Any:
    return a.call(spec.actions[0], {}, CallContext(intent_id="i"))


def test_token_is_fetched_once_and_shared_by_threads(server: AuthServer) -> None:
    a, spec = adapter(server)
    results: list[bool] = []
    threads = [threading.Thread(target=lambda: results.append(call(a, spec).ok)) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [True] * 20
    assert len(server.token_requests) == 1
    assert server.token_requests[0]["form"] == {"grant_type": ["client_credentials"], "scope": ["tickets"]}
    a.close()


def test_token_is_refreshed_before_it_expires(server: AuthServer) -> None:
    server.expires_in = 31  # the refresh margin is 30 s: stale after about one second
    a, spec = adapter(server)
    assert call(a, spec).ok
    assert call(a, spec).ok and len(server.token_requests) == 1
    time.sleep(1.1)
    assert call(a, spec).ok and len(server.token_requests) == 2
    a.close()


def test_a_401_refreshes_the_token_once_and_retries(server: AuthServer) -> None:
    a, spec = adapter(server)
    assert call(a, spec).ok
    server.valid = set()  # the system revoked every token
    outcome = call(a, spec)
    assert outcome.ok and outcome.data == {"token": "tok-2"}
    assert len(server.token_requests) == 2


def test_missing_client_secret_names_the_variable(server: AuthServer) -> None:
    with pytest.raises(MissingSecret, match="CRM_CLIENT_SECRET"):
        adapter(server, {"CRM_CLIENT_ID": "client-1"})


def test_the_secret_never_appears_in_the_auth_repr(server: AuthServer) -> None:
    a, _ = adapter(server)
    assert "s3cret" not in repr(a._client.auth)  # noqa: SLF001
    a.close()


def test_a_refused_client_is_downstream_auth_failed_and_never_calls_the_api(server: AuthServer) -> None:
    a, spec = adapter(server, {"CRM_CLIENT_ID": "client-1", "CRM_CLIENT_SECRET": "wrong"})
    outcome = call(a, spec)
    assert not outcome.ok and outcome.code.value == "DOWNSTREAM_AUTH_FAILED" and outcome.sent is False
    a.close()
