"""zeep's transport over the adapter's httpx client: each SOAP call with the calling thread's
timeout and headers, and the loading of the WSDL and what it imports (from its own origin only)."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit
from urllib.request import url2pathname

import httpx
import zeep
from zeep.wsdl.utils import etree_to_string

from connectors.adapters.auth import bind_call
from connectors.adapters.base import CallContext
from connectors.adapters.http_answers import ResponseTooLarge, read_capped
from connectors.adapters.soap.wsdl import LOAD_TIMEOUT, MAX_DOCUMENT_BYTES, WsdlError, origin
from producers.wire import ErrorCode


class HttpRefused(Exception):
    """The system answered with an HTTP status that says more than any body could (401, 403, 429)."""

    def __init__(self, status: int, retry_after: str | None) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status
        self.retry_after = retry_after


@dataclass(frozen=True)
class Reply:
    """What zeep's ``process_reply`` reads of a response (it expects a requests.Response)."""

    status_code: int
    content: bytes
    headers: httpx.Headers
    encoding: str | None


@dataclass
class Scope:
    """One call's HTTP facts, seen by the transport on the calling thread."""

    ctx: CallContext
    timeout: float
    deadline: float
    headers: dict[str, str]
    sent: bool = False  # the request left this process (from here on its effect may have happened)
    status: int | None = None  # the HTTP status of the answer


class SoapTransport(zeep.Transport):
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
        self._origin = origin(wsdl)
        self._max_response_bytes = max_response_bytes
        self._local = threading.local()

    @contextmanager
    def scope(self, ctx: CallContext, timeout: float, headers: dict[str, str]) -> Iterator[Scope]:
        scope = Scope(ctx, timeout, time.perf_counter() + timeout, headers)
        self._local.scope = scope
        try:
            yield scope
        finally:
            self._local.scope = None

    def post_xml(self, address: str, envelope: Any, headers: dict[str, str]) -> Reply:
        scope: Scope | None = getattr(self._local, "scope", None)
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
                raise HttpRefused(response.status_code, response.headers.get("Retry-After"))
            raw = read_capped(response, self._max_response_bytes, scope.deadline)
        finally:
            response.close()
        return Reply(response.status_code, raw, response.headers, response.encoding)

    def post(self, address: str, message: Any, headers: dict[str, str]) -> Any:
        raise NotImplementedError("only SOAP bindings are called (post_xml)")

    def get(self, address: str, params: Any, headers: dict[str, str]) -> Any:
        raise NotImplementedError("HTTP GET bindings are not called; only SOAP ports are used")

    def load(self, url: str) -> bytes:
        parts = urlsplit(url)
        if parts.scheme in ("http", "https"):
            if self._origin is None or origin(url) != self._origin:
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
                    return read_capped(response, MAX_DOCUMENT_BYTES, deadline)
                except ResponseTooLarge as exc:
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
