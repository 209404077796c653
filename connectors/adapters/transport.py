"""An httpx transport on urllib3's connection pools: one calling thread's HTTP/1.1 connections,
kept alive, one per origin.

What was decided (issue 31; figures in BENCHMARKS.md, "The HTTP transport", how they were reached
in docs/performance.md): the connection work is a well-kept library's, not this project's. The
transport written here before on ``http.client`` (``ThreadTransport``) spent less CPU a call, but
within the 10 % of the fleet's throughput the issue allows, so it went. httpx's default
transport (httpcore and h11) was not taken because, when the choice was made, it had measured far
costlier a call (2026-12-02); measured in the same runs as this one since, it costs about the
same, within the 10 % too. What still tells the two apart: here the answer is read by
``http.client``, which refuses heads h11 lets through (more than 100 header lines, one line over
64 KiB, a whole head over 100 KiB arriving in one read, a status line that is not HTTP/1.x: the
cases tests/unit/test_transport_differential.py lists as intended). Moving to httpx's default
transport stays open on those terms, and would leave no connection code of ours at all.

urllib3 does the connection work (opening, keeping alive, dropping a connection the system closed
while idle, TLS with the given context, sending, framing the answer's body). What urllib3 leaves
lenient is made as strict as h11 here:

- the answer is read by ``http.client`` through :class:`StrictResponse` (interim answers, bad
  ``Content-Length`` or chunk sizes, malformed header lines, bodies on 204/304, trailer bounds);
- header names and values are checked as h11 checks them before anything is written;
- an idle connection is dropped after ``keepalive_expiry`` (5 s, httpx's default);
- the ``timeout`` extension's connect, write and read limits each apply to their phase;
- failures are httpx's own exceptions, raised from urllib3's (and so, through it, from the socket
  or TLS error underneath: the adapter reads a refused client certificate from that chain).

urllib3 retries nothing here, follows no redirect and decodes no content: httpx and the adapter
do those. Where the result still differs from httpx's own transport is listed in
tests/unit/test_transport_differential.py.
"""

from __future__ import annotations

import http.client
import ssl
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import urllib3
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.exceptions import (
    ConnectTimeoutError,
    HTTPError,
    NewConnectionError,
    ProtocolError,
    ReadTimeoutError,
    SSLError,
)
from urllib3.response import BaseHTTPResponse

from connectors.adapters.strict_http import StrictResponse, check_request_headers, field_value

_DEFAULT_PORTS = {b"http": 80, b"https": 443}
_READ_CHUNK = 64 * 1024
KEEPALIVE_EXPIRY = 5.0  # seconds, as httpx.HTTPTransport

_Origin = tuple[bytes, bytes, int]

# what a connection was doing when a call failed: which httpx error the failure becomes
_CONNECT, _WRITE, _READ = "connect", "write", "read"

_call = threading.local()  # the calling thread's write limit, request-target and the connection its call is on


class _Phases:
    """A connection's part in telling apart where a call failed, with its write limit; a write
    that fails still reads the answer, as httpcore does: a system may answer (413) and close
    before taking the whole body, and a TLS 1.3 system refusing the client certificate says so
    on the read."""

    phase = _CONNECT
    write_timeout: float | None = None
    write_error: OSError | None = None
    idle_since = 0.0
    sock: Any

    def connect(self) -> None:
        self.phase = _CONNECT
        super().connect()  # type: ignore[misc]
        self.phase = _WRITE
        self.sock.settimeout(self.write_timeout)

    def request(self, method: str, url: str, *args: Any, **kwargs: Any) -> None:
        self.write_error = None
        if self.sock is not None:
            self.phase = _WRITE
            self.sock.settimeout(self.write_timeout)
        # urllib3's urlopen re-encodes the target and upper-cases its %xx escapes ("%2f" -> "%2F");
        # a system may tell them apart (a signed URL, an opaque id), so the request-target httpx
        # built (checked against the endpoint by the adapter, all ASCII) goes out as it is
        target = getattr(_call, "target", None)
        try:
            super().request(method, target or url, *args, **kwargs)  # type: ignore[misc]
        except TimeoutError:
            raise
        except OSError as exc:
            if self.phase != _WRITE:
                raise
            self.write_error = exc  # the connection is not kept (_put_conn)

    def getresponse(self) -> Any:
        self.phase = _READ
        try:
            return super().getresponse()  # type: ignore[misc]
        except Exception as exc:
            if self.write_error is not None and exc.__cause__ is None and exc.__context__ is None:
                exc.__context__ = self.write_error  # e.g. the TLS alert that broke the write
            raise


class _Connection(_Phases, HTTPConnection):
    response_class = StrictResponse


class _TlsConnection(_Phases, HTTPSConnection):
    response_class = StrictResponse


class _PoolMixin:
    """One origin's connections: an idle one past its expiry is closed before it is handed out,
    and the calling thread remembers the connection its call is on."""

    expiry = KEEPALIVE_EXPIRY

    def _get_conn(self, timeout: float | None = None) -> Any:
        conn = super()._get_conn(timeout)  # type: ignore[misc]  # drops one the system closed
        if conn.sock is not None and time.monotonic() - conn.idle_since >= self.expiry:
            conn.close()
        conn.phase = _CONNECT if conn.sock is None else _WRITE
        conn.write_timeout = getattr(_call, "write_timeout", None)
        _call.conn = conn
        return conn

    def _put_conn(self, conn: Any) -> None:
        if conn is not None:
            if conn.write_error is not None:
                conn.close()
            conn.idle_since = time.monotonic()
        super()._put_conn(conn)  # type: ignore[misc]


class _Pool(_PoolMixin, urllib3.HTTPConnectionPool):
    ConnectionCls = _Connection


class _TlsPool(_PoolMixin, urllib3.HTTPSConnectionPool):
    ConnectionCls = _TlsConnection


class PooledTransport(httpx.BaseTransport):
    """Thread-safe. The HTTP adapter gives each calling thread one of its own (one kept-alive
    connection per origin, no waiting on other threads); the SOAP adapter shares one."""

    def __init__(
        self,
        verify: ssl.SSLContext | None = None,
        keepalive_expiry: float = KEEPALIVE_EXPIRY,
        max_connections: int = 1,
    ) -> None:
        """``verify``: the TLS context (CAs, client certificate), None: httpx's default one;
        ``max_connections``: kept alive per origin (more are opened when needed, then closed)."""
        self._ssl = verify
        self._expiry = keepalive_expiry
        self._maxsize = max_connections
        self._pools: dict[_Origin, _Pool | _TlsPool] = {}
        self._lock = threading.Lock()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        scheme = url.raw_scheme
        if scheme not in _DEFAULT_PORTS:
            raise httpx.UnsupportedProtocol(f"unsupported URL scheme {scheme.decode('ascii', 'replace')!r}")
        check_request_headers(request)
        timeouts: dict[str, Any] = request.extensions.get("timeout") or {}
        origin = (scheme, url.raw_host, url.port or _DEFAULT_PORTS[scheme])
        pool = self._pools.get(origin) or self._pool(origin)
        _call.write_timeout = _seconds(timeouts.get("write"))
        _call.conn = None
        _call.target = url.raw_path.decode("ascii")
        raw = request.headers.raw
        headers: dict[str, str] | urllib3.HTTPHeaderDict = {
            name.decode("latin-1"): value.decode("latin-1") for name, value in raw
        }
        if len(headers) < len(raw):  # a name given twice: urllib3's multi-valued dict keeps both
            headers = urllib3.HTTPHeaderDict()
            for name, value in raw:
                headers.add(name.decode("latin-1"), value.decode("latin-1"))
        body = request.read() or None
        try:
            response = pool.urlopen(
                request.method,
                _call.target,
                body=body,
                headers=headers,
                retries=False,
                redirect=False,
                assert_same_host=False,
                timeout=urllib3.Timeout(connect=_seconds(timeouts.get("connect")), read=_seconds(timeouts.get("read"))),
                preload_content=False,
                decode_content=False,
                release_conn=False,
                enforce_content_length=True,
            )
        except Exception as exc:
            conn = _call.conn
            phase = conn.phase if conn is not None else _CONNECT
            raise _mapped(exc, phase, request) from exc
        original = response._original_response  # type: ignore[attr-defined]
        return httpx.Response(
            status_code=response.status,
            headers=[(name.encode("latin-1"), field_value(value)) for name, value in original.getheaders()],
            stream=_Body(response, request),
            extensions={
                "http_version": b"HTTP/1.1" if response.version == 11 else b"HTTP/1.0",
                "reason_phrase": (response.reason or "").encode("latin-1", "replace"),
            },
        )

    def _pool(self, origin: _Origin) -> _Pool | _TlsPool:
        with self._lock:
            pool = self._pools.get(origin)
            if pool is None:
                pool = self._pools[origin] = self._new_pool(origin)
            return pool

    def _new_pool(self, origin: _Origin) -> _Pool | _TlsPool:
        scheme, host, port = origin
        pool: _Pool | _TlsPool
        if scheme == b"https":
            if self._ssl is None:
                self._ssl = httpx.create_ssl_context()
            # cert_reqs from the context itself: urllib3 sets the context's verify_mode from it
            pool = _TlsPool(
                host.decode("ascii"),
                port,
                maxsize=self._maxsize,
                block=False,
                retries=False,
                ssl_context=self._ssl,
                cert_reqs=self._ssl.verify_mode,
            )
        else:
            pool = _Pool(host.decode("ascii"), port, maxsize=self._maxsize, block=False, retries=False)
        pool.expiry = self._expiry
        return pool

    def close(self) -> None:
        with self._lock:
            pools, self._pools = self._pools, {}
        for pool in list(pools.values()):
            pool.close()  # a connection still in use is closed when its call gives it back


def _seconds(value: Any) -> float | None:
    return None if value is None else float(value)


def _inner(exc: BaseException) -> BaseException:
    """The socket, TLS or ``http.client`` error a urllib3 error wraps, or the error itself."""
    if isinstance(exc, ProtocolError) and len(exc.args) > 1 and isinstance(exc.args[1], BaseException):
        return exc.args[1]
    if isinstance(exc, SSLError) and exc.args and isinstance(exc.args[0], BaseException):
        return exc.args[0]
    return exc


def _mapped(exc: Exception, phase: str, request: httpx.Request) -> Exception:
    """urllib3's error for a call that got no answer, as httpcore would raise it."""
    inner = _inner(exc)
    text = str(inner) or type(inner).__name__
    if isinstance(exc, NewConnectionError):
        return httpx.ConnectError(text, request=request)
    timed_out = isinstance(exc, (ConnectTimeoutError, ReadTimeoutError)) or isinstance(inner, TimeoutError)
    if phase == _CONNECT:
        if timed_out:
            return httpx.ConnectTimeout(text, request=request)
        return httpx.ConnectError(text, request=request)  # refused, unreachable, a failed TLS handshake
    if phase == _WRITE:
        if timed_out:
            return httpx.WriteTimeout(text, request=request)
        if isinstance(inner, (ValueError, http.client.HTTPException)) and not isinstance(inner, OSError):
            # http.client refused the request line or a header before a byte was written
            return httpx.LocalProtocolError(text, request=request)
        return httpx.WriteError(text, request=request)
    if timed_out:
        return httpx.ReadTimeout(text, request=request)
    return read_error(inner, request)


def read_error(exc: BaseException, request: httpx.Request) -> Exception:
    """An error reading an answer (its head or its body) as httpx's."""
    if isinstance(exc, httpx.HTTPError):
        return exc
    if isinstance(exc, ReadTimeoutError | TimeoutError):
        return httpx.ReadTimeout(str(exc) or "timed out reading the answer", request=request)
    inner = _inner(exc)
    if inner is not exc:
        return read_error(inner, request)
    if isinstance(exc, (http.client.HTTPException, ValueError)):
        # a malformed status line or headers, an answer cut short, a connection closed unanswered
        return httpx.RemoteProtocolError(str(exc) or type(exc).__name__, request=request)
    if isinstance(exc, OSError | HTTPError):
        return httpx.ReadError(str(exc) or type(exc).__name__, request=request)
    return httpx.ReadError(f"{type(exc).__name__}: {exc}", request=request)


class _Body(httpx.SyncByteStream):
    """An answer's body as it arrives; reading it to the end gives the connection back to its pool,
    closing it before the end closes the connection."""

    def __init__(self, response: BaseHTTPResponse, request: httpx.Request) -> None:
        self._response = response
        self._request = request
        self._complete = False
        self._closed = False

    def __iter__(self) -> Iterator[bytes]:
        response = self._response
        while True:
            try:
                chunk = response.read1(_READ_CHUNK)
            except Exception as exc:
                self.close()
                raise read_error(exc, self._request) from exc
            except BaseException:
                self.close()
                raise
            if not chunk:
                self._complete = True
                return
            yield chunk

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        response = self._response
        if not self._complete:
            response.close()  # closes the connection too: it is not handed to the next call
        response.release_conn()
