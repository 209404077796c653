"""The one way the fleet opens Redis, and reads its replies as text."""

from __future__ import annotations

import redis

from workers.settings import Settings


def connect_redis(settings: Settings) -> redis.Redis:
    """A client for ``REACH_REDIS_URL``: five-second timeouts, so a Redis that does not answer is
    an error the caller reports rather than a hang; idle connections are checked before reuse."""
    return redis.Redis.from_url(
        settings.redis_url, socket_timeout=5, socket_connect_timeout=5, health_check_interval=30
    )


def text(value: object) -> str:
    """A reply (bytes, str, number, or None for a missing field) as a string; None is ``""``."""
    if value is None:
        return ""
    return value.decode() if isinstance(value, bytes) else str(value)
