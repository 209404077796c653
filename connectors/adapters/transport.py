"""An httpx transport on the standard library's ``http.client``: one calling thread's HTTP/1.1
connections, kept alive, one per origin.

The HTTP adapter builds and reads its calls with httpx (requests, auth flows, responses, timeouts
and errors); only the bytes on the socket go through here. ``httpx.HTTPTransport`` (httpcore and
h11) spends about three times the CPU of ``http.client`` on the same call, and a pool's threads
each have a transport of their own, so the connection pool and its locks buy nothing there.

What httpcore does for the adapter, this does too:

- an idle connection the system has closed (or written to) is not reused: it is dropped before the
  request and a new one is opened, so a request is never sent on a connection known to be dead;
- the ``timeout`` extension's connect, write and read limits apply to each socket operation;
- failures are httpx's own exceptions (``ConnectError``, ``ConnectTimeout``, ``WriteTimeout``,
  ``ReadTimeout``, ``ReadError``, ``RemoteProtocolError``, ``LocalProtocolError``), caused by the
  socket or TLS error underneath (the adapter reads a refused client certificate from the cause).

A request is never sent twice: a connection that breaks mid-call is closed and the error raised.
"""

from __future__ import annotations

import http.client
import select
import socket
import ssl
from collections.abc import Iterator
from typing import Any

import httpx

_Origin = tuple[bytes, bytes, int]
_DEFAULT_PORTS = {b"http": 80, b"https": 443}
_READ_CHUNK = 64 * 1024


def _still_idle(sock: socket.socket | None) -> bool:
    """An idle keep-alive connection is usable only while nothing is there to read: readable means
    the system closed it (EOF) or sent bytes no request asked for."""
    if sock is None or sock.fileno() < 0:
        return False
    poller = select.poll()  # not select(): it refuses descriptors past 1024, which a big pool has
    poller.register(sock, select.POLLIN)
    try:
        return not poller.poll(0)
    except OSError:
        return False


def _timeout(timeouts: dict[str, Any], key: str) -> float | None:
    value = timeouts.get(key)
    return None if value is None else float(value)


class ThreadTransport(httpx.BaseTransport):
    """Not thread-safe: one per calling thread (the adapter keeps one in each thread's client)."""

    def __init__(self, verify: ssl.SSLContext | None = None) -> None:
        """``verify``: the TLS context (CAs, client certificate); None: httpx's default one."""
        self._ssl = verify
        self._idle: dict[_Origin, http.client.HTTPConnection] = {}

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        scheme = url.raw_scheme
        if scheme not in _DEFAULT_PORTS:
            raise httpx.UnsupportedProtocol(f"unsupported URL scheme {scheme.decode('ascii', 'replace')!r}")
        origin = (scheme, url.raw_host, url.port or _DEFAULT_PORTS[scheme])
        timeouts: dict[str, Any] = request.extensions.get("timeout") or {}
        body = request.read() or None

        connection = self._idle.pop(origin, None)
        if connection is not None and not _still_idle(connection.sock):
            connection.close()
            connection = None
        if connection is None:
            connection = self._connect(origin, _timeout(timeouts, "connect"))
        sock = connection.sock
        try:
            # validated (and refused) by http.client before a byte is written
            connection.putrequest(
                request.method, url.raw_path.decode("ascii"), skip_host=True, skip_accept_encoding=True
            )
            for name, value in request.headers.raw:
                connection.putheader(name, value)
        except (ValueError, http.client.HTTPException, UnicodeError) as exc:
            connection.close()
            raise httpx.LocalProtocolError(str(exc), request=request) from exc
        try:
            sock.settimeout(_timeout(timeouts, "write"))
            connection.endheaders(body)
        except TimeoutError as exc:
            connection.close()
            raise httpx.WriteTimeout(str(exc) or "timed out writing the request", request=request) from exc
        except OSError as exc:
            connection.close()
            raise httpx.WriteError(str(exc) or type(exc).__name__, request=request) from exc
        try:
            sock.settimeout(_timeout(timeouts, "read"))
            response = connection.getresponse()
        except BaseException as exc:
            connection.close()
            raise _read_error(exc, request) from exc
        return httpx.Response(
            status_code=response.status,
            headers=[(name.encode("latin-1"), value.encode("latin-1")) for name, value in response.getheaders()],
            stream=_Body(self, origin, connection, response, request),
            extensions={
                "http_version": b"HTTP/1.1" if response.version == 11 else b"HTTP/1.0",
                "reason_phrase": (response.reason or "").encode("latin-1", "replace"),
            },
        )

    def _connect(self, origin: _Origin, timeout: float | None) -> http.client.HTTPConnection:
        scheme, host, port = origin
        name = host.decode("ascii")
        connection: http.client.HTTPConnection
        if scheme == b"https":
            if self._ssl is None:
                self._ssl = httpx.create_ssl_context()
            connection = http.client.HTTPSConnection(name, port, timeout=timeout, context=self._ssl)
        else:
            connection = http.client.HTTPConnection(name, port, timeout=timeout)
        try:
            connection.connect()
        except TimeoutError as exc:
            connection.close()
            raise httpx.ConnectTimeout(str(exc) or "timed out connecting") from exc
        except OSError as exc:  # refused, unreachable, a failed TLS handshake (ssl.SSLError)
            connection.close()
            raise httpx.ConnectError(str(exc) or type(exc).__name__) from exc
        return connection

    def _release(self, origin: _Origin, connection: http.client.HTTPConnection) -> None:
        """A call's answer was read to its end: keep the connection for the next call to the origin."""
        if connection.sock is None or origin in self._idle:
            connection.close()
        else:
            self._idle[origin] = connection

    def close(self) -> None:
        idle, self._idle = self._idle, {}
        for connection in idle.values():
            connection.close()


def _read_error(exc: BaseException, request: httpx.Request) -> Exception:
    if isinstance(exc, TimeoutError):
        return httpx.ReadTimeout(str(exc) or "timed out reading the answer", request=request)
    if isinstance(exc, (http.client.HTTPException, ValueError)):
        # a malformed status line or headers, an answer cut short, a connection closed unanswered
        return httpx.RemoteProtocolError(str(exc) or type(exc).__name__, request=request)
    if isinstance(exc, OSError):
        return httpx.ReadError(str(exc) or type(exc).__name__, request=request)
    return exc if isinstance(exc, Exception) else httpx.ReadError(type(exc).__name__, request=request)


class _Body(httpx.SyncByteStream):
    """An answer's body as it arrives (chunked or sized, http.client decodes the framing); closing
    it before the end closes the connection, reading it to the end keeps the connection."""

    def __init__(
        self,
        transport: ThreadTransport,
        origin: _Origin,
        connection: http.client.HTTPConnection,
        response: http.client.HTTPResponse,
        request: httpx.Request,
    ) -> None:
        self._transport = transport
        self._origin = origin
        self._connection: http.client.HTTPConnection | None = connection
        self._response = response
        self._request = request
        self._complete = False

    def __iter__(self) -> Iterator[bytes]:
        response = self._response
        while True:
            try:
                chunk = response.read1(_READ_CHUNK)
            except BaseException as exc:
                self._abandon()
                raise _read_error(exc, self._request) from exc
            if not chunk:
                self._complete = True
                return
            yield chunk

    def close(self) -> None:
        connection, self._connection = self._connection, None
        if connection is None:
            return
        self._response.close()
        if self._complete and not self._response.will_close:
            self._transport._release(self._origin, connection)
        else:
            connection.close()

    def _abandon(self) -> None:
        connection, self._connection = self._connection, None
        self._response.close()
        if connection is not None:
            connection.close()
