"""The history stores behind one interface, each against the real thing: Redis (the fleet's) and
PostgreSQL (started from the Debian binaries by the test). The same tests run on both; what only
Redis has (its caps, expiries and keys) is tested on Redis alone."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from connectors import history
from connectors.spec import ActionSpec, FieldSpec
from tests.fleet import REDIS_URL
from tests.integration.postgres import serve
from workers.state import keys
from workers.state.history import HistoryError, HistoryStore, Query, RedisHistory
from workers.state.history_pg import TABLE, PostgresHistory, month_bounds

DAY = 86400
CREATE = ActionSpec(
    action="create_order",
    input={
        "order_id": FieldSpec(type="string", entity="order"),
        "customer": FieldSpec(type="integer", entity="customer"),
        "card": FieldSpec(type="string", sensitive=True),
    },
    output={"order_id": FieldSpec(type="string", entity="order")},
)
UPDATE = ActionSpec(action="update_order", input={"order_id": FieldSpec(entity="order"), "note": FieldSpec()})
CANCEL = ActionSpec(action="cancel_order", input={"order_id": FieldSpec(entity="order")})


def everything(connector: str, action: str) -> bool:
    return True


def rec(
    agent: str, action: ActionSpec, params: dict[str, Any], at_ms: int, *, status: str = "succeeded", **extra: Any
) -> history.Record:
    return history.record(
        agent=agent,
        intent_id=extra.pop("intent_id", f"i-{uuid.uuid4().hex[:10]}"),
        connector="shop",
        action=action,
        status=status,
        code=None if status == "succeeded" else "CONFLICT",
        at="2026-01-01T00:00:00.000Z",
        at_ms=at_ms,
        trace_id="t-1",
        params=params,
        data=extra.pop("data", None),
        retain_seconds=extra.pop("retain", 30 * DAY),
        version=history.action_version(action),
    )


@pytest.fixture(scope="module")
def postgres() -> Iterator[PostgresHistory]:
    for server in serve(database="history"):
        store = PostgresHistory(server.url().replace("postgresql+psycopg://", "postgresql://"))
        store.migrate(90 * DAY)
        yield store
        store.close()


@pytest.fixture(scope="module")
def client() -> redis.Redis:
    return redis.Redis.from_url(REDIS_URL)


@pytest.fixture(params=["redis", "postgres"])
def store(request: pytest.FixtureRequest, client: redis.Redis) -> HistoryStore:
    if request.param == "redis":
        return RedisHistory(client, 90 * DAY)
    return request.getfixturevalue("postgres")  # type: ignore[no-any-return]


@pytest.fixture
def agent() -> str:
    return f"hist_{uuid.uuid4().hex[:10]}"


def now_ms() -> int:
    import time

    return int(time.time() * 1000)


def test_an_orders_create_update_cancel_come_back_newest_first(store: HistoryStore, agent: str) -> None:
    t = now_ms()
    store.write(
        [
            rec(agent, CREATE, {"order_id": "123", "customer": 7, "card": "4111"}, t - 3000, data={"order_id": "123"}),
            rec(agent, UPDATE, {"order_id": "123", "note": "gift"}, t - 2000),
            rec(agent, CREATE, {"order_id": "999", "customer": 7, "card": "4111"}, t - 1500),
            rec(agent, CANCEL, {"order_id": "123"}, t - 1000, status="failed"),
        ]
    )
    page = store.query(agent, Query(entity=("order", "123")), everything)
    assert [r["action"] for r in page.records] == ["cancel_order", "update_order", "create_order"]
    assert page.records[2]["params"] == {"order_id": "123", "customer": 7, "card": "[redacted]"}
    assert page.records[2]["data"] == {"order_id": "123"}
    assert page.records[0]["status"] == "failed" and page.records[0]["code"] == "CONFLICT"
    assert page.next_cursor is None
    by_customer = store.query(agent, Query(entity=("customer", "7")), everything)
    assert [r["params"]["order_id"] for r in by_customer.records] == ["999", "123"]
    by_action = store.query(agent, Query(action=("shop", "create_order")), everything)
    assert len(by_action.records) == 2


def test_another_agent_sees_nothing(store: HistoryStore, agent: str) -> None:
    store.write([rec(agent, CANCEL, {"order_id": "123"}, now_ms())])
    other = agent + "_b"
    assert store.query(other, Query(entity=("order", "123")), everything).records == []
    assert store.query(other, Query(action=("shop", "cancel_order")), everything).records == []


def test_records_of_actions_no_longer_visible_are_left_out(store: HistoryStore, agent: str) -> None:
    t = now_ms()
    store.write([rec(agent, CREATE, {"order_id": "5"}, t - 10), rec(agent, CANCEL, {"order_id": "5"}, t)])
    page = store.query(agent, Query(entity=("order", "5")), lambda c, a: a != "cancel_order")
    assert [r["action"] for r in page.records] == ["create_order"]


def test_pages_follow_the_cursor_without_gaps_or_repeats_even_within_one_ms(store: HistoryStore, agent: str) -> None:
    t = now_ms()
    # two records in the same ms: the cursor must still tell them apart
    times = [t - 6, t - 5, t - 4, t - 4, t - 3, t - 2, t - 1]
    store.write([rec(agent, UPDATE, {"order_id": "7", "note": str(i)}, at) for i, at in enumerate(times)])
    seen: list[str] = []
    cursor = None
    for _ in range(5):
        page = store.query(agent, Query(entity=("order", "7"), limit=3, cursor=cursor), everything)
        seen += [r["params"]["note"] for r in page.records]
        cursor = page.next_cursor
        if cursor is None:
            break
    assert sorted(seen) == [str(i) for i in range(7)] and len(seen) == 7
    assert seen[0] == "6" and set(seen[-2:]) == {"1", "0"}


def test_since_and_status_narrow_the_answer(store: HistoryStore, agent: str) -> None:
    t = now_ms()
    store.write(
        [
            rec(agent, UPDATE, {"order_id": "8"}, t - 60_000),
            rec(agent, UPDATE, {"order_id": "8"}, t - 1000, status="failed"),
            rec(agent, UPDATE, {"order_id": "8"}, t - 500),
        ]
    )
    recent = store.query(agent, Query(entity=("order", "8"), since_ms=t - 2000), everything)
    assert len(recent.records) == 2
    failed = store.query(agent, Query(entity=("order", "8"), status="failed"), everything)
    assert [r["status"] for r in failed.records] == ["failed"]


def test_a_cursor_that_is_not_ours_is_refused(store: HistoryStore, agent: str) -> None:
    with pytest.raises(HistoryError):
        store.query(agent, Query(entity=("order", "1"), cursor="not a cursor"), everything)


def test_a_purge_of_one_entity_leaves_the_others(store: HistoryStore, agent: str) -> None:
    t = now_ms()
    store.write(
        [
            rec(agent, CREATE, {"order_id": "123", "customer": 1}, t - 2),
            rec(agent, CREATE, {"order_id": "456", "customer": 2}, t - 1),
        ]
    )
    assert store.purge(agent, ("order", "123")) > 0
    assert store.query(agent, Query(entity=("order", "123")), everything).records == []
    assert store.query(agent, Query(entity=("customer", "1")), everything).records == []  # the record itself is gone
    assert [
        r["params"]["order_id"] for r in store.query(agent, Query(action=("shop", "create_order")), everything).records
    ] == ["456"]
    assert len(store.query(agent, Query(entity=("order", "456")), everything).records) == 1


def test_a_purge_of_an_agent_leaves_nothing_of_it(
    store: HistoryStore, agent: str, client: redis.Redis, request: pytest.FixtureRequest
) -> None:
    other = agent + "_keep"
    t = now_ms()
    store.write([rec(agent, CREATE, {"order_id": str(i), "customer": i}, t - i) for i in range(20)])
    store.write([rec(other, CREATE, {"order_id": "1"}, t)])
    assert store.purge(agent) > 0
    assert store.query(agent, Query(action=("shop", "create_order")), everything).records == []
    assert len(store.query(other, Query(entity=("order", "1")), everything).records) == 1
    if isinstance(store, RedisHistory):
        assert list(client.scan_iter(match=f"*{{{agent}}}*", count=1000)) == []
        assert list(client.scan_iter(match=f"*{{{other}}}*", count=1000)) != []
    else:
        assert isinstance(store, PostgresHistory)
        left = store._run(
            lambda cur: cur.execute(f"SELECT count(*) FROM {TABLE} WHERE agent = %s", (agent,)).fetchone()
        )
        assert left == (0,)


def test_a_purge_of_one_agent_never_reaches_an_intent_id_naming_another(client: redis.Redis, agent: str) -> None:
    store = RedisHistory(client, 90 * DAY)
    victim = agent + "_v"
    # an intent id that holds the victim's tag: the purge pattern's * runs across it
    store.write([rec(agent, CREATE, {"order_id": "1"}, now_ms(), intent_id=f"x:{{{victim}}}:y")])
    store.write([rec(victim, CREATE, {"order_id": "1"}, now_ms())])
    store.purge(victim)
    assert client.exists(keys.history_record(agent, f"x:{{{victim}}}:y")) == 1


# -- Redis alone: caps, expiry, bounds -------------------------------------------------------


def test_an_index_keeps_the_newest_1000_and_every_key_expires(client: redis.Redis, agent: str) -> None:
    store = RedisHistory(client, 30 * DAY)
    t = now_ms()
    records = [rec(agent, UPDATE, {"order_id": "42", "note": str(i)}, t - 2000 + i) for i in range(1100)]
    store.write(records)
    index = keys.history_entity(agent, "order", history.value_digest("42"))
    assert client.zcard(index) == history.INDEX_CAP
    assert client.zcard(keys.history_action(agent, "shop", "update_order")) == history.INDEX_CAP
    newest = store.query(agent, Query(entity=("order", "42"), limit=1), everything).records
    assert newest[0]["params"]["note"] == "1099"
    for key in client.scan_iter(match=f"*{{{agent}}}*", count=2000):
        assert client.pttl(key) > 0, key
    assert 0 < client.pttl(keys.history_record(agent, records[-1].intent_id)) <= 30 * DAY * 1000


def test_an_index_drops_members_older_than_the_retention(client: redis.Redis, agent: str) -> None:
    store = RedisHistory(client, 60)  # a minute
    t = now_ms()
    store.write([rec(agent, UPDATE, {"order_id": "1"}, t - 120_000, retain=60)])
    store.write([rec(agent, UPDATE, {"order_id": "1"}, t, retain=60)])
    assert client.zcard(keys.history_entity(agent, "order", history.value_digest("1"))) == 1


def test_hostile_values_stay_bounded(client: redis.Redis, agent: str) -> None:
    store = RedisHistory(client, 30 * DAY)
    many = ActionSpec(action="many", input={f"f{i}": FieldSpec(entity=f"e{i}") for i in range(40)})
    deep: dict[str, Any] = {}
    for _ in range(30):
        deep = {"d": deep}
    params: dict[str, Any] = {f"f{i}": f"v{i}" for i in range(40)}
    params["f0"] = "x" * 5000  # too long to index
    blob = ActionSpec(action="blob", input={"order_id": FieldSpec(entity="order"), "body": FieldSpec(type="object")})
    store.write(
        [
            rec(agent, many, params, now_ms()),
            rec(agent, blob, {"order_id": "1", "body": {"deep": deep, "pad": "p" * 200_000}}, now_ms()),
        ]
    )
    found = list(client.scan_iter(match=f"*{{{agent}}}*", count=1000))
    entity_keys = [k for k in found if k.startswith(keys.HISTORY_ENTITY_PREFIX.encode())]
    assert len(entity_keys) == history.MAX_ENTITIES + 1  # 16 of the first, order 1 of the second
    for key in found:
        if client.type(key) == b"string":
            assert client.strlen(key) <= history.MAX_RECORD_BYTES
        assert len(key) < 200


def test_postgres_keeps_months_as_partitions_and_drops_the_old(postgres: PostgresHistory) -> None:
    t = now_ms()
    old = t - 400 * DAY * 1000
    postgres.write([rec("hist_old", UPDATE, {"order_id": "1"}, old)])
    name = month_bounds(old)[0]

    def partitions() -> set[str]:
        rows = postgres._run(
            lambda cur: cur.execute(
                "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
                "JOIN pg_class p ON p.oid = i.inhparent WHERE p.relname = %s",
                (TABLE,),
            ).fetchall()
        )
        return {r[0] for r in rows}

    assert name in partitions()
    done = postgres.migrate(90 * DAY)
    assert f"dropped {name}" in done and name not in partitions()
    assert month_bounds(t)[0] in partitions()


def test_a_filter_that_skips_many_reads_a_bounded_page_and_says_where_to_go_on(store: HistoryStore, agent: str) -> None:
    t = now_ms()
    store.write([rec(agent, UPDATE, {"order_id": "9"}, t - 10_000, status="failed")])
    store.write([rec(agent, UPDATE, {"order_id": "9"}, t - 5000 + i) for i in range(history.READ_BUDGET + 50)])
    pages, found = 0, []
    cursor = None
    while True:
        page = store.query(agent, Query(entity=("order", "9"), status="failed", cursor=cursor), everything)
        pages += 1
        found += page.records
        cursor = page.next_cursor
        if cursor is None:
            break
        assert pages < 5
    assert [r["status"] for r in found] == ["failed"]
    if isinstance(store, RedisHistory):
        assert pages == 2  # the first answer read its budget and found nothing, and said where to go on


def test_reach_history_migrate_and_show_against_postgres(postgres: PostgresHistory, tmp_path: Any) -> None:
    from click.testing import CliRunner

    from workers.cli import main

    (tmp_path / "shop.yaml").write_text(
        """
connector:
  name: shop
  endpoint: http://127.0.0.1:9
  actions:
    - action: cancel_order
      path: POST /cancel
      input:
        order_id: { type: string, entity: order }
      history: { retain: 400d }
---
agent_app:
  name: pg_clerk
  connector_bindings:
    - connector: shop
      allowed_actions: ["*"]
"""
    )
    env = {"REACH_HISTORY_URL": postgres.url, "REACH_CATALOG": str(tmp_path), "REACH_REDIS_URL": REDIS_URL}
    migrated = CliRunner().invoke(main, ["history", "migrate"], env=env)
    assert migrated.exit_code == 0, migrated.output
    assert "partition reach_history_y" in migrated.stdout
    postgres.write([rec("pg_clerk", CANCEL, {"order_id": "123"}, now_ms(), intent_id="pg-1")])
    shown = CliRunner().invoke(main, ["history", "--agent", "pg_clerk", "--entity", "order:123", "--json"], env=env)
    assert shown.exit_code == 0, shown.output
    assert [r["intent_id"] for r in json.loads(shown.stdout)["records"]] == ["pg-1"]
    purged = CliRunner().invoke(main, ["history", "purge", "--agent", "pg_clerk"], env=env)
    assert purged.exit_code == 0 and "2 key(s) or row(s)" in purged.stdout  # its action's row and its order's
    unset = CliRunner().invoke(main, ["history", "migrate"], env={**env, "REACH_HISTORY_URL": ""})
    assert unset.exit_code == 2
