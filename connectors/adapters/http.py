"""HTTP adapter: one semantic action -> one httpx request -> one Outcome.

This is the only place that looks at HTTP status codes and httpx exceptions; everything above
it sees reach error codes (the boundary translation of httpx's own ``map_httpcore_exceptions``).

Safety: the scheme, host, port and path template come from the catalog only. Path parameters
are percent-encoded (``/`` and dot segments too) and the finished URL is checked against the
endpoint before anything is sent. A value too long for a URL or header is refused (never sent)
as VALIDATION_FAILED, not raised.

An answer nested deeper than ``max_depth`` or larger than ``max_response_bytes`` is not parsed: a
2xx keeps its success with ``data`` replaced by an ``{"_reach_omitted": ...}`` marker — except a read
that declares an ``output``, which is DOWNSTREAM_CONTRACT_VIOLATION (a write's effect never turns into a failure).
"""

from __future__ import annotations

import json
import threading
import time
from array import array
from collections.abc import Mapping
from itertools import accumulate
from typing import Any, cast
from urllib.parse import quote

import httpx

from connectors.adapters.auth import (
    CredentialsError,
    CredentialsUnavailable,
    TokenError,
    bind_call,
    build_auth,
    ssl_context,
    tls_refusal,
)
from connectors.adapters.base import CallContext, Outcome, ProbeResult
from connectors.adapters.common import (
    OMIT,
    CookielessClient,
    check_output,
    compile_outputs,
    convert_for_system,
    header_safe,
    retry_after_ms,
    scalar_text,
)
from connectors.adapters.errors import Unsendable, refused_outcome, violation_suggestion
from connectors.adapters.transport import PooledTransport
from connectors.schema import (
    MAX_HEADER_VALUE_BYTES,
    MAX_PATH_SEGMENT_BYTES,
    MAX_URL_BYTES,
)
from connectors.spec import PATH_PARAM, ActionSpec, ConnectorSpec, split_path
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


class UnsafeRequest(Unsendable):
    """The request would leave the connector's endpoint or template, or cannot be formed; it is never sent.

    ``field`` names the param at fault, when one is, and ``code`` the problem as the params
    validator names it (``max_length``, ``header``).
    """

    def __init__(self, message: str, field: str | None = None, code: str = "max_length") -> None:
        super().__init__(message, field, code)


def encode_path_segment(value: Any) -> str:
    """Percent-encode a path parameter so it stays exactly one segment."""
    text = scalar_text(value)
    encoded = quote(text, safe="")
    if encoded.strip(".") == "":
        # "." and ".." are dot segments that HTTP clients and servers collapse
        encoded = encoded.replace(".", "%2E")
    return encoded


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
        self._base_path = self._base.raw_path.decode("ascii").rstrip("/")
        self._max_response_bytes = max_response_bytes
        self._max_depth = max_depth
        self._outputs = compile_outputs(connector)
        self._auth = build_auth(connector.auth, connector.name, environ, redis=redis)
        self._transport = transport
        # one TLS context for every thread's client: building one loads the whole CA bundle
        self._ssl = ssl_context(connector.auth, connector.name, environ)
        self._local = threading.local()
        self._urls: dict[str, httpx.URL] = {}
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
        url = self._base.copy_with(raw_path=(self._base_path + path).encode("ascii")) if health else self._base
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

    # -- request building ---------------------------------------------------------------

    def build_request(self, action: ActionSpec, params: dict[str, Any], ctx: CallContext) -> httpx.Request:
        if action.path is None:
            raise ValueError(f"action {action.action} has no path")
        method, template = split_path(action.path)
        in_template = set(PATH_PARAM.findall(template))
        default_place = "query" if method in ("GET", "DELETE") else "body"
        path_values: dict[str, str] = {}
        query: list[tuple[str, str]] = []
        headers: dict[str, str] = {}
        body: dict[str, Any] = {}
        for name, value in params.items():
            spec = action.input.get(name)
            if spec is None:
                raise UnsafeRequest(f"param {name!r} is not declared")  # validation runs first; never reached
            place = spec.in_ or ("path" if name in in_template else default_place)
            wire = spec.name or name
            converted = convert_for_system(value, spec)
            if converted is OMIT:
                continue
            if place == "path":
                segment = encode_path_segment(converted)
                if len(segment) > MAX_PATH_SEGMENT_BYTES:
                    raise UnsafeRequest(
                        f"path parameter {name!r} is longer than {MAX_PATH_SEGMENT_BYTES} bytes once URL-encoded",
                        field=name,
                    )
                path_values[name] = segment
            elif place == "query":
                if converted is None:
                    continue
                items = converted if isinstance(converted, list) else [converted]
                query.extend((wire, scalar_text(v)) for v in items)
            elif place == "header":
                if converted is None:
                    continue
                text = scalar_text(converted)
                if not header_safe(text):
                    raise UnsafeRequest(
                        f"header value for {name!r} must be plain ASCII without control characters",
                        field=name,
                        code="header",
                    )
                if len(text) > MAX_HEADER_VALUE_BYTES:
                    raise UnsafeRequest(
                        f"header value for {name!r} is longer than {MAX_HEADER_VALUE_BYTES} bytes", field=name
                    )
                headers[wire] = text
            else:
                body[wire] = converted
        path = PATH_PARAM.sub(lambda m: path_values[m.group(1)], template)
        for header, value in (
            (self.connector.idempotency_header, ctx.idempotency_key),
            ("traceparent", ctx.traceparent),
        ):
            if header and value:
                if not header_safe(value) or len(value) > MAX_HEADER_VALUE_BYTES:
                    raise UnsafeRequest(
                        f"the {header} value must be plain ASCII without control characters, "
                        f"at most {MAX_HEADER_VALUE_BYTES} bytes"
                    )
                headers[header] = value
        content = None
        if method not in ("GET", "DELETE") or body:
            try:
                content = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
            except RecursionError as exc:
                raise UnsafeRequest("the params nest too deeply to be written as JSON") from exc
            except ValueError as exc:  # text UTF-8 cannot carry (a lone surrogate)
                raise UnsafeRequest(f"the params cannot be written as JSON: {exc}", code="unsendable") from exc
            headers["Content-Type"] = "application/json"
        headers.setdefault("Accept", "application/json")
        try:
            url = self._urls.get(path) if path == template else None
            if url is None:
                url = self._base.copy_with(raw_path=(self._base_path + path).encode("ascii"))
                if path == template:  # no path params: the same URL every time (one per action)
                    self._urls[path] = url
            request = self._client.build_request(
                method, url, params=cast(Any, query) or None, headers=headers, content=content
            )
        except httpx.InvalidURL as exc:  # httpx's own bound (64 KiB a component): far past ours
            raise UnsafeRequest(f"the request URL is longer than {MAX_URL_BYTES} bytes") from exc
        if len(request.url.raw_path) > MAX_URL_BYTES:
            raise UnsafeRequest(f"the request URL is longer than {MAX_URL_BYTES} bytes")
        self._check_destination(request, template, path)
        bind_call(request, ctx)  # for an auth that names the caller (jwt)
        return request

    def _check_destination(self, request: httpx.Request, template: str, path: str) -> None:
        url = request.url
        if (url.scheme, url.host, url.port) != (self._base.scheme, self._base.host, self._base.port):
            raise UnsafeRequest("the request would leave the connector's endpoint")
        expected = (self._base_path + path).encode("ascii")
        if url.raw_path.split(b"?", 1)[0] != expected:
            raise UnsafeRequest("the request path was rewritten")

    # -- calling --------------------------------------------------------------------------

    def call(self, action: ActionSpec, params: dict[str, Any], ctx: CallContext) -> Outcome:
        """One attempt. Never raises for anything the system or network does."""
        try:
            request = self.build_request(action, params, ctx)
        except Unsendable as exc:
            return refused_outcome(exc, suggestion=_UNSAFE_SUGGESTION)
        safe_to_repeat = self.connector.safe_to_repeat(action)
        timeout = ctx.timeout if ctx.timeout is not None else action.timeout_seconds
        request.extensions["timeout"] = httpx.Timeout(timeout, connect=min(timeout, 5.0)).as_dict()
        started = time.perf_counter()
        try:
            response = self._send(request)
            try:
                raw = self._read_capped(response, started + timeout)
            finally:
                response.close()
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
            if refused := tls_refusal(exc):
                return self._tls_refused(refused, started)
            return self._failed(
                ErrorCode.DOWNSTREAM_UNREACHABLE,
                f"could not connect to {self.connector.name}: {type(exc).__name__}",
                "The system is unreachable; retry later.",
                started,
                sent=False,
            )
        except httpx.TimeoutException:
            if safe_to_repeat:
                return self._failed(
                    ErrorCode.DOWNSTREAM_TIMEOUT,
                    f"{self.connector.name} did not answer within {timeout:g}s",
                    "Retry later; the action is safe to repeat.",
                    started,
                )
            return self._unknown(
                f"{self.connector.name} did not answer within {timeout:g}s after the request was sent", action, started
            )
        except TokenError as exc:
            return self._failed(
                ErrorCode.DOWNSTREAM_AUTH_FAILED,
                f"could not obtain credentials for {self.connector.name}: {exc}",
                "The connector's credentials were refused; do not retry. Tell an operator.",
                started,
                sent=False,
            )
        except CredentialsUnavailable as exc:
            return self._failed(
                ErrorCode.DOWNSTREAM_UNREACHABLE,
                f"could not obtain credentials for {self.connector.name}: {exc}",
                "The system's sign-in is unreachable; retry later.",
                started,
                sent=False,
            )
        except (httpx.LocalProtocolError, UnicodeEncodeError) as exc:
            # the HTTP library refused to form or encode the request: nothing was sent
            return refused_outcome(
                Unsendable(f"the request could not be formed: {exc}"),
                suggestion="Remove control characters and surrounding spaces from the params and send again.",
                started=started,
            )
        except _ResponseTooLarge as exc:
            omitted: dict[str, Any] = {
                "_reach_omitted": f"the system's answer is larger than {self._max_response_bytes} bytes, the limit"
            }
            if exc.declared_bytes is not None:
                omitted["bytes"] = exc.declared_bytes
            return self._map_response(
                action, exc.response, b"", (time.perf_counter() - started) * 1000, omitted=omitted
            )
        except (httpx.TransportError, httpx.DecodingError) as exc:
            if refused := tls_refusal(exc):
                return self._tls_refused(refused, started)
            if safe_to_repeat:
                return self._failed(
                    ErrorCode.DOWNSTREAM_ERROR,
                    f"connection to {self.connector.name} failed: {type(exc).__name__}",
                    "Retry later; the action is safe to repeat.",
                    started,
                )
            return self._unknown(
                f"the connection to {self.connector.name} broke after the request was sent ({type(exc).__name__})",
                action,
                started,
            )
        elapsed = (time.perf_counter() - started) * 1000
        max_depth = ctx.max_depth if ctx.max_depth is not None else self._max_depth
        depth = _depth_past(raw, max_depth)
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

    def _read_capped(self, response: httpx.Response, deadline: float) -> bytes:
        """Read the body up to the size limit, and within the action's timeout as a whole: httpx's
        timeouts apply per read, so a system trickling bytes could otherwise hold a thread for ever."""
        chunks: list[bytes] = []
        size = 0
        for chunk in response.iter_bytes():
            if time.perf_counter() > deadline:
                raise httpx.ReadTimeout("the response did not complete within the action's timeout")
            size += len(chunk)
            if size > self._max_response_bytes:
                raise _ResponseTooLarge(response, self._max_response_bytes)
            chunks.append(chunk)
        return b"".join(chunks)

    def _failed(
        self,
        code: ErrorCode,
        message: str,
        suggestion: str,
        started: float,
        *,
        sent: bool = True,
        status: int | None = None,
        retry_after_ms: int | None = None,
    ) -> Outcome:
        return Outcome(
            False,
            code=code,
            message=message,
            suggestion=suggestion,
            sent=sent,
            http_status=status,
            retry_after_ms=retry_after_ms,
            downstream_ms=(time.perf_counter() - started) * 1000,
        )

    def _tls_refused(self, reason: str, started: float) -> Outcome:
        # the handshake failed, so the system never read the request
        return self._failed(
            ErrorCode.DOWNSTREAM_AUTH_FAILED,
            f"{self.connector.name}: {reason}",
            "The connector's client certificate is missing or not accepted; do not retry. Tell an operator.",
            started,
            sent=False,
        )

    def _unknown(self, message: str, action: ActionSpec, started: float) -> Outcome:
        return self._failed(
            ErrorCode.OUTCOME_UNKNOWN, message, self.connector.check_first_suggestion(action.action), started
        )

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
                    suggestion=rule.suggestion or _default_suggestion(code),
                    http_status=status,
                    downstream_ms=elapsed_ms,
                )
        if 200 <= status < 300 and omitted is not None:
            if self._outputs[action.action] and action.is_idempotent and not action.is_write:
                return Outcome(
                    False,
                    code=ErrorCode.DOWNSTREAM_CONTRACT_VIOLATION,
                    message=f"{self.connector.name} answered {status} but {omitted['_reach_omitted']}",
                    suggestion="The answer cannot be checked against the declared output; tell an operator.",
                    http_status=status,
                    downstream_ms=elapsed_ms,
                )
            # a write's effect happened (the system said so): it stays a success, without the data
            return Outcome(True, data=omitted, http_status=status, downstream_ms=elapsed_ms)
        if 200 <= status < 300:
            data = body if isinstance(body, dict) else ({} if body is None else {"result": body})
            problems = check_output(self._outputs[action.action], data)
            if problems:
                return Outcome(
                    False,
                    code=ErrorCode.DOWNSTREAM_CONTRACT_VIOLATION,
                    message=f"{self.connector.name} answered {status} but the response breaks the declared output",
                    suggestion=violation_suggestion(action, "ask an operator to check the connector's output schema."),
                    details=problems,
                    http_status=status,
                    downstream_ms=elapsed_ms,
                )
            return Outcome(True, data=data, http_status=status, downstream_ms=elapsed_ms)
        code = _status_code(status)
        retry_after = retry_after_ms(response.headers.get("Retry-After")) if status in (429, 503) else None
        return Outcome(
            False,
            code=code,
            message=_system_message(body, status),
            suggestion=_default_suggestion(code),
            http_status=status,
            retry_after_ms=retry_after,
            downstream_ms=elapsed_ms,
        )


class _ResponseTooLarge(Exception):
    def __init__(self, response: httpx.Response, limit: int) -> None:
        super().__init__(f"the response is larger than {limit} bytes")
        self.response = response
        length = response.headers.get("Content-Length", "")
        self.declared_bytes = int(length) if length.isascii() and length.isdigit() and len(length) < 20 else None


def _status_code(status: int) -> ErrorCode:
    if status in (400, 422):
        return ErrorCode.DOWNSTREAM_VALIDATION_FAILED
    if status in (401, 403):
        return ErrorCode.DOWNSTREAM_AUTH_FAILED
    if status in (404, 410):
        return ErrorCode.DOWNSTREAM_NOT_FOUND
    if status == 409:
        return ErrorCode.DOWNSTREAM_CONFLICT
    if status == 429:
        return ErrorCode.DOWNSTREAM_RATE_LIMITED
    if status >= 500:
        return ErrorCode.DOWNSTREAM_ERROR
    if 400 <= status < 500:
        return ErrorCode.DOWNSTREAM_VALIDATION_FAILED
    return ErrorCode.DOWNSTREAM_CONTRACT_VIOLATION  # 1xx/3xx: not an answer we can use


_SUGGESTIONS = {
    ErrorCode.DOWNSTREAM_VALIDATION_FAILED: "The system rejected the params; fix them as its message says and send again.",
    ErrorCode.DOWNSTREAM_AUTH_FAILED: "The connector's credentials were refused; do not retry. Tell an operator.",
    ErrorCode.DOWNSTREAM_NOT_FOUND: "The record does not exist; check the id (for example with a search or list action).",
    ErrorCode.DOWNSTREAM_CONFLICT: "The record changed or already exists; read its current state before trying again.",
    ErrorCode.DOWNSTREAM_RATE_LIMITED: "The system is throttling requests; wait retry_after_ms (or a few seconds) and send again.",
    ErrorCode.DOWNSTREAM_ERROR: "The system failed; retry later.",
    ErrorCode.DOWNSTREAM_CONTRACT_VIOLATION: "The system answered in an unexpected way; tell an operator.",
}


def _default_suggestion(code: ErrorCode) -> str:
    return _SUGGESTIONS.get(code, "See the error message.")


_NOT_BRACKET = bytes(b for b in range(256) if b not in b"[]{}")
_ONE_KIND = bytes.maketrans(b"{}", b"[]")  # depth does not depend on which kind of bracket
_BRACKET_STEP = bytes.maketrans(b"[]", b"\x01\xff")  # +1 / -1 as signed bytes


def _brackets(raw: bytes) -> bytes:
    """The JSON text's brackets outside strings, in order. All in C, no parsing: escaped
    backslashes go first, then escaped quotes, so every quote left opens or closes a string."""
    unescaped = raw.replace(b"\\\\", b"").replace(b'\\"', b"")
    return b"".join(unescaped.split(b'"')[::2]).translate(_ONE_KIND, _NOT_BRACKET)


def json_depth(raw: bytes) -> int:
    """The deepest nesting of arrays and objects in a JSON text, found without parsing it (no
    recursion, so no limit a hostile answer can hit): brackets inside strings do not count."""
    return _nesting(_brackets(raw))


def _nesting(brackets: bytes) -> int:
    return max(accumulate(array("b", brackets.translate(_BRACKET_STEP))), default=0)


def _depth_past(raw: bytes, limit: int) -> int | None:
    """How deep ``data`` would nest (one more than the answer when an array is wrapped in
    ``{"result": ...}``) if that is past ``limit``; None when within it, or not JSON nesting at all."""
    start = raw.lstrip(b" \t\r\n\xef\xbb\xbf")[:1]
    if start not in (b"[", b"{"):
        return None  # a scalar or text: never parsed recursively
    limit -= start == b"["
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return None  # the usual answer: too few brackets to nest that deep
    brackets = remaining = _brackets(raw)
    for _ in range(limit):  # each pass removes the innermost level (every container without one inside)
        peeled = remaining.replace(b"[]", b"")
        if not peeled:
            return None
        if len(peeled) == len(remaining):
            break  # unbalanced: only the exact figure can tell
        remaining = peeled
    depth = _nesting(brackets)  # past the limit (or unbalanced): worth the exact figure
    return depth + (start == b"[") if depth > limit else None


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
