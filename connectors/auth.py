"""Credentials for a connector, read from the environment variables its spec names.

Secrets are read once when the pool starts (a missing one stops the pool with a clear message)
and are never logged, put in receipts or repr'd.
"""

from __future__ import annotations

import os
import ssl
import threading
import time
from collections.abc import Generator, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from connectors.spec import AuthSpec


class MissingSecret(RuntimeError):
    """A connector's auth names an environment variable that is not set."""


def _secret(environ: Mapping[str, str], var: str | None, connector: str) -> str:
    value = environ.get(var or "")
    if not value:
        raise MissingSecret(f"connector {connector}: auth needs the environment variable {var}, which is not set")
    return value


@dataclass(frozen=True)
class TlsFiles:
    """mtls: the client certificate and key (and the CA bundle that signed the server), as paths."""

    cert: str
    key: str
    ca: str | None


def tls_files(spec: AuthSpec, connector: str, environ: Mapping[str, str] | None = None) -> TlsFiles | None:
    """The files an ``mtls`` connector presents (None for other auth types). Every HTTP-based
    adapter (http, soap) loads them into its TLS context."""
    if spec.type != "mtls":
        return None
    env = os.environ if environ is None else environ
    files = TlsFiles(
        _secret(env, spec.cert_env, connector),
        _secret(env, spec.key_env, connector),
        env.get(spec.ca_env) if spec.ca_env else None,
    )
    for path in (files.cert, files.key, files.ca):
        if path is not None and not os.path.isfile(path):
            raise MissingSecret(f"connector {connector}: mtls file {path} does not exist")
    return files


def ssl_context(spec: AuthSpec, connector: str, environ: Mapping[str, str] | None = None) -> ssl.SSLContext:
    """The TLS context of an HTTP-based adapter: the system's CAs (or the connector's CA bundle),
    plus the client certificate for ``mtls``."""
    files = tls_files(spec, connector, environ)
    context = (
        httpx.create_ssl_context() if files is None or files.ca is None else ssl.create_default_context(cafile=files.ca)
    )
    if files is not None:
        context.load_cert_chain(files.cert, files.key)
    return context


def read_secret(var: str | None, connector: str, environ: Mapping[str, str] | None = None) -> str:
    """The value of the environment variable a connector names (``dsn_env``, ``url_env``, ...);
    raises MissingSecret when it is not set. Every adapter reads its secrets through here."""
    return _secret(os.environ if environ is None else environ, var, connector)


class TokenError(RuntimeError):
    """The token endpoint refused the client or answered something that is not a token."""


class StaticAuth(httpx.Auth):
    """api_key (header or query), bearer."""

    def __init__(self, headers: dict[str, str], query: dict[str, str]) -> None:
        self._headers = headers
        self._query = query

    def __repr__(self) -> str:
        return "StaticAuth(<redacted>)"

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        for name, value in self._headers.items():
            request.headers[name] = value
        if self._query:
            request.url = request.url.copy_merge_params(self._query)
        yield request


class ClientCredentialsAuth(httpx.Auth):
    """OAuth2 client credentials: one cached token per connector, shared by the pool's threads.

    Refreshed shortly before it expires, and once when the system answers 401.
    """

    requires_response_body = False
    refresh_margin = 30.0  # seconds before expiry

    def __init__(
        self, token_url: str, client_id: str, client_secret: str, scope: str | None, timeout: float = 10.0
    ) -> None:
        self._token_url = token_url
        self._client_id = client_id
        self._client_secret = client_secret
        self._scope = scope
        self._timeout = timeout
        self._lock = threading.Lock()
        self._token: str | None = None
        self._expires_at = 0.0

    def __repr__(self) -> str:
        return f"ClientCredentialsAuth({self._token_url}, <redacted>)"

    def _fetch(self) -> None:
        data = {"grant_type": "client_credentials"}
        if self._scope:
            data["scope"] = self._scope
        response = httpx.post(
            self._token_url, data=data, auth=(self._client_id, self._client_secret), timeout=self._timeout
        )
        if response.status_code != 200:
            raise TokenError(f"the token endpoint answered HTTP {response.status_code}")
        try:
            body = response.json()
            self._token = str(body["access_token"])
            self._expires_at = time.monotonic() + float(body.get("expires_in", 3600))
        except (ValueError, KeyError, TypeError) as exc:
            raise TokenError("the token endpoint's answer has no access_token") from exc

    def token(self, force: bool = False, stale: str | None = None) -> str:
        with self._lock:
            # another thread may already have refreshed the token we saw fail
            if force and self._token is not None and self._token != stale:
                return self._token
            if force or self._token is None or time.monotonic() > self._expires_at - self.refresh_margin:
                self._fetch()
            assert self._token is not None
            return self._token

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        token = self.token()
        request.headers["Authorization"] = f"Bearer {token}"
        response = yield request
        if response.status_code == 401:
            request.headers["Authorization"] = f"Bearer {self.token(force=True, stale=token)}"
            yield request


def build_auth(
    spec: AuthSpec, connector: str, environ: Mapping[str, str] | None = None, *, redis: Any = None
) -> httpx.Auth | None:
    """The httpx auth for a connector, or None for ``type: none``.

    The variables are the ones the spec names (catalog data, not fleet settings), read from
    ``environ`` (default: the process environment, read now, never at import).

    Raises:
        MissingSecret: a named environment variable is not set.
    """
    env = os.environ if environ is None else environ
    if spec.type in ("none", "mtls"):  # mtls is in the TLS context (ssl_context), not a header
        return None
    if spec.type == "api_key":
        value = _secret(env, spec.key_env, connector)
        assert spec.name is not None
        if spec.in_ == "query":
            return StaticAuth({}, {spec.name: value})
        return StaticAuth({spec.name: value}, {})
    if spec.type == "bearer":
        return StaticAuth({"Authorization": f"Bearer {_secret(env, spec.token_env, connector)}"}, {})
    if spec.type == "basic":
        return httpx.BasicAuth(_secret(env, spec.username_env, connector), _secret(env, spec.password_env, connector))
    assert spec.token_url is not None
    return ClientCredentialsAuth(
        spec.token_url,
        _secret(env, spec.client_id_env, connector),
        _secret(env, spec.client_secret_env, connector),
        spec.scope,
    )
