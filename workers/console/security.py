"""What stands between a browser and a state change: the session's CSRF token, the Origin check,
the role, the login rate limit and the end of sessions.

The session is Starlette's signed cookie (HttpOnly, SameSite=Strict, Secure when configured); it
holds the login name, the login time, a random session id, a fingerprint of the user's credential
and a random CSRF token, never the role (read from the users file at each request). When a session
ends (logout, password change, removal, "log out everywhere") is :class:`Sessions`' business, kept
in Redis so that every replica agrees and a copy of the cookie dies with it. A state change must
carry the token (form field ``csrf_token`` or header ``X-CSRF-Token``) and come from the console's
own origin (``Origin``, else ``Referer``).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass
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


# KEYS: the attempt sets of a login's names; ARGV: now (ms), window (ms), limit, this attempt's member.
# Either every name has room and the attempt is counted in each, or nothing changes and the answer
# is how long until the fullest has room: judged and counted in one step, so concurrent logins
# (on any replica) cannot all pass a check made before any of them is counted.
_RESERVE = """
local now, window, limit = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local wait = 0
for i = 1, #KEYS do
  redis.call('ZREMRANGEBYSCORE', KEYS[i], 0, now - window)
  if redis.call('ZCARD', KEYS[i]) >= limit then
    local oldest = redis.call('ZRANGE', KEYS[i], -limit, -limit, 'WITHSCORES')
    wait = math.max(wait, tonumber(oldest[2]) + window - now)
  end
end
if wait > 0 then
  return wait
end
for i = 1, #KEYS do
  redis.call('ZADD', KEYS[i], now, ARGV[4])
  redis.call('PEXPIRE', KEYS[i], window)
end
return 0
"""


# KEYS: a user's "sessions ended before" time; ARGV: the new time, seconds to keep it. Only ever later.
_END_ALL = """
local current = redis.call('GET', KEYS[1])
if not current or tonumber(current) < tonumber(ARGV[1]) then
  redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
end
return 0
"""


@dataclass(frozen=True)
class Attempt:
    """A login attempt as the limiter answered it: counted (``retry_after`` 0) or refused."""

    names: tuple[str, ...]
    member: str
    retry_after: float  # seconds until one of the names may try again; 0: this attempt may go on


class LoginLimiter:
    """Login attempts counted per key (a user name, a client address) over a sliding window, in Redis,
    so every console replica counts the same ones; a key with ``limit`` attempts in the window is
    refused until the oldest leaves it.

    An attempt is counted *before* its password is checked (:meth:`reserve`) and given back only
    when it succeeds, so no number of concurrent logins checks more than ``limit`` passwords.
    Keys are digests of what was typed (a name, an address), so a caller's text never becomes a
    Redis key; each holds at most ``limit`` timestamps and expires with its window.
    """

    def __init__(self, client: redis.Redis, limit: int, window_seconds: float) -> None:
        self._client = client
        self._limit = limit
        self._window_ms = max(1, int(window_seconds * 1000))
        self._reserve = client.register_script(_RESERVE)

    @staticmethod
    def _key(key: str) -> str:
        return keys.console_login_failures(hashlib.sha256(key.encode()).hexdigest())

    def reserve(self, *names: str) -> Attempt:
        """Count an attempt for every one of ``names``, or none if any is at its limit.

        Raises:
            redis.RedisError: Redis did not answer (the caller refuses the login).
        """
        member = secrets.token_hex(8)
        now = int(time.time() * 1000)
        wait_ms = self._reserve(keys=[self._key(n) for n in names], args=[now, self._window_ms, self._limit, member])
        return Attempt(names, member, int(wait_ms) / 1000)

    def retry_after(self, *names: str) -> float:
        """Seconds until any of ``names`` may try again (0: now), counting nothing.

        Raises:
            redis.RedisError: Redis did not answer.
        """
        now = int(time.time() * 1000)
        pipe = self._client.pipeline(transaction=False)
        for name in names:
            pipe.zremrangebyscore(self._key(name), 0, now - self._window_ms)
            pipe.zrange(self._key(name), 0, -1, withscores=True)
        wait_ms = 0
        for times in pipe.execute()[1::2]:
            if len(times) >= self._limit:
                oldest = int(times[-self._limit][1])  # the oldest of the newest ``limit`` attempts
                wait_ms = max(wait_ms, oldest + self._window_ms - now)
        return wait_ms / 1000

    def failed(self, *names: str) -> None:
        """Count a failed attempt that was not reserved."""
        now = int(time.time() * 1000)
        pipe = self._client.pipeline(transaction=False)
        for name in names:
            key = self._key(name)
            pipe.zadd(key, {secrets.token_hex(8): now})
            pipe.zremrangebyrank(key, 0, -(self._limit + 1))  # only the newest ``limit`` count
            pipe.pexpire(key, self._window_ms)
        pipe.execute()

    def succeeded(self, name: str, attempt: Attempt | None = None) -> None:
        """A login of ``name`` succeeded: its name's attempts are forgotten, and the attempt's own
        count under its other names (the address) given back."""
        pipe = self._client.pipeline(transaction=False)
        pipe.delete(self._key(name))
        for other in attempt.names if attempt is not None else ():
            pipe.zrem(self._key(other), attempt.member)  # type: ignore[union-attr]
        pipe.execute()


class Sessions:
    """Whether a console session still stands, judged on every request from what every replica sees.

    A session (the signed cookie) records its user, when it began, a random id and a fingerprint
    of the user's credential (an HMAC of the password hash under the session key). It is over when:

    - it was logged out (its id, in Redis until it would have expired anyway);
    - the user's password hash in the users file is no longer the one it began with (a changed
      password, or a user removed and added again with a new hash) — no Redis needed for that;
    - it began before the user's sessions were ended in Redis: "log out everywhere", or a console
      replica saw the user gone from the users file (the file's time of change counts, so every
      replica that sees the same change writes the same time).
    """

    def __init__(self, client: redis.Redis, key: str) -> None:
        self._client = client
        self._key = key.encode()
        self._end_all = client.register_script(_END_ALL)

    def fingerprint(self, user_name: str, password_hash: str) -> str:
        return hmac.new(self._key, f"{user_name}\0{password_hash}".encode(), hashlib.sha256).hexdigest()[:32]

    @staticmethod
    def _user_key(name: str) -> str:
        return keys.console_user(hashlib.sha256(name.encode()).hexdigest())

    def stands(self, session_id: str, user_name: str, began: float) -> bool:
        """Not logged out and not begun before the user's sessions were ended.

        Raises:
            redis.RedisError: Redis did not answer (the caller refuses the session).
        """
        pipe = self._client.pipeline(transaction=False)
        pipe.exists(keys.console_session_ended(session_id))
        pipe.get(self._user_key(user_name))
        ended, ended_before = pipe.execute()
        return not ended and (ended_before is None or began > float(ended_before))

    def end(self, session_id: str, seconds_left: float) -> None:
        """End one session on every replica."""
        self._client.set(keys.console_session_ended(session_id), b"1", ex=max(1, int(seconds_left) + 1))

    def end_all(self, user_name: str, at: float, keep_seconds: int) -> None:
        """End every session of ``user_name`` that began before ``at`` (kept as long as a session
        lasts; never moved back, so an older change seen late cannot revive a session).

        Raises:
            redis.RedisError: Redis did not answer.
        """
        self._end_all(keys=[self._user_key(user_name)], args=[repr(at), keep_seconds])
