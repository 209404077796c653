"""The soap adapter itself: the params -> one WSDL operation called with zeep -> one Outcome, and the
one place that turns what zeep, lxml, httpx and the auth raise into reach error codes (with the
http adapter's rules for an exchange's failure, http_answers.py)."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any
from urllib.parse import urlsplit

import httpx
import zeep
import zeep.exceptions
from lxml import etree
from zeep.helpers import serialize_object
from zeep.proxy import ServiceProxy

from connectors.adapters.auth import CredentialsError, TokenError, build_auth, ssl_context
from connectors.adapters.base import AdapterOptions, CallContext, Outcome, ProbeResult

# the http adapter's rules, kept identical here: field conversions (null_as, format/timezone, as: string),
# output checks, header safety, Retry-After, a client without a cookie jar, and what a failed exchange means
from connectors.adapters.common import OMIT, CookielessClient, compile_outputs, convert_for_system, header_safe
from connectors.adapters.errors import Unsendable, refused_outcome, violation_suggestion
from connectors.adapters.http_answers import (
    SUGGESTIONS,
    ResponseTooLarge,
    checked_success,
    exchange_failure,
    failed,
    omitted_success,
    status_code,
    status_retry_after,
)
from connectors.adapters.scrub import Scrubber, auth_secrets
from connectors.adapters.soap.exchange import HttpRefused, Scope, SoapTransport
from connectors.adapters.soap.values import TooDeep, bounded, plain
from connectors.adapters.soap.wsdl import LOAD_TIMEOUT, SETTINGS, Service, WsdlError, operations, origin, soap_port
from connectors.adapters.transport import PooledTransport
from connectors.schema import MAX_HEADER_VALUE_BYTES
from connectors.spec import ActionSpec, ConnectorSpec, split_path
from producers.wire import ErrorCode

log = logging.getLogger("reach.soap")

DEFAULT_MAX_RESPONSE_BYTES = 1 << 20
DEFAULT_MAX_DEPTH = 32
CLIENT_FAULTS = ("Client", "Sender")  # SOAP 1.1 / 1.2: the request was wrong, not the system
_UNREACHABLE = ErrorCode.DOWNSTREAM_UNREACHABLE


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
        self._transport = SoapTransport(self._http, self._wsdl, self._max_response_bytes)
        # a fault that echoes the credential must not pass it on to the agent
        self._scrub = Scrubber(auth_secrets(connector.auth, options.environ))
        self._load_lock = threading.Lock()
        self._service: Service | None = None

    # -- the WSDL ------------------------------------------------------------------------------

    def service(self, timeout: float = LOAD_TIMEOUT) -> Service:
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

    def _load(self, timeout: float) -> Service:
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
            raise WsdlError(f"{self._wsdl} is not a usable WSDL: {type(exc).__name__}: {bounded(str(exc))}") from exc
        except NotImplementedError as exc:  # e.g. a binding transport other than SOAP over HTTP
            raise WsdlError(f"{self._wsdl} is not a usable WSDL: {bounded(str(exc))}") from exc
        port = soap_port(client)
        address = self.connector.endpoint or port.binding_options.get("address")
        if not address:
            raise WsdlError("the WSDL's SOAP port has no address; set the connector's endpoint")
        proxy = ServiceProxy(client, port.binding, address=address)  # type: ignore[no-untyped-call, unused-ignore]
        return Service(client, proxy, address, operations(port.binding))

    # -- calling -------------------------------------------------------------------------------

    def call(self, action: ActionSpec, params: dict[str, Any], ctx: CallContext) -> Outcome:
        """One attempt. Never raises for anything the system, the network or the params do."""
        return self._scrub.outcome(self._call(action, params, ctx))

    def _call(self, action: ActionSpec, params: dict[str, Any], ctx: CallContext) -> Outcome:
        started = time.perf_counter()
        timeout = ctx.timeout if ctx.timeout is not None else action.timeout_seconds
        try:
            service = self.service(timeout)
        except WsdlError as exc:
            return failed(
                exc.code,
                f"the WSDL of {self.connector.name} cannot be loaded: {exc}",
                "The system is unreachable; retry later."
                if exc.code is _UNREACHABLE
                else SUGGESTIONS.get(exc.code, "Tell an operator."),
                started,
                sent=False,
            )
        operation = service.operations.get(action.operation or "")
        if operation is None:
            return failed(
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
                converted = convert_for_system(value, spec, name) if spec is not None else value
            except ValueError as exc:  # a date the field's format or time zone cannot take (Unsendable)
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

    def _failure(self, exc: Exception, action: ActionSpec, scope: Scope, timeout: float, started: float) -> Outcome:
        """The one place that turns what zeep, lxml, httpx and the auth raise into reach error codes."""
        name = self.connector.name
        if not scope.sent and isinstance(exc, (TypeError, ValueError, zeep.exceptions.Error)):
            # zeep or lxml refused to write the params as XML
            return self._refused(f"the params do not fit the operation: {bounded(str(exc))}", started)
        if not scope.sent:
            raise exc  # a bug: the pool answers INTERNAL
        # from here the request was handed to httpx: no credentials, no connection, no answer in time
        exchanged = exchange_failure(exc, self.connector, action, timeout, started)
        if exchanged is not None:
            return exchanged
        if isinstance(exc, httpx.LocalProtocolError):
            return self._refused(f"the request could not be formed: {exc}", started)
        if isinstance(exc, HttpRefused):
            code = status_code(exc.status)
            return failed(
                code,
                f"{name} answered HTTP {exc.status}",
                SUGGESTIONS[code],
                started,
                status=exc.status,
                retry_after_ms=status_retry_after(exc.status, exc.retry_after),
            )
        status = scope.status or 0
        if isinstance(exc, zeep.exceptions.Fault) and exc.code:
            return self._fault(exc, status, started)
        if isinstance(exc, ResponseTooLarge) and status == 200:
            return self._omitted(action, str(exc), started)
        if isinstance(exc, (ResponseTooLarge, zeep.exceptions.TransportError, zeep.exceptions.Fault)):
            # too large to read, not XML, or XML without a Fault on an error status
            code = ErrorCode.DOWNSTREAM_ERROR if status >= 500 else ErrorCode.DOWNSTREAM_CONTRACT_VIOLATION
            return failed(
                code,
                f"{name} answered HTTP {status} without a usable SOAP envelope",
                SUGGESTIONS[code],
                started,
                status=status,
            )
        if not isinstance(exc, (zeep.exceptions.Error, etree.LxmlError, ValueError)):
            # not a way zeep is known to refuse an answer; never "not sent": the call may have run
            log.exception("%s: reading the answer of %s failed", name, action.operation)
        # a DTD, entities, bad XML, or an answer that breaks the WSDL's types
        return failed(
            ErrorCode.DOWNSTREAM_CONTRACT_VIOLATION,
            f"{name} answered with something its WSDL does not declare: {bounded(str(exc))}",
            violation_suggestion(action, "tell an operator."),
            started,
            status=status,
        )

    def _fault(self, fault: Any, status: int, started: float) -> Outcome:
        code_text = str(fault.code or "")
        local = code_text.rsplit(":", 1)[-1].split(".", 1)[0]  # soap11env:Client.InvalidAmount -> Client
        code = ErrorCode.DOWNSTREAM_VALIDATION_FAILED if local in CLIENT_FAULTS else ErrorCode.DOWNSTREAM_ERROR
        message = bounded(str(fault.message or "")) or f"{self.connector.name} answered with a SOAP fault {code_text}"
        details = [{"code": "soap_fault", "message": bounded(code_text)}] if code_text else []
        return failed(code, message, SUGGESTIONS[code], started, status=status, details=details)

    def _success(self, action: ActionSpec, result: Any, ctx: CallContext, started: float) -> Outcome:
        limit = ctx.max_depth if ctx.max_depth is not None else self._max_depth
        try:
            result = serialize_object(result, dict)  # type: ignore[no-untyped-call, unused-ignore]
            value = plain(result, limit - (0 if isinstance(result, dict) else 1), 0)
        except TooDeep:
            return self._omitted(action, f"the system's answer nests deeper than {limit} levels, the limit", started)
        data = value if isinstance(value, dict) else ({} if value is None else {"result": value})
        elapsed = (time.perf_counter() - started) * 1000
        return checked_success(self.connector.name, action, self._outputs[action.action], data, elapsed)

    def _omitted(self, action: ActionSpec, reason: str, started: float) -> Outcome:
        """A successful answer too large or deep to pass on: a write stays a success (its effect
        happened); a read that declares an output cannot be checked."""
        elapsed = (time.perf_counter() - started) * 1000
        uncheckable = bool(self._outputs[action.action]) and not action.is_write
        return omitted_success(self.connector.name, {"_reach_omitted": reason}, elapsed, uncheckable=uncheckable)

    def _refused(self, message: str, started: float, field: str | None = None) -> Outcome:
        return refused_outcome(
            Unsendable(message, field, "soap_part"),
            suggestion="Send only values the operation's types accept (no control characters) and send again.",
            started=started,
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
            if origin(self._wsdl) is not None:
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
