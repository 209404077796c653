"""Connector type amqp: request/reply to a legacy system over its own broker (a vhost of its own here),
answered by a real consumer (tests.integration.legacy_responder) that counts every request.

First the adapter alone (what one attempt turns into), then the same system behind a real fleet
(validation, retries only when safe, the idempotency ledger, the breaker)."""

from __future__ import annotations

import socket
import textwrap
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from connectors.adapters.amqp import AmqpAdapter
from connectors.adapters.amqp_rpc import DIRECT_REPLY_TO
from connectors.adapters.auth import MissingSecret
from connectors.adapters.base import AdapterOptions, CallContext
from connectors.adapters.factory import build_adapter
from connectors.spec import ConnectorSpec
from tests.fleet import Fleet, agent
from tests.integration.legacy_responder import LegacyResponder, Reply, close_connections, legacy_vhost

PLACE, STATUS, CANCEL, PING = "legacy.orders.place", "legacy.orders.status", "legacy.orders.cancel", "legacy.ping"
LEGACY_EXCHANGE = "legacy.orders"
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

CONNECTOR = f"""
name: legacy_orders
type: amqp
url_env: LEGACY_MQ_URL
retry: {{max_attempts: 2, initial_backoff: 50ms, max_backoff: 100ms}}
breaker: {{fail_max: 50, reset_timeout: 30s}}
actions:
  - action: place_order
    routing_key: {PLACE}
    permission: write
    idempotent: false
    timeout: 1s
    input:
      sku: {{type: string, required: true, max_length: 20}}
      qty: {{type: integer, required: true, min: 1}}
      note: {{type: string, name: remark}}
      urgent: {{type: boolean, as: string}}
  - action: order_status
    routing_key: {STATUS}
    timeout: 1s
    input:
      order_id: {{type: string, required: true}}
    output:
      state: {{type: enum, values: [open, shipped]}}
  - action: cancel_order
    exchange: {LEGACY_EXCHANGE}
    routing_key: cancel
    permission: write
    timeout: 1s
    input:
      order_id: {{type: string, required: true}}
"""
FRAGILE = f"""
name: legacy_fragile
type: amqp
url_env: LEGACY_MQ_URL
retry: {{max_attempts: 1}}
breaker: {{fail_max: 2, reset_timeout: 30s}}
actions:
  - action: ping
    routing_key: {PING}
    timeout: 500ms
"""
CATALOG = f"""
connector:
{textwrap.indent(CONNECTOR.strip(), "  ")}
---
connector:
{textwrap.indent(FRAGILE.strip(), "  ")}
---
agent_app:
  name: shop_bot
  connector_bindings:
    - connector: legacy_orders
      allowed_actions: ["*"]
    - connector: legacy_fragile
      allowed_actions: ["*"]
"""
SPEC = ConnectorSpec.model_validate(yaml.safe_load(CONNECTOR))


@pytest.fixture(scope="module")
def legacy_url() -> Iterator[str]:
    with legacy_vhost() as url:
        yield url


@pytest.fixture(scope="module")
def responder(legacy_url: str) -> Iterator[LegacyResponder]:
    system = LegacyResponder(legacy_url, [PLACE, STATUS, CANCEL, PING], [(LEGACY_EXCHANGE, "cancel", CANCEL)]).start()
    yield system
    system.stop()


@pytest.fixture
def legacy(responder: LegacyResponder) -> LegacyResponder:
    responder.reset()
    return responder


@pytest.fixture(scope="module")
def adapter(legacy_url: str, responder: LegacyResponder) -> Iterator[AmqpAdapter]:
    built = build_adapter(SPEC, AdapterOptions(environ={"LEGACY_MQ_URL": legacy_url}, extra={"max_answer_bytes": 4096}))
    assert isinstance(built, AmqpAdapter)
    yield built
    built.close()


def call(adapter: AmqpAdapter, action: str, params: dict[str, Any], timeout: float = 1.0, **ctx: Any) -> Any:
    return adapter.call(SPEC.action(action), params, CallContext(uuid.uuid4().hex, timeout=timeout, **ctx))  # type: ignore[arg-type]


# -- the adapter alone -------------------------------------------------------------------------------


def test_request_carries_the_params_as_json_with_reply_to_and_the_answer_is_the_data(
    legacy_url: str, legacy: LegacyResponder
) -> None:
    legacy.behaviours[PLACE] = lambda params, n: Reply.json({"order_id": "O-1", "got": params})
    spec = SPEC.model_copy(update={"idempotency_header": "x-request-key"})
    adapter = build_adapter(spec, AdapterOptions(environ={"LEGACY_MQ_URL": legacy_url}))
    try:
        outcome = adapter.call(
            spec.action("place_order"),  # type: ignore[arg-type]
            {"sku": "A-1", "qty": 2, "note": "gift", "urgent": True},
            CallContext("i-1", timeout=1, traceparent=TRACEPARENT, idempotency_key="key-1"),
        )
    finally:
        adapter.close()
    assert outcome.ok and outcome.sent, outcome
    # the field's `name` and `as: string` apply, as they do over HTTP
    assert outcome.data == {"order_id": "O-1", "got": {"sku": "A-1", "qty": 2, "remark": "gift", "urgent": "true"}}
    [seen] = legacy.seen(PLACE)
    props = seen.properties
    assert props["content_type"] == "application/json" and props["delivery_mode"] == 2
    assert props["reply_to"].startswith(DIRECT_REPLY_TO) and len(props["correlation_id"]) == 32
    assert props["expiration"] == "1000"  # nobody runs it after the caller gave up
    assert seen.headers == {"traceparent": TRACEPARENT, "x-request-key": "key-1"}


def test_named_exchange_and_a_non_object_answer_wrapped_as_result(
    adapter: AmqpAdapter, legacy: LegacyResponder
) -> None:
    legacy.behaviours[CANCEL] = lambda params, n: Reply.json(["cancelled", params["order_id"]])
    outcome = call(adapter, "cancel_order", {"order_id": "O-9"})
    assert outcome.ok and outcome.data == {"result": ["cancelled", "O-9"]}
    assert legacy.count(CANCEL) == 1


@pytest.mark.parametrize(
    "reply, code, message",
    [
        (
            Reply(b"order O-1 exists", {"x-error-code": "DOWNSTREAM_CONFLICT"}),
            "DOWNSTREAM_CONFLICT",
            "order O-1 exists",
        ),
        (
            Reply.json({"detail": "x"}, {"x-error-code": "DOWNSTREAM_NOT_FOUND", "x-error-message": "no order O-1"}),
            "DOWNSTREAM_NOT_FOUND",
            "no order O-1",
        ),
        (
            Reply.json({"error": {"code": "DOWNSTREAM_VALIDATION_FAILED", "message": "qty over stock"}}),
            "DOWNSTREAM_VALIDATION_FAILED",
            "qty over stock",
        ),
    ],
)
def test_error_answers_map_onto_the_error_table(
    adapter: AmqpAdapter, legacy: LegacyResponder, reply: Reply, code: str, message: str
) -> None:
    legacy.behaviours[STATUS] = lambda params, n: reply
    outcome = call(adapter, "order_status", {"order_id": "O-1"})
    assert not outcome.ok and outcome.code == code and outcome.message == message and outcome.sent
    assert outcome.suggestion  # a model always gets a next step


def test_rate_limited_envelope_keeps_its_retry_after(adapter: AmqpAdapter, legacy: LegacyResponder) -> None:
    legacy.behaviours[STATUS] = lambda params, n: Reply.json(
        {"error": {"code": "DOWNSTREAM_RATE_LIMITED", "message": "slow down", "retry_after_ms": 1500}}
    )
    outcome = call(adapter, "order_status", {"order_id": "O-1"})
    assert outcome.code == "DOWNSTREAM_RATE_LIMITED" and outcome.retry_after_ms == 1500


@pytest.mark.parametrize(
    "reply, reason",
    [
        (Reply(b"OK, done"), "not UTF-8 JSON"),
        (Reply(b'{"state": NaN}'), "not UTF-8 JSON"),
        (Reply(b"\xff\xfe"), "not UTF-8 JSON"),
        (Reply.json({"blob": "x" * 5000}), "bytes; the limit is 4096"),
        (Reply(b"[" * 40 + b"]" * 40), "nests 40 levels"),
        (Reply(b"{}", {"x-error-code": "OUTCOME_UNKNOWN"}), "x-error-code"),  # not the system's to claim
        (Reply.json({"error": {"code": "TEAPOT", "message": "?"}}), "error is malformed"),
        (Reply.json({"state": "lost"}), "breaks the declared output"),
        (Reply.json({"nothing": 1}), "breaks the declared output"),
    ],
)
def test_unreadable_or_off_contract_answers_are_contract_violations(
    adapter: AmqpAdapter, legacy: LegacyResponder, reply: Reply, reason: str
) -> None:
    legacy.behaviours[STATUS] = lambda params, n: reply
    outcome = call(adapter, "order_status", {"order_id": "O-1"})
    assert outcome.code == "DOWNSTREAM_CONTRACT_VIOLATION", outcome
    assert reason in outcome.message or any(d["code"] in ("enum", "required") for d in outcome.details)


def test_no_answer_is_unknown_for_a_write_and_a_timeout_for_a_read(
    adapter: AmqpAdapter, legacy: LegacyResponder
) -> None:
    legacy.behaviours[PLACE] = legacy.behaviours[STATUS] = lambda params, n: None
    write = call(adapter, "place_order", {"sku": "A", "qty": 1}, timeout=0.4)
    read = call(adapter, "order_status", {"order_id": "O-1"}, timeout=0.4)
    assert write.code == "OUTCOME_UNKNOWN" and write.sent and "check" in write.suggestion.lower()
    assert read.code == "DOWNSTREAM_TIMEOUT" and read.sent
    assert legacy.count() == 2


def test_a_late_answer_is_never_taken_for_the_next_requests(adapter: AmqpAdapter, legacy: LegacyResponder) -> None:
    legacy.behaviours[STATUS] = lambda params, n: Reply.json({"state": "open", "n": n}, delay=0.6 if n == 1 else 0)
    first = call(adapter, "order_status", {"order_id": "O-1"}, timeout=0.3)
    assert first.code == "DOWNSTREAM_TIMEOUT"
    second = call(adapter, "order_status", {"order_id": "O-1"}, timeout=2)  # waits past the late one's arrival
    third = call(adapter, "order_status", {"order_id": "O-1"}, timeout=2)
    assert (second.data, third.data) == ({"state": "open", "n": 2}, {"state": "open", "n": 3})


def test_concurrent_threads_each_get_their_own_answer(adapter: AmqpAdapter, legacy: LegacyResponder) -> None:
    legacy.behaviours[STATUS] = lambda params, n: Reply.json({"state": "open", "order_id": params["order_id"]})
    wrong: list[Any] = []

    def caller(i: int) -> None:
        for j in range(5):
            order = f"O-{i}-{j}"
            outcome = call(adapter, "order_status", {"order_id": order}, timeout=5)
            if not outcome.ok or outcome.data["order_id"] != order:
                wrong.append(outcome)

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert wrong == [] and legacy.count(STATUS) == 40


def test_unroutable_requests_are_unreachable_and_never_sent(legacy_url: str, legacy: LegacyResponder) -> None:
    spec = ConnectorSpec.model_validate(
        yaml.safe_load(
            """
name: legacy_lost
type: amqp
url_env: U
actions:
  - {action: no_queue, routing_key: legacy.nobody.listens, permission: write}
  - {action: no_exchange, exchange: legacy.missing, routing_key: x, permission: write}
"""
        )
    )
    adapter = build_adapter(spec, AdapterOptions(environ={"U": legacy_url}))
    try:
        for action in ("no_queue", "no_exchange", "no_queue"):  # the line is opened again after the 404
            outcome = adapter.call(spec.action(action), {}, CallContext(uuid.uuid4().hex, timeout=1))  # type: ignore[arg-type]
            assert outcome.code == "DOWNSTREAM_UNREACHABLE" and outcome.sent is False, outcome
        probe = adapter.probe(2)
        assert not probe.healthy and "legacy.missing" in probe.detail
    finally:
        adapter.close()
    assert legacy.count() == 0


def test_a_broker_that_is_down_is_unreachable_and_unhealthy() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens once closed
    adapter = build_adapter(SPEC, AdapterOptions(environ={"LEGACY_MQ_URL": f"amqp://guest:guest@127.0.0.1:{port}//"}))
    outcome = adapter.call(SPEC.action("place_order"), {"sku": "A", "qty": 1}, CallContext("i", timeout=1))  # type: ignore[arg-type]
    assert outcome.code == "DOWNSTREAM_UNREACHABLE" and outcome.sent is False
    assert adapter.probe(1).healthy is False


def test_a_connection_closed_by_the_broker_is_opened_again(
    adapter: AmqpAdapter, legacy: LegacyResponder, legacy_url: str
) -> None:
    legacy.behaviours[STATUS] = lambda params, n: Reply.json({"state": "shipped"})
    assert call(adapter, "order_status", {"order_id": "O-1"}).ok  # this thread's line is open
    close_connections(legacy_url)
    # the responder reconnects too; until it consumes again the request waits in its queue
    outcome = call(adapter, "order_status", {"order_id": "O-1"}, timeout=5)
    assert outcome.ok and outcome.data == {"state": "shipped"}, outcome
    assert adapter.probe(2).healthy


def test_the_url_is_a_secret_the_pool_needs() -> None:
    with pytest.raises(MissingSecret, match="LEGACY_MQ_URL"):
        build_adapter(SPEC, AdapterOptions(environ={}))


# -- through the fleet -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fleet(legacy_url: str, responder: LegacyResponder) -> Iterator[Fleet]:
    with Fleet(CATALOG, ["legacy_orders", "legacy_fragile"], env={"LEGACY_MQ_URL": legacy_url}) as running:
        yield running


def test_fleet_places_an_order_and_the_answer_is_the_receipts_data(fleet: Fleet, legacy: LegacyResponder) -> None:
    legacy.behaviours[PLACE] = lambda params, n: Reply.json({"order_id": f"O-{n}", "sku": params["sku"]})
    with agent("shop_bot") as shop:
        receipt = shop.call("place_order", {"sku": "A-1", "qty": 3}, timeout=20, idempotency_key="fleet-place-1")
    assert receipt.status == "succeeded", receipt
    assert receipt.data == {"order_id": "O-1", "sku": "A-1"} and receipt.connector == "legacy_orders"
    [seen] = legacy.seen(PLACE)
    assert seen.params == {"sku": "A-1", "qty": 3} and seen.headers["traceparent"].startswith("00-")


def test_fleet_invalid_params_never_reach_the_legacy_system(fleet: Fleet, legacy: LegacyResponder) -> None:
    with agent("shop_bot") as shop:
        receipt = shop.call("place_order", {"sku": "A-1", "qty": 0, "colour": "red"}, timeout=20)
    assert receipt.status == "rejected" and receipt.error is not None
    assert receipt.error.code == "VALIDATION_FAILED" and {d["field"] for d in receipt.error.details} == {
        "qty",
        "colour",
    }
    assert legacy.count() == 0


def test_fleet_error_answer_becomes_a_failed_receipt_without_retries(fleet: Fleet, legacy: LegacyResponder) -> None:
    legacy.behaviours[STATUS] = lambda params, n: Reply.json(
        {"error": {"code": "DOWNSTREAM_NOT_FOUND", "message": "no order O-404", "suggestion": "List orders first."}}
    )
    with agent("shop_bot") as shop:
        receipt = shop.call("order_status", {"order_id": "O-404"}, timeout=20)
    assert receipt.status == "failed" and receipt.error is not None
    assert (receipt.error.code, receipt.error.message, receipt.error.suggestion) == (
        "DOWNSTREAM_NOT_FOUND",
        "no order O-404",
        "List orders first.",
    )
    assert receipt.execution.attempts == 1 and legacy.count(STATUS) == 1


def test_fleet_unanswered_write_is_unknown_and_sent_once_while_a_read_is_retried(
    fleet: Fleet, legacy: LegacyResponder
) -> None:
    legacy.behaviours[PLACE] = legacy.behaviours[STATUS] = lambda params, n: None
    with agent("shop_bot") as shop:
        write = shop.call("place_order", {"sku": "A-1", "qty": 1}, timeout=20)
        read = shop.call("order_status", {"order_id": "O-1"}, timeout=20)
    assert write.status == "unknown" and write.error is not None and write.error.code == "OUTCOME_UNKNOWN"
    assert write.execution.attempts == 1 and legacy.count(PLACE) == 1
    assert read.status == "failed" and read.error is not None and read.error.code == "DOWNSTREAM_TIMEOUT"
    assert read.execution.attempts == 2 and legacy.count(STATUS) == 2


def test_fleet_same_idempotency_key_reaches_the_legacy_system_once(fleet: Fleet, legacy: LegacyResponder) -> None:
    legacy.behaviours[PLACE] = lambda params, n: Reply.json({"order_id": f"O-{n}"})
    key = f"once-{uuid.uuid4().hex}"
    with agent("shop_bot") as shop:
        first = shop.call("place_order", {"sku": "A-1", "qty": 1}, timeout=20, idempotency_key=key)
        second = shop.call("place_order", {"sku": "A-1", "qty": 1}, timeout=20, idempotency_key=key)
    assert first.status == second.status == "succeeded" and first.data == second.data == {"order_id": "O-1"}
    assert second.execution.deduplicated and second.intent_id != first.intent_id
    assert legacy.count(PLACE) == 1


def test_fleet_breaker_opens_after_unanswered_calls_and_stops_sending(fleet: Fleet, legacy: LegacyResponder) -> None:
    legacy.behaviours[PING] = lambda params, n: None
    with agent("shop_bot") as shop:
        codes = [shop.call("legacy_fragile.ping", {}, timeout=20).error for _ in range(3)]
    assert [e.code if e else None for e in codes] == [
        "DOWNSTREAM_TIMEOUT",
        "DOWNSTREAM_TIMEOUT",
        "CONNECTOR_UNAVAILABLE",
    ]
    assert legacy.count(PING) == 2
    assert codes[2] is not None and codes[2].retry_after_ms
