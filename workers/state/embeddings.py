"""The shared cache of action-text embeddings (``connectors.routing.VectorCache``) in Redis.

One string per (model, text digest), written by whichever router embedded the text first and
read by every router that starts later: a restart with a warm cache embeds nothing, and a catalog
change embeds only the texts that changed. Only catalog texts are kept, never an agent's request,
so nothing an agent sends can fill it. Entries live ``ttl`` seconds after their last read (a
router refreshes the ones it uses when it starts), so texts no catalog uses any more go away.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

import redis

from workers.state import keys

log = logging.getLogger("reach.routing")

BATCH = 1000  # keys per round trip
DEFAULT_TTL_SECONDS = 30 * 24 * 3600


class RedisVectorCache:
    """Embeddings by cache key; a Redis error is a cache miss (the router embeds instead), never a failure."""

    def __init__(self, client: redis.Redis, ttl_seconds: int = DEFAULT_TTL_SECONDS) -> None:
        self._client = client
        self._ttl = ttl_seconds

    def get_many(self, cache_keys: Sequence[str]) -> list[bytes | None]:
        found: list[bytes | None] = []
        try:
            for start in range(0, len(cache_keys), BATCH):
                pipe = self._client.pipeline(transaction=False)
                for key in cache_keys[start : start + BATCH]:
                    pipe.getex(keys.embedding(key), ex=self._ttl)  # read and keep alive in one command
                found.extend(pipe.execute())
        except redis.RedisError as exc:
            log.warning("embedding cache unavailable (%s); embedding %d text(s) here", exc, len(cache_keys))
            return found + [None] * (len(cache_keys) - len(found))
        return found

    def put_many(self, items: Mapping[str, bytes]) -> None:
        try:
            pipe = self._client.pipeline(transaction=False)
            for key, value in items.items():
                pipe.set(keys.embedding(key), value, ex=self._ttl)
            pipe.execute()
        except redis.RedisError as exc:
            log.warning("could not keep %d embedding(s) in the cache: %s", len(items), exc)
