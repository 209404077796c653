"""Rate limits in the real Redis: atomic, shared by every router replica."""

from __future__ import annotations

import threading
import uuid

import redis

from tests.fleet import REDIS_URL
from workers.state.ratelimit import RedisRateLimiter, parse_rate


def test_burst_of_twelve_against_five_per_minute_allows_exactly_five() -> None:
    limiter = RedisRateLimiter(redis.Redis.from_url(REDIS_URL))
    agent = f"rl_{uuid.uuid4().hex[:8]}"
    verdicts = [limiter.hit(agent, "tickets", parse_rate("5/min")) for _ in range(12)]
    assert [v.allowed for v in verdicts] == [True] * 5 + [False] * 7
    # the next slot opens one interval (12 s) after the burst
    assert all(0 < v.retry_after_ms <= 12_000 for v in verdicts[5:])


def test_replicas_share_one_limit_under_concurrency() -> None:
    agent = f"rl_{uuid.uuid4().hex[:8]}"
    # two "router replicas", each with its own connection, hammering from 8 threads each
    limiters = [RedisRateLimiter(redis.Redis.from_url(REDIS_URL)) for _ in range(2)]
    allowed: list[bool] = []
    lock = threading.Lock()

    def hammer(limiter: RedisRateLimiter) -> None:
        for _ in range(25):
            verdict = limiter.hit(agent, "tickets", parse_rate("10/min"))
            with lock:
                allowed.append(verdict.allowed)

    threads = [threading.Thread(target=hammer, args=(limiters[i % 2],)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(allowed) == 400 and sum(allowed) == 10


def test_limits_are_per_agent_and_connector() -> None:
    limiter = RedisRateLimiter(redis.Redis.from_url(REDIS_URL))
    a, b = f"rl_{uuid.uuid4().hex[:8]}", f"rl_{uuid.uuid4().hex[:8]}"
    rate = parse_rate("1/hour")
    assert limiter.hit(a, "x", rate).allowed and not limiter.hit(a, "x", rate).allowed
    assert limiter.hit(b, "x", rate).allowed and limiter.hit(a, "y", rate).allowed


def test_tokens_come_back_over_time() -> None:
    import time

    limiter = RedisRateLimiter(redis.Redis.from_url(REDIS_URL))
    agent = f"rl_{uuid.uuid4().hex[:8]}"
    rate = parse_rate("4/sec")  # one every 250 ms: slow enough that a loaded machine's pause is not a slot
    assert sum(limiter.hit(agent, "t", rate).allowed for _ in range(10)) == 4
    time.sleep(0.6)
    # 600 ms at one per 250 ms: two slots (three if the machine paused up to 150 ms more)
    assert sum(limiter.hit(agent, "t", rate).allowed for _ in range(10)) in (2, 3)
