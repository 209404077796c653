"""How often the router has been handed one message again, shared by every router through Redis.

A message that stops its router before a decision (the process dies, or loses the broker while
deciding) comes back with the ``redelivered`` flag, to whichever router the broker picks. Counting
those returns in Redis, by sender and a digest of the message, lets any router see that the
message has had its chances and answer it instead of deciding it again (``REACH_MAX_DELIVERIES``);
the router's in-process ``RetryCounts`` only sees the requeues it made itself. First deliveries
cost nothing here: only redelivered messages are counted.
"""

from __future__ import annotations

import hashlib

import redis

from producers.wire import AGENT_ID_PATTERN
from workers.state import keys

COUNT_TTL_SECONDS = 3600  # a message redelivered after an hour starts its count again


def message_digest(body: bytes, message_id: str | None, user_id: str | None) -> str:
    """What identifies one message across its deliveries: its bytes and the properties it came with."""
    h = hashlib.blake2b(digest_size=16)
    for part in (body, (message_id or "").encode("utf-8", "replace"), (user_id or "").encode("utf-8", "replace")):
        h.update(len(part).to_bytes(8, "big"))
        h.update(part)
    return h.hexdigest()


class Redeliveries:
    """Counts the redeliveries of one message to any router."""

    def __init__(self, client: redis.Redis, ttl_seconds: int = COUNT_TTL_SECONDS) -> None:
        self._redis = client
        self._ttl = ttl_seconds

    def count(self, body: bytes, message_id: str | None, user_id: str | None) -> int:
        """Deliveries of this message so far, this one included (so at least 2: it was redelivered).

        ``user_id`` is the broker-checked AMQP user_id: the count is filed under that sender, so no
        agent can spend another's count; a message without one files under no agent.
        """
        sender = user_id if user_id and AGENT_ID_PATTERN.match(user_id) else None
        key = keys.router_deliveries(sender, message_digest(body, message_id, user_id))
        pipe = self._redis.pipeline(transaction=False)
        pipe.incr(key)
        pipe.expire(key, self._ttl)
        returned, _ = pipe.execute()
        return int(returned) + 1
