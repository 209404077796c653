"""HTTP adapter: one semantic action -> one httpx request -> one Outcome.

This is the only place that looks at HTTP status codes and httpx exceptions; everything above
it sees reach error codes (the boundary translation of httpx's own ``map_httpcore_exceptions``).

Requests are built by http_request.py (the catalog's endpoint and template only; anything unsafe
is refused, never sent, as VALIDATION_FAILED); an exchange's failure, the status table and the
checks of an answer are shared with the soap adapter (http_answers.py).

An answer nested deeper than ``max_depth`` or larger than ``max_response_bytes`` is not parsed: a
2xx keeps its success with ``data`` replaced by an ``{"_reach_omitted": ...}`` marker — except a read
that declares an ``output``, which is DOWNSTREAM_CONTRACT_VIOLATION (a write's effect never turns into a failure).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping
from typing import Any

import httpx

from connectors.adapters.auth import CredentialsError, CredentialsUnavailable, TokenError, build_auth, ssl_context
from connectors.adapters.base import CallContext, Outcome, ProbeResult
from connectors.adapters.common import CookielessClient, compile_outputs
from connectors.adapters.errors import Unsendable, refused_outcome
from connectors.adapters.http_answers import (
    ResponseTooLarge,
    checked_success,
    default_suggestion,
    exchange_failure,
    omitted_success,
    read_capped,
    status_code,
    status_retry_after,
)
from connectors.adapters.http_request import RequestBuilder
from connectors.adapters.json_nesting import depth_past
from connectors.adapters.scrub import Scrubber, auth_secrets
from connectors.adapters.transport import PooledTransport
from connectors.spec import ActionSpec, ConnectorSpec, split_path
from producers.wire import ErrorCode

DEFAULT_MAX_RESPONSE_BYTES = 1 << 20
DEFAULT_MAX_DEPTH = 32  # nesting of ``data`` passed on (REACH_MAX_DEPTH): a receipt's JSON must stay cheap to handle
_UNSAFE_SUGGESTION = (
    "Remove control characters and path tricks from the params, keep URL and header values short, and send again."
)
_SYSTEM_MESSAGE_KEYS = ("detail", "message", "error_description", "error", "errors", "title")


def _sent(transport: httpx.BaseTransport, request: httpx.Request) -> httpx.Response:
    response = transport.handle_request(request)
    response.request = request  # (an auth flow reads it, as from the client)
    return response


class HttpAdapter:
    """Calls one connector's HTTP system, with one httpx client per calling thread.

    One instance per pool process. Each thread's client sends on a ``PooledTransport`` of its own
    (one kept-alive connection to the system), so the pool's threads never wait on each other's
    connections; all threads share the auth (and its token cache) and the TLS context."""

    def __init__(
        self,
        connector: ConnectorSpec,
        *,
        environ: Mapping[str, str] | None = None,
        transport: httpx.BaseTransport | None = None,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        max_depth: int = DEFAULT_MAX_DEPTH,
        redis: Any = None,
    ) -> None:
        """``redis``: where shared auth state lives (rotated OAuth2 refresh tokens)."""
        self.connector = connector
        if connector.endpoint is None:
            raise ValueError(f"connector {connector.name} has no endpoint")
        self._base = httpx.URL(connector.endpoint)
        self._requests = RequestBuilder(connector, self._base)
        self._max_response_bytes = max_response_bytes
        self._max_depth = max_depth
        self._outputs = compile_outputs(connector)
        self._auth = build_auth(connector.auth, connector.name, environ, redis=redis)
        # a system that echoes the credential in its error text must not pass it on to the agent
        self._scrub = Scrubber(auth_secrets(connector.auth, environ))
        self._transport = transport
        # one TLS context for every thread's client: building one loads the whole CA bundle
        self._ssl = ssl_context(connector.auth, connector.name, environ)
        self._local = threading.local()
        self._clients: list[httpx.Client] = []
        self._clients_lock = threading.Lock()

    @property
    def _client(self) -> httpx.Client:
        """This thread's client: requests are built (and probes sent) with it."""
        return self._connection()[0]

    def _connection(self) -> tuple[httpx.Client, httpx.BaseTransport]:
        """This thread's client and the transport under it, which ``_send`` sends calls on."""
        made: tuple[httpx.Client, httpx.BaseTransport] | None = getattr(self._local, "made", None)
        if made is None:
            transport = self._transport or PooledTransport(verify=self._ssl)
            client = CookielessClient(
                auth=self._auth,
                timeout=httpx.Timeout(15.0, connect=5.0),
                follow_redirects=False,  # a redirect could point anywhere
                transport=transport,
                trust_env=False,  # no proxies or .netrc from the environment
            )
            made = self._local.made = (client, transport)
            with self._clients_lock:
                self._clients.append(client)
        return made

    def _send(self, request: httpx.Request) -> httpx.Response:
        """What ``httpx.Client.send(request, stream=True)`` does for this adapter's requests — the
        auth flow, no redirects, no cookies, no event hooks — on this thread's transport directly:
        the client's own layers cost about a quarter of a call's CPU. The body is not read yet."""
        transport = self._connection()[1]
        if self._auth is None:
            return _sent(transport, request)
        flow = self._auth.sync_auth_flow(request)
        try:
            request = next(flow)
            while True:
                response = _sent(transport, request)
                try:
                    next_request = flow.send(response)
                except StopIteration:
                    return response
                except BaseException:
                    response.close()
                    raise
                try:
                    response.read()  # the flow answers it with another request: release its connection
                finally:
                    response.close()
                request = next_request
        finally:
            flow.close()

    def probe(self, timeout: float) -> ProbeResult:
        """The declared ``health.path`` must answer 2xx; without one, a GET of the endpoint counts
        any answer below 500 (a 404 on / still proves the system is up)."""
        health = self.connector.health
        method, path = split_path(health.path) if health and health.path else ("GET", "/")
        url = self._requests.url(path) if health else self._base
        try:
            response = self._client.request(method, url, timeout=timeout)
        except (httpx.HTTPError, CredentialsError) as exc:
            return ProbeResult(False, type(exc).__name__)
        ok = 200 <= response.status_code < 300 if health else response.status_code < 500
        return ProbeResult(ok, f"HTTP {response.status_code}")

    def close(self) -> None:
        with self._clients_lock:
            clients, self._clients = self._clients, []
        for client in clients:
            client.close()

    def build_request(self, action: ActionSpec, params: dict[str, Any], ctx: CallContext) -> httpx.Request:
        """The request for one call (on this thread's client). Raises UnsafeRequest."""
        return self._requests.build(self._client, action, params, ctx)

    # -- calling --------------------------------------------------------------------------

    def call(self, action: ActionSpec, params: dict[str, Any], ctx: CallContext) -> Outcome:
        """One attempt. Never raises for anything the system or network does."""
        return self._scrub.outcome(self._call(action, params, ctx))

    def _call(self, action: ActionSpec, params: dict[str, Any], ctx: CallContext) -> Outcome:
        try:
            request = self.build_request(action, params, ctx)
        except Unsendable as exc:
            return refused_outcome(exc, suggestion=_UNSAFE_SUGGESTION)
        timeout = ctx.timeout if ctx.timeout is not None else action.timeout_seconds
        request.extensions["timeout"] = httpx.Timeout(timeout, connect=min(timeout, 5.0)).as_dict()
        started = time.perf_counter()
        try:
            response = self._send(request)
            try:
                raw = read_capped(response, self._max_response_bytes, started + timeout)
            finally:
                response.close()
        except (httpx.LocalProtocolError, UnicodeEncodeError) as exc:
            # the HTTP library refused to form or encode the request: nothing was sent
            return refused_outcome(
                Unsendable(f"the request could not be formed: {exc}"),
                suggestion="Remove control characters and surrounding spaces from the params and send again.",
                started=started,
            )
        except ResponseTooLarge as exc:
            omitted: dict[str, Any] = {"_reach_omitted": str(exc)}
            if exc.declared_bytes is not None:
                omitted["bytes"] = exc.declared_bytes
            return self._map_response(
                action, exc.response, b"", (time.perf_counter() - started) * 1000, omitted=omitted
            )
        except (httpx.TransportError, httpx.DecodingError, TokenError, CredentialsUnavailable) as exc:
            failure = exchange_failure(exc, self.connector, action, timeout, started)
            if failure is None:
                raise
            return failure
        elapsed = (time.perf_counter() - started) * 1000
        max_depth = ctx.max_depth if ctx.max_depth is not None else self._max_depth
        depth = depth_past(raw, max_depth)
        if depth is not None:
            return self._map_response(
                action,
                response,
                raw,
                elapsed,
                omitted={
                    "_reach_omitted": f"the system's answer nests {depth} levels; the limit is {max_depth}",
                    "bytes": len(raw),
                },
            )
        return self._map_response(action, response, raw, elapsed)

    def _map_response(
        self,
        action: ActionSpec,
        response: httpx.Response,
        raw: bytes,
        elapsed_ms: float,
        *,
        omitted: dict[str, Any] | None = None,
    ) -> Outcome:
        """``omitted``: the answer was too large or too deep to parse; this marker stands for its data."""
        status = response.status_code
        body = None if omitted is not None else _decode_body(raw)
        for rule in action.errors:
            if rule.status == status and (rule.field is None or _dig(body, rule.field) == rule.equals):
                code = ErrorCode(rule.code)
                return Outcome(
                    False,
                    code=code,
                    message=rule.message or _system_message(body, status),
                    suggestion=rule.suggestion or default_suggestion(code),
                    http_status=status,
                    downstream_ms=elapsed_ms,
                )
        checks = self._outputs[action.action]
        if 200 <= status < 300 and omitted is not None:
            uncheckable = bool(checks) and action.is_idempotent and not action.is_write
            return omitted_success(self.connector.name, omitted, elapsed_ms, uncheckable=uncheckable, status=status)
        if 200 <= status < 300:
            data = body if isinstance(body, dict) else ({} if body is None else {"result": body})
            return checked_success(self.connector.name, action, checks, data, elapsed_ms, status)
        code = status_code(status)
        retry_after = status_retry_after(status, response.headers.get("Retry-After"))
        return Outcome(
            False,
            code=code,
            message=_system_message(body, status),
            suggestion=default_suggestion(code),
            http_status=status,
            retry_after_ms=retry_after,
            downstream_ms=elapsed_ms,
        )


def _decode_body(raw: bytes) -> Any:
    if not raw:
        return None
    try:
        # UTF-8 only (RFC 8259), as the depth scan reads it; json.loads(bytes) would also take UTF-16/32
        return json.loads(raw.decode("utf-8-sig"))
    except (ValueError, RecursionError):  # RecursionError: only if max_depth was set past Python's own limit
        return raw.decode("utf-8", errors="replace")


def _system_message(body: Any, status: int) -> str:
    """The system's own words, so a model can correct itself."""
    if isinstance(body, dict):
        for key in _SYSTEM_MESSAGE_KEYS:
            if body.get(key):
                value = body[key]
                text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
                return text[:500]
    if isinstance(body, str) and body.strip():
        return body.strip()[:500]
    return f"the system answered HTTP {status}"


def _dig(body: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(body, dict):
            return None
        body = body.get(part)
    return body
