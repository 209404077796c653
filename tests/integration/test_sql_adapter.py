"""The sql adapter against a real PostgreSQL (started by the test, never mocked): each result shape,
the SQLSTATE mapping, timeouts, lost connections around COMMIT, read-only transactions, and
hostile params that must arrive as data."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest

from connectors.adapters.base import AdapterOptions, CallContext, Outcome
from connectors.adapters.factory import build_adapter
from connectors.adapters.sql.postgres import SqlAdapter
from connectors.spec import ConnectorSpec
from producers.wire import ErrorCode
from tests.integration.faultproxy import FaultProxy
from tests.integration.postgres import SHOP_SCHEMA, PostgresServer, serve

EXTRA_SCHEMA = r"""
CREATE FUNCTION shop.kinds()
RETURNS TABLE (n numeric, exact numeric, huge numeric, f float8, nan float8, t timestamptz, d date, u uuid,
               b bytea, j jsonb, a int[], i interval, flag boolean, nothing text)
LANGUAGE sql IMMUTABLE AS $$
SELECT 12.50, 0.1, 123456789012345678901.5, 0.25::float8, 'NaN'::float8, '2026-01-31 12:00:00+00'::timestamptz,
       '2026-01-31'::date, '00000000-0000-0000-0000-000000000001'::uuid, '\x0102'::bytea,
       '{"k": [1, 2]}'::jsonb, ARRAY[1, 2], interval '90 seconds', true, NULL
$$;
CREATE FUNCTION shop.deep(levels int) RETURNS jsonb LANGUAGE sql IMMUTABLE
AS $$ SELECT (repeat('[', levels) || repeat(']', levels))::jsonb $$;
CREATE FUNCTION shop.series(n int) RETURNS SETOF int LANGUAGE sql IMMUTABLE AS $$ SELECT generate_series(1, n) $$;
CREATE FUNCTION shop.sum_all(vals numeric[]) RETURNS numeric LANGUAGE sql IMMUTABLE
AS $$ SELECT sum(v) FROM unnest(vals) v $$;
CREATE FUNCTION shop.keys_of(doc jsonb) RETURNS text[] LANGUAGE sql IMMUTABLE
AS $$ SELECT array_agg(k ORDER BY k) FROM jsonb_object_keys(doc) k $$;
CREATE FUNCTION shop.noop() RETURNS void LANGUAGE sql AS $$ SELECT $$;
CREATE FUNCTION shop.whoami() RETURNS TABLE (intent text, agent text, key text, read_only text, timeout text)
LANGUAGE sql STABLE AS $$
SELECT current_setting('reach.intent_id', true), current_setting('reach.agent_id', true),
       current_setting('reach.idempotency_key', true), current_setting('transaction_read_only'),
       current_setting('statement_timeout')
$$;
-- names that only work as quoted identifiers: a reserved word, and capitals
CREATE FUNCTION public."select"(x int) RETURNS int LANGUAGE sql IMMUTABLE AS $$ SELECT x + 1 $$;
CREATE FUNCTION shop."OrderCount"() RETURNS bigint LANGUAGE sql STABLE AS $$ SELECT count(*) FROM shop.orders $$;
-- OUT arguments between the inputs
CREATE PROCEDURE shop.split_name(full_name text, OUT first text, sep text, OUT rest text) LANGUAGE plpgsql AS $$
BEGIN
    first := split_part(full_name, sep, 1);
    rest := substr(full_name, length(first) + length(sep) + 1);
END $$;
"""

WRITE = {"permission": "write", "idempotent": False}
ACTIONS: list[dict[str, Any]] = [
    {
        "action": "place_order",
        "procedure": "shop.place_order",
        "input": {
            "customer": {"type": "string", "required": True},
            "amount": {"type": "number", "required": True},
            "title": {"type": "string", "required": True},
        },
        **WRITE,
    },
    {
        "action": "place_secret_order",
        "procedure": "shop.place_order",
        "input": {
            "customer": {"type": "string", "required": True},
            "amount": {"type": "number", "required": True},
            "title": {"type": "string", "required": True, "sensitive": True},
        },
        **WRITE,
    },
    {"action": "order_total", "function": "shop.order_total", "input": {"customer": {"type": "string"}}},
    {"action": "orders_of", "function": "shop.orders_of", "input": {"customer": {"type": "string"}}},
    {"action": "customer_summary", "function": "shop.customer_summary", "input": {"customer": {"type": "string"}}},
    {"action": "order_by_title", "function": "shop.order_by_title", "input": {"title": {"type": "string"}}},
    {"action": "sleep", "function": "shop.sleep", "input": {"seconds": {"type": "number"}}, "timeout": "300ms"},
    {"action": "add_item", "procedure": "shop.add_item", "input": {"title": {"type": "string"}}, **WRITE},
    {
        "action": "add_item_safely",
        "procedure": "shop.add_item",
        "input": {"title": {"type": "string"}},
        "permission": "write",
        "idempotent": True,
    },
    {
        "action": "add_item_slowly",
        "procedure": "shop.add_item_slowly",
        "input": {"title": {"type": "string"}},
        "timeout": "100ms",
        **WRITE,
    },
    {"action": "add_item_flaky", "procedure": "shop.add_item_flaky", "input": {"title": {"type": "string"}}, **WRITE},
    {"action": "count_and_log", "function": "shop.count_and_log", "input": {"title": {"type": "string"}}},
    {"action": "missing", "function": "shop.no_such_function", "input": {"x": {"type": "integer"}}},
    {"action": "kinds", "function": "shop.kinds"},
    {"action": "deep", "function": "shop.deep", "input": {"levels": {"type": "integer"}}},
    {"action": "series", "function": "shop.series", "input": {"n": {"type": "integer"}}},
    {
        "action": "sum_all",
        "function": "shop.sum_all",
        "input": {"vals": {"type": "array", "items": {"type": "number"}}},
    },
    {"action": "keys_of", "function": "shop.keys_of", "input": {"doc": {"type": "object"}}},
    {"action": "noop", "function": "shop.noop"},
    {"action": "whoami", "function": "shop.whoami"},
    {"action": "plus_one", "function": "select", "input": {"x": {"type": "integer"}}},
    {"action": "order_count", "function": "shop.OrderCount"},
    {"action": "reshaped", "procedure": "shop.reshaped", "input": {"x": {"type": "integer"}}, **WRITE},
    {
        "action": "split_name",
        "procedure": "shop.split_name",
        "input": {"full_name": {"type": "string"}, "sep": {"type": "string"}},
    },
]
CONNECTOR = ConnectorSpec.model_validate({"name": "shop", "type": "sql", "dsn_env": "SHOP_DSN", "actions": ACTIONS})
CTX = CallContext(intent_id="intent-1", idempotency_key="key-1", agent_id="shop_bot")


@pytest.fixture(scope="module")
def pg() -> Iterator[PostgresServer]:
    yield from serve(SHOP_SCHEMA + EXTRA_SCHEMA, "shop")


def make_adapter(dsn: str, **extra: Any) -> SqlAdapter:
    adapter = build_adapter(
        CONNECTOR,
        AdapterOptions(max_connections=4, environ={"SHOP_DSN": dsn}, extra={"watchdog_grace": 0.5, **extra}),
    )
    assert isinstance(adapter, SqlAdapter)
    return adapter


@pytest.fixture
def shop(pg: PostgresServer) -> Iterator[SqlAdapter]:
    adapter = make_adapter(pg.dsn, max_rows=10)
    yield adapter
    adapter.close()


def call(adapter: SqlAdapter, action: str, ctx: CallContext = CTX, **params: Any) -> Outcome:
    spec = CONNECTOR.action(action)
    assert spec is not None
    return adapter.call(spec, params, ctx)


def items(pg: PostgresServer, title: str) -> int:
    return int(pg.scalar("SELECT count(*) FROM shop.items WHERE title = %s", (title,)))


# -- the three shapes of data ---------------------------------------------------------------------


def test_a_procedure_answers_its_inout_values_and_its_row_is_committed(shop: SqlAdapter, pg: PostgresServer) -> None:
    outcome = call(shop, "place_order", customer="ada", amount=12.5, title="proc-1")
    assert outcome.ok, outcome
    order_id = outcome.data["order_id"]
    assert outcome.data == {"order_id": order_id} and isinstance(order_id, int)
    assert pg.run_sql("SELECT customer, amount::text FROM shop.orders WHERE id = %s", (order_id,)) == [("ada", "12.50")]


def test_functions_answer_a_result_a_record_or_rows(shop: SqlAdapter) -> None:
    for amount, title in ((12.5, "fn-1"), (7, "fn-2")):
        assert call(shop, "place_order", customer="grace", amount=amount, title=title).ok
    assert call(shop, "order_total", customer="grace").data == {"result": 19.5}
    assert call(shop, "customer_summary", customer="grace").data == {"result": {"orders": 2, "total": 19.5}}
    rows = call(shop, "orders_of", customer="grace").data["rows"]
    assert [(r["amount"], r["title"]) for r in rows] == [(12.5, "fn-1"), (7, "fn-2")]
    assert all(datetime.fromisoformat(r["placed_at"]).tzinfo is not None for r in rows)
    assert call(shop, "orders_of", customer="nobody").data == {"rows": []}
    assert call(shop, "noop").data == {"result": None}
    found = call(shop, "order_by_title", title="fn-2").data["result"]
    assert found["customer"] == "grace" and found["amount"] == 7


def test_out_arguments_between_inputs_get_their_nulls(shop: SqlAdapter) -> None:
    outcome = call(shop, "split_name", full_name="Ada-King-Lovelace", sep="-")
    assert outcome.data == {"first": "Ada", "rest": "King-Lovelace"}, outcome


def test_a_procedure_given_new_out_arguments_is_read_again(shop: SqlAdapter, pg: PostgresServer) -> None:
    pg.run_sql("CREATE PROCEDURE shop.reshaped(x int) LANGUAGE plpgsql AS $$ BEGIN END $$")
    assert call(shop, "reshaped", x=2).data == {}
    pg.run_sql(
        "DROP PROCEDURE shop.reshaped(int);"
        "CREATE PROCEDURE shop.reshaped(x int, OUT doubled int) LANGUAGE plpgsql AS $$ BEGIN doubled := 2 * x; END $$"
    )
    stale = call(shop, "reshaped", x=2)  # the cached CALL lacks the new OUT argument
    assert stale.code is ErrorCode.DOWNSTREAM_ERROR and not stale.sent  # so the pool would retry it
    assert call(shop, "reshaped", x=2).data == {"doubled": 4}


def test_values_come_back_as_json(shop: SqlAdapter) -> None:
    outcome = call(shop, "kinds")
    (row,) = outcome.data["rows"]
    json.dumps(outcome.data, allow_nan=False)  # strict JSON: no NaN, no Decimal, no bytes
    assert row["n"] == 12.5 and row["exact"] == 0.1 and row["huge"] == "123456789012345678901.5"
    assert row["f"] == 0.25 and row["nan"] == "NaN" and row["flag"] is True and row["nothing"] is None
    assert datetime.fromisoformat(row["t"]) == datetime.fromisoformat("2026-01-31T12:00:00+00:00")
    assert row["d"] == "2026-01-31" and row["u"] == "00000000-0000-0000-0000-000000000001"
    assert row["b"] == "AQI=" and row["j"] == {"k": [1, 2]} and row["a"] == [1, 2] and row["i"] == 90.0


def test_arrays_and_objects_bind_to_array_and_jsonb_arguments(shop: SqlAdapter) -> None:
    assert call(shop, "sum_all", vals=[1.5, 2, 0.25]).data == {"result": 3.75}
    assert call(shop, "keys_of", doc={"b": 1, "a": {"x": [1]}}).data == {"result": ["a", "b"]}


def test_rows_are_capped_and_the_cap_is_said(shop: SqlAdapter) -> None:
    outcome = call(shop, "series", n=25)
    assert outcome.ok and [r["series"] for r in outcome.data["rows"]] == list(range(1, 11))
    assert "more than 10 rows" in outcome.data["_reach_omitted"]
    assert "_reach_omitted" not in call(shop, "series", n=10).data


def test_a_result_nested_past_the_limit_is_not_passed_on(shop: SqlAdapter) -> None:
    # past the adapter's limit (32): never parsed, a marker stands in for the value
    outcome = call(shop, "deep", levels=5000)
    assert outcome.ok and outcome.data == {
        "result": {"_reach_omitted": "a JSON value nests 5000 levels; the limit is 32"}
    }
    # within it, but past the intent's REACH_MAX_DEPTH: the whole data is replaced
    outcome = call(shop, "deep", ctx=CallContext(intent_id="deep", max_depth=8), levels=20)
    assert outcome.ok and outcome.data == {"_reach_omitted": "the result nests 21 levels; the limit is 8"}
    assert call(shop, "deep", levels=3).data == {"result": [[[]]]}


def test_routine_names_are_quoted_identifiers(shop: SqlAdapter) -> None:
    """``select`` (a reserved word) and ``OrderCount`` (capitals) only resolve when quoted."""
    assert call(shop, "plus_one", x=41).data == {"result": 42}
    assert call(shop, "order_count").ok


def test_the_transaction_carries_the_intent_and_a_read_is_read_only(shop: SqlAdapter) -> None:
    (row,) = call(shop, "whoami").data["rows"]
    assert row == {"intent": "intent-1", "agent": "shop_bot", "key": "key-1", "read_only": "on", "timeout": "5s"}


# -- errors the database reports: rolled back, sent=False ----------------------------------------


def test_raise_exception_is_downstream_validation_failed_with_its_message_and_hint(
    shop: SqlAdapter, pg: PostgresServer
) -> None:
    outcome = call(shop, "place_order", customer="ada", amount=-5, title="negative")
    assert outcome.code is ErrorCode.DOWNSTREAM_VALIDATION_FAILED and not outcome.sent
    assert outcome.message == "amount must be positive, got -5"
    assert outcome.suggestion == "Send an amount greater than 0."
    assert pg.scalar("SELECT count(*) FROM shop.orders WHERE title = 'negative'") == 0


def test_a_unique_violation_is_downstream_conflict(shop: SqlAdapter, pg: PostgresServer) -> None:
    assert call(shop, "place_order", customer="ada", amount=1, title="twice").ok
    outcome = call(shop, "place_order", customer="ada", amount=2, title="twice")
    assert outcome.code is ErrorCode.DOWNSTREAM_CONFLICT and not outcome.sent
    assert "orders_title_key" in outcome.message and "twice" in outcome.message
    assert pg.scalar("SELECT count(*) FROM shop.orders WHERE title = 'twice'") == 1


def test_a_sensitive_value_quoted_by_postgresql_is_redacted(shop: SqlAdapter) -> None:
    secret = "card-4111-1111"
    assert call(shop, "place_secret_order", customer="ada", amount=1, title=secret).ok
    outcome = call(shop, "place_secret_order", customer="ada", amount=1, title=secret)
    assert outcome.code is ErrorCode.DOWNSTREAM_CONFLICT
    assert secret not in outcome.message + outcome.suggestion and "[redacted]" in outcome.message


def test_no_data_found_is_downstream_not_found(shop: SqlAdapter) -> None:
    assert call(shop, "order_by_title", title="no such order").code is ErrorCode.DOWNSTREAM_NOT_FOUND


def test_a_bad_value_for_the_routines_type_is_downstream_validation_failed(shop: SqlAdapter) -> None:
    outcome = call(shop, "keys_of", doc={"a": "\u0000"})  # jsonb refuses \u0000: SQLSTATE 22P05
    assert outcome.code is ErrorCode.DOWNSTREAM_VALIDATION_FAILED and not outcome.sent, outcome


def test_a_missing_routine_is_downstream_error_naming_the_mismatch(shop: SqlAdapter) -> None:
    outcome = call(shop, "missing", x=1)
    assert outcome.code is ErrorCode.DOWNSTREAM_ERROR and not outcome.sent
    assert "shop.no_such_function" in outcome.message and "42883" in outcome.message
    assert "catalog and the database do not match" in outcome.suggestion


def test_a_serialization_failure_was_rolled_back_and_is_retryable(shop: SqlAdapter, pg: PostgresServer) -> None:
    pg.run_sql("SELECT setval('shop.flaky_calls', 2)")  # the next call is the odd one: it fails
    failed = call(shop, "add_item_flaky", title="flaky-1")
    assert failed.code is ErrorCode.DOWNSTREAM_ERROR and not failed.sent and items(pg, "flaky-1") == 0
    assert call(shop, "add_item_flaky", title="flaky-1").ok and items(pg, "flaky-1") == 1


def test_a_read_action_runs_read_only_so_a_writing_routine_fails_and_writes_nothing(
    shop: SqlAdapter, pg: PostgresServer
) -> None:
    outcome = call(shop, "count_and_log", title="read-writes")
    assert outcome.code is ErrorCode.DOWNSTREAM_CONTRACT_VIOLATION and not outcome.sent
    assert "declared read-only" in outcome.message and "shop.count_and_log" in outcome.message
    assert items(pg, "read-writes") == 0


# -- time -----------------------------------------------------------------------------------------


def test_a_slow_read_is_cancelled_by_the_statement_timeout(shop: SqlAdapter) -> None:
    started = time.monotonic()
    outcome = call(shop, "sleep", seconds=5)
    assert outcome.code is ErrorCode.DOWNSTREAM_TIMEOUT and not outcome.sent
    assert time.monotonic() - started < 1.5 and "0.3s" in outcome.message


def test_a_slow_write_is_cancelled_and_rolled_back(shop: SqlAdapter, pg: PostgresServer) -> None:
    outcome = call(shop, "add_item_slowly", title="too-slow")  # 0.3 s of work, timeout 100ms
    assert outcome.code is ErrorCode.DOWNSTREAM_TIMEOUT and not outcome.sent
    assert "nothing was committed" in outcome.message
    time.sleep(0.4)  # had the statement gone on, its row would be there by now
    assert items(pg, "too-slow") == 0


def test_the_call_context_timeout_wins_over_the_actions(shop: SqlAdapter) -> None:
    outcome = call(shop, "sleep", ctx=CallContext(intent_id="short", timeout=0.05), seconds=1)
    assert outcome.code is ErrorCode.DOWNSTREAM_TIMEOUT and "0.05s" in outcome.message


# -- connections ----------------------------------------------------------------------------------


def test_nothing_listening_is_downstream_unreachable_never_sent(pg: PostgresServer) -> None:
    from workers.ops.local_fleet import free_port

    adapter = make_adapter(pg.url(port=free_port()))
    try:
        outcome = call(adapter, "add_item", title="nowhere")
        assert outcome.code is ErrorCode.DOWNSTREAM_UNREACHABLE and outcome.sent is False
        assert "Connection refused" in outcome.message
        assert adapter.probe(1.0).healthy is False
    finally:
        adapter.close()


def test_a_wrong_password_is_downstream_auth_failed_and_never_shown(
    pg: PostgresServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    wrong = "Wr0ng-Passw0rd-123"
    adapter = make_adapter(pg.url(password=wrong))
    try:
        outcome = call(adapter, "order_total", customer="ada")
        probe = adapter.probe(1.0)
    finally:
        adapter.close()
    assert outcome.code is ErrorCode.DOWNSTREAM_AUTH_FAILED and not outcome.sent
    assert "password authentication failed" in outcome.message
    assert not probe.healthy
    shown = outcome.message + outcome.suggestion + probe.detail + caplog.text + repr(adapter._engine)
    assert wrong not in shown and pg.password not in shown


def test_a_dsn_that_is_not_postgresql_is_refused_without_echoing_it() -> None:
    for dsn in ("mysql://root:s3cret-pw@db/shop", "not a url s3cret-pw", "postgresql+psycopg2://u:s3cret-pw@h/db"):
        with pytest.raises(ValueError) as refused:
            make_adapter(dsn)
        assert "s3cret-pw" not in str(refused.value) and "SHOP_DSN" in str(refused.value)


def test_a_stale_pooled_connection_is_replaced_before_the_routine_is_sent(shop: SqlAdapter, pg: PostgresServer) -> None:
    assert call(shop, "order_total", customer="ada").ok
    killed = pg.run_sql(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'agent-reach shop'"
    )
    assert killed  # the pool's idle connections are gone (as after a server restart)
    outcome = call(shop, "add_item", title="after-restart")
    assert outcome.ok, outcome
    assert items(pg, "after-restart") == 1


def test_the_probe_says_healthy(shop: SqlAdapter) -> None:
    assert shop.probe(1.0).healthy


@pytest.fixture
def proxied(pg: PostgresServer) -> Iterator[tuple[SqlAdapter, FaultProxy]]:
    proxy = FaultProxy(pg.port).start()
    adapter = make_adapter(pg.url(port=proxy.port))
    yield adapter, proxy
    adapter.close()
    proxy.stop()


def test_a_connection_lost_during_commit_is_outcome_unknown_for_a_write(
    proxied: tuple[SqlAdapter, FaultProxy], pg: PostgresServer
) -> None:
    adapter, proxy = proxied
    proxy.reset_on(rb"COMMIT")
    calls = pg.scalar("SELECT last_value FROM shop.item_calls")
    outcome = call(adapter, "add_item", title="commit-lost")
    assert outcome.code is ErrorCode.OUTCOME_UNKNOWN and outcome.sent, outcome
    assert "may or may not have been committed" in outcome.message and outcome.suggestion
    assert proxy.reset_matched == 1 and pg.scalar("SELECT last_value FROM shop.item_calls") == calls + 1
    assert items(pg, "commit-lost") == 0  # in fact COMMIT never arrived: PostgreSQL rolled it back


def test_a_connection_lost_during_commit_of_a_safe_action_is_retryable(
    proxied: tuple[SqlAdapter, FaultProxy],
) -> None:
    adapter, proxy = proxied
    proxy.reset_on(rb"COMMIT")
    outcome = call(adapter, "add_item_safely", title="commit-lost-safe")
    assert outcome.code is ErrorCode.DOWNSTREAM_ERROR and outcome.sent and outcome.code.retryable


def test_a_commit_that_gets_no_answer_is_ended_by_the_watchdog_as_outcome_unknown(
    proxied: tuple[SqlAdapter, FaultProxy], pg: PostgresServer
) -> None:
    adapter, proxy = proxied
    proxy.hold(rb"COMMIT")  # forwarded up to COMMIT, then silence (a hung proxy or server)
    started = time.monotonic()
    outcome = call(adapter, "add_item", ctx=CallContext(intent_id="hung", timeout=0.5), title="commit-hung")
    assert outcome.code is ErrorCode.OUTCOME_UNKNOWN and proxy.held.is_set(), outcome
    assert 0.9 < time.monotonic() - started < 3  # timeout 0.5 s + grace 0.5 s
    assert items(pg, "commit-hung") == 0


def test_a_statement_that_gets_no_answer_is_a_timeout_before_commit(
    proxied: tuple[SqlAdapter, FaultProxy], pg: PostgresServer
) -> None:
    adapter, proxy = proxied
    assert call(adapter, "order_total", customer="ada").ok  # a pooled connection through the proxy
    proxy.hold(rb"CALL ")
    outcome = call(adapter, "add_item", ctx=CallContext(intent_id="silent", timeout=0.5), title="call-hung")
    assert outcome.code is ErrorCode.DOWNSTREAM_TIMEOUT and outcome.sent is False, outcome
    proxy.hold(None)
    assert call(adapter, "add_item", title="call-after").ok  # the broken connection left the pool
    assert items(pg, "call-hung") == 0 and items(pg, "call-after") == 1


# -- hostile params -------------------------------------------------------------------------------

INJECTIONS = [
    "x'); DROP TABLE shop.items; --",
    "'; DELETE FROM shop.orders; --",
    "$$; DROP SCHEMA shop CASCADE; $$",
    "\\'; SELECT pg_sleep(10); --",
    "Robert'); TRUNCATE shop.orders;--",
    "%s %(title)s {0} :title",
]


def test_sql_injection_in_params_arrives_as_data(shop: SqlAdapter, pg: PostgresServer) -> None:
    orders_before = pg.scalar("SELECT count(*) FROM shop.orders")
    for i, text in enumerate(INJECTIONS):
        assert call(shop, "add_item", title=text).ok, text
        assert call(shop, "place_order", customer=text, amount=1, title=f"inject-{i}").ok
    assert [items(pg, text) for text in INJECTIONS] == [1] * len(INJECTIONS)
    assert pg.scalar("SELECT count(*) FROM shop.orders") == orders_before + len(INJECTIONS)
    assert call(shop, "orders_of", customer="' OR '1'='1").data == {"rows": []}  # not every order
    (row,) = call(shop, "orders_of", customer=INJECTIONS[1]).data["rows"]
    assert row["title"] == "inject-1"


def test_a_routine_name_that_is_not_an_identifier_is_refused_by_the_catalog() -> None:
    with pytest.raises(ValueError, match="routine name"):
        ConnectorSpec.model_validate(
            {
                "name": "evil",
                "type": "sql",
                "dsn_env": "X",
                "actions": [{"action": "a", "function": 'shop.x"(); DROP TABLE shop.items; --'}],
            }
        )
