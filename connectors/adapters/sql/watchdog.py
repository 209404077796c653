"""The watchdog of a SQL call: ends a call the server's own timeout did not end."""

from __future__ import annotations

import os
import socket
import threading


class Watchdog:
    """Ends a call the server's statement_timeout did not end (a hung server or proxy): after
    ``seconds`` it shuts the connection's socket down, so the blocked read returns an error. The
    socket is shut, never closed: the driver still owns the descriptor."""

    def __init__(self, fd: int, seconds: float) -> None:
        self._fd = fd
        self._lock = threading.Lock()
        self._done = False
        self.fired = False
        self._timer = threading.Timer(max(0.0, seconds), self._fire)
        self._timer.daemon = True
        self._timer.start()

    def _fire(self) -> None:
        with self._lock:
            if self._done:
                return
            self.fired = True
            try:
                with socket.socket(fileno=os.dup(self._fd)) as sock:
                    sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def stop(self) -> None:
        with self._lock:
            self._done = True
        self._timer.cancel()
