"""What stands between a browser and a state change: the session's CSRF token, the Origin check,
the role, and the login rate limit.

The session is Starlette's signed cookie (HttpOnly, SameSite=Strict, Secure when configured); it
holds the login name, the login time, a random session id and a random CSRF token, never the role
(read from the users file at each request); a logout is recorded in Redis under the session id
(``workers.console.views.Fleet.end_session``), so a copy of the cookie dies with it. A state change must carry the token (form field ``csrf_token`` or header
``X-CSRF-Token``) and come from the console's own origin (``Origin``, else ``Referer``).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from urllib.parse import urlsplit

import redis
from starlette.requests import Request

from workers.state import keys

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
    """Failed logins counted per key (a user name, a client address) over a sliding window, in Redis,
    so every console replica counts the same failures; a key past ``limit`` failures is refused until
    the oldest leaves the window.

    Keys are digests of what was typed (a name, an address), so a caller's text never becomes a
    Redis key; each holds at most ``limit`` timestamps and expires with its window.
    """

    def __init__(self, client: redis.Redis, limit: int, window_seconds: float) -> None:
        self._client = client
        self._limit = limit
        self._window_ms = max(1, int(window_seconds * 1000))

    @staticmethod
    def _key(key: str) -> str:
        return keys.console_login_failures(hashlib.sha256(key.encode()).hexdigest())

    def retry_after(self, *names: str) -> float:
        """Seconds until any of ``names`` may try again (0: now).

        Raises:
            redis.RedisError: Redis did not answer (the caller refuses the login).
        """
        now = int(time.time() * 1000)
        pipe = self._client.pipeline(transaction=False)
        for name in names:
            pipe.zremrangebyscore(self._key(name), 0, now - self._window_ms)
            pipe.zrange(self._key(name), 0, -1, withscores=True)
        wait_ms = 0
        for times in pipe.execute()[1::2]:
            if len(times) >= self._limit:
                oldest = int(times[-self._limit][1])  # the oldest of the newest ``limit`` failures
                wait_ms = max(wait_ms, oldest + self._window_ms - now)
        return wait_ms / 1000

    def failed(self, *names: str) -> None:
        now = int(time.time() * 1000)
        pipe = self._client.pipeline(transaction=False)
        for name in names:
            key = self._key(name)
            pipe.zadd(key, {secrets.token_hex(8): now})
            pipe.zremrangebyrank(key, 0, -(self._limit + 1))  # only the newest ``limit`` count
            pipe.pexpire(key, self._window_ms)
        pipe.execute()

    def succeeded(self, name: str) -> None:
        self._client.delete(self._key(name))
