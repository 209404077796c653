"""A value the adapter or its client library refuses before sending is the agent's input, not the
system's health, on every adapter (issue 30): the receipt is VALIDATION_FAILED at once (rejected,
not retryable, one attempt), nothing reaches the system, the connector's breaker stays closed
(each connector opens at its second counted failure), and another agent is still served. Beside
test_unsendable_values.py (PostgreSQL's NUL), through one real fleet:

- MariaDB (PyMySQL): a character the connection's charset lacks (``?charset=latin1`` and ``✓``);
  PyMySQL encodes the statement before writing a byte. A NUL is no such value: PyMySQL escapes
  it and MariaDB stores it.
- AMQP (py-amqp), HTTP and SOAP (tests/unit/test_soap_adapter.py): a date-time the field's ``timezone`` cannot hold (the instant of
  ``9999-12-31T23:00:00-10:00`` in Asia/Tokyo is in the year 10000); it used to escape the adapter
  as an INTERNAL failure, "retry later". A NUL is no such value for AMQP: the JSON body carries it.
- The agent connector has no such value: its request is the params as JSON, unconverted (a
  ``timezone`` is not applied), so a NUL, a control character or the edge date-time reach the
  answering agent as sent.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from producers.client import ReachClient
from producers.serve import AgentServer, Request
from producers.wire import Receipt
from tests.fleet import BROKER_URL, REDIS_URL, Fleet
from tests.integration.counting_system import CountingSystem
from tests.integration.legacy_responder import LegacyResponder, legacy_vhost
from tests.integration.test_sql_mariadb import SCHEMA, MariadbServer
from workers.state import keys

RUN = uuid.uuid4().hex[:6]
HOSTILE, BYSTANDER = f"odd_{RUN}", f"calm_{RUN}"
MARIA, LEGACY, WEB, DESK = "shop_latin1", "legacy_dates", "web_dates", "desk_dates"
HELPER = f"helper_{RUN}"  # the agent that answers DESK's actions
BOOK_QUEUE = f"legacy.book.{RUN}"
EDGE = "9999-12-31T23:00:00-10:00"  # a valid date-time; in Asia/Tokyo it is 10000-01-01T18:00
POLICY = """
  retry: { max_attempts: 3, initial_backoff: 50ms, max_backoff: 100ms }
  breaker: { fail_max: 2, reset_timeout: 30s }"""
WHEN = "when: { type: datetime, required: true, timezone: Asia/Tokyo }"

CATALOG = f"""
connector:
  name: {MARIA}
  type: sql
  dsn_env: MARIA_DSN
  pool: {{ concurrency: 2 }}{POLICY}
  actions:
    - action: add_item
      procedure: shop.add_item
      input: {{ title: {{ type: string, required: true }} }}
      permission: write
      idempotent: false
      timeout: 5s
---
connector:
  name: {LEGACY}
  type: amqp
  url_env: LEGACY_MQ_URL{POLICY}
  actions:
    - action: book
      routing_key: {BOOK_QUEUE}
      permission: write
      idempotent: false
      timeout: 5s
      input:
        title: {{ type: string, required: true }}
        {WHEN}
---
connector:
  name: {WEB}
  endpoint: WEB_URL{POLICY}
  actions:
    - action: book
      path: POST /items
      permission: write
      idempotent: false
      timeout: 5s
      input:
        title: {{ type: string, required: true }}
        {WHEN}
---
connector:
  name: {DESK}
  type: agent
  agent: {HELPER}{POLICY}
  actions:
    - action: book
      permission: write
      idempotent: false
      timeout: 5s
      input:
        title: {{ type: string, required: true }}
        {WHEN}
"""
AGENTS = "".join(
    f"""---
agent_app:
  name: {name}
  connector_bindings:
    - {{ connector: {MARIA}, allowed_actions: ["*"] }}
    - {{ connector: {LEGACY}, allowed_actions: ["*"] }}
    - {{ connector: {WEB}, allowed_actions: ["*"] }}
    - {{ connector: {DESK}, allowed_actions: ["*"] }}
"""
    for name in (HOSTILE, BYSTANDER)
)


@pytest.fixture(scope="module")
def maria() -> Iterator[MariadbServer]:
    server = MariadbServer()
    try:
        server.start()
        server.run_sql(*SCHEMA)
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def legacy() -> Iterator[tuple[str, LegacyResponder]]:
    with legacy_vhost() as url:
        system = LegacyResponder(url, [BOOK_QUEUE]).start()
        try:
            yield url, system
        finally:
            system.stop()


@pytest.fixture(scope="module")
def web() -> Iterator[CountingSystem]:
    system = CountingSystem().start()
    yield system
    system.stop()


@pytest.fixture(scope="module")
def fleet(maria: MariadbServer, legacy: tuple[str, LegacyResponder], web: CountingSystem) -> Iterator[Fleet]:
    marks = redis.Redis.from_url(REDIS_URL)  # an earlier run's breaker or health marks in this Redis database
    for connector in (MARIA, LEGACY, WEB, DESK):
        marks.delete(keys.breaker(connector), keys.health(connector))
    env = {"MARIA_DSN": maria.dsn + "?charset=latin1", "LEGACY_MQ_URL": legacy[0]}
    with Fleet(CATALOG.replace("WEB_URL", web.url) + AGENTS, [MARIA, LEGACY, WEB, DESK], env=env) as running:
        yield running


def client(agent: str) -> ReachClient:
    return ReachClient(agent, BROKER_URL, reply_to=f"{agent}.{uuid.uuid4().hex[:8]}", drop_duplicates=False)


def assert_refused_as_input(receipts: list[Receipt], field: str | None = None) -> None:
    for receipt in receipts:
        assert receipt.status == "rejected" and receipt.error is not None, receipt
        assert receipt.error.code == "VALIDATION_FAILED" and not receipt.error.retryable, receipt
        assert receipt.execution.attempts == 1, receipt
        if field is not None:
            assert [d["field"] for d in receipt.error.details] == [field], receipt


def breaker_state(connector: str) -> bytes | None:
    state: bytes | None = redis.Redis.from_url(REDIS_URL).hget(keys.breaker(connector), "state")  # type: ignore[assignment]
    return state


def executions(maria: MariadbServer, title: str) -> int:
    """Calls of shop.add_item with ``title``, committed or not (item_calls is MyISAM: never rolled back)."""
    return int(maria.scalar("SELECT count(*) FROM item_calls WHERE title = %s", (title,)))


def test_mariadb_a_character_the_connection_charset_lacks_is_the_agents_input(
    fleet: Fleet, maria: MariadbServer
) -> None:
    titles = [f"tick ✓ {RUN}-{n}" for n in range(2)]
    with client(HOSTILE) as hostile:
        receipts = [hostile.call(f"{MARIA}.add_item", {"title": title}, timeout=30) for title in titles]
    assert_refused_as_input(receipts)
    assert all("refused a param before sending it" in (r.error.message if r.error else "") for r in receipts)
    # the routine never ran (matched by their ASCII part: item_calls is latin1, and cannot hold the tick)
    assert int(maria.scalar("SELECT count(*) FROM item_calls WHERE title LIKE %s", (f"tick % {RUN}-%",))) == 0
    assert breaker_state(MARIA) in (None, b"closed")
    with client(BYSTANDER) as calm:
        served = calm.call(f"{MARIA}.add_item", {"title": f"plain-{RUN}"}, timeout=30)
    assert served.status == "succeeded", served
    assert executions(maria, f"plain-{RUN}") == 1


def test_mariadb_a_nul_is_no_such_value_it_is_stored_as_sent(fleet: Fleet, maria: MariadbServer) -> None:
    title = f"a\x00b-{RUN}"
    with client(BYSTANDER) as calm:
        served = calm.call(f"{MARIA}.add_item", {"title": title}, timeout=30)
    assert served.status == "succeeded", served
    assert int(maria.scalar("SELECT count(*) FROM items WHERE title = %s", (title,))) == 1


def test_amqp_a_date_time_its_time_zone_cannot_hold_is_the_agents_input(
    fleet: Fleet, legacy: tuple[str, LegacyResponder]
) -> None:
    system = legacy[1]
    system.reset()
    with client(HOSTILE) as hostile:
        receipts = [hostile.call(f"{LEGACY}.book", {"title": f"edge-{n}", "when": EDGE}, timeout=30) for n in range(2)]
    assert_refused_as_input(receipts, "when")
    assert all("outside the years 1-9999" in (r.error.message if r.error else "") for r in receipts)
    assert system.count() == 0
    assert breaker_state(LEGACY) in (None, b"closed")
    with client(BYSTANDER) as calm:
        served = calm.call(f"{LEGACY}.book", {"title": "a\x00b", "when": "2026-01-31T12:00:00Z"}, timeout=30)
    assert served.status == "succeeded", served
    (seen,) = system.seen()
    # a NUL is no such value: the JSON body carries it as \u0000
    assert seen.params == {"title": "a\x00b", "when": "2026-01-31T21:00:00+09:00"}
    assert b"\\u0000" in seen.body and json.loads(seen.body)["title"] == "a\x00b"


def test_http_a_date_time_its_time_zone_cannot_hold_is_the_agents_input(fleet: Fleet, web: CountingSystem) -> None:
    web.state.reset()
    with client(HOSTILE) as hostile:
        receipts = [hostile.call(f"{WEB}.book", {"title": f"edge-{n}", "when": EDGE}, timeout=30) for n in range(2)]
    assert_refused_as_input(receipts, "when")
    assert receipts[0].error is not None and "1-9999" in (receipts[0].error.suggestion or "")
    assert web.requests() == []
    assert breaker_state(WEB) in (None, b"closed")
    with client(BYSTANDER) as calm:
        served = calm.call(f"{WEB}.book", {"title": f"plain-{RUN}", "when": "2026-01-31T12:00:00Z"}, timeout=30)
    assert served.status == "succeeded", served
    (request,) = web.requests(title=f"plain-{RUN}")
    assert request["body"]["when"] == "2026-01-31T21:00:00+09:00"


def test_the_agent_connector_has_no_such_value_every_param_reaches_the_agent_as_sent(fleet: Fleet) -> None:
    seen: list[dict[str, Any]] = []

    def book(params: dict[str, Any], request: Request) -> dict[str, Any]:
        seen.append(params)
        return {"booked": True}

    odd = {"title": "a\x00b\x01\x7f 😀 ✓ " + "x" * 5000, "when": EDGE}
    with AgentServer(HELPER, BROKER_URL, {"book": book}), client(HOSTILE) as hostile:
        receipt = hostile.call(f"{DESK}.book", odd, timeout=30)
    assert receipt.status == "succeeded" and receipt.data == {"booked": True}, receipt
    assert seen == [odd]
