"""SOAP adapter: one semantic action -> one WSDL operation called with zeep -> one Outcome.

The WSDL (a local path or an http(s) URL) is loaded once per process, on first use, and shared by
every thread; ``endpoint`` replaces the service address it names. Params become the operation's
input parts by name (a field's ``name`` is the part's own name); zeep and lxml set every value as
element text, so nothing an agent sends is ever spliced into the XML. A value XML cannot carry, a
part the operation lacks or a wrong type is refused before sending (VALIDATION_FAILED).

Every HTTP exchange goes through one httpx client with the connector's auth (any
``connectors.adapters.auth.build_auth`` kind, since httpx runs its auth flow on each request) and TLS context
(``mtls``): zeep's requests session would need each auth kind written twice. Answers are bounded
like the http adapter's (``max_response_bytes``, the action's timeout over the whole exchange),
parsed without DTDs or entities, and documents the WSDL imports must come from where the WSDL
itself is (its own origin, or local files for a local WSDL).

``data`` is the operation's result as plain JSON: a dict result as it is, anything else as
``{"result": value}``; decimals become strings (exact: money must not turn into a binary float),
dates and times ISO 8601 strings, binary base64. An answer nested deeper than ``max_depth`` keeps
its success with ``data`` replaced by an ``{"_reach_omitted": ...}`` marker, as in the http adapter.

Faults: a Client / Sender fault is DOWNSTREAM_VALIDATION_FAILED with the fault string as message;
any other fault is DOWNSTREAM_ERROR. HTTP 401/403 is DOWNSTREAM_AUTH_FAILED, 429
DOWNSTREAM_RATE_LIMITED; an answer that is not SOAP is DOWNSTREAM_ERROR for a 5xx, else
DOWNSTREAM_CONTRACT_VIOLATION. As in the http adapter: no connection (or no WSDL) is
DOWNSTREAM_UNREACHABLE with ``sent`` False; no answer in time after sending is DOWNSTREAM_TIMEOUT
when the action is safe to repeat (``ConnectorSpec.safe_to_repeat``), else OUTCOME_UNKNOWN.
"""

from __future__ import annotations

import base64
import difflib
import logging
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from datetime import time as clock_time
from decimal import Decimal
from typing import Any
from urllib.parse import urlsplit
from urllib.request import url2pathname

import httpx
import isodate
import zeep
import zeep.exceptions
from lxml import etree
from zeep.helpers import serialize_object
from zeep.proxy import ServiceProxy
from zeep.wsdl.bindings.soap import SoapBinding
from zeep.wsdl.utils import etree_to_string

from connectors.adapters.auth import (
    CredentialsError,
    CredentialsUnavailable,
    MissingSecret,
    TokenError,
    bind_call,
    build_auth,
    ssl_context,
    tls_refusal,
)
from connectors.adapters.base import AdapterOptions, CallContext, Outcome, ProbeResult

# the http adapter's rules, kept identical here: field conversions (null_as, format/timezone, as: string),
# output checks, header safety, Retry-After, and a client without a cookie jar
from connectors.adapters.common import (
    OMIT,
    CookielessClient,
    check_output,
    compile_outputs,
    convert_for_system,
    header_safe,
    retry_after_ms,
)
from connectors.adapters.errors import Unsendable, refused_outcome, violation_suggestion
from connectors.adapters.transport import PooledTransport
from connectors.schema import MAX_HEADER_VALUE_BYTES
from connectors.spec import ActionSpec, ConnectorSpec, split_path
from producers.wire import ErrorCode

log = logging.getLogger("reach.soap")

DEFAULT_MAX_RESPONSE_BYTES = 1 << 20
DEFAULT_MAX_DEPTH = 32
MAX_DOCUMENT_BYTES = 16 << 20  # the WSDL and each schema it imports
LOAD_TIMEOUT = 10.0  # seconds for loading the WSDL (and its imports) on first use
MAX_MESSAGE_CHARS = 500
CLIENT_FAULTS = ("Client", "Sender")  # SOAP 1.1 / 1.2: the request was wrong, not the system
_UNREACHABLE = ErrorCode.DOWNSTREAM_UNREACHABLE
# the parser of every document: no DOCTYPE (so no entity expansion), libxml2's own depth and size limits
SETTINGS = zeep.Settings(strict=True, forbid_dtd=True, forbid_entities=True, xml_huge_tree=False)


class WsdlError(Exception):
    """The WSDL cannot be used. ``code`` is what a call answers meanwhile: DOWNSTREAM_UNREACHABLE
    (it could not be fetched), DOWNSTREAM_AUTH_FAILED (401/403) or DOWNSTREAM_CONTRACT_VIOLATION
    (not a usable WSDL)."""

    def __init__(self, message: str, code: ErrorCode = ErrorCode.DOWNSTREAM_CONTRACT_VIOLATION) -> None:
        super().__init__(message)
        self.code = code


class _ResponseTooLarge(Exception):
    def __init__(self, limit: int) -> None:
        super().__init__(f"the system's answer is larger than {limit} bytes, the limit")


class _HttpRefused(Exception):
    """The system answered with an HTTP status that says more than any body could (401, 403, 429)."""

    def __init__(self, status: int, retry_after: str | None) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status
        self.retry_after = retry_after


@dataclass(frozen=True)
class _Reply:
    """What zeep's ``process_reply`` reads of a response (it expects a requests.Response)."""

    status_code: int
    content: bytes
    headers: httpx.Headers
    encoding: str | None


@dataclass
class _Scope:
    """One call's HTTP facts, seen by the transport on the calling thread."""

    ctx: CallContext
    timeout: float
    deadline: float
    headers: dict[str, str]
    sent: bool = False  # the request left this process (from here on its effect may have happened)
    status: int | None = None  # the HTTP status of the answer


@dataclass(frozen=True)
class _Operation:
    name: str
    parts: tuple[str, ...]  # the input parts, in the WSDL's order
    required: tuple[str, ...]  # parts that must be present (minOccurs >= 1)


@dataclass(frozen=True)
class _Service:
    """The loaded WSDL: the zeep client, the port called, and its operations' inputs."""

    client: Any
    proxy: Any
    address: str
    operations: dict[str, _Operation] = field(default_factory=dict)


def _read_capped(response: httpx.Response, limit: int, deadline: float) -> bytes:
    """The body up to ``limit`` bytes, within the deadline as a whole (httpx times each read)."""
    chunks: list[bytes] = []
    size = 0
    for chunk in response.iter_bytes():
        if time.perf_counter() > deadline:
            raise httpx.ReadTimeout("the response did not complete within the action's timeout")
        size += len(chunk)
        if size > limit:
            raise _ResponseTooLarge(limit)
        chunks.append(chunk)
    return b"".join(chunks)


def _origin(url: str) -> tuple[str, str, int | None] | None:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        return None
    return parts.scheme, (parts.hostname or "").lower(), parts.port


class _Transport(zeep.Transport):
    """zeep's transport over one shared httpx client (auth, TLS, no cookie jar, no redirects).

    ``post_xml`` sends one call with the timeout and headers of the calling thread's scope; ``load``
    fetches the WSDL and what it imports, from the WSDL's own origin only (or local files, for a
    local WSDL).
    """

    def __init__(self, client: httpx.Client, wsdl: str, max_response_bytes: int) -> None:
        # zeep's own __init__ opens a requests session this transport never uses
        self.cache = None
        self.logger = logging.getLogger(__name__)
        self._close_session = False
        self.load_timeout = LOAD_TIMEOUT
        self.operation_timeout = None
        self._http = client
        self._origin = _origin(wsdl)
        self._max_response_bytes = max_response_bytes
        self._local = threading.local()

    @contextmanager
    def scope(self, ctx: CallContext, timeout: float, headers: dict[str, str]) -> Iterator[_Scope]:
        scope = _Scope(ctx, timeout, time.perf_counter() + timeout, headers)
        self._local.scope = scope
        try:
            yield scope
        finally:
            self._local.scope = None

    def post_xml(self, address: str, envelope: Any, headers: dict[str, str]) -> _Reply:
        scope: _Scope | None = getattr(self._local, "scope", None)
        if scope is None:
            raise RuntimeError("a SOAP call outside SoapAdapter.call")
        request = self._http.build_request(
            "POST",
            address,
            content=etree_to_string(envelope),  # type: ignore[no-untyped-call, unused-ignore]
            headers={**headers, **scope.headers},
            timeout=httpx.Timeout(scope.timeout, connect=min(scope.timeout, 5.0)),
        )
        bind_call(request, scope.ctx)  # for an auth that names the caller (jwt)
        scope.sent = True  # a connect failure below is still told apart (httpx.ConnectError)
        response = self._http.send(request, stream=True)
        scope.status = response.status_code
        try:
            if response.status_code in (401, 403, 429):
                raise _HttpRefused(response.status_code, response.headers.get("Retry-After"))
            raw = _read_capped(response, self._max_response_bytes, scope.deadline)
        finally:
            response.close()
        return _Reply(response.status_code, raw, response.headers, response.encoding)

    def post(self, address: str, message: Any, headers: dict[str, str]) -> Any:
        raise NotImplementedError("only SOAP bindings are called (post_xml)")

    def get(self, address: str, params: Any, headers: dict[str, str]) -> Any:
        raise NotImplementedError("HTTP GET bindings are not called; only SOAP ports are used")

    def load(self, url: str) -> bytes:
        parts = urlsplit(url)
        if parts.scheme in ("http", "https"):
            if self._origin is None or _origin(url) != self._origin:
                raise WsdlError(f"{url} is not where the WSDL is: imports must come from the WSDL's own origin")
            deadline = time.perf_counter() + self.load_timeout
            with self._http.stream("GET", url, timeout=self.load_timeout) as response:
                status = response.status_code
                if status != 200:
                    code = (
                        ErrorCode.DOWNSTREAM_AUTH_FAILED
                        if status in (401, 403)
                        else ErrorCode.DOWNSTREAM_UNREACHABLE
                        if status >= 500 or status == 429
                        else ErrorCode.DOWNSTREAM_CONTRACT_VIOLATION
                    )
                    raise WsdlError(f"{url} answered HTTP {status}", code)
                try:
                    return _read_capped(response, MAX_DOCUMENT_BYTES, deadline)
                except _ResponseTooLarge as exc:
                    raise WsdlError(f"{url} is larger than {MAX_DOCUMENT_BYTES} bytes") from exc
        if self._origin is not None:
            raise WsdlError(f"{url}: a WSDL from a URL may not read local files")
        if parts.scheme == "file":
            path = url2pathname(parts.path)
        elif parts.scheme == "":
            path = url
        else:
            raise WsdlError(f"{url}: only http(s) URLs and local files are loaded")
        path = os.path.expanduser(path)
        if os.path.getsize(path) > MAX_DOCUMENT_BYTES:
            raise WsdlError(f"{path} is larger than {MAX_DOCUMENT_BYTES} bytes")
        with open(path, "rb") as handle:
            return handle.read()


def _operations(binding: Any) -> dict[str, _Operation]:
    """Each operation's input parts: the children of its body (document: the wrapper element's,
    rpc: the message's parts)."""
    found = {}
    for name, operation in binding.all().items():
        body = getattr(operation.input, "body", None) if operation.input is not None else None
        elements = getattr(getattr(body, "type", None), "elements", None) or []
        parts = tuple(part for part, _ in elements)
        required = tuple(part for part, element in elements if getattr(element, "min_occurs", 0) >= 1)
        found[name] = _Operation(name, parts, required)
    return found


def _soap_port(client: Any) -> Any:
    for service in client.wsdl.services.values():
        for port in service.ports.values():
            if isinstance(port.binding, SoapBinding):
                return port
    raise WsdlError("the WSDL has no SOAP port")


class SoapAdapter:
    """Calls one connector's SOAP service; one instance per pool process, called from many threads."""

    def __init__(self, connector: ConnectorSpec, options: AdapterOptions | None = None) -> None:
        options = options or AdapterOptions()
        if connector.wsdl is None:
            raise ValueError(f"connector {connector.name} has no wsdl")
        self.connector = connector
        self._wsdl = connector.wsdl
        self._max_response_bytes = int(options.extra.get("max_response_bytes", DEFAULT_MAX_RESPONSE_BYTES))
        self._max_depth = options.max_depth if options.max_depth is not None else DEFAULT_MAX_DEPTH
        self._outputs = compile_outputs(connector)
        self._http = CookielessClient(
            auth=build_auth(connector.auth, connector.name, options.environ, redis=options.redis),
            timeout=httpx.Timeout(15.0, connect=5.0),
            # the HTTP adapter's transport, shared by the pool's threads
            transport=PooledTransport(
                verify=ssl_context(connector.auth, connector.name, options.environ),
                max_connections=options.max_connections,
            ),
            follow_redirects=False,  # a redirect could point anywhere
            trust_env=False,  # no proxies or .netrc from the environment
        )
        self._transport = _Transport(self._http, self._wsdl, self._max_response_bytes)
        self._load_lock = threading.Lock()
        self._service: _Service | None = None

    # -- the WSDL ------------------------------------------------------------------------------

    def service(self, timeout: float = LOAD_TIMEOUT) -> _Service:
        """The loaded WSDL, loading it on first use (once for all threads).

        Raises:
            WsdlError: it cannot be loaded within ``timeout`` or is not a usable WSDL.
        """
        service = self._service
        if service is not None:
            return service
        if not self._load_lock.acquire(timeout=max(timeout, 0.0)):
            raise WsdlError("the WSDL is still being loaded by another call", _UNREACHABLE)
        try:
            if self._service is None:
                self._service = self._load(min(timeout, LOAD_TIMEOUT))
            return self._service
        finally:
            self._load_lock.release()

    def _load(self, timeout: float) -> _Service:
        self._transport.load_timeout = timeout
        try:
            client = zeep.Client(self._wsdl, transport=self._transport, settings=SETTINGS)  # type: ignore[no-untyped-call, unused-ignore]
        except WsdlError:
            raise
        except httpx.HTTPError as exc:
            raise WsdlError(f"{self._wsdl} cannot be fetched: {type(exc).__name__}", _UNREACHABLE) from exc
        except CredentialsError as exc:
            code = ErrorCode.DOWNSTREAM_AUTH_FAILED if isinstance(exc, TokenError) else _UNREACHABLE
            raise WsdlError(f"no credentials to fetch {self._wsdl}: {exc}", code) from exc
        except OSError as exc:
            raise WsdlError(f"{self._wsdl} cannot be read: {exc.strerror or exc}") from exc
        except (zeep.exceptions.Error, etree.LxmlError, ValueError, LookupError, TypeError, AttributeError) as exc:
            # zeep's own errors, and what its parser trips on in a malformed document
            raise WsdlError(f"{self._wsdl} is not a usable WSDL: {type(exc).__name__}: {_bounded(str(exc))}") from exc
        except NotImplementedError as exc:  # e.g. a binding transport other than SOAP over HTTP
            raise WsdlError(f"{self._wsdl} is not a usable WSDL: {_bounded(str(exc))}") from exc
        port = _soap_port(client)
        address = self.connector.endpoint or port.binding_options.get("address")
        if not address:
            raise WsdlError("the WSDL's SOAP port has no address; set the connector's endpoint")
        proxy = ServiceProxy(client, port.binding, address=address)  # type: ignore[no-untyped-call, unused-ignore]
        return _Service(client, proxy, address, _operations(port.binding))

    # -- calling -------------------------------------------------------------------------------

    def call(self, action: ActionSpec, params: dict[str, Any], ctx: CallContext) -> Outcome:
        """One attempt. Never raises for anything the system, the network or the params do."""
        started = time.perf_counter()
        timeout = ctx.timeout if ctx.timeout is not None else action.timeout_seconds
        try:
            service = self.service(timeout)
        except WsdlError as exc:
            return self._failed(
                exc.code,
                f"the WSDL of {self.connector.name} cannot be loaded: {exc}",
                "The system is unreachable; retry later."
                if exc.code is _UNREACHABLE
                else _SUGGESTIONS.get(exc.code, "Tell an operator."),
                started,
                sent=False,
            )
        operation = service.operations.get(action.operation or "")
        if operation is None:
            return self._failed(
                ErrorCode.DOWNSTREAM_CONTRACT_VIOLATION,
                f"the WSDL of {self.connector.name} has no operation {action.operation}",
                "The connector does not match its system; tell an operator.",
                started,
                sent=False,
            )
        headers = {}
        for header, value in (
            (self.connector.idempotency_header, ctx.idempotency_key),
            ("traceparent", ctx.traceparent),
        ):
            if header and value:
                if not header_safe(value) or len(value) > MAX_HEADER_VALUE_BYTES:
                    return self._refused(
                        f"the {header} value must be plain ASCII without control characters, "
                        f"at most {MAX_HEADER_VALUE_BYTES} bytes",
                        started,
                    )
                headers[header] = value
        kwargs = {}
        for name, value in params.items():
            spec = action.input.get(name)
            wire = (spec.name if spec is not None else None) or name
            if wire not in operation.parts:
                return self._refused(f"{operation.name} has no input part {wire!r}", started, field=name)
            try:
                converted = convert_for_system(value, spec) if spec is not None else value
            except ValueError as exc:  # a date the field's format cannot take
                return self._refused(f"param {name!r} cannot be converted: {exc}", started, field=name)
            if converted is not OMIT:
                kwargs[wire] = converted
        left = max(0.001, timeout - (time.perf_counter() - started))  # the first call also loaded the WSDL
        with self._transport.scope(ctx, left, headers) as scope:
            try:
                result = service.proxy[operation.name](**kwargs)
            except Exception as exc:
                return self._failure(exc, action, scope, timeout, started)
        return self._success(action, result, ctx, started)

    def _failure(self, exc: Exception, action: ActionSpec, scope: _Scope, timeout: float, started: float) -> Outcome:
        """The one place that turns what zeep, lxml, httpx and the auth raise into reach error codes."""
        name = self.connector.name
        if not scope.sent and isinstance(exc, (TypeError, ValueError, zeep.exceptions.Error)):
            # zeep or lxml refused to write the params as XML
            return self._refused(f"the params do not fit the operation: {_bounded(str(exc))}", started)
        if not scope.sent:
            raise exc  # a bug: the pool answers INTERNAL
        # from here the request was handed to httpx; these failures still left nothing at the system
        if isinstance(exc, TokenError):
            code = ErrorCode.DOWNSTREAM_AUTH_FAILED
            return self._failed(
                code, f"could not obtain credentials for {name}: {exc}", _SUGGESTIONS[code], started, sent=False
            )
        if isinstance(exc, CredentialsUnavailable):
            message = f"could not obtain credentials for {name}: {exc}"
            return self._failed(
                _UNREACHABLE, message, "The system's sign-in is unreachable; retry later.", started, sent=False
            )
        if isinstance(exc, httpx.TransportError) and (refused := tls_refusal(exc)):
            message = f"{name}: {refused}"
            return self._failed(ErrorCode.DOWNSTREAM_AUTH_FAILED, message, _TLS_REFUSED, started, sent=False)
        if isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)):
            message = f"could not connect to {name}: {type(exc).__name__}"
            return self._failed(_UNREACHABLE, message, "The system is unreachable; retry later.", started, sent=False)
        if isinstance(exc, httpx.LocalProtocolError):
            return self._refused(f"the request could not be formed: {exc}", started)
        safe = self.connector.safe_to_repeat(action)
        if isinstance(exc, httpx.TimeoutException):
            if safe:
                return self._failed(
                    ErrorCode.DOWNSTREAM_TIMEOUT,
                    f"{name} did not answer within {timeout:g}s",
                    "Retry later; the action is safe to repeat.",
                    started,
                )
            return self._unknown(
                f"{name} did not answer within {timeout:g}s after the request was sent", action, started
            )
        if isinstance(exc, (httpx.TransportError, httpx.DecodingError)):
            if safe:
                return self._failed(
                    ErrorCode.DOWNSTREAM_ERROR,
                    f"connection to {name} failed: {type(exc).__name__}",
                    "Retry later; the action is safe to repeat.",
                    started,
                )
            return self._unknown(
                f"the connection to {name} broke after the request was sent ({type(exc).__name__})", action, started
            )
        if isinstance(exc, _HttpRefused):
            code = ErrorCode.DOWNSTREAM_RATE_LIMITED if exc.status == 429 else ErrorCode.DOWNSTREAM_AUTH_FAILED
            return self._failed(
                code,
                f"{name} answered HTTP {exc.status}",
                _SUGGESTIONS[code],
                started,
                status=exc.status,
                retry_after_ms=retry_after_ms(exc.retry_after) if exc.status == 429 else None,
            )
        status = scope.status or 0
        if isinstance(exc, zeep.exceptions.Fault) and exc.code:
            return self._fault(exc, status, started)
        if isinstance(exc, _ResponseTooLarge) and status == 200:
            return self._omitted(action, str(exc), started)
        if isinstance(exc, (_ResponseTooLarge, zeep.exceptions.TransportError, zeep.exceptions.Fault)):
            # too large to read, not XML, or XML without a Fault on an error status
            code = ErrorCode.DOWNSTREAM_ERROR if status >= 500 else ErrorCode.DOWNSTREAM_CONTRACT_VIOLATION
            return self._failed(
                code,
                f"{name} answered HTTP {status} without a usable SOAP envelope",
                _SUGGESTIONS[code],
                started,
                status=status,
            )
        if not isinstance(exc, (zeep.exceptions.Error, etree.LxmlError, ValueError)):
            # not a way zeep is known to refuse an answer; never "not sent": the call may have run
            log.exception("%s: reading the answer of %s failed", name, action.operation)
        # a DTD, entities, bad XML, or an answer that breaks the WSDL's types
        return self._failed(
            ErrorCode.DOWNSTREAM_CONTRACT_VIOLATION,
            f"{name} answered with something its WSDL does not declare: {_bounded(str(exc))}",
            violation_suggestion(action, "tell an operator."),
            started,
            status=status,
        )

    def _fault(self, fault: Any, status: int, started: float) -> Outcome:
        code_text = str(fault.code or "")
        local = code_text.rsplit(":", 1)[-1].split(".", 1)[0]  # soap11env:Client.InvalidAmount -> Client
        code = ErrorCode.DOWNSTREAM_VALIDATION_FAILED if local in CLIENT_FAULTS else ErrorCode.DOWNSTREAM_ERROR
        message = _bounded(str(fault.message or "")) or f"{self.connector.name} answered with a SOAP fault {code_text}"
        details = [{"code": "soap_fault", "message": _bounded(code_text)}] if code_text else []
        return self._failed(code, message, _SUGGESTIONS[code], started, status=status, details=details)

    def _success(self, action: ActionSpec, result: Any, ctx: CallContext, started: float) -> Outcome:
        limit = ctx.max_depth if ctx.max_depth is not None else self._max_depth
        try:
            result = serialize_object(result, dict)  # type: ignore[no-untyped-call, unused-ignore]
            plain = _plain(result, limit - (0 if isinstance(result, dict) else 1), 0)
        except _TooDeep:
            return self._omitted(action, f"the system's answer nests deeper than {limit} levels, the limit", started)
        data = plain if isinstance(plain, dict) else ({} if plain is None else {"result": plain})
        elapsed = (time.perf_counter() - started) * 1000
        problems = check_output(self._outputs[action.action], data)
        if problems:
            return Outcome(
                False,
                code=ErrorCode.DOWNSTREAM_CONTRACT_VIOLATION,
                message=f"{self.connector.name} answered but the response breaks the declared output",
                suggestion=violation_suggestion(action, "ask an operator to check the connector's output schema."),
                details=problems,
                downstream_ms=elapsed,
            )
        return Outcome(True, data=data, downstream_ms=elapsed)

    def _omitted(self, action: ActionSpec, reason: str, started: float) -> Outcome:
        """A successful answer too large or deep to pass on: a write stays a success (its effect
        happened); a read that declares an output cannot be checked."""
        elapsed = (time.perf_counter() - started) * 1000
        if self._outputs[action.action] and not action.is_write:
            return Outcome(
                False,
                code=ErrorCode.DOWNSTREAM_CONTRACT_VIOLATION,
                message=f"{self.connector.name} answered but {reason}",
                suggestion="The answer cannot be checked against the declared output; tell an operator.",
                downstream_ms=elapsed,
            )
        return Outcome(True, data={"_reach_omitted": reason}, downstream_ms=elapsed)

    def _refused(self, message: str, started: float, field: str | None = None) -> Outcome:
        return refused_outcome(
            Unsendable(message, field, "soap_part"),
            suggestion="Send only values the operation's types accept (no control characters) and send again.",
            started=started,
        )

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
        details: list[dict[str, Any]] | None = None,
    ) -> Outcome:
        return Outcome(
            False,
            code=code,
            message=message,
            suggestion=suggestion,
            details=details or [],
            sent=sent,
            http_status=status,
            retry_after_ms=retry_after_ms,
            downstream_ms=(time.perf_counter() - started) * 1000,
        )

    def _unknown(self, message: str, action: ActionSpec, started: float) -> Outcome:
        return self._failed(
            ErrorCode.OUTCOME_UNKNOWN, message, self.connector.check_first_suggestion(action.action), started
        )

    # -- health --------------------------------------------------------------------------------

    def probe(self, timeout: float) -> ProbeResult:
        """A declared ``health.path`` (on the service address's host) must answer 2xx; else a WSDL
        URL must answer 200 (fetched, not parsed); else the service address must answer HTTP at all
        (a SOAP endpoint may refuse a GET: only a gateway's 502/503/504 counts as down)."""
        try:
            health = self.connector.health
            if health is not None:
                method, path = split_path(health.path)
                parts = urlsplit(self._address(timeout))
                url = f"{parts.scheme}://{parts.netloc}{path}"
                response = self._http.request(method, url, timeout=timeout)
                return ProbeResult(200 <= response.status_code < 300, f"HTTP {response.status_code}")
            if _origin(self._wsdl) is not None:
                with self._http.stream("GET", self._wsdl, timeout=timeout) as response:
                    return ProbeResult(response.status_code == 200, f"WSDL: HTTP {response.status_code}")
            response = self._http.get(self._address(timeout), timeout=timeout)
            return ProbeResult(response.status_code not in (502, 503, 504), f"HTTP {response.status_code}")
        except (httpx.HTTPError, WsdlError, CredentialsError, ValueError) as exc:
            return ProbeResult(False, type(exc).__name__)

    def _address(self, timeout: float) -> str:
        return self.connector.endpoint or self.service(timeout).address

    def close(self) -> None:
        self._http.close()


_TLS_REFUSED = "The connector's client certificate is missing or not accepted; do not retry. Tell an operator."
_SUGGESTIONS = {
    ErrorCode.DOWNSTREAM_VALIDATION_FAILED: "The system rejected the params; fix them as its message says and send again.",
    ErrorCode.DOWNSTREAM_AUTH_FAILED: "The connector's credentials were refused; do not retry. Tell an operator.",
    ErrorCode.DOWNSTREAM_RATE_LIMITED: "The system is throttling requests; wait retry_after_ms (or a few seconds) and send again.",
    ErrorCode.DOWNSTREAM_ERROR: "The system failed; retry later.",
    ErrorCode.DOWNSTREAM_CONTRACT_VIOLATION: "The system answered in an unexpected way; tell an operator.",
}


class _TooDeep(Exception):
    pass


def _plain(value: Any, limit: int, depth: int) -> Any:
    """``value`` (zeep's result as dicts and lists) as JSON-safe values; raises _TooDeep past
    ``limit`` levels of nesting (recursion bounded by the limit, not by the answer)."""
    if isinstance(value, dict):
        if depth >= limit:
            raise _TooDeep
        return {str(k): _plain(v, limit, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        if depth >= limit:
            raise _TooDeep
        return [_plain(v, limit, depth + 1) for v in value]
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if value == value and value not in (float("inf"), float("-inf")) else str(value)
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, (datetime, date, clock_time)):
        return value.isoformat()
    if isinstance(value, timedelta):
        return str(isodate.duration_isoformat(value))
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, etree._Element):  # xsd:any content: passed on as its XML text
        return str(etree.tostring(value, encoding="unicode"))
    return str(value)


def _bounded(text: str) -> str:
    text = text.strip()
    return text if len(text) <= MAX_MESSAGE_CHARS else text[: MAX_MESSAGE_CHARS - 1] + "…"


def wsdl_problems(connector: ConnectorSpec) -> list[str]:
    """What ``reach validate`` finds by reading a soap connector's WSDL: operations it lacks, params
    that are not input parts, required parts the input leaves out; or why the WSDL cannot be loaded."""
    try:
        adapter = SoapAdapter(connector, AdapterOptions(max_connections=1))
    except (MissingSecret, OSError, ValueError) as exc:
        return [f"the WSDL {connector.wsdl} cannot be loaded: {exc}"]
    try:
        service = adapter.service(LOAD_TIMEOUT)
    except WsdlError as exc:  # its message names the WSDL
        return [f"the WSDL cannot be loaded: {exc}"]
    finally:
        adapter.close()
    problems = []
    for action in connector.actions:
        operation = service.operations.get(action.operation or "")
        if operation is None:
            near = difflib.get_close_matches(action.operation or "", list(service.operations), n=1)
            hint = f" (did you mean {near[0]}?)" if near else f" (it has {', '.join(sorted(service.operations))})"
            problems.append(f"action {action.action}: operation {action.operation} is not in the WSDL{hint}")
            continue
        wire = {(spec.name or name): name for name, spec in action.input.items()}
        for part, name in wire.items():
            if part not in operation.parts:
                problems.append(
                    f"action {action.action}: input {name} is not an input part of {operation.name} "
                    f"(its parts: {', '.join(operation.parts) or 'none'})"
                )
        for part in operation.required:
            if part not in wire:
                problems.append(f"action {action.action}: {operation.name} requires part {part}, which input lacks")
    return problems
