"""Where an ``oauth2_refresh_token`` connector's rotating tokens live: in Redis, shared by every
pool process of the connector (memory, in tools that run without Redis).

Redis: the one key of this package, ``reach:auth:{<connector>}`` (a hash: the connector's current
tokens) and its lock ``reach:auth:{<connector>}:lock``. Listed with every other key in
workers/state/keys.py, which this lower layer cannot import. Connector names have no ``:`` and no
braces; the braces are the Redis Cluster hash tag, which keeps the tokens, their lock and the
connector's other keys in one slot.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

from redis.exceptions import RedisError

from connectors.adapters.auth.errors import AUTH_TIMEOUT, CredentialsUnavailable

_PREFIX = "reach:"
AUTH_KEY_PREFIX = _PREFIX + "auth:"


def state_key(connector: str) -> str:
    """The Redis hash holding ``connector``'s rotating OAuth2 tokens (shared by its pool processes)."""
    return AUTH_KEY_PREFIX + "{" + connector + "}"


@dataclass(frozen=True)
class Tokens:
    access: str
    refresh: str
    expires_at: float  # epoch seconds

    def __repr__(self) -> str:
        return f"Tokens(<redacted>, expires_at={self.expires_at:.0f})"


class MemoryTokens:
    """Tokens of a single process (tools that run without Redis)."""

    def __init__(self) -> None:
        self._tokens: Tokens | None = None

    def load(self) -> Tokens | None:
        return self._tokens

    def exclusive(self) -> nullcontext[None]:
        return nullcontext()  # the auth's own thread lock is all there is

    def save(self, used: str, tokens: Tokens) -> None:
        self._tokens = tokens


# Store the new tokens unless another process stored tokens from a newer refresh token meanwhile
# (its lock expired under a slow token endpoint): the hash's refresh token must still be the one
# used, or belong to another first token (``seed``: the operator gave a new one).
_SAVE_IF_CURRENT = """
local current = redis.call('HGET', KEYS[1], 'refresh')
local seed = redis.call('HGET', KEYS[1], 'seed')
if current and current ~= ARGV[1] and seed == ARGV[5] then return 0 end
redis.call('HSET', KEYS[1], 'refresh', ARGV[2], 'access', ARGV[3], 'expires_at', ARGV[4], 'seed', ARGV[5])
return 1
"""


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class RedisTokens:
    """Tokens shared by every pool process of a connector: the newest refresh token is in Redis,
    and a Redis lock lets one process at a time spend it (the server accepts each one once)."""

    def __init__(self, client: Any, connector: str, first_refresh: str) -> None:
        self._redis = client
        self._key = state_key(connector)
        # which first token the stored chain grew from: a new one in the environment restarts it
        self._seed = hashlib.sha256(first_refresh.encode()).hexdigest()[:32]
        self._save = client.register_script(_SAVE_IF_CURRENT)

    def load(self) -> Tokens | None:
        try:
            stored = {_text(k): _text(v) for k, v in self._redis.hgetall(self._key).items()}
        except RedisError as exc:
            raise CredentialsUnavailable(f"the shared token store did not answer ({type(exc).__name__})") from exc
        if stored.get("seed") != self._seed or not stored.get("refresh"):
            return None
        try:
            return Tokens(stored.get("access", ""), stored["refresh"], float(stored.get("expires_at", 0)))
        except ValueError:
            return Tokens("", stored["refresh"], 0.0)

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        lock = self._redis.lock(self._key + ":lock", timeout=3 * AUTH_TIMEOUT, blocking_timeout=AUTH_TIMEOUT)
        try:
            acquired = lock.acquire()
        except RedisError as exc:
            raise CredentialsUnavailable(f"the shared token store did not answer ({type(exc).__name__})") from exc
        if not acquired:
            raise CredentialsUnavailable(f"another process's token refresh did not finish within {AUTH_TIMEOUT:g}s")
        try:
            yield
        finally:
            try:
                lock.release()
            except RedisError:  # expired meanwhile (LockNotOwnedError) or Redis gone: it lapses by itself
                pass

    def save(self, used: str, tokens: Tokens) -> None:
        try:
            self._save(
                keys=[self._key], args=[used, tokens.refresh, tokens.access, repr(tokens.expires_at), self._seed]
            )
        except RedisError as exc:
            raise CredentialsUnavailable(f"the shared token store did not answer ({type(exc).__name__})") from exc
