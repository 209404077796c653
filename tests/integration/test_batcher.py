"""The Redis batcher against the real Redis: each caller gets its own results in order, one
caller's refused command fails only that caller, an unreachable Redis raises instead of hanging,
and the audit lines of every item are written."""

from __future__ import annotations

import threading
import uuid

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from tests.fleet import REDIS_URL
from workers.state.batcher import Batcher


def test_forty_threads_get_their_own_results_in_order() -> None:
    client = redis.Redis.from_url(REDIS_URL)
    batcher = Batcher(client, write_lines=lambda lines: None)
    prefix = f"test:batcher:{uuid.uuid4().hex[:8]}"
    wrong: list[str] = []

    def work(t: int) -> None:
        for i in range(25):
            key = f"{prefix}:{t}"
            results = batcher.call(lambda pipe: (pipe.incr(key), pipe.get(key), pipe.expire(key, 60)))
            if results[0] != i + 1 or int(results[1]) != i + 1:
                wrong.append(f"thread {t} call {i}: {results}")

    threads = [threading.Thread(target=work, args=(t,)) for t in range(40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    batcher.close()
    assert wrong == []


def test_a_refused_command_fails_only_its_caller() -> None:
    client = redis.Redis.from_url(REDIS_URL)
    batcher = Batcher(client, write_lines=lambda lines: None)
    key = f"test:batcher:{uuid.uuid4().hex[:8]}"
    client.set(key, "a string", ex=60)
    with pytest.raises(redis.ResponseError):
        batcher.call(lambda pipe: pipe.rpush(key, "x"))  # WRONGTYPE
    assert batcher.call(lambda pipe: pipe.get(key)) == [b"a string"]
    batcher.close()


def test_an_unreachable_redis_raises_for_the_caller() -> None:
    dead = redis.Redis(
        host="127.0.0.1", port=1, socket_connect_timeout=1, socket_timeout=1, retry=Retry(NoBackoff(), 0)
    )  # (redis-py's default retries take seconds)
    batcher = Batcher(dead, write_lines=lambda lines: None)
    with pytest.raises(redis.ConnectionError):
        batcher.call(lambda pipe: pipe.set("k", "v"))
    batcher.submit(lambda pipe: pipe.set("k", "v"))  # best effort: logged, never raised
    batcher.close()


def test_every_items_audit_lines_are_written_and_close_flushes_them() -> None:
    written: list[str] = []
    batcher = Batcher(redis.Redis.from_url(REDIS_URL), write_lines=written.extend)
    for i in range(100):
        batcher.submit(None, [f"line {i}"])
    batcher.lines(["last"])
    batcher.close()
    assert written == [f"line {i}" for i in range(100)] + ["last"]
