"""The HTTP adapter's transport against httpx's own (httpcore and h11), answer for answer: a raw
socket server on 127.0.0.1 sends the same crafted bytes to each, and each must come out the same
way — the same status, body and headers, or the same httpx exception class.

Where the two differ on purpose, the case says so in ``INTENDED`` with the reason; every other
case must match. A new malformed answer someone finds goes in ``CORPUS``.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from connectors.adapters.transport import PooledTransport

# a script: what the server sends after reading a request's head, as (bytes, then sleep seconds);
# then it closes the connection (after ``hold`` seconds)
Step = tuple[bytes, float]

OK = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"


@dataclass(frozen=True)
class Case:
    steps: tuple[Step, ...]
    hold: float = 0.0
    read_timeout: float = 2.0


def once(answer: bytes, hold: float = 0.0) -> Case:
    return Case(((answer, 0.0),), hold=hold)


CORPUS: dict[str, Case] = {
    # well-formed, as a baseline
    "plain": once(OK + b"Content-Length: 2\r\n\r\nok"),
    "chunked": once(OK + b"Transfer-Encoding: chunked\r\n\r\n2\r\nok\r\n3;ext=1\r\n!!!\r\n0\r\n\r\n"),
    "chunked-with-trailers": once(OK + b"Transfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\nX-T: 1\r\n\r\n"),
    "http-1.0-read-to-close": once(b"HTTP/1.0 200 OK\r\n\r\nall of it"),
    "no-reason-phrase": once(b"HTTP/1.1 200\r\nContent-Length: 2\r\n\r\nok"),
    "status-999": once(b"HTTP/1.1 999 Odd\r\nContent-Length: 0\r\n\r\n"),
    "bare-lf-line-ends": once(b"HTTP/1.1 200 OK\nContent-Length: 2\n\nok"),
    "obs-text-in-value": once(OK + b"X-Name: caf\xe9\r\nContent-Length: 0\r\n\r\n"),
    "same-length-twice": once(OK + b"Content-Length: 2\r\nContent-Length: 2\r\n\r\nok"),
    "extra-bytes-after-body": once(OK + b"Content-Length: 2\r\n\r\nokEXTRA"),
    "padded-and-folded-values": once(OK + b"Retry-After:  5 \r\nX-Note: a\r\n  b\r\nContent-Length: 0\r\n\r\n"),
    # status lines
    "status-not-a-number": once(b"HTTP/1.1 abc OK\r\n\r\n"),
    "status-two-digits": once(b"HTTP/1.1 20 OK\r\nContent-Length: 0\r\n\r\n"),
    "status-four-digits": once(b"HTTP/1.1 2000 OK\r\nContent-Length: 0\r\n\r\n"),
    "garbage-status-line": once(b"garbage\r\n\r\n"),
    "unknown-version": once(b"HTTP/2.0 200 OK\r\nContent-Length: 0\r\n\r\n"),
    "blank-line-before-status": once(b"\r\nHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"),
    "nul-in-reason": once(b"HTTP/1.1 200 O\x00K\r\nContent-Length: 0\r\n\r\n"),
    # header blocks
    "line-without-colon": once(OK + b"Bad Line\r\nContent-Length: 2\r\n\r\nok"),
    "space-before-colon": once(OK + b"Content-Length : 2\r\n\r\nok"),
    "space-in-name": once(OK + b"X Y: 1\r\nContent-Length: 0\r\n\r\n"),
    "nul-in-value": once(OK + b"X-Evil: a\x00b\r\nContent-Length: 0\r\n\r\n"),
    "folding-first-line": once(OK + b" X-Folded: 1\r\nContent-Length: 0\r\n\r\n"),
    "huge-header-line": once(OK + b"X-Big: " + b"a" * 70_000 + b"\r\nContent-Length: 0\r\n\r\n"),
    "over-100-headers": once(OK + b"".join(b"X-H%d: v\r\n" % i for i in range(120)) + b"Content-Length: 0\r\n\r\n"),
    "head-over-100-kib": once(OK + b"".join(b"X-H%d: %s\r\n" % (i, b"v" * 2000) for i in range(60)) + b"\r\n"),
    "control-in-value": once(OK + b"X-Evil: a\x01b\r\nContent-Length: 0\r\n\r\n"),
    "del-in-value": once(OK + b"X-Evil: a\x7fb\r\nContent-Length: 0\r\n\r\n"),
    "tab-in-value": once(OK + b"X-Tab: a\tb\r\nContent-Length: 0\r\n\r\n"),
    "head-never-ends": once(OK + b"X-A: 1\r\n", hold=0.1),
    # framing
    "two-different-lengths": once(OK + b"Content-Length: 2\r\nContent-Length: 3\r\n\r\nabc"),
    "length-list": once(OK + b"Content-Length: 2, 3\r\n\r\nabc"),
    "negative-length": once(OK + b"Content-Length: -1\r\n\r\nok"),
    "plus-sign-length": once(OK + b"Content-Length: +2\r\n\r\nok"),
    "underscored-length": once(OK + b"Content-Length: 1_0\r\n\r\n0123456789"),
    "cut-short-body": once(OK + b"Content-Length: 40\r\n\r\n" + b'{"id": "12'),
    "chunked-and-length": once(OK + b"Transfer-Encoding: chunked\r\nContent-Length: 100\r\n\r\n2\r\nok\r\n0\r\n\r\n"),
    "gzip-then-chunked-coding": once(OK + b"Transfer-Encoding: gzip, chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n"),
    "unknown-transfer-coding": once(OK + b"Transfer-Encoding: foo\r\n\r\nok"),
    "negative-chunk": once(OK + b"Transfer-Encoding: chunked\r\n\r\n-1\r\nx\r\n0\r\n\r\n"),
    "prefixed-chunk": once(OK + b"Transfer-Encoding: chunked\r\n\r\n0x2\r\nab\r\n0\r\n\r\n"),
    "underscored-chunk": once(OK + b"Transfer-Encoding: chunked\r\n\r\n1_0\r\n0123456789abcdef\r\n0\r\n\r\n"),
    "not-hex-chunk": once(OK + b"Transfer-Encoding: chunked\r\n\r\nzz\r\nab\r\n0\r\n\r\n"),
    "huge-chunk-size": once(OK + b"Transfer-Encoding: chunked\r\n\r\n" + b"f" * 17 + b"\r\nab\r\n0\r\n\r\n"),
    "chunk-longer-than-said": once(OK + b"Transfer-Encoding: chunked\r\n\r\n2\r\nokay\r\n0\r\n\r\n"),
    "cut-short-chunked": once(OK + b"Transfer-Encoding: chunked\r\n\r\n10\r\nshort"),
    "no-last-chunk": once(OK + b"Transfer-Encoding: chunked\r\n\r\n2\r\nok\r\n"),
    "too-many-trailers": once(
        OK + b"Transfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n" + b"X-T: 1\r\n" * 150 + b"\r\n"
    ),
    # answers without a body
    "204-with-length": once(b"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\nhello"),
    "204-claiming-chunks": once(b"HTTP/1.1 204 No Content\r\nTransfer-Encoding: chunked\r\n\r\n"),
    "304-with-length": once(b"HTTP/1.1 304 Not Modified\r\nContent-Length: 5\r\n\r\n"),
    # interim answers
    "interim-answers": once(
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 102 Processing\r\n\r\n"
        b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok"
    ),
    "1xx-storm": once(b"HTTP/1.1 102 Processing\r\n\r\n" * 2000 + b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"),
    "1xx-then-close": once(b"HTTP/1.1 103 Early Hints\r\n\r\n"),
    # connections that end or stall
    "close-unanswered": once(b""),
    "close-mid-status-line": once(b"HTTP/1.1 20"),
    "close-mid-headers": once(OK + b"Content-Len"),
    "silent-then-timeout": Case(((b"", 1.5),), read_timeout=0.3),
    "stall-after-head": Case(((OK + b"Content-Length: 10\r\n\r\nabc", 1.5),), read_timeout=0.3),
    "slowloris-within-limits": Case(tuple((bytes([c]), 0.02) for c in OK + b"Content-Length: 2\r\n\r\nok")),
}

# where our transport differs from httpx's on purpose, and why
INTENDED: dict[str, str] = {
    "over-100-headers": "http.client refuses an answer with more than 100 header lines; h11 only bounds their bytes",
    "huge-header-line": "http.client refuses a header line over 64 KiB; h11 only bounds the whole head (100 KiB)",
    "head-over-100-kib": "ours bounds every head at 100 KiB; h11 refuses one still incomplete past 100 KiB, so a"
    " longer head that arrives in one read passes there",
    "unknown-version": "http.client refuses a status line that is not HTTP/1.x; h11 takes any HTTP/d.d",
}


class ScriptServer:
    """Accepts connections on 127.0.0.1; on each, reads a request's head and plays ``case``."""

    def __init__(self, case: Case) -> None:
        self.case = case
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(8)
        self.port = self._sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._play, args=(conn,), daemon=True).start()

    def _play(self, conn: socket.socket) -> None:
        with conn:
            try:
                head = b""
                while b"\r\n\r\n" not in head:
                    data = conn.recv(65536)
                    if not data:
                        return
                    head += data
                for data, pause in self.case.steps:
                    if data:
                        conn.sendall(data)
                    if pause:
                        time.sleep(pause)
                if self.case.hold:
                    time.sleep(self.case.hold)
            except OSError:
                return  # the client gave up (a timeout, a refused answer)

    def close(self) -> None:
        self._sock.close()


def outcome(transport: httpx.BaseTransport, port: int, read_timeout: float) -> tuple[object, ...]:
    """What a caller sees: the answer's status, body and headers, or the httpx exception's class."""
    timeout = httpx.Timeout(5.0, read=read_timeout)
    with httpx.Client(transport=transport, timeout=timeout, trust_env=False) as client:
        try:
            response = client.get(f"http://127.0.0.1:{port}/x")
        except httpx.HTTPError as exc:
            return ("error", type(exc).__name__)
    return ("answer", response.status_code, response.content, sorted(response.headers.multi_items()))


@pytest.fixture(params=sorted(CORPUS), ids=sorted(CORPUS))
def case_name(request: pytest.FixtureRequest) -> Iterator[str]:
    yield request.param


def test_an_answer_comes_out_as_httpx_own_transport_gives_it(case_name: str) -> None:
    case = CORPUS[case_name]
    server = ScriptServer(case)
    try:
        theirs = outcome(httpx.HTTPTransport(), server.port, case.read_timeout)
        ours = outcome(PooledTransport(), server.port, case.read_timeout)
    finally:
        server.close()
    if case_name in INTENDED:
        assert ours != theirs, f"{case_name} now matches httpx: drop it from INTENDED"
    else:
        assert ours == theirs


def test_the_request_target_reaches_the_system_as_the_catalog_built_it() -> None:
    """urllib3 on its own upper-cases percent-escapes ("%2f" -> "%2F"); a system that tells them
    apart (a signed URL, an opaque id) must get the bytes httpx built, as httpx's own transport sends."""
    targets: list[bytes] = []
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(4)
    port = sock.getsockname()[1]

    def serve() -> None:
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            with conn:
                head = b""
                while b"\r\n\r\n" not in head:
                    head += conn.recv(65536)
                targets.append(head.split(b"\r\n", 1)[0])
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")

    threading.Thread(target=serve, daemon=True).start()
    raw = b"/files/a%2fb/%e2%82%ac~x%7e/..%2f?q=%e2%82%ac&r=~%2F"
    try:
        for transport in (PooledTransport(), httpx.HTTPTransport()):
            request = httpx.Request("GET", httpx.URL(f"http://127.0.0.1:{port}").copy_with(raw_path=raw))
            transport.handle_request(request).read()
            transport.close()
    finally:
        sock.close()
    assert targets == [b"GET " + raw + b" HTTP/1.1"] * 2
