"""Which history store a fleet uses (REACH_HISTORY_URL), apart from both stores so neither imports the other."""

from __future__ import annotations

import redis

from workers.state.history import HistoryStore, RedisHistory


def open_store(client: redis.Redis, url: str | None, index_retention_seconds: int) -> HistoryStore:
    """The fleet's history store: PostgreSQL when REACH_HISTORY_URL names one, else Redis."""
    if url:
        from workers.state.history_pg import PostgresHistory  # only a fleet that uses it loads the driver

        return PostgresHistory(url)
    return RedisHistory(client, index_retention_seconds)
