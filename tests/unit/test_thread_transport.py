"""The HTTP adapter's transport (``connectors.adapters.transport``, on urllib3) against a real local server
whose connections a test can see and break: kept-alive connections are reused, dead ones never
are, and a request is never sent twice."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx
import pytest

from connectors.adapters.base import CallContext
from connectors.adapters.http import HttpAdapter
from connectors.adapters.transport import PooledTransport
from producers.wire import ErrorCode
from tests.unit.test_http_adapter import connector

OK_BODY = b'{"ok": true}'


@dataclass
class Server:
    """One thread per connection; reads a request (headers and a Content-Length body), then does
    what ``mode`` says: ``ok`` answers and keeps the connection, ``close_after`` answers (saying
    keep-alive) and closes it, ``close_header`` answers with ``Connection: close``, ``chunked``
    answers in chunks, ``drop`` closes without answering, ``big`` sends 1 MiB, ``raw`` sends
    ``raw`` as it is and then closes the connection."""

    mode: str = "ok"
    raw: bytes = b""
    port: int = 0
    connections: int = 0
    requests: list[bytes] = field(default_factory=list)
    closed: threading.Event = field(default_factory=threading.Event)
    _sock: socket.socket | None = None

    def start(self) -> None:
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(16)
        self.port = self._sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def stop(self) -> None:
        if self._sock is not None:
            self._sock.close()

    def _accept(self) -> None:
        assert self._sock is not None
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        buffer = b""
        with conn:
            while True:
                while b"\r\n\r\n" not in buffer:
                    try:
                        data = conn.recv(65536)
                    except OSError:  # the client reset it (it stopped reading an answer)
                        data = b""
                    if not data:
                        self.closed.set()
                        return
                    buffer += data
                head, _, buffer = buffer.partition(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                while len(buffer) < length:
                    buffer += conn.recv(65536)
                self.requests.append(head + b"\r\n\r\n" + buffer[:length])
                buffer = buffer[length:]
                if not self._answer(conn):
                    self.closed.set()
                    return

    def _answer(self, conn: socket.socket) -> bool:
        """False: the connection ends here."""
        json_head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
        if self.mode == "drop":
            return False
        if self.mode == "raw":
            conn.sendall(self.raw)
            return False
        if self.mode == "chunked":
            conn.sendall(json_head + b'Transfer-Encoding: chunked\r\n\r\n5\r\n{"ok"\r\n7\r\n: true}\r\n0\r\n\r\n')
            return True
        if self.mode == "big":
            body = b'"' + b"x" * (1 << 20) + b'"'
            try:
                conn.sendall(json_head + b"Content-Length: %d\r\n\r\n" % len(body) + body)
            except OSError:
                pass  # the client stopped reading
            return True
        keep = self.mode == "ok"  # decided before answering: the test may change the mode once answered
        extra = b"Connection: close\r\n" if self.mode == "close_header" else b""
        conn.sendall(json_head + extra + b"Content-Length: %d\r\n\r\n" % len(OK_BODY) + OK_BODY)
        return keep


@pytest.fixture
def server() -> Iterator[Server]:
    s = Server()
    s.start()
    yield s
    s.stop()


def _get(client: httpx.Client, server: Server, path: str = "/x") -> httpx.Response:
    return client.get(f"http://127.0.0.1:{server.port}{path}", timeout=5.0)


def test_calls_share_one_kept_alive_connection(server: Server) -> None:
    with httpx.Client(transport=PooledTransport()) as client:
        answers = [_get(client, server).json() for _ in range(5)]
    assert answers == [{"ok": True}] * 5
    assert server.connections == 1
    assert len(server.requests) == 5


def test_a_connection_the_system_closed_while_idle_is_not_reused(server: Server) -> None:
    server.mode = "close_after"  # answers as if keeping the connection, then closes it
    with httpx.Client(transport=PooledTransport()) as client:
        assert _get(client, server).json() == {"ok": True}
        assert server.closed.wait(5)
        time.sleep(0.05)  # the FIN reaches the client's socket
        assert _get(client, server).json() == {"ok": True}
    assert server.connections == 2
    assert len(server.requests) == 2  # each request went out once, on a live connection


def test_connection_close_is_honoured(server: Server) -> None:
    server.mode = "close_header"
    with httpx.Client(transport=PooledTransport()) as client:
        for _ in range(3):
            assert _get(client, server).json() == {"ok": True}
    assert server.connections == 3


def test_a_chunked_answer_is_read_whole_and_the_connection_kept(server: Server) -> None:
    server.mode = "chunked"
    with httpx.Client(transport=PooledTransport()) as client:
        assert _get(client, server).json() == {"ok": True}
        assert _get(client, server).json() == {"ok": True}
    assert server.connections == 1


def test_an_answer_not_read_to_its_end_closes_its_connection(server: Server) -> None:
    server.mode = "big"
    with httpx.Client(transport=PooledTransport()) as client:
        with client.stream("GET", f"http://127.0.0.1:{server.port}/big", timeout=5.0) as response:
            assert len(next(response.iter_raw())) > 0  # the first chunk only
        server.mode = "ok"
        assert _get(client, server).json() == {"ok": True}
    assert server.connections == 2  # the half-read connection was not handed to the next call


def test_a_refused_connection_is_a_connect_error() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again: nothing listens there
    with httpx.Client(transport=PooledTransport()) as client, pytest.raises(httpx.ConnectError):
        client.get(f"http://127.0.0.1:{port}/x")


def test_a_write_whose_connection_drops_unanswered_is_sent_once_and_unknown(server: Server) -> None:
    spec = connector(
        f"http://127.0.0.1:{server.port}",
        {"action": "create_ticket", "path": "POST /tickets", "permission": "write", "input": {"title": {}}},
    )
    adapter = HttpAdapter(spec)
    action = spec.actions[0]
    ctx = CallContext("intent-1")
    assert adapter.call(action, {"title": "first"}, ctx).ok  # a kept-alive connection now exists
    server.mode = "drop"  # the next request is read, then the connection closes without an answer
    outcome = adapter.call(action, {"title": "second"}, ctx)
    adapter.close()
    assert outcome.code == ErrorCode.OUTCOME_UNKNOWN
    assert len([r for r in server.requests if b"second" in r]) == 1  # never sent again


def _raw(server: Server, answer: bytes) -> httpx.Response:
    server.mode, server.raw = "raw", answer
    with httpx.Client(transport=PooledTransport()) as client:
        return _get(client, server)


def test_interim_answers_are_skipped_for_the_final_one(server: Server) -> None:
    answer = _raw(
        server,
        b"HTTP/1.1 102 Processing\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"
        b"HTTP/1.1 201 Created\r\nContent-Length: 7\r\n\r\ncreated",
    )
    assert (answer.status_code, answer.content) == (201, b"created")


@pytest.mark.parametrize(
    "answer",
    [
        pytest.param(b'HTTP/1.1 200 OK\r\nContent-Length: 40\r\n\r\n{"id": "12', id="cut-short"),
        pytest.param(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n-1\r\nx\r\n0\r\n\r\n", id="negative-chunk"),
        pytest.param(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0x2\r\nab\r\n0\r\n\r\n", id="prefixed-chunk"
        ),
        pytest.param(b"HTTP/1.1 200 OK\r\nContent-Length: 1_0\r\n\r\n0123456789", id="underscored-length"),
        pytest.param(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nabc", id="two-lengths"),
        pytest.param(b"HTTP/1.1 200 OK\r\nBad Line\r\nContent-Length: 2\r\n\r\nok", id="not-a-header"),
        pytest.param(b"HTTP/1.1 abc OK\r\n\r\n", id="bad-status"),
    ],
)
def test_a_malformed_answer_is_a_protocol_error(server: Server, answer: bytes) -> None:
    with pytest.raises(httpx.RemoteProtocolError):
        _raw(server, answer)


def test_a_204_claiming_a_chunked_body_has_none(server: Server) -> None:
    answer = _raw(server, b"HTTP/1.1 204 No Content\r\nTransfer-Encoding: chunked\r\n\r\n")
    assert (answer.status_code, answer.content) == (204, b"")


def test_folded_and_padded_header_values_come_out_as_h11_gives_them(server: Server) -> None:
    answer = _raw(server, b"HTTP/1.1 200 OK\r\nRetry-After: 5  \r\nX-Note: a\r\n b\r\nContent-Length: 0\r\n\r\n")
    assert (answer.headers["retry-after"], answer.headers["x-note"]) == ("5", "a b")


def test_an_answer_sent_before_the_whole_body_was_taken_is_read(server: Server) -> None:
    """A system may refuse a large body at once (413) and close: the answer, not a write error."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]

        def refuse() -> None:
            conn, _ = listener.accept()
            with conn:
                conn.recv(1024)
                conn.sendall(b"HTTP/1.1 413 Too Large\r\nConnection: close\r\nContent-Length: 8\r\n\r\ntoo big!")
                conn.shutdown(socket.SHUT_WR)
                time.sleep(0.5)  # unread bytes in the buffer: closing now resets the connection

        threading.Thread(target=refuse, daemon=True).start()
        with httpx.Client(transport=PooledTransport()) as client:
            answer = client.post(f"http://127.0.0.1:{port}/upload", content=b"x" * (8 << 20), timeout=5.0)
    assert (answer.status_code, answer.content) == (413, b"too big!")


@pytest.mark.parametrize("value", [b"abc\r\n X-Admin: 1", b"a\x00b", b" padded", b"tab\t"])
def test_a_header_value_h11_would_refuse_is_refused_unsent(server: Server, value: bytes) -> None:
    with httpx.Client(transport=PooledTransport()) as client:
        request = client.build_request("GET", f"http://127.0.0.1:{server.port}/x")
        request.headers["X-Token"] = "a"
        request.headers._list[-1] = (b"X-Token", b"x-token", value)  # as an auth flow could set it
        with pytest.raises(httpx.LocalProtocolError):
            client.send(request)
    assert server.requests == []


def test_an_idle_connection_past_its_expiry_is_not_reused(server: Server) -> None:
    with httpx.Client(transport=PooledTransport(keepalive_expiry=0.2)) as client:
        assert _get(client, server).json() == {"ok": True}
        time.sleep(0.3)
        assert _get(client, server).json() == {"ok": True}
    assert server.connections == 2


def test_a_connection_in_use_when_the_transport_closes_is_closed_after_it(server: Server) -> None:
    transport = PooledTransport()
    with httpx.Client(transport=transport) as client:
        with client.stream("GET", f"http://127.0.0.1:{server.port}/x", timeout=5.0) as response:
            transport.close()  # from another thread at shutdown, in the adapter
            assert response.read() == OK_BODY
        assert server.closed.wait(5)  # the connection ended with its call, not kept for another
