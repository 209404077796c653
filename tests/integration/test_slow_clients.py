"""Every HTTP server of the fleet against slow and half-open clients, as processes of their own:
``reach mcp --http`` (and its /metrics and probes port), ``reach console``, and the probes of
``reach beat`` (served by the runner as the router's and the pools' are).

A stranger without a token opens sockets from one address (127.0.0.2) and sends half a request
header, or a header a byte at a time, or half a body; meanwhile a caller from another address
(127.0.0.1) must be served, and every slow socket must be closed once its deadline passes
(REACH_HTTP_HEADER_TIMEOUT=2, REACH_HTTP_BODY_TIMEOUT=3 here; the connection limits are the defaults).
"""

from __future__ import annotations

import importlib.metadata
import json
import secrets
import select
import socket
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.fleet import Fleet, free_port
from tests.waiting import wait_for
from workers.console.users import hash_password
from workers.mcp.tokens import digest

HEADER_TIMEOUT, BODY_TIMEOUT = 2.0, 3.0
STRANGER = "127.0.0.2"  # all of 127.0.0.0/8 is this machine: a second client address
AGENT = "slow_desk"
TOKEN = secrets.token_urlsafe(24)
BEAT_PER_CLIENT = 4
HALF_HEADER = b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "
CATALOG = f"""
connector:
  name: slow_notes
  endpoint: http://127.0.0.1:9
  actions:
    - action: get_note
      description: Read a note
      path: GET /notes/{{nid}}
      input:
        nid: {{ type: string, required: true }}
      permission: read
---
agent_app:
  name: {AGENT}
  connector_bindings:
    - connector: slow_notes
      allowed_actions: [get_note]
"""


@dataclass
class Servers:
    fleet: Fleet
    mcp_port: int
    probes_port: int
    console_port: int
    beat_port: int


@pytest.fixture(scope="module")
def servers() -> Iterator[Servers]:
    """The facade and the console; neither needs the router to answer what is asked of them here."""
    fleet = Fleet(CATALOG, [], env={"REACH_HTTP_HEADER_TIMEOUT": "2", "REACH_HTTP_BODY_TIMEOUT": "3"})
    private = Path(tempfile.mkdtemp(prefix="reach-test-slow-"))
    (private / "tokens.yaml").write_text(f"{AGENT}: {digest(TOKEN)}\n")
    (private / "users.yaml").write_text(f"olga: {{password_hash: '{hash_password('pw')}', role: operator}}\n")
    mcp_port, console_port = free_port(), free_port()
    try:
        fleet.start_process(
            "mcp",
            ["mcp", "--http", "--port", str(mcp_port)],
            {
                "REACH_MCP_TOKENS_FILE": str(private / "tokens.yaml"),
                "REACH_MCP_URL": f"http://127.0.0.1:{mcp_port}/mcp",
            },
        )
        fleet.start_process(
            "console", ["console", "--port", str(console_port)], {"REACH_CONSOLE_USERS": str(private / "users.yaml")}
        )
        # below the probes' own cap of 8, so the test can tell the variable from the cap
        fleet.start_process("beat", ["beat"], {"REACH_HTTP_MAX_CONNECTIONS_PER_CLIENT": str(BEAT_PER_CLIENT)})
        running = Servers(fleet, mcp_port, fleet.metrics_port("mcp"), console_port, fleet.metrics_port("beat"))
        wait_for(
            lambda: status(f"http://127.0.0.1:{mcp_port}/mcp", post=True) == 401, 60, "reach mcp --http did not start"
        )
        wait_for(lambda: status(f"http://127.0.0.1:{console_port}/healthz") == 200, 60, "reach console did not start")
        wait_for(lambda: status(f"http://127.0.0.1:{running.probes_port}/healthz") == 200, 30, "no probes")
        wait_for(lambda: status(f"http://127.0.0.1:{running.beat_port}/healthz") == 200, 60, "no probes of reach beat")
        yield running
    finally:
        fleet.stop()


def status(url: str, post: bool = False) -> int:
    try:
        return (httpx.post(url, json={}, timeout=3) if post else httpx.get(url, timeout=3)).status_code
    except httpx.TransportError:
        return 0


def mcp_request(port: int, method: str, params: dict[str, object]) -> httpx.Response:
    """One JSON-RPC request with the agent's valid bearer token, from 127.0.0.1."""
    return httpx.post(
        f"http://127.0.0.1:{port}/mcp",
        json={"jsonrpc": "2.0", "id": 1, "method": method, "params": params},
        headers={"Authorization": f"Bearer {TOKEN}", "Accept": "application/json, text/event-stream"},
        timeout=10,
    )


def open_slow(port: int, count: int, first_bytes: bytes = HALF_HEADER) -> list[socket.socket]:
    """``count`` connections from the stranger's address, each sending ``first_bytes`` and no more."""
    opened = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(STRANGER, 0))
        try:
            sock.sendall(first_bytes)
        except OSError:  # already closed by the server: it still counts as one of ours
            pass
        sock.setblocking(False)
        opened.append(sock)
    return opened


def closed(sock: socket.socket, got: dict[socket.socket, bytes]) -> bool:
    """Whether the server has closed ``sock`` (what it sent before is kept in ``got``)."""
    while True:
        try:
            data = sock.recv(4096)
        except BlockingIOError:
            return False
        except OSError:  # reset
            return True
        if not data:
            return True
        got[sock] = got.get(sock, b"") + data


def still_open(socks: list[socket.socket], got: dict[socket.socket, bytes]) -> list[socket.socket]:
    return [s for s in socks if not closed(s, got)]


def close_all(socks: list[socket.socket]) -> None:
    for sock in socks:
        sock.close()


def closed_count(port: int, server: str, reason: str) -> float:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    prefix = f'reach_http_connections_closed_total{{reason="{reason}",server="{server}"}} '
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefix))


def test_half_headers_from_one_address_do_not_shut_the_mcp_facade_and_are_closed_after_the_header_timeout(
    servers: Servers,
) -> None:
    before = closed_count(servers.probes_port, "mcp", "header_timeout")
    started = time.monotonic()  # each deadline runs from its connection
    slow = open_slow(servers.mcp_port, 1030)  # more than the facade's 1,024 connections
    got: dict[socket.socket, bytes] = {}
    try:
        answer = mcp_request(servers.mcp_port, "tools/list", {})
        assert answer.status_code == 200, answer.text[:300]
        assert [t["name"] for t in answer.json()["result"]["tools"]] == ["slow_notes__get_note"]
        held = still_open(slow, got)
        assert 0 < len(held) <= 64, f"{len(held)} of the stranger's connections are held (at most 64 per address)"
        wait_for(lambda: not still_open(held, got), HEADER_TIMEOUT + 3, "half headers were not cut off")
        assert time.monotonic() - started >= HEADER_TIMEOUT - 0.5
        assert all(got.get(s, b"").startswith(b"HTTP/1.1 408 ") for s in held), {got.get(s, b"")[:40] for s in held}
    finally:
        close_all(slow)
    assert closed_count(servers.probes_port, "mcp", "header_timeout") >= before + len(held)
    assert closed_count(servers.probes_port, "mcp", "per_client_limit") >= 1030 - 64


def test_a_header_sent_a_byte_at_a_time_is_cut_off_at_its_deadline_not_per_byte(servers: Servers) -> None:
    for port in (servers.mcp_port, servers.console_port, servers.probes_port):
        sock = socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(STRANGER, 0))
        started, got = time.monotonic(), b""
        try:
            for byte in b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: " + b"a" * 200:
                if time.monotonic() - started > HEADER_TIMEOUT + 4:
                    break
                sock.sendall(bytes([byte]))
                if select.select([sock], [], [], 0.25)[0]:
                    got = sock.recv(4096)
                    break
        except OSError:  # closed while we were still writing
            pass
        finally:
            sock.close()
        lasted = time.monotonic() - started
        assert HEADER_TIMEOUT - 0.5 <= lasted <= HEADER_TIMEOUT + 2, f"port {port}: cut off after {lasted:.1f} s"
        assert not got or got.startswith(b"HTTP/1.1 408 "), got[:60]


def test_a_body_that_stops_coming_is_cut_off_after_the_body_timeout(servers: Servers) -> None:
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}).encode()
    head = (
        f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{servers.mcp_port}\r\nAuthorization: Bearer {TOKEN}\r\n"
        f"Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n"
        f"Content-Length: {len(body) + 500}\r\n\r\n"
    ).encode()
    (sock,) = open_slow(servers.mcp_port, 1, head + body)  # 500 bytes short
    started, got = time.monotonic(), {}
    try:
        wait_for(lambda: closed(sock, got), BODY_TIMEOUT + 3, "a body that stopped coming was not cut off")
        assert time.monotonic() - started >= BODY_TIMEOUT - 0.5
        assert mcp_request(servers.mcp_port, "tools/list", {}).status_code == 200  # the facade goes on
    finally:
        sock.close()


def test_half_open_clients_do_not_hold_the_console_or_the_probes(servers: Servers) -> None:
    for port, health, count, per_client in (
        (servers.console_port, "/healthz", 100, 64),
        (servers.probes_port, "/healthz", 20, 8),
    ):
        started = time.monotonic()  # each deadline runs from its connection
        slow = open_slow(port, count, b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        got: dict[socket.socket, bytes] = {}
        try:
            assert httpx.get(f"http://127.0.0.1:{port}{health}", timeout=5).status_code == 200
            held = still_open(slow, got)
            assert 0 < len(held) <= per_client, f"port {port}: {len(held)} held from one address"
            wait_for(lambda: not still_open(held, got), HEADER_TIMEOUT + 3, f"port {port}: half headers stay")
            assert time.monotonic() - started >= HEADER_TIMEOUT - 0.5
        finally:
            close_all(slow)


def test_the_probes_of_a_runner_process_keep_the_http_settings_against_half_requests(servers: Servers) -> None:
    """``reach beat``'s /metrics and probes (started by the runner, as the router's and the pools'
    are) take REACH_HTTP_HEADER_TIMEOUT and REACH_HTTP_MAX_CONNECTIONS_PER_CLIENT, not the defaults:
    30 half requests from one address hold at most 4 connections for at most 2 s, and /healthz and
    /metrics answer meanwhile."""
    port = servers.beat_port
    before = closed_count(port, "probes", "header_timeout")
    refused_before = closed_count(port, "probes", "per_client_limit")
    started = time.monotonic()
    slow = open_slow(port, 30, b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
    got: dict[socket.socket, bytes] = {}
    try:
        assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code == 200
        held = still_open(slow, got)
        assert 0 < len(held) <= BEAT_PER_CLIENT, f"{len(held)} held from one address (at most {BEAT_PER_CLIENT})"
        wait_for(
            lambda: len(still_open(held, got)) < len(held), HEADER_TIMEOUT + 3, "none cut off at the header timeout"
        )
        lasted = time.monotonic() - started
        assert HEADER_TIMEOUT - 0.5 <= lasted <= HEADER_TIMEOUT + 3, f"the first cut off after {lasted:.1f} s"
        # on a loaded machine one of them may have waited in the listen backlog and been accepted only
        # when a place came free: it gets its own header timeout from then (still far below the default 10 s)
        wait_for(
            lambda: not still_open(held, got), 3 * HEADER_TIMEOUT + 3, "half requests stay past the header timeout"
        )
        assert all(got.get(s, b"")[:13] in (b"", b"HTTP/1.1 408 ") for s in held), {got.get(s, b"")[:40] for s in held}
    finally:
        close_all(slow)
    timed_out = closed_count(port, "probes", "header_timeout") - before
    refused = closed_count(port, "probes", "per_client_limit") - refused_before
    assert timed_out >= len(held)
    # every half request was closed unserved; on a loaded machine the server accepts some only after the
    # held ones timed out, so they are timed out rather than refused (the per-client setting is checked
    # above: never more than 4 held at once)
    assert timed_out + refused >= 30 and refused >= 1, (timed_out, refused)


def test_the_mcp_server_reports_the_package_version(servers: Servers) -> None:
    answer = mcp_request(
        servers.mcp_port,
        "initialize",
        {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
    )
    assert answer.status_code == 200, answer.text[:300]
    info = answer.json()["result"]["serverInfo"]
    assert info["name"] == "agent-reach" and info["version"] == importlib.metadata.version("agent-reach")
