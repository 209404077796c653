"""The console's failed-login limiter in a real Redis: every replica counts the same failures, keys are
digests of what was typed, and what it keeps is bounded and expires with its window."""

from __future__ import annotations

import time
import uuid

import redis

from tests.fleet import REDIS_URL
from workers.console.security import LoginLimiter
from workers.state import keys


def client() -> redis.Redis:
    return redis.Redis.from_url(REDIS_URL)


def name() -> str:
    return f"user:{uuid.uuid4().hex[:10]}"


def test_failures_past_the_limit_are_refused_until_the_oldest_leaves_the_window() -> None:
    limiter, who, bystander = LoginLimiter(client(), 3, 1.0), name(), name()
    for _ in range(2):
        limiter.failed(who)
    assert limiter.retry_after(who) == 0
    limiter.failed(who)
    wait = limiter.retry_after(who)
    assert 0 < wait <= 1.0
    assert limiter.retry_after(bystander) == 0 and 0 < limiter.retry_after(bystander, who) <= wait
    time.sleep(wait + 0.05)
    assert limiter.retry_after(who) == 0


def test_two_replicas_count_the_same_failures() -> None:
    first, second, who = LoginLimiter(client(), 4, 60.0), LoginLimiter(client(), 4, 60.0), name()
    first.failed(who)
    second.failed(who)
    first.failed(who)
    assert second.retry_after(who) == 0
    second.failed(who)  # the fourth, on either replica
    assert 59 < first.retry_after(who) <= 60 and 59 < second.retry_after(who) <= 60


def test_a_successful_login_clears_its_names_failures() -> None:
    limiter, who = LoginLimiter(client(), 2, 60.0), name()
    limiter.failed(who)
    limiter.failed(who)
    assert limiter.retry_after(who) > 0
    limiter.succeeded(who)
    assert limiter.retry_after(who) == 0


def test_what_was_typed_never_becomes_a_key_and_each_key_stays_small_and_expires() -> None:
    hostile = "user:" + "{a}:*\n" * 500 + uuid.uuid4().hex
    limiter = LoginLimiter(client(), 5, 30.0)
    for _ in range(50):
        limiter.failed(hostile)
    found = list(client().scan_iter(match=keys.console_login_failures("*"), count=10_000))
    assert found and all(len(k) == len(keys.console_login_failures("0" * 64)) for k in found)
    assert not any(b"{a}" in k for k in found)
    mine = [k for k in found if client().zcard(k) == 5]
    assert mine and all(0 < client().pttl(k) <= 30_000 for k in mine)
    assert 29 < limiter.retry_after(hostile) <= 30
