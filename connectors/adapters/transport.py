"""An httpx transport on the standard library's ``http.client``: one calling thread's HTTP/1.1
connections, kept alive, one per origin.

The HTTP adapter builds and reads its calls with httpx (requests, auth flows, responses, timeouts
and errors); only the bytes on the socket go through here. ``httpx.HTTPTransport`` (httpcore and
h11) spends about three times the CPU of ``http.client`` on the same call, and a pool's threads
each have a transport of their own, so a shared connection pool and its locks buy nothing there.

It behaves as httpcore and h11 do where a user could tell:

- a connection is reused only if it is idle, open, with nothing unread, and idle for less than
  ``keepalive_expiry`` (5 s, httpx's default); otherwise a new one is opened before the request,
  so a request is never sent on a connection known to be dead, and never sent twice;
- the ``timeout`` extension's connect, write and read limits apply to each socket operation;
- a failed write still reads the answer: a system may answer (413) and close before taking the
  whole body, and a TLS 1.3 system refusing the client certificate says so on the read;
- header names and values are checked as h11 checks them before anything is written;
- interim answers (1xx but 101) are skipped; an answer cut short, a bad ``Content-Length`` or
  chunk size, a header line that is not one, or a 204/304 claiming a body is a protocol error;
- failures are httpx's own exceptions (``ConnectError``, ``ConnectTimeout``, ``WriteTimeout``,
  ``ReadTimeout``, ``ReadError``, ``RemoteProtocolError``, ``LocalProtocolError``), caused by the
  socket or TLS error underneath (the adapter reads a refused client certificate from the cause).

One difference is kept: ``http.client`` refuses an answer with more than 100 header lines
(``RemoteProtocolError``), where h11 bounds their bytes instead.
"""

from __future__ import annotations

import http.client
import re
import select
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx

_Origin = tuple[bytes, bytes, int]
_DEFAULT_PORTS = {b"http": 80, b"https": 443}
_READ_CHUNK = 64 * 1024
KEEPALIVE_EXPIRY = 5.0  # seconds, as httpx.HTTPTransport
MAX_TRAILER_LINES = 100

# h11's rules (RFC 9110): a name is a token; a value has no control characters, no line breaks
# and no blanks at either end
_HEADER_NAME = re.compile(rb"[-!#$%&'*+.^_`|~0-9a-zA-Z]+")
_HEADER_VALUE = re.compile(rb"(?:[\x21-\x7e\x80-\xff]+(?:[ \t]+[\x21-\x7e\x80-\xff]+)*)?")
_CHUNK_SIZE = re.compile(rb"[0-9A-Fa-f]{1,16}")
_FOLD = re.compile(r"[ \t]*\r?\n[ \t]+")


class _Response(http.client.HTTPResponse):
    """``http.client``'s reading of an answer, as strict as h11 where it is lenient."""

    def _read_status(self) -> tuple[str, int, str]:
        while True:  # http.client skips only 100 Continue; every interim answer but 101 goes
            version, status, reason = super()._read_status()  # type: ignore[misc]
            if not 100 <= status < 200 or status == 101:
                return version, status, reason
            http.client._read_headers(self.fp)  # type: ignore[attr-defined]  # the interim answer's headers

    def begin(self) -> None:
        super().begin()
        if self.msg.defects:  # e.g. a line that is not a header: what follows it was dropped
            self._close_conn()  # type: ignore[attr-defined]
            raise http.client.HTTPException(f"malformed headers in the answer ({self.msg.defects[0]!r})")
        lengths = [value.strip() for value in self.msg.get_all("content-length") or []]
        if lengths and (not all(v.isascii() and v.isdigit() for v in lengths) or len(set(lengths)) > 1):
            self._close_conn()  # type: ignore[attr-defined]
            raise http.client.HTTPException(f"bad Content-Length in the answer: {', '.join(lengths)[:100]!r}")
        if self.length == 0:  # 204, 304, an answer to HEAD: no body, whatever the headers claim
            self.chunked = False

    def _line(self, what: str) -> bytes:
        line: bytes = self.fp.readline(http.client._MAXLINE + 1)  # type: ignore[attr-defined]
        if len(line) > http.client._MAXLINE:  # type: ignore[attr-defined]
            raise http.client.LineTooLong(what)
        return line

    def _read_next_chunk_size(self) -> int:
        size = self._line("chunk size").split(b";", 1)[0].strip(b" \t\r\n")
        if not _CHUNK_SIZE.fullmatch(size):
            self._close_conn()  # type: ignore[attr-defined]
            raise ValueError(f"bad chunk size {size[:40]!r}")  # http.client makes it IncompleteRead
        return int(size, 16)

    def _read_and_discard_trailer(self) -> None:
        for _ in range(MAX_TRAILER_LINES):
            if self._line("trailer line") in (b"\r\n", b"\n", b""):
                return
        raise http.client.HTTPException(f"more than {MAX_TRAILER_LINES} trailer lines")


class _Connection(http.client.HTTPConnection):
    response_class = _Response


class _TlsConnection(http.client.HTTPSConnection):
    response_class = _Response


def _still_idle(sock: socket.socket | None) -> bool:
    """An idle keep-alive connection is usable only while nothing is there to read: readable means
    the system closed it (EOF) or sent bytes no request asked for."""
    if sock is None or sock.fileno() < 0:
        return False
    if isinstance(sock, ssl.SSLSocket) and sock.pending():
        return False
    poller = select.poll()  # not select(): it refuses descriptors past 1024, which a big pool has
    poller.register(sock, select.POLLIN)
    try:
        return not poller.poll(0)
    except OSError:
        return False


def _field_value(value: str) -> bytes:
    """A header value as h11 hands it on: no blanks at either end, folded lines joined by a space."""
    value = value.strip(" \t\r\n")
    if "\n" in value:
        value = _FOLD.sub(" ", value)
    return value.encode("latin-1")


def _timeout(timeouts: dict[str, Any], key: str) -> float | None:
    value = timeouts.get(key)
    return None if value is None else float(value)


class ThreadTransport(httpx.BaseTransport):
    """Not thread-safe: one per calling thread (the adapter keeps one in each thread's client);
    only ``close`` may come from another thread."""

    def __init__(self, verify: ssl.SSLContext | None = None, keepalive_expiry: float = KEEPALIVE_EXPIRY) -> None:
        """``verify``: the TLS context (CAs, client certificate); None: httpx's default one."""
        self._ssl = verify
        self._expiry = keepalive_expiry
        self._idle: dict[_Origin, tuple[http.client.HTTPConnection, float]] = {}
        self._lock = threading.Lock()  # only against ``close`` from another thread
        self._closed = False

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        scheme = url.raw_scheme
        if scheme not in _DEFAULT_PORTS:
            raise httpx.UnsupportedProtocol(f"unsupported URL scheme {scheme.decode('ascii', 'replace')!r}")
        origin = (scheme, url.raw_host, url.port or _DEFAULT_PORTS[scheme])
        timeouts: dict[str, Any] = request.extensions.get("timeout") or {}
        for name, value in request.headers.raw:
            if not _HEADER_NAME.fullmatch(name) or not _HEADER_VALUE.fullmatch(value):
                raise httpx.LocalProtocolError(f"illegal header {name[:100]!r}", request=request)
        body = request.read() or None

        connection = self._take_idle(origin)
        if connection is None:
            connection = self._connect(origin, _timeout(timeouts, "connect"))
        sock = connection.sock
        reusable = True
        write_error: OSError | None = None
        try:
            try:
                # validated (and refused) by http.client too, before a byte is written
                connection.putrequest(
                    request.method, url.raw_path.decode("ascii"), skip_host=True, skip_accept_encoding=True
                )
                for name, value in request.headers.raw:
                    connection.putheader(name, value)
            except (ValueError, http.client.HTTPException, UnicodeError) as exc:
                raise httpx.LocalProtocolError(str(exc), request=request) from exc
            try:
                sock.settimeout(_timeout(timeouts, "write"))
                connection.endheaders(body)
            except TimeoutError as exc:
                raise httpx.WriteTimeout(str(exc) or "timed out writing the request", request=request) from exc
            except OSError as exc:
                reusable = False  # the system may have answered before it took the whole request
                write_error = exc
            try:
                sock.settimeout(_timeout(timeouts, "read"))
                response = connection.getresponse()
            except Exception as exc:
                if write_error is not None and exc.__cause__ is None and exc.__context__ is None:
                    exc.__context__ = write_error  # e.g. the TLS alert that broke the write
                raise _read_error(exc, request) from exc
        except BaseException:
            connection.close()
            raise
        return httpx.Response(
            status_code=response.status,
            headers=[(name.encode("latin-1"), _field_value(value)) for name, value in response.getheaders()],
            stream=_Body(self, origin, connection, response, request, reusable),
            extensions={
                "http_version": b"HTTP/1.1" if response.version == 11 else b"HTTP/1.0",
                "reason_phrase": (response.reason or "").encode("latin-1", "replace"),
            },
        )

    def _take_idle(self, origin: _Origin) -> http.client.HTTPConnection | None:
        with self._lock:
            kept = self._idle.pop(origin, None)
        if kept is None:
            return None
        connection, since = kept
        if time.monotonic() - since < self._expiry and _still_idle(connection.sock):
            return connection
        connection.close()
        return None

    def _connect(self, origin: _Origin, timeout: float | None) -> http.client.HTTPConnection:
        scheme, host, port = origin
        name = host.decode("ascii")
        connection: http.client.HTTPConnection
        if scheme == b"https":
            if self._ssl is None:
                self._ssl = httpx.create_ssl_context()
            connection = _TlsConnection(name, port, timeout=timeout, context=self._ssl)
        else:
            connection = _Connection(name, port, timeout=timeout)
        try:
            connection.connect()
        except TimeoutError as exc:
            connection.close()
            raise httpx.ConnectTimeout(str(exc) or "timed out connecting") from exc
        except OSError as exc:  # refused, unreachable, a failed TLS handshake (ssl.SSLError)
            connection.close()
            raise httpx.ConnectError(str(exc) or type(exc).__name__) from exc
        except BaseException:
            connection.close()
            raise
        return connection

    def _release(self, origin: _Origin, connection: http.client.HTTPConnection) -> None:
        """A call's answer was read to its end: keep the connection for the next call to the origin."""
        with self._lock:
            if not self._closed and connection.sock is not None and origin not in self._idle:
                self._idle[origin] = (connection, time.monotonic())
                return
        connection.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, {}
        for connection, _ in idle.values():
            connection.close()


def _read_error(exc: Exception, request: httpx.Request) -> Exception:
    if isinstance(exc, httpx.HTTPError):
        return exc
    if isinstance(exc, TimeoutError):
        return httpx.ReadTimeout(str(exc) or "timed out reading the answer", request=request)
    if isinstance(exc, (http.client.HTTPException, ValueError)):
        # a malformed status line or headers, an answer cut short, a connection closed unanswered
        return httpx.RemoteProtocolError(str(exc) or type(exc).__name__, request=request)
    if isinstance(exc, OSError):
        return httpx.ReadError(str(exc) or type(exc).__name__, request=request)
    return httpx.ReadError(f"{type(exc).__name__}: {exc}", request=request)


class _Body(httpx.SyncByteStream):
    """An answer's body as it arrives (chunked or sized, http.client decodes the framing); reading
    it to the end keeps the connection, closing it before the end closes the connection."""

    def __init__(
        self,
        transport: ThreadTransport,
        origin: _Origin,
        connection: http.client.HTTPConnection,
        response: http.client.HTTPResponse,
        request: httpx.Request,
        reusable: bool,
    ) -> None:
        self._transport = transport
        self._origin = origin
        self._connection: http.client.HTTPConnection | None = connection
        self._response = response
        self._request = request
        self._reusable = reusable
        self._complete = False

    def __iter__(self) -> Iterator[bytes]:
        response = self._response
        while True:
            try:
                chunk = response.read1(_READ_CHUNK)
                if not chunk and not response.chunked and response.length:
                    raise http.client.IncompleteRead(b"", response.length)  # closed before the end
            except Exception as exc:
                self._abandon()
                raise _read_error(exc, self._request) from exc
            except BaseException:
                self._abandon()
                raise
            if not chunk:
                self._complete = True
                return
            yield chunk

    def close(self) -> None:
        connection, self._connection = self._connection, None
        if connection is None:
            return
        self._response.close()
        if self._complete and self._reusable and not self._response.will_close:
            self._transport._release(self._origin, connection)
        else:
            connection.close()

    def _abandon(self) -> None:
        self._reusable = False
        self.close()
