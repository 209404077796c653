"""Credentials for a connector, read from the environment variables its spec names.

Secrets are read once when the pool starts (a missing one stops the pool with a clear message)
and are never logged, put in receipts or repr'd.

What can go wrong, and what a call's receipt says then::

    MissingSecret               at start: a named variable is unset, a named file unusable
    CredentialsError            during a call, before the request is sent (nothing reached the system)
    ├── TokenError              the credentials were refused (wrong secret, burned refresh
    │                           token, login refused): DOWNSTREAM_AUTH_FAILED, not retried
    └── CredentialsUnavailable  the login page, token endpoint or shared token store did not
                                answer: DOWNSTREAM_UNREACHABLE, retried

Per auth ``type``: ``api_key``, ``bearer``, ``basic`` set a header (StaticAuth, httpx.BasicAuth);
``oauth2_client_credentials`` and ``oauth2_refresh_token`` fetch and cache access tokens;
``form_login`` keeps a session cookie; ``jwt`` signs a short token per call (it needs the call's
context, which the adapter puts in the request with :func:`bind_call`); ``mtls`` is in the TLS
context (:func:`ssl_context`), not in the request.
"""

from __future__ import annotations

import hashlib
import os
import ssl
import threading
import time
from collections.abc import Generator, Iterator, Mapping
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import httpx
import jwt
from redis.exceptions import RedisError

from connectors.adapters.base import CallContext
from connectors.spec import AuthSpec

# Redis: the one key of this module, ``reach:auth:{<connector>}`` (a hash: an oauth2_refresh_token
# connector's current tokens) and its lock ``reach:auth:{<connector>}:lock``. Listed with every other
# key in workers/state/keys.py, which this lower layer cannot import. Connector names have no ``:``
# and no braces; the braces are the Redis Cluster hash tag, which keeps the tokens, their lock and
# the connector's other keys in one slot.
_PREFIX = "reach:"
AUTH_KEY_PREFIX = _PREFIX + "auth:"
CALL_EXTENSION = "reach.call"  # request.extensions key of the CallContext (bind_call)
AUTH_TIMEOUT = 10.0  # seconds for a login or token request, and to wait for another process's refresh
REFUSAL_HOLD = 30.0  # seconds a refused login or refresh token is not tried again (account lockouts)


def state_key(connector: str) -> str:
    """The Redis hash holding ``connector``'s rotating OAuth2 tokens (shared by its pool processes)."""
    return AUTH_KEY_PREFIX + "{" + connector + "}"


class MissingSecret(RuntimeError):
    """A connector's auth names an environment variable that is not set (or a file or key that cannot be used)."""


class CredentialsError(RuntimeError):
    """The auth could not produce credentials for a call; the request was not sent."""


class TokenError(CredentialsError):
    """The token endpoint or login page refused the credentials, or answered something that is not a token."""


class CredentialsUnavailable(CredentialsError):
    """The login page, token endpoint or shared token store did not answer (try again later)."""


class _Refusals:
    """The last refusal, repeated without asking again for ``REFUSAL_HOLD`` seconds: a pool's
    threads must not hammer a login page with a wrong password (systems lock such accounts), nor
    present a burned refresh token over and over. Used under its auth's lock."""

    def __init__(self) -> None:
        self._last: tuple[float, str] | None = None

    def check(self) -> None:
        if self._last is not None and time.monotonic() - self._last[0] < REFUSAL_HOLD:
            raise TokenError(self._last[1])

    @contextmanager
    def remembered(self) -> Iterator[None]:
        try:
            yield
        except TokenError as exc:
            self._last = (time.monotonic(), str(exc))
            raise
        self._last = None


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
    plus the client certificate for ``mtls``.

    Raises:
        MissingSecret: a named variable is unset, or a named file is missing or not a usable
            certificate, key or CA bundle.
    """
    files = tls_files(spec, connector, environ)
    try:
        context = (
            httpx.create_ssl_context()
            if files is None or files.ca is None
            else ssl.create_default_context(cafile=files.ca)
        )
        if files is not None:
            context.load_cert_chain(files.cert, files.key)
    except (ssl.SSLError, OSError) as exc:
        reason = getattr(exc, "reason", None) or type(exc).__name__
        raise MissingSecret(
            f"connector {connector}: the mtls certificate, key or CA cannot be used ({reason})"
        ) from exc
    return context


# alerts a TLS server sends when it refuses this side's client certificate (or its absence)
_CLIENT_CERT_ALERTS = frozenset(
    {
        "TLSV13_ALERT_CERTIFICATE_REQUIRED",
        "SSLV3_ALERT_HANDSHAKE_FAILURE",  # TLS 1.2: how most servers say "no certificate"
        "SSLV3_ALERT_BAD_CERTIFICATE",
        "SSLV3_ALERT_UNSUPPORTED_CERTIFICATE",
        "SSLV3_ALERT_CERTIFICATE_REVOKED",
        "SSLV3_ALERT_CERTIFICATE_EXPIRED",
        "SSLV3_ALERT_CERTIFICATE_UNKNOWN",
        "TLSV1_ALERT_UNKNOWN_CA",
        "TLSV1_ALERT_ACCESS_DENIED",
    }
)


def tls_refusal(exc: BaseException) -> str | None:
    """Why the system refused this side's TLS client certificate, if that is what ``exc`` (an
    httpx transport error) comes from; None otherwise. The handshake failed, so the system never
    read the request (with TLS 1.3 the refusal only shows on the first read)."""
    seen = 0
    cause: BaseException | None = exc
    while cause is not None and seen < 8:
        if isinstance(cause, ssl.SSLError) and cause.reason in _CLIENT_CERT_ALERTS:
            return f"the system refused the TLS client certificate ({cause.reason})"
        cause = cause.__cause__ or cause.__context__
        seen += 1
    return None


def read_secret(var: str | None, connector: str, environ: Mapping[str, str] | None = None) -> str:
    """The value of the environment variable a connector names (``dsn_env``, ``url_env``, ...);
    raises MissingSecret when it is not set. Every adapter reads its secrets through here."""
    return _secret(os.environ if environ is None else environ, var, connector)


def bind_call(request: httpx.Request, ctx: CallContext) -> None:
    """Hand the call's context (agent, action, intent) to the auth flow: a ``jwt`` names them."""
    request.extensions[CALL_EXTENSION] = ctx


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


# -- form_login -------------------------------------------------------------------------------


class FormLoginAuth(httpx.Auth):
    """A login form: POST the credentials, keep the session cookie, log in again when it expires.

    The adapter's clients keep no cookies (one pool serves every agent), so the session lives here,
    one per pool process, and goes out as the Cookie header of each request (only to the hosts and
    paths the cookie names). A 401, or a redirect to the login page, means the session expired:
    log in once more and resend (the system refused the request, so resending is safe). One login
    at a time; threads that waited reuse its session.
    """

    requires_response_body = False

    def __init__(self, login_url: str, form: dict[str, str], verify: ssl.SSLContext) -> None:
        self._login_url = httpx.URL(login_url)
        self._form = form
        self._verify = verify
        self._lock = threading.Lock()
        self._session: httpx.Cookies | None = None
        self._refusals = _Refusals()

    def __repr__(self) -> str:
        return f"FormLoginAuth({self._login_url}, <redacted>)"

    def _is_login_page(self, response: httpx.Response) -> bool:
        if not response.is_redirect:
            return False
        try:
            target = response.request.url.join(response.headers["Location"])
        except (httpx.InvalidURL, KeyError):
            return False
        login = self._login_url
        return (target.host, target.port, target.path) == (login.host, login.port, login.path)

    def _login(self) -> httpx.Cookies:
        try:
            response = httpx.post(
                self._login_url, data=self._form, timeout=AUTH_TIMEOUT, verify=self._verify, trust_env=False
            )
        except httpx.HTTPError as exc:
            raise CredentialsUnavailable(f"the login page did not answer ({type(exc).__name__})") from exc
        status = response.status_code
        if status >= 500 or status == 429:
            raise CredentialsUnavailable(f"the login page answered HTTP {status}")
        session = httpx.Cookies()
        session.extract_cookies(response)
        if status >= 400 or self._is_login_page(response) or not session:
            raise TokenError(f"the login at {self._login_url} was refused (HTTP {status})")
        return session

    def session(self, stale: httpx.Cookies | None = None) -> httpx.Cookies:
        """The current session; a new one when there is none or it is ``stale`` (it was refused)."""
        with self._lock:
            if self._session is None or self._session is stale:
                self._session = None
                self._refusals.check()
                with self._refusals.remembered():
                    self._session = self._login()
            return self._session

    @staticmethod
    def _apply(request: httpx.Request, session: httpx.Cookies) -> None:
        request.headers.pop("Cookie", None)
        session.set_cookie_header(request)

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        session = self.session()
        self._apply(request, session)
        response = yield request
        if response.status_code == 401 or self._is_login_page(response):
            self._apply(request, self.session(stale=session))
            yield request


# -- oauth2_refresh_token ---------------------------------------------------------------------


@dataclass(frozen=True)
class Tokens:
    access: str
    refresh: str
    expires_at: float  # epoch seconds

    def __repr__(self) -> str:
        return f"Tokens(<redacted>, expires_at={self.expires_at:.0f})"


class _MemoryTokens:
    """Tokens of a single process (tools that run without Redis)."""

    def __init__(self) -> None:
        self._tokens: Tokens | None = None

    def load(self) -> Tokens | None:
        return self._tokens

    def exclusive(self) -> nullcontext[None]:
        return nullcontext()  # the auth's own thread lock is all there is

    def save(self, used: str, tokens: Tokens) -> None:
        self._tokens = tokens


# Store the new tokens unless another process stored tokens from a newer refresh token meanwhile
# (its lock expired under a slow token endpoint): the hash's refresh token must still be the one
# used, or belong to another first token (``seed``: the operator gave a new one).
_SAVE_IF_CURRENT = """
local current = redis.call('HGET', KEYS[1], 'refresh')
local seed = redis.call('HGET', KEYS[1], 'seed')
if current and current ~= ARGV[1] and seed == ARGV[5] then return 0 end
redis.call('HSET', KEYS[1], 'refresh', ARGV[2], 'access', ARGV[3], 'expires_at', ARGV[4], 'seed', ARGV[5])
return 1
"""


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class _RedisTokens:
    """Tokens shared by every pool process of a connector: the newest refresh token is in Redis,
    and a Redis lock lets one process at a time spend it (the server accepts each one once)."""

    def __init__(self, client: Any, connector: str, first_refresh: str) -> None:
        self._redis = client
        self._key = state_key(connector)
        # which first token the stored chain grew from: a new one in the environment restarts it
        self._seed = hashlib.sha256(first_refresh.encode()).hexdigest()[:32]
        self._save = client.register_script(_SAVE_IF_CURRENT)

    def load(self) -> Tokens | None:
        try:
            stored = {_text(k): _text(v) for k, v in self._redis.hgetall(self._key).items()}
        except RedisError as exc:
            raise CredentialsUnavailable(f"the shared token store did not answer ({type(exc).__name__})") from exc
        if stored.get("seed") != self._seed or not stored.get("refresh"):
            return None
        try:
            return Tokens(stored.get("access", ""), stored["refresh"], float(stored.get("expires_at", 0)))
        except ValueError:
            return Tokens("", stored["refresh"], 0.0)

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        lock = self._redis.lock(self._key + ":lock", timeout=3 * AUTH_TIMEOUT, blocking_timeout=AUTH_TIMEOUT)
        try:
            acquired = lock.acquire()
        except RedisError as exc:
            raise CredentialsUnavailable(f"the shared token store did not answer ({type(exc).__name__})") from exc
        if not acquired:
            raise CredentialsUnavailable(f"another process's token refresh did not finish within {AUTH_TIMEOUT:g}s")
        try:
            yield
        finally:
            try:
                lock.release()
            except RedisError:  # expired meanwhile (LockNotOwnedError) or Redis gone: it lapses by itself
                pass

    def save(self, used: str, tokens: Tokens) -> None:
        try:
            self._save(
                keys=[self._key], args=[used, tokens.refresh, tokens.access, repr(tokens.expires_at), self._seed]
            )
        except RedisError as exc:
            raise CredentialsUnavailable(f"the shared token store did not answer ({type(exc).__name__})") from exc


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
        store: _MemoryTokens | _RedisTokens,
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
        self._refusals = _Refusals()

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


# -- jwt --------------------------------------------------------------------------------------


class JwtAuth(httpx.Auth):
    """A short-lived JWT per call: ``sub`` the calling agent, ``scope`` "connector:action",
    ``jti`` the intent id, signed with the connector's key (HS256 secret or RS256 private key).

    A request without a call context (a health probe) goes out without a token."""

    def __init__(self, connector: str, key: Any, algorithm: str, issuer: str, audience: str, ttl: float) -> None:
        self._connector = connector
        self._key = key
        self._algorithm = algorithm
        self._issuer = issuer
        self._audience = audience
        self._ttl = ttl

    def __repr__(self) -> str:
        return f"JwtAuth({self._connector}, {self._algorithm}, <redacted>)"

    def mint(self, ctx: CallContext) -> str:
        if not ctx.agent_id or not ctx.action:
            raise TokenError("a jwt names the calling agent and action, and this call carries neither")
        now = time.time()
        claims = {
            "iss": self._issuer,
            "aud": self._audience,
            "sub": ctx.agent_id,
            "scope": f"{self._connector}:{ctx.action}",
            "iat": int(now),
            "exp": int(now + self._ttl),
            "jti": ctx.intent_id,
        }
        return jwt.encode(claims, self._key, algorithm=self._algorithm)

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        ctx = request.extensions.get(CALL_EXTENSION)
        if isinstance(ctx, CallContext):
            request.headers["Authorization"] = f"Bearer {self.mint(ctx)}"
        yield request


def _signing_key(spec: AuthSpec, connector: str, environ: Mapping[str, str]) -> Any:
    """The jwt signing key, checked now so a bad one stops the pool at start, not every call."""
    secret = _secret(environ, spec.signing_key_env, connector)
    if spec.algorithm == "HS256":
        key = secret.encode()
        if len(key) < 32:  # RFC 7518 3.2: at least as long as the hash
            raise MissingSecret(
                f"connector {connector}: the HS256 key in {spec.signing_key_env} is {len(key)} bytes; "
                "it must be at least 32"
            )
        return key
    from cryptography.hazmat.primitives.asymmetric.rsa import RSAPrivateKey
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    try:
        private = load_pem_private_key(secret.encode(), password=None)
    except (ValueError, TypeError) as exc:
        raise MissingSecret(
            f"connector {connector}: {spec.signing_key_env} is not an unencrypted PEM private key"
        ) from exc
    if not isinstance(private, RSAPrivateKey):
        raise MissingSecret(f"connector {connector}: {spec.signing_key_env} is not an RSA key (algorithm RS256)")
    return private


def build_auth(
    spec: AuthSpec, connector: str, environ: Mapping[str, str] | None = None, *, redis: Any = None
) -> httpx.Auth | None:
    """The httpx auth for a connector, or None for ``type: none`` and ``mtls``.

    The variables are the ones the spec names (catalog data, not fleet settings), read from
    ``environ`` (default: the process environment, read now, never at import). ``redis``: where an
    ``oauth2_refresh_token`` connector's rotating tokens are shared by its processes (None: kept in
    this process's memory).

    Raises:
        MissingSecret: a named environment variable is not set, or a jwt key cannot be used.
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
    if spec.type == "form_login":
        assert spec.login_url is not None
        form = {
            spec.username_field: _secret(env, spec.username_env, connector),
            spec.password_field: _secret(env, spec.password_env, connector),
        }
        return FormLoginAuth(spec.login_url, form, ssl_context(spec, connector, env))
    if spec.type == "jwt":
        assert spec.audience is not None
        key = _signing_key(spec, connector, env)
        return JwtAuth(connector, key, spec.algorithm, spec.issuer, spec.audience, spec.ttl)
    assert spec.token_url is not None
    if spec.type == "oauth2_refresh_token":
        first = _secret(env, spec.refresh_token_env, connector)
        return RefreshTokenAuth(
            spec.token_url,
            _secret(env, spec.client_id_env, connector),
            _secret(env, spec.client_secret_env, connector) if spec.client_secret_env else None,
            first,
            spec.scope,
            ssl_context(spec, connector, env),
            _MemoryTokens() if redis is None else _RedisTokens(redis, connector, first),
        )
    return ClientCredentialsAuth(
        spec.token_url,
        _secret(env, spec.client_id_env, connector),
        _secret(env, spec.client_secret_env, connector),
        spec.scope,
    )
