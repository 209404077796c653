"""A small fault-injecting TCP proxy for failure tests (stdlib, one thread per connection).

It listens on 127.0.0.1 (a free port) in front of one downstream and is switched at run time::

    proxy = FaultProxy(downstream_port).start()      # proxy.url -> put it in the catalog
    proxy.set("latency", 1.0)   # each request is held this long before it is forwarded
    proxy.set("reset_before")   # a request arrives -> RST (SO_LINGER 0); nothing is forwarded
    proxy.set("reset_after")    # forwarded; when the downstream answers -> RST, answer dropped
    proxy.set("blackhole")      # accepted, read and never answered (nor forwarded)
    proxy.set("refuse")         # not listening (open connections closed): connections are refused
    proxy.set("pass")           # heal
    proxy.hold(rb"regex")       # pass, but a connection whose data matches stalls there for good;
                                # proxy.held (an Event) is set when that happens
    proxy.reset_on(rb"regex")   # pass, but every chunk that matches gets an RST instead of being
                                # forwarded (until reset_on(None)); proxy.reset_matched counts them

The mode is read for every chunk, so pooled keep-alive connections change behaviour too.
``counts()`` gives (requests, forwarded, resets): client chunks that start an HTTP request (one
per attempt), those sent on to the downstream, and the RSTs sent.
"""

from __future__ import annotations

import re
import select
import socket
import struct
import threading
import time
from urllib.parse import urlsplit, urlunsplit

MODES = ("pass", "latency", "reset_before", "reset_after", "blackhole", "refuse")
_METHODS = (b"GET ", b"POST ", b"PUT ", b"PATCH ", b"DELETE ", b"HEAD ", b"OPTIONS ")


def _close(sock: socket.socket | None, rst: bool = False) -> None:
    """Close quietly; with ``rst``, SO_LINGER 0 makes the kernel send RST instead of FIN."""
    if sock is None:
        return
    try:
        if rst:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()
    except OSError:
        pass


def redis_proxy(redis_url: str) -> tuple[FaultProxy, str]:
    """A started proxy in front of the Redis at ``redis_url``, and the URL that reaches it through
    the proxy (same database)."""
    url = urlsplit(redis_url)
    proxy = FaultProxy(url.port or 6379, url.hostname or "127.0.0.1").start()
    return proxy, urlunsplit(url._replace(netloc=f"127.0.0.1:{proxy.port}"))


class FaultProxy:
    def __init__(self, upstream_port: int, upstream_host: str = "127.0.0.1") -> None:
        self.upstream = (upstream_host, upstream_port)
        self.mode, self.latency = "pass", 0.0
        self.requests = self.forwarded = self.resets = 0
        self.held = threading.Event()
        self._pattern: re.Pattern[bytes] | None = None
        self._reset_pattern: re.Pattern[bytes] | None = None
        self.reset_matched = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._listener: socket.socket | None = None
        self._clients: set[socket.socket] = set()
        self.port = 0
        self._listen()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FaultProxy:
        threading.Thread(target=self._accept_loop, daemon=True, name="faultproxy").start()
        return self

    def set(self, mode: str, latency: float = 0.0) -> None:
        """Switch behaviour; ``latency`` (seconds) applies to mode ``latency``."""
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; one of {MODES}")
        with self._lock:
            was, self.mode, self.latency = self.mode, mode, latency
            clients = list(self._clients)
        if mode == "refuse" and self._listener is not None:
            self._close_listener()
            for client in clients:  # pooled keep-alive connections would bypass the refusal
                try:
                    client.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        elif was == "refuse" and mode != "refuse":
            self._listen()

    def hold(self, pattern: bytes | None) -> None:
        """Stall (for good) the first connection that sends data matching ``pattern``; None stops."""
        self.held.clear()
        self._pattern = None if pattern is None else re.compile(pattern)

    def reset_on(self, pattern: bytes | None) -> None:
        """Reset (RST, nothing forwarded) every connection that sends data matching ``pattern``."""
        self._reset_pattern = None if pattern is None else re.compile(pattern)

    def counts(self) -> tuple[int, int, int]:
        with self._lock:
            return self.requests, self.forwarded, self.resets

    def stop(self) -> None:
        self._stop.set()
        self._close_listener()

    def _listen(self) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self.port))  # port 0 the first time, the same port after "refuse"
        sock.listen(128)
        sock.settimeout(0.1)
        self.port = sock.getsockname()[1]
        self._listener = sock

    def _close_listener(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            try:
                listener.shutdown(socket.SHUT_RDWR)  # stops listening now, even while accept() polls it
            except OSError:
                pass
            _close(listener)

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            listener = self._listener
            if listener is None:
                time.sleep(0.05)
                continue
            try:
                client, _ = listener.accept()
            except OSError:  # timeouts included
                continue
            client.settimeout(None)
            threading.Thread(target=self._serve, args=(client,), daemon=True, name="faultproxy-conn").start()

    def _serve(self, client: socket.socket) -> None:
        with self._lock:
            self._clients.add(client)
        upstream: socket.socket | None = None
        armed = held = False  # armed: reset_after forwarded a request; held: matched hold()
        try:
            while not self._stop.is_set():
                readable, _, _ = select.select([client] + ([upstream] if upstream else []), [], [], 0.1)
                with self._lock:
                    mode, latency = self.mode, self.latency
                if client in readable:
                    data = client.recv(65536)
                    if not data:
                        break
                    starts_request = data.startswith(_METHODS)
                    with self._lock:
                        self.requests += starts_request
                    pattern = self._pattern
                    if pattern is not None and not held and pattern.search(data):
                        held = True
                        self.held.set()
                    if mode == "blackhole" or held:
                        continue
                    reset_pattern = self._reset_pattern
                    if reset_pattern is not None and reset_pattern.search(data):
                        with self._lock:
                            self.resets += 1
                            self.reset_matched += 1
                        _close(client, rst=True)
                        return
                    if mode == "reset_before":
                        with self._lock:
                            self.resets += 1
                        _close(client, rst=True)
                        return
                    if mode == "latency" and latency and starts_request:
                        time.sleep(latency)
                    if upstream is None:
                        upstream = socket.create_connection(self.upstream, timeout=5)
                        upstream.settimeout(None)
                    upstream.sendall(data)
                    with self._lock:
                        self.forwarded += starts_request
                    armed = armed or mode == "reset_after"
                if upstream is not None and upstream in readable:
                    data = upstream.recv(65536)
                    if not data:
                        break
                    if armed:
                        with self._lock:
                            self.resets += 1
                        _close(client, rst=True)
                        return
                    if mode != "blackhole" and not held:
                        client.sendall(data)
        except OSError:
            pass
        finally:
            with self._lock:
                self._clients.discard(client)
            _close(client)
            _close(upstream)
