"""The router's answers to hostile messages, without services: each is answered once, within bounds."""

from __future__ import annotations

import json
from typing import Any

import pytest

from connectors.catalog import Catalog
from producers.wire import ErrorCode, ErrorInfo, Execution, Receipt
from tests.unit.routing_catalog import routing_catalog
from tests.unit.test_router_decide import CountingLimiter, code_of, message, router
from workers.router.allowances import INVALID_ALLOWANCE
from workers.router.decisions import Answer
from workers.router.intake import RawMessage
from workers.state.ratelimit import Rate
from workers.transport.receipts import ReceiptLimits, fit


@pytest.fixture(scope="module")
def catalog(tmp_path_factory: pytest.TempPathFactory) -> Catalog:
    return routing_catalog(tmp_path_factory.mktemp("catalog"))


def deep(levels: int) -> Any:
    value: Any = "leaf"
    for _ in range(levels - 1):
        value = {"a": value}
    return {"a": value} if levels else value


@pytest.mark.parametrize("reply_to", ["bot." + "x" * 309, "bot." + "é" * 200])
def test_reply_to_over_255_bytes_is_invalid_and_answered_on_the_agents_own_key(catalog: Catalog, reply_to: str) -> None:
    decision = router(catalog).decide(
        message({"agent_id": "bot", "action": "query_ticket", "params": {"tid": "1"}, "reply_to": reply_to})
    )
    assert code_of(decision) == "INVALID_INTENT"
    assert "255 bytes" in decision.receipt.error.message  # type: ignore[union-attr]
    assert isinstance(decision, Answer) and decision.routing_key == "bot"


def test_params_nested_past_the_limit_are_refused_before_validation(catalog: Catalog) -> None:
    for levels in (33, 40, 1000):
        card = '{"a":' * levels + '"leaf"' + "}" * levels  # (json.dumps itself recurses)
        body = (
            '{"agent_id": "bot", "intent_id": "deep-1", "action": "create_ticket", "params": {"title": "t", '
            f'"card": {card}}}}}'
        ).encode()
        decision = router(catalog).decide(message(body))
        assert code_of(decision) == "INVALID_INTENT"
        assert "at most 32" in decision.receipt.error.message  # type: ignore[union-attr]
        # the sender is told, under its own intent id
        assert isinstance(decision, Answer) and decision.routing_key == "bot"
        assert decision.receipt.intent_id == "deep-1"
    within = router(catalog).decide(
        message({"agent_id": "bot", "action": "create_ticket", "params": {"title": "t", "x": deep(20)}})
    )
    assert code_of(within) == "VALIDATION_FAILED"  # deep enough to be read, then judged by the schema


def test_the_depth_limit_is_configurable(catalog: Catalog) -> None:
    decision = router(catalog, max_depth=4).decide(
        message({"agent_id": "bot", "action": "create_ticket", "params": {"title": "t", "card": deep(5)}})
    )
    assert "at most 4" in decision.receipt.error.message  # type: ignore[union-attr]


def test_unreadable_properties_are_answered_to_the_broker_login_only(catalog: Catalog) -> None:
    body = json.dumps({"agent_id": "office_bot", "action": "query_ticket"}).encode()
    told = router(catalog).decide(RawMessage(body=body, user_id="bot", unreadable="the headers nest deeper than 8"))
    assert code_of(told) == "INVALID_INTENT"
    assert isinstance(told, Answer) and told.routing_key == "bot" and told.dead_letter_reason is not None
    nobody = router(catalog).decide(RawMessage(body=body, unreadable="bad"))
    assert isinstance(nobody, Answer) and nobody.routing_key is None and nobody.dead_letter_reason is not None


def test_an_oversize_body_is_refused_by_its_size_alone(catalog: Catalog) -> None:
    decision = router(catalog).decide(
        RawMessage(body=b"", headers={"agent_id": "bot"}, oversize=(50 * 1024 * 1024, "ab" * 32))
    )
    assert code_of(decision) == "INVALID_INTENT"
    assert "52428800 bytes" in decision.receipt.error.message  # type: ignore[union-attr]


def test_a_broker_login_outside_the_name_rule_is_not_an_identity(catalog: Catalog) -> None:
    decision = router(catalog).decide(message({"action": "query_ticket"}, user_id="Desk:Bot"))
    assert code_of(decision) == "PERMISSION_DENIED"
    assert isinstance(decision, Answer) and decision.routing_key is None


def test_invalid_intents_past_the_allowance_are_rate_limited_and_not_dead_lettered(catalog: Catalog) -> None:
    limiter = CountingLimiter(allow=2)
    routed = router(catalog, limiter=limiter, invalid_rate=Rate(2, 1000))
    answers = [routed.decide(message(b"{not json", headers={"agent_id": "bot"})) for _ in range(4)]
    assert [code_of(a) for a in answers] == ["INVALID_INTENT", "INVALID_INTENT", "RATE_LIMITED", "RATE_LIMITED"]
    assert all(isinstance(a, Answer) for a in answers)
    assert [a.dead_letter_reason is not None for a in answers] == [True, True, False, False]  # type: ignore[union-attr]
    limited = answers[-1].receipt.error  # type: ignore[union-attr]
    assert limited is not None and limited.retryable and limited.retry_after_ms == 12_000
    assert "INVALID_INTENT" in limited.message  # still says what was wrong
    assert {call[1] for call in limiter.calls} == {INVALID_ALLOWANCE}


def test_valid_intents_do_not_touch_the_invalid_allowance(catalog: Catalog) -> None:
    limiter = CountingLimiter(allow=0)
    routed = router(catalog, limiter=limiter, invalid_rate=Rate(1, 1000))
    routed.decide(message({"agent_id": "bot", "action": "query_ticket", "params": {"tid": "1"}}))
    assert all(call[1] != INVALID_ALLOWANCE for call in limiter.calls)


def _receipt(details: int, data: Any = None) -> Receipt:
    error = (
        None
        if details < 0
        else ErrorInfo(
            code=ErrorCode.VALIDATION_FAILED,
            message="m" * 10_000,
            retryable=False,
            suggestion="s",
            details=[{"field": f"f{i}", "message": "not declared"} for i in range(details)],
        )
    )
    return Receipt(
        intent_id="i",
        agent_id="bot",
        action="a",
        connector="c",
        status="rejected" if error else "succeeded",
        success=error is None,
        data=data,
        error=error,
        execution=Execution(trace_id="t", received_at="now", finished_at="now"),
    )


def test_receipt_details_are_cut_with_a_count_of_the_rest() -> None:
    receipt, body = fit(_receipt(125_000), ReceiptLimits(max_details=50, max_bytes=1 << 20))
    details = receipt.error.details  # type: ignore[union-attr]
    assert len(details) == 50
    assert details[-1]["message"] == "and 124951 more"
    assert len(body) < 20_000


def test_an_oversize_receipt_is_cut_to_the_byte_limit() -> None:
    receipt, body = fit(_receipt(-1, data={"blob": "x" * 100_000}), ReceiptLimits(max_details=50, max_bytes=8192))
    assert len(body) <= 8192
    assert "_reach_omitted" in receipt.data and receipt.status == "succeeded"
    receipt, body = fit(_receipt(40), ReceiptLimits(max_details=50, max_bytes=8192))
    assert len(body) <= 8192 and receipt.error is not None and len(receipt.error.message) <= 2000


def test_twenty_thousand_unknown_params_give_a_bounded_receipt_that_counts_the_rest(catalog: Catalog) -> None:
    params: dict[str, Any] = {f"k{i}": 1 for i in range(20_000)}  # (within the 256 KiB limit)
    params["title"] = "t"
    decision = router(catalog).decide(message({"agent_id": "bot", "action": "create_ticket", "params": params}))
    assert code_of(decision) == "VALIDATION_FAILED"
    details = decision.receipt.error.details  # type: ignore[union-attr]
    assert len(details) == 50
    assert details[-1]["message"] == "and 19951 more"
