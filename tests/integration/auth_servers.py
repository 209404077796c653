"""Real systems behind the four newer auth kinds, for the tests: each one checks credentials the
way such a system does and counts what it did, so a test can tell a login, a grant or a refusal
from a call that went through.

Stdlib HTTP servers on 127.0.0.1 (a free port each), one thread per connection:

- ``FormLoginApp``: ``POST /login`` (form fields ``username``/``password``) sets a ``sid`` session
  cookie and redirects home; a wrong password redirects back to ``/login?error=1`` (with a flash
  cookie, as real apps do). Everything else needs a live session: without one it answers 401, or
  (``expired = "redirect"``) a redirect to the login page. ``expire_sessions()`` ends every session.
  ``POST /api/notes`` is a write whose executions are counted per text.
- ``MtlsServer``: HTTPS that requires a client certificate signed by its trustme CA; it answers
  with the client certificate's name and counts refused handshakes.
- ``OAuthServer``: ``POST /token`` with the refresh-token grant; every refresh token works once
  and is then burned (presenting a burned one is counted as ``reused`` and refused with
  ``invalid_grant``). ``/api/...`` needs a live access token; ``revoke_access()`` ends them all.
- ``JwtApi``: verifies a bearer JWT (signature, ``iss``, ``aud``, ``exp``, a lifetime of at most
  5 minutes) and that its ``scope`` is the one the path demands; 401 for a bad token, 403 for a
  scope that does not fit. Keeps the claims of every accepted token.

``shared_refresh_worker`` is the client side: a process of its own holding an HTTP adapter whose
refresh tokens live in Redis (two of them race for one refresh token).
"""

from __future__ import annotations

import base64
import json
import secrets
import ssl
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import jwt
import trustme

MAX_BODY = 1 << 16


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # many threads connect at once; the default 5 drops SYNs (a 1 s retry)
    scheme = "http"

    def __init__(self, handler: type[BaseHTTPRequestHandler]) -> None:
        super().__init__(("127.0.0.1", 0), handler)
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.server_address[1]}"

    def start(self) -> _Server:
        threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
        return self

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    def body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(min(length, MAX_BODY))

    def send(self, status: int, body: Any, headers: list[tuple[str, str]] | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in headers or []:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def bearer(self) -> str:
        value = self.headers.get("Authorization", "")
        return value[7:] if value.startswith("Bearer ") else ""


# -- form login -------------------------------------------------------------------------------


class FormLoginApp(_Server):
    def __init__(self, username: str = "clerk", password: str = "open sesame") -> None:
        super().__init__(_FormHandler)
        self.username = username
        self.password = password
        self.sessions: set[str] = set()
        self.logins = 0  # successful
        self.failed_logins = 0
        self.login_delay = 0.0  # seconds a login takes (so concurrent callers overlap)
        self.logins_in_flight = self.most_logins_in_flight = 0
        self.expired = "401"  # or "redirect": how a request without a live session is answered
        self.refused = 0  # requests answered 401 / redirect
        self.notes: Counter[str] = Counter()  # executions per note text
        self.cookies_seen: list[str] = []

    def expire_sessions(self) -> None:
        with self.lock:
            self.sessions.clear()


class _FormHandler(_Handler):
    server: FormLoginApp

    def _login(self) -> None:
        srv = self.server
        form = parse_qs(self.body().decode(errors="replace"))
        with srv.lock:
            srv.logins_in_flight += 1
            srv.most_logins_in_flight = max(srv.most_logins_in_flight, srv.logins_in_flight)
        time.sleep(srv.login_delay)
        ok = form.get("username") == [srv.username] and form.get("password") == [srv.password]
        with srv.lock:
            srv.logins_in_flight -= 1
            if not ok:
                srv.failed_logins += 1
                self.send(303, {}, [("Location", "/login?error=1"), ("Set-Cookie", "flash=bad-login; Path=/")])
                return
            srv.logins += 1
            sid = secrets.token_urlsafe(16)
            srv.sessions.add(sid)
        self.send(303, {}, [("Location", "/home"), ("Set-Cookie", f"sid={sid}; Path=/; HttpOnly")])

    def _session(self) -> bool:
        cookies = dict(part.strip().split("=", 1) for part in self.headers.get("Cookie", "").split(";") if "=" in part)
        srv = self.server
        with srv.lock:
            srv.cookies_seen.append(self.headers.get("Cookie", ""))
            if cookies.get("sid") in srv.sessions:
                return True
            srv.refused += 1
        if srv.expired == "redirect":
            self.send(302, {}, [("Location", f"/login?next={urlsplit(self.path).path}")])
        else:
            self.send(401, {"detail": "session expired"})
        return False

    def do_POST(self) -> None:  # noqa: N802
        path = urlsplit(self.path).path
        if path == "/login":
            return self._login()
        body = self.body()  # read before answering, so a refused request leaves the connection usable
        if not self._session():
            return
        text = str(json.loads(body or b"{}").get("text", ""))
        with self.server.lock:
            self.server.notes[text] += 1
        self.send(201, {"text": text, "saved": True})

    def do_GET(self) -> None:  # noqa: N802
        if self._session():
            self.send(200, {"user": self.server.username})


# -- mTLS ---------------------------------------------------------------------------------------


class TlsFiles:
    """A trustme CA and the PEM files a connector needs: the CA, a client certificate and its key."""

    def __init__(self, directory: Path, client_name: str = "reach-client.example") -> None:
        self.ca = trustme.CA()
        self.server_cert = self.ca.issue_cert("127.0.0.1")
        client = self.ca.issue_cert(client_name)
        self.ca_path = str(directory / "ca.pem")
        self.cert_path = str(directory / "client.pem")
        self.key_path = str(directory / "client.key")
        self.ca.cert_pem.write_to_path(self.ca_path)
        client.cert_chain_pems[0].write_to_path(self.cert_path)
        client.private_key_pem.write_to_path(self.key_path)


class MtlsServer(_Server):
    scheme = "https"

    def __init__(self, files: TlsFiles) -> None:
        super().__init__(_MtlsHandler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        files.server_cert.configure_cert(context)
        files.ca.configure_trust(context)
        context.verify_mode = ssl.CERT_REQUIRED  # no certificate, no connection
        self.context = context
        self.answered = 0
        self.refused_handshakes = 0

    def finish_request(self, request: Any, client_address: Any) -> None:
        # the handshake runs in the connection's own thread, so a slow client cannot stall the others
        try:
            tls = self.context.wrap_socket(request, server_side=True)
        except (ssl.SSLError, OSError):
            with self.lock:
                self.refused_handshakes += 1
            return
        try:
            super().finish_request(tls, client_address)
        finally:
            tls.close()


class _MtlsHandler(_Handler):
    server: MtlsServer

    def _answer(self) -> None:
        cert = self.connection.getpeercert() or {}
        names = [value for kind, value in cert.get("subjectAltName", ()) if kind == "DNS"]
        with self.server.lock:
            self.server.answered += 1
        self.send(200, {"client": names[0] if names else None, "path": urlsplit(self.path).path})

    def do_GET(self) -> None:  # noqa: N802
        self._answer()

    def do_POST(self) -> None:  # noqa: N802
        self.body()
        self._answer()


# -- OAuth2 refresh tokens ----------------------------------------------------------------------


class OAuthServer(_Server):
    def __init__(self, client_id: str = "reach", client_secret: str | None = "s3cret", first: str = "rt-0") -> None:
        super().__init__(_OAuthHandler)
        self.client_id = client_id
        self.client_secret = client_secret
        self.refresh_tokens = {first}  # usable, each once
        self.burned: set[str] = set()
        self.access: set[str] = set()
        self.grants = 0
        self.reused = 0  # burned refresh tokens presented again
        self.refused_grants = 0
        self.grant_delay = 0.0  # seconds a grant takes (so concurrent refreshes overlap)
        self.grants_in_flight = self.most_grants_in_flight = 0
        self.expires_in = 3600
        self.api_calls = 0
        self.api_refused = 0
        self.forms: list[dict[str, list[str]]] = []

    def revoke_access(self) -> None:
        with self.lock:
            self.access.clear()

    @property
    def current_refresh_token(self) -> str:
        with self.lock:
            (token,) = self.refresh_tokens
            return token


class _OAuthHandler(_Handler):
    server: OAuthServer

    def _client_ok(self, form: dict[str, list[str]]) -> bool:
        srv = self.server
        if srv.client_secret is None:
            return form.get("client_id") == [srv.client_id]
        basic = self.headers.get("Authorization", "")
        if not basic.startswith("Basic "):
            return False
        return base64.b64decode(basic[6:]).decode() == f"{srv.client_id}:{srv.client_secret}"

    def do_POST(self) -> None:  # noqa: N802
        srv = self.server
        form = parse_qs(self.body().decode())
        with srv.lock:
            srv.forms.append(form)
            srv.grants_in_flight += 1
            srv.most_grants_in_flight = max(srv.most_grants_in_flight, srv.grants_in_flight)
        try:
            time.sleep(srv.grant_delay)
            if urlsplit(self.path).path != "/token" or form.get("grant_type") != ["refresh_token"]:
                return self.send(400, {"error": "unsupported_grant_type"})
            if not self._client_ok(form):
                return self.send(401, {"error": "invalid_client"})
            (presented,) = form.get("refresh_token", [""])
            with srv.lock:
                if presented not in srv.refresh_tokens:
                    srv.refused_grants += 1
                    srv.reused += presented in srv.burned
                    return self.send(400, {"error": "invalid_grant", "error_description": "refresh token not valid"})
                srv.refresh_tokens.discard(presented)
                srv.burned.add(presented)
                srv.grants += 1
                refresh, access = f"rt-{srv.grants}", f"at-{srv.grants}-{secrets.token_hex(4)}"
                srv.refresh_tokens.add(refresh)
                srv.access.add(access)
            self.send(
                200,
                {
                    "access_token": access,
                    "refresh_token": refresh,
                    "token_type": "Bearer",
                    "expires_in": srv.expires_in,
                },
            )
        finally:
            with srv.lock:
                srv.grants_in_flight -= 1

    def do_GET(self) -> None:  # noqa: N802
        srv = self.server
        with srv.lock:
            ok = self.bearer() in srv.access
            srv.api_calls += ok
            srv.api_refused += not ok
        if ok:
            self.send(200, {"orders": [], "path": urlsplit(self.path).path})
        else:
            self.send(401, {"error": "invalid_token"})


# -- JWT ------------------------------------------------------------------------------------------


class JwtApi(_Server):
    def __init__(self, key: Any, algorithm: str, audience: str, issuer: str, scopes: dict[str, str]) -> None:
        """``key``: the verification key (the HS256 secret or the RS256 public key); ``scopes``:
        path -> the scope a token must carry to use it."""
        super().__init__(_JwtHandler)
        self.key = key
        self.algorithm = algorithm
        self.audience = audience
        self.issuer = issuer
        self.scopes = scopes
        self.accepted: list[dict[str, Any]] = []  # claims of every token let through
        self.refused: list[tuple[int, str]] = []


class _JwtHandler(_Handler):
    server: JwtApi

    def _serve(self) -> None:
        srv = self.server
        path = urlsplit(self.path).path
        try:
            claims = jwt.decode(
                self.bearer(),
                srv.key,
                algorithms=[srv.algorithm],
                audience=srv.audience,
                issuer=srv.issuer,
                options={"require": ["exp", "iat", "sub", "jti", "scope"]},
            )
        except jwt.InvalidTokenError as exc:
            return self._refuse(401, f"invalid token: {type(exc).__name__}")
        if claims["exp"] - claims["iat"] > 300:
            return self._refuse(401, "token lives too long")
        if claims["scope"] != srv.scopes.get(path):
            return self._refuse(403, f"scope {claims['scope']} may not use {path}")
        with srv.lock:
            srv.accepted.append(claims)
        self.send(200, {"sub": claims["sub"], "scope": claims["scope"], "jti": claims["jti"]})

    def _refuse(self, status: int, why: str) -> None:
        with self.server.lock:
            self.server.refused.append((status, why))
        self.send(status, {"detail": why})

    def do_GET(self) -> None:  # noqa: N802
        self._serve()

    def do_POST(self) -> None:  # noqa: N802
        self.body()
        self._serve()


# -- a second process --------------------------------------------------------------------------


def shared_refresh_worker(
    spec: dict[str, Any], environ: dict[str, str], redis_url: str, threads: int, rounds: int, pipe: Any
) -> None:
    """One pool process in miniature (run with multiprocessing's spawn): an HTTP adapter whose
    refresh tokens live in Redis. Says "ready", then per round waits for "go" and makes ``threads``
    calls at once, sending back whether each succeeded and its error code."""
    import redis

    from connectors.adapters.base import CallContext
    from connectors.adapters.http import HttpAdapter
    from connectors.spec import ConnectorSpec

    connector = ConnectorSpec.model_validate(spec)
    adapter = HttpAdapter(connector, environ=environ, redis=redis.Redis.from_url(redis_url))
    action = connector.actions[0]
    pipe.send("ready")
    for _ in range(rounds):
        if pipe.recv() != "go":
            return
        results: list[str] = []

        def one(n: int) -> None:
            outcome = adapter.call(action, {}, CallContext(intent_id=f"i{n}", agent_id="desk", action=action.action))
            results.append("ok" if outcome.ok else str(outcome.code))

        workers = [threading.Thread(target=one, args=(n,)) for n in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(30)
        pipe.send(results)
    adapter.close()
