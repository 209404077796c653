"""The suite's own Redis database: it empties only a database that is empty or carries its
marker, never one that holds someone else's keys (a user running the suite beside real data)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

import pytest
import redis

from tests.fleet import REDIS_URL, TEST_DATABASES, TEST_MARKER, NoTestDatabase, claim_database

RUN = uuid.uuid4().hex[:8]
OTHER_RUN = f"elsewhere.example:{RUN}"  # another host's run: taken as alive, so its database is not ours


def url_of(database: int) -> str:
    return urlunsplit(urlsplit(REDIS_URL)._replace(path=f"/{database}"))


@pytest.fixture
def foreign_database() -> Iterator[tuple[int, redis.Redis]]:
    """A database (1..15) that was empty, now holding one key of a user's: removed afterwards."""
    for database in range(1, TEST_DATABASES + 1):
        client = redis.Redis.from_url(url_of(database))
        if client.dbsize() == 0 and client.set(f"user-data:{RUN}", "keep me", nx=True):
            try:
                yield database, client
            finally:
                client.delete(f"user-data:{RUN}")
                client.close()
            return
        client.close()
    pytest.fail("no empty Redis database 1..15 to put a user's key in")


def test_a_database_with_keys_the_suite_did_not_write_is_passed_over_not_emptied(
    foreign_database: tuple[int, redis.Redis],
) -> None:
    database, client = foreign_database
    taken = claim_database(url_of, database - 1, me=OTHER_RUN)  # the user's database is the first tried
    try:
        assert taken != database
        assert client.get(f"user-data:{RUN}") == b"keep me"
        assert redis.Redis.from_url(url_of(taken)).get(TEST_MARKER) == OTHER_RUN.encode()
    finally:
        redis.Redis.from_url(url_of(taken)).delete(TEST_MARKER)  # ours only: nothing else is there


def test_no_database_to_take_fails_with_a_clear_message(foreign_database: tuple[int, redis.Redis]) -> None:
    database, client = foreign_database
    with pytest.raises(NoTestDatabase, match="holds keys the suite did not write"):
        claim_database(lambda _: url_of(database), 0, me=OTHER_RUN)  # every try lands on the user's
    assert client.get(f"user-data:{RUN}") == b"keep me"
