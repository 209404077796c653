"""What stands between a browser and a state change: the session's CSRF token, the Origin check,
the role, and the login rate limit.

The session is Starlette's signed cookie (HttpOnly, SameSite=Strict, Secure when configured); it
holds the login name, the login time and a random CSRF token, never the role (read from the users
file at each request). A state change must carry the token (form field ``csrf_token`` or header
``X-CSRF-Token``) and come from the console's own origin (``Origin``, else ``Referer``).
"""

from __future__ import annotations

import hmac
import secrets
import threading
import time
from collections import OrderedDict, deque
from urllib.parse import urlsplit

from starlette.requests import Request

CSRF_FIELD = "csrf_token"
CSRF_HEADER = "X-CSRF-Token"


def csrf_token(request: Request) -> str:
    """The session's CSRF token, made on first use (the login form has one too)."""
    token = request.session.get("csrf")
    if not isinstance(token, str):
        token = secrets.token_urlsafe(32)
        request.session["csrf"] = token
    return token


def csrf_ok(request: Request, sent: str | None) -> bool:
    """Whether ``sent`` is this session's token (constant-time)."""
    expected = request.session.get("csrf")
    if not isinstance(expected, str) or not sent:
        return False
    return hmac.compare_digest(sent.encode(), expected.encode())


def same_origin(request: Request, public_url: str | None) -> bool:
    """Whether a state change comes from the console's own pages.

    The browser's ``Origin`` (or, without it, ``Referer``) must be ``public_url``'s origin when one
    is configured (behind an Ingress), else the scheme and Host the request came to. A request
    carrying neither is refused: every browser sends ``Origin`` on a POST.
    """
    sent = request.headers.get("origin") or request.headers.get("referer")
    if not sent or sent == "null":
        return False
    parts = urlsplit(sent)
    got = (parts.scheme, parts.netloc.lower())
    if public_url:
        own = urlsplit(public_url)
        return got == (own.scheme, own.netloc.lower())
    return got == (request.url.scheme, (request.headers.get("host") or "").lower())


class LoginLimiter:
    """Failed logins counted per key (a user name, a client address) in a sliding window, in this
    process's memory; a key past ``limit`` failures is refused until the oldest leaves the window.

    Bounded: at most ``max_keys`` keys are tracked, the least recently failed dropped first.
    """

    def __init__(self, limit: int, window_seconds: float, max_keys: int = 10_000) -> None:
        self._limit = limit
        self._window = window_seconds
        self._max_keys = max_keys
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()
        self._lock = threading.Lock()

    def retry_after(self, *keys: str) -> float:
        """Seconds until any of ``keys`` may try again (0: now)."""
        now = time.monotonic()
        wait = 0.0
        with self._lock:
            for key in keys:
                times = self._failures.get(key)
                if times is None:
                    continue
                while times and now - times[0] >= self._window:
                    times.popleft()
                if len(times) >= self._limit:
                    wait = max(wait, self._window - (now - times[0]))
        return wait

    def failed(self, *keys: str) -> None:
        now = time.monotonic()
        with self._lock:
            for key in keys:
                times = self._failures.pop(key, None) or deque(maxlen=self._limit)
                times.append(now)
                self._failures[key] = times
            while len(self._failures) > self._max_keys:
                self._failures.popitem(last=False)

    def succeeded(self, key: str) -> None:
        with self._lock:
            self._failures.pop(key, None)
