"""The OAuth2 kinds: ``oauth2_client_credentials`` (one cached token per process) and
``oauth2_refresh_token`` (rotating refresh tokens, spent once each, shared through a token store)."""

from __future__ import annotations

import ssl
import threading
import time
from collections.abc import Generator

import httpx

from connectors.adapters.auth.errors import AUTH_TIMEOUT, CredentialsUnavailable, Refusals, TokenError
from connectors.adapters.auth.token_store import MemoryTokens, RedisTokens, Tokens


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


class RefreshTokenAuth(httpx.Auth):
    """OAuth2 refresh-token grant with rotation: each refresh token is good for one refresh.

    The newest refresh token and access token live in a store every pool process of the connector
    reads (Redis; memory without it). Refreshing happens under the store's lock, and whoever gets
    the lock first looks again: a process that waited uses the tokens the other one just stored
    instead of spending the old refresh token a second time. The access token is refreshed shortly
    before it expires, and once when the system answers 401 to it.
    """

    requires_response_body = False
    refresh_margin = 30.0  # seconds before expiry

    def __init__(
        self,
        token_url: str,
        client_id: str,
        client_secret: str | None,
        first_refresh: str,
        scope: str | None,
        verify: ssl.SSLContext,
        store: MemoryTokens | RedisTokens,
    ) -> None:
        self._token_url = token_url
        self._client_id = client_id
        self._client_secret = client_secret
        self._first_refresh = first_refresh
        self._scope = scope
        self._verify = verify
        self._store = store
        self._lock = threading.Lock()
        self._tokens: Tokens | None = None  # this process's copy
        self._refusals = Refusals()

    def __repr__(self) -> str:
        return f"RefreshTokenAuth({self._token_url}, <redacted>)"

    def _grant(self, refresh: str) -> Tokens:
        data = {"grant_type": "refresh_token", "refresh_token": refresh}
        if self._scope:
            data["scope"] = self._scope
        if self._client_secret is None:
            data["client_id"] = self._client_id  # a public client names itself in the form
        client_auth = (self._client_id, self._client_secret) if self._client_secret is not None else None
        try:
            response = httpx.post(
                self._token_url,
                data=data,
                auth=client_auth,
                timeout=AUTH_TIMEOUT,
                verify=self._verify,
                trust_env=False,
            )
        except httpx.HTTPError as exc:
            raise CredentialsUnavailable(f"the token endpoint did not answer ({type(exc).__name__})") from exc
        if response.status_code >= 500 or response.status_code == 429:
            raise CredentialsUnavailable(f"the token endpoint answered HTTP {response.status_code}")
        if response.status_code != 200:
            raise TokenError(
                f"the token endpoint refused the refresh token (HTTP {response.status_code}{_oauth_error(response)}); "
                "a new refresh token is needed"
            )
        try:
            body = response.json()
            access = str(body["access_token"])
            lifetime = float(body.get("expires_in", 3600))
        except (ValueError, KeyError, TypeError) as exc:
            raise TokenError("the token endpoint's answer has no access_token") from exc
        # a server that does not rotate answers without a new refresh token: the old one stays good
        return Tokens(access, str(body.get("refresh_token") or refresh), time.time() + lifetime)

    def _usable(self, tokens: Tokens | None, stale: str | None) -> bool:
        if tokens is None or not tokens.access or tokens.access == stale:
            return False
        return time.time() < tokens.expires_at - self.refresh_margin

    def token(self, stale: str | None = None) -> str:
        """A good access token; ``stale`` is one the system just refused (never handed out again)."""
        with self._lock:
            if self._usable(self._tokens, stale):
                assert self._tokens is not None
                return self._tokens.access
            shared = self._store.load()
            if not self._usable(shared, stale):
                with self._store.exclusive():
                    shared = self._store.load()  # another process may have refreshed while we waited
                    if not self._usable(shared, stale):
                        used = shared.refresh if shared is not None else self._first_refresh
                        self._refusals.check()
                        with self._refusals.remembered():
                            shared = self._grant(used)
                        self._tokens = shared  # kept even if storing it fails: this process goes on
                        self._store.save(used, shared)
            assert shared is not None
            self._tokens = shared
            return shared.access

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        token = self.token()
        request.headers["Authorization"] = f"Bearer {token}"
        response = yield request
        if response.status_code == 401:
            request.headers["Authorization"] = f"Bearer {self.token(stale=token)}"
            yield request


def _oauth_error(response: httpx.Response) -> str:
    """The RFC 6749 ``error`` code of a refusal (``invalid_grant``), when it is a plain code."""
    try:
        error = response.json().get("error")
    except (ValueError, AttributeError):
        return ""
    if isinstance(error, str) and 0 < len(error) <= 40 and error.replace("_", "").isalpha() and error.isascii():
        return f", {error}"
    return ""
