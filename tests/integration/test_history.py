"""reach.history through the running fleet: an agent asks what it already did to order 123.

One fleet (router and one pool) against the counting system, Redis as the store. What a user sees:
the receipts of reach.history, the keys left in Redis, the CLI's output.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from click.testing import CliRunner

from producers.wire import Receipt
from tests.fleet import Fleet, agent
from tests.integration.counting_system import CountingSystem
from tests.waiting import wait_for
from workers.cli import main
from workers.state import keys

RUN = uuid.uuid4().hex[:6]
A, B = f"hist_a_{RUN}", f"hist_b_{RUN}"
CARD = "4111-1111-1111-1111"

CATALOG = """
connector:
  name: shop
  endpoint: {url}
  actions:
    - action: create_order
      path: POST /orders
      permission: write
      input:
        order_id: {{ type: string, required: true, entity: order }}
        customer: {{ type: integer, entity: customer }}
        title: {{ type: string, required: true }}
        card: {{ type: string, sensitive: true }}
        note: {{ type: string }}
        extra: {{ type: object }}
      output:
        item_id: {{ type: string }}
        title: {{ type: string }}
      history:
        retain: 90d
    - action: update_order
      path: POST /orders/update
      permission: write
      input:
        order_id: {{ type: string, required: true, entity: order }}
        title: {{ type: string, required: true }}
    - action: cancel_order
      path: POST /orders/cancel
      permission: write
      input:
        order_id: {{ type: string, required: true, entity: order }}
        title: {{ type: string, required: true }}
    - action: ping
      path: POST /ping
      input:
        order_id: {{ type: string, entity: order }}
        title: {{ type: string, required: true }}
      history:
        retain: 3s
    - action: untracked
      path: POST /untracked
      input:
        order_id: {{ type: string, entity: order }}
        title: {{ type: string, required: true }}
      history: off
    - action: many
      path: POST /many
      input:
{many}
        title: {{ type: string, required: true }}
---
agent_app:
  name: {a}
  connector_bindings:
    - connector: shop
      allowed_actions: ["*"]
---
agent_app:
  name: {b}
  connector_bindings:
    - connector: shop
      allowed_actions: ["*"]
"""
MANY = "\n".join(f"        f{i}: {{ type: string, entity: e{i} }}" for i in range(24))


def catalog_text(url: str, a_actions: str = '["*"]') -> str:
    text = CATALOG.format(url=url, a=A, b=B, many=MANY)
    return text.replace('allowed_actions: ["*"]', f"allowed_actions: {a_actions}", 1)


@pytest.fixture(scope="module")
def system() -> Iterator[CountingSystem]:
    downstream = CountingSystem().start()
    yield downstream
    downstream.stop()


@pytest.fixture(scope="module")
def fleet(system: CountingSystem) -> Iterator[Fleet]:
    with Fleet(catalog_text(system.url), ["shop"]) as running:
        yield running


@pytest.fixture(scope="module")
def client(fleet: Fleet) -> redis.Redis:
    return redis.Redis.from_url(fleet.redis_url)


def ok(receipt: Receipt) -> Receipt:
    assert receipt.success, receipt.error
    return receipt


def ask(agent_id: str, params: dict[str, Any], action: str = "reach.history") -> Receipt:
    with agent(agent_id) as c:
        return c.call(action, params, timeout=30)


def history_keys(client: redis.Redis, agent_id: str) -> list[bytes]:
    own = keys.history_prefixes(agent_id)
    return [k for k in client.scan_iter(match=keys.history_match(agent_id), count=1000) if k.decode().startswith(own)]


def cli(fleet: Fleet, *args: str) -> Any:
    env = {"REACH_REDIS_URL": fleet.redis_url, "REACH_BROKER_URL": fleet.broker_url, "REACH_CATALOG": str(fleet.dir)}
    return CliRunner().invoke(main, list(args), env=env)


@pytest.fixture(scope="module")
def orders(fleet: Fleet) -> list[str]:
    """Agent A creates, updates and cancels order 123 (and creates 999 for customer 7 too)."""
    with agent(A) as c:
        create = ok(
            c.call(
                "create_order",
                {"order_id": "123", "customer": 7, "title": "lamp", "card": CARD, "extra": {"a": 1}},
                timeout=30,
            )
        )
        ok(c.call("create_order", {"order_id": "999", "customer": 7, "title": "desk"}, timeout=30))
        update = ok(c.call("update_order", {"order_id": "123", "title": "lamp, blue"}, timeout=30))
        cancel = ok(c.call("cancel_order", {"order_id": "123", "title": "lamp"}, timeout=30))
    return [cancel.intent_id, update.intent_id, create.intent_id]


def test_order_123_comes_back_newest_first_with_declared_fields_only(orders: list[str], client: redis.Redis) -> None:
    answer = ok(ask(A, {"entity": "order", "id": "123"}))
    records = answer.data["records"]
    assert [r["intent_id"] for r in records] == orders
    assert [r["action"] for r in records] == ["cancel_order", "update_order", "create_order"]
    assert all(r["connector"] == "shop" and r["status"] == "succeeded" and r["code"] is None for r in records)
    create = records[2]
    assert create["params"] == {
        "order_id": "123",
        "customer": 7,
        "title": "lamp",
        "card": "[redacted]",
        "extra": {"a": 1},
    }
    assert create["data"] == {"item_id": create["data"]["item_id"], "title": "lamp"}  # not the system's "status"
    assert records[0]["data"] is None  # cancel_order declares no output
    assert answer.data["next_cursor"] is None
    # the card number is in no history key's value
    for key in history_keys(client, A):
        if client.type(key) == b"string":
            assert CARD.encode() not in client.get(key)


def test_the_tool_name_integer_ids_actions_and_pages_answer_too(orders: list[str]) -> None:
    by_customer = ok(ask(A, {"entity": "customer", "id": 7}, action="reach__history"))
    assert [r["params"]["order_id"] for r in by_customer.data["records"]] == ["999", "123"]
    first = ok(ask(A, {"action": "shop.create_order", "limit": 1}))
    assert len(first.data["records"]) == 1 and first.data["next_cursor"]
    second = ok(ask(A, {"action": "shop.create_order", "limit": 1, "cursor": first.data["next_cursor"]}))
    assert [r["params"]["order_id"] for r in first.data["records"] + second.data["records"]] == ["999", "123"]
    assert second.data["next_cursor"] is None
    since = ok(ask(A, {"entity": "order", "id": "123", "since": "2999-01-01T00:00:00Z"}))
    assert since.data["records"] == []


def test_another_agent_sees_nothing_of_it(orders: list[str]) -> None:
    assert ok(ask(B, {"entity": "order", "id": "123"})).data["records"] == []
    assert ok(ask(B, {"action": "shop.cancel_order"})).data["records"] == []


@pytest.mark.parametrize(
    "params, field",
    [
        ({"entity": "invoice", "id": "1"}, "entity"),
        ({"entity": "order", "id": "1", "limit": 51}, "limit"),
        ({"entity": "order", "id": "1", "cursor": "garbage"}, "cursor"),
        ({"entity": "order", "id": "1", "since": "yesterday"}, "since"),
        ({"entity": "order"}, "id"),
        ({"action": "shop.nothing"}, "action"),
        ({}, "entity"),
        ({"entity": "order", "id": "1", "status": "odd"}, "status"),
        ({"entity": "order", "id": "1", "mine": True}, "mine"),
    ],
)
def test_a_bad_question_is_validation_failed_naming_the_field(
    orders: list[str], params: dict[str, Any], field: str
) -> None:
    receipt = ask(A, params)
    assert receipt.error is not None and receipt.error.code == "VALIDATION_FAILED", receipt
    assert field in {d["field"] for d in receipt.error.details}


def test_history_off_keeps_nothing_and_a_short_retention_expires(fleet: Fleet, client: redis.Redis) -> None:
    with agent(A) as c:
        ok(c.call("untracked", {"order_id": "u-1", "title": "x"}, timeout=30))
        ping = ok(c.call("ping", {"order_id": "p-1", "title": "x"}, timeout=30))
    assert ok(ask(A, {"entity": "order", "id": "u-1"})).data["records"] == []
    assert [r["intent_id"] for r in ok(ask(A, {"entity": "order", "id": "p-1"})).data["records"]] == [ping.intent_id]
    record = keys.history_record(A, ping.intent_id)
    assert 0 < client.pttl(record) <= 3000
    for key in history_keys(client, A):  # every history key expires; no index outlives the longest retention
        assert 0 < client.pttl(key) <= 90 * 86400 * 1000
    wait_for(lambda: client.exists(record) == 0, 10, "the ping record did not expire")
    assert ok(ask(A, {"entity": "order", "id": "p-1"})).data["records"] == []


def test_hostile_values_stay_bounded(fleet: Fleet, client: redis.Redis) -> None:
    deep: dict[str, Any] = {"x": 1}
    for _ in range(25):
        deep = {"d": deep}
    with agent(A) as c:
        big = ok(
            c.call(
                "create_order",
                {"order_id": "h-" + "9" * 300, "title": "t", "note": "n" * 150_000, "extra": deep},
                timeout=30,
            )
        )
        many = ok(c.call("many", {**{f"f{i}": f"v{i}" for i in range(24)}, "title": "t"}, timeout=30))
    assert client.strlen(keys.history_record(A, big.intent_id)) <= 8192
    doc = json.loads(client.get(keys.history_record(A, big.intent_id)))
    assert "_reach_omitted" in doc["params"]
    assert doc["entities"] == []  # a 302-byte order id is not indexed
    many_doc = json.loads(client.get(keys.history_record(A, many.intent_id)))
    assert len(many_doc["entities"]) == 16
    entity_keys = [k for k in history_keys(client, A) if k.startswith(keys.HISTORY_ENTITY_PREFIX.encode())]
    assert not any(b":e16:" in k or b":e23:" in k for k in entity_keys)


def test_the_cli_shows_the_same_and_a_purge_leaves_no_key(fleet: Fleet, orders: list[str], client: redis.Redis) -> None:
    shown = cli(fleet, "history", "--agent", A, "--entity", "order:123", "--json")
    assert shown.exit_code == 0, shown.output
    assert [r["intent_id"] for r in json.loads(shown.stdout)["records"]] == orders
    table = cli(fleet, "history", "--agent", A, "--action", "shop.cancel_order")
    assert table.exit_code == 0 and orders[0] in table.stdout
    assert cli(fleet, "history", "--agent", A).exit_code == 2  # neither --entity nor --action

    purged = cli(fleet, "history", "purge", "--agent", A, "--entity", "order:123")
    assert purged.exit_code == 0, purged.output
    assert ok(ask(A, {"entity": "order", "id": "123"})).data["records"] == []
    assert [r["params"]["order_id"] for r in ok(ask(A, {"entity": "customer", "id": "7"})).data["records"]] == ["999"]
    assert not any(client.exists(keys.history_record(A, i)) for i in orders)
    nothing = cli(fleet, "history", "--agent", A, "--entity", "order:123")
    assert nothing.exit_code == 1 and "no records" in nothing.stdout

    assert cli(fleet, "history", "purge", "--agent", A).exit_code == 0
    assert history_keys(client, A) == []
    assert list(client.scan_iter(match=f"reach:history*{{{A}}}*", count=1000)) == []


def test_an_action_whose_binding_is_removed_shows_nothing(fleet: Fleet, system: CountingSystem) -> None:
    with agent(A) as c:
        ok(c.call("update_order", {"order_id": "777", "title": "x"}, timeout=30))
        ok(c.call("cancel_order", {"order_id": "777", "title": "x"}, timeout=30))
    assert len(ok(ask(A, {"entity": "order", "id": "777"})).data["records"]) == 2
    # A loses cancel_order: the router starts again with the new catalog
    (fleet.dir / "catalog.yaml").write_text(catalog_text(system.url, "[create_order, update_order]"))
    fleet.stop_process("router")
    fleet.start_process("router", ["router"])
    deadline = time.time() + 60
    while True:
        try:
            records = ask(A, {"entity": "order", "id": "777"}).data["records"]
            break
        except TimeoutError:
            assert time.time() < deadline, "the router did not come back"
    assert [r["action"] for r in records] == ["update_order"]
    refused = ask(A, {"action": "shop.cancel_order"})
    assert refused.error is not None and refused.error.code == "VALIDATION_FAILED"
