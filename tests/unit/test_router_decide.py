"""Router decisions without services: order of guardrails, time windows, rate limits, identity,
dead-letter redaction, and a property test over thousands of generated messages."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from connectors.catalog import Catalog
from producers.wire import ErrorCode
from tests.unit.routing_catalog import routing_catalog
from workers.observability.redaction import REDACTED, redact_body
from workers.router.decisions import Answer, Dispatch
from workers.router.intake import RawMessage
from workers.router.routing import Router
from workers.state.ratelimit import NoRateLimit, Rate, Verdict


class CountingLimiter:
    def __init__(self, allow: int) -> None:
        self.allow = allow
        self.calls: list[tuple[str, str, Rate]] = []

    def hit(self, agent: str, connector: str, rate: Rate) -> Verdict:
        self.calls.append((agent, connector, rate))
        return Verdict(True) if len(self.calls) <= self.allow else Verdict(False, 12_000)


@pytest.fixture(scope="module")
def catalog(tmp_path_factory: pytest.TempPathFactory) -> Catalog:
    return routing_catalog(tmp_path_factory.mktemp("catalog"))


def at(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def router(catalog: Catalog, *, limiter: Any = None, now: str = "2026-06-15T12:00:00+00:00", **kw: Any) -> Router:
    return Router(catalog, max_intent_bytes=256 * 1024, limiter=limiter or NoRateLimit(), clock=lambda: at(now), **kw)


def message(body: Any, **kw: Any) -> RawMessage:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return RawMessage(body=data, received_at=at("2026-06-15T12:00:00+00:00"), **kw)


def code_of(decision: Any) -> str:
    assert isinstance(decision, Answer), decision
    assert decision.receipt.error is not None
    return decision.receipt.error.code.value


def test_valid_intent_is_dispatched_with_defaults_applied(catalog: Catalog) -> None:
    decision = router(catalog).decide(message({"agent_id": "bot", "action": "create_ticket", "params": {"title": "t"}}))
    assert isinstance(decision, Dispatch)
    assert decision.queue == "reach.connector.tickets"
    assert decision.job.params == {"title": "t", "priority": "medium"}
    assert decision.job.idempotency_key == decision.job.intent_id


@pytest.mark.parametrize(
    "now, open_",
    [
        ("2026-06-15T04:00:00+00:00", False),  # 12:00 in Shanghai
        ("2026-06-15T14:30:00+00:00", True),  # 22:30
        ("2026-06-15T21:59:00+00:00", True),  # 05:59 next day: across midnight
        ("2026-06-15T22:00:00+00:00", False),  # 06:00: closed again
    ],
)
def test_action_time_window_across_midnight(catalog: Catalog, now: str, open_: bool) -> None:
    decision = router(catalog, now=now).decide(message({"agent_id": "bot", "action": "night_batch"}))
    if open_:
        assert isinstance(decision, Dispatch)
    else:
        assert code_of(decision) == "OUTSIDE_TIME_WINDOW"
        assert decision.receipt.error.retryable is True
        assert decision.receipt.error.retry_after_ms and decision.receipt.error.retry_after_ms > 0


def test_outside_window_says_when_it_opens(catalog: Catalog) -> None:
    # 12:00 in Shanghai; the window opens at 22:00: ten hours
    decision = router(catalog, now="2026-06-15T04:00:00+00:00").decide(
        message({"agent_id": "bot", "action": "night_batch"})
    )
    assert decision.receipt.error.retry_after_ms == 10 * 3600 * 1000


def test_binding_time_window_applies_to_that_agent_only(catalog: Catalog) -> None:
    night = "2026-06-15T20:00:00+00:00"  # 22:00 in Berlin
    office = router(catalog, now=night).decide(
        message({"agent_id": "office_bot", "action": "tickets.query_ticket", "params": {"tid": "1"}})
    )
    assert code_of(office) == "OUTSIDE_TIME_WINDOW"
    bot = router(catalog, now=night).decide(
        message({"agent_id": "bot", "action": "tickets.query_ticket", "params": {"tid": "1"}})
    )
    assert isinstance(bot, Dispatch)


def test_rate_limit_rejects_with_retry_after_and_uses_the_binding_rate(catalog: Catalog) -> None:
    limiter = CountingLimiter(allow=5)
    r = router(catalog, limiter=limiter)
    decisions = [
        r.decide(message({"agent_id": "bot", "action": "tickets.query_ticket", "params": {"tid": str(i)}}))
        for i in range(12)
    ]
    assert sum(isinstance(d, Dispatch) for d in decisions) == 5
    limited = [d for d in decisions if isinstance(d, Answer)]
    assert {code_of(d) for d in limited} == {"RATE_LIMITED"}
    assert all(d.receipt.error.retry_after_ms == 12_000 and d.receipt.error.retryable for d in limited)
    assert limiter.calls[0] == ("bot", "tickets", Rate(5, 60_000))


def test_guardrail_order_permission_before_rate_limit_before_validation(catalog: Catalog) -> None:
    limiter = CountingLimiter(allow=0)
    r = router(catalog, limiter=limiter)
    # not permitted: the limiter is not even asked
    assert (
        code_of(r.decide(message({"agent_id": "office_bot", "action": "create_ticket", "params": {}})))
        == "PERMISSION_DENIED"
    )
    assert limiter.calls == []
    # rate limit comes before params validation (docs/contract.md section 6)
    assert (
        code_of(r.decide(message({"agent_id": "bot", "action": "create_ticket", "params": {"bogus": 1}})))
        == "RATE_LIMITED"
    )


def test_bindings_decide_between_connectors_offering_the_same_action(catalog: Catalog) -> None:
    # query_ticket exists on tickets and crm; bot is bound to tickets only
    decision = router(catalog).decide(message({"agent_id": "bot", "action": "query_ticket", "params": {"tid": "1"}}))
    assert isinstance(decision, Dispatch) and decision.job.connector == "tickets"


def test_reply_to_must_belong_to_the_agent(catalog: Catalog) -> None:
    ok = router(catalog).decide(
        message(
            {"agent_id": "bot", "reply_to": "bot.session-1", "action": "tickets.query_ticket", "params": {"tid": "1"}}
        )
    )
    assert isinstance(ok, Dispatch) and ok.job.reply_to == "bot.session-1"
    bad = router(catalog).decide(
        message({"agent_id": "bot", "reply_to": "office_bot", "action": "tickets.query_ticket", "params": {"tid": "1"}})
    )
    assert code_of(bad) == "INVALID_INTENT" and bad.routing_key == "bot"


def test_user_id_is_the_identity_and_a_claim_is_refused_to_the_authenticated_agent(catalog: Catalog) -> None:
    decision = router(catalog).decide(
        message({"agent_id": "office_bot", "action": "create_ticket", "params": {"title": "t"}}, user_id="bot")
    )
    assert code_of(decision) == "PERMISSION_DENIED"
    assert decision.routing_key == "bot" and decision.receipt.agent_id == "bot"
    assert decision.dead_letter_reason is None


def test_require_user_id_refuses_unauthenticated_intents(catalog: Catalog) -> None:
    strict = router(catalog, require_user_id=True)
    refused = strict.decide(
        message(
            {"agent_id": "bot", "action": "tickets.query_ticket", "params": {"tid": "1"}}, headers={"agent_id": "bot"}
        )
    )
    assert code_of(refused) == "PERMISSION_DENIED"
    # nobody the broker vouched for is answered (that could spoof receipts into bot's stream)
    assert refused.routing_key is None and refused.dead_letter_reason
    accepted = strict.decide(message({"action": "tickets.query_ticket", "params": {"tid": "1"}}, user_id="bot"))
    assert isinstance(accepted, Dispatch) and accepted.job.agent_id == "bot"


def test_dead_letter_body_has_sensitive_params_redacted(catalog: Catalog) -> None:
    body = json.dumps(
        {
            "agent_id": "bot",
            "action": "create_ticket",
            "params": {
                "title": "t",
                "api_token": "s3cr3t-token",
                "card": {"number": "4111111111111111", "holder": "Ann"},
            },
            "extra": 1,
        }
    ).encode()
    redacted = redact_body(body, catalog)
    assert b"s3cr3t-token" not in redacted and b"4111111111111111" not in redacted
    doc = json.loads(redacted)
    assert doc["params"]["api_token"] == REDACTED and doc["params"]["card"] == {"number": REDACTED, "holder": "Ann"}


def test_sensitive_values_never_appear_in_rejection_receipts(catalog: Catalog) -> None:
    decision = router(catalog).decide(
        message(
            {
                "agent_id": "bot",
                "action": "create_ticket",
                "params": {"title": "t", "api_token": "tok\r\nen-s3cr3t", "card": {"number": 4111, "holder": "A"}},
            }
        )
    )
    assert code_of(decision) == "VALIDATION_FAILED"
    text = decision.receipt.to_json().decode()
    assert "s3cr3t" not in text and "4111" not in text


# -- property test: nothing a message contains crashes or slips through -------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)
actions = st.sampled_from(
    [
        "create_ticket",
        "tickets.create_ticket",
        "tickets__query_ticket",
        "query_ticket",
        "crm.query_ticket",
        "night_batch",
        "nope",
        "tickets.",
        ".x",
        "a__",
        "reach.list_tools",
    ]
)
bad_params = st.dictionaries(
    st.sampled_from(["title", "priority", "tid", "api_token", "card", "zzz"]), json_values, max_size=4
)
intent_like = st.fixed_dictionaries(
    {"action": actions | json_values, "params": bad_params | json_values},
    optional={
        "agent_id": st.sampled_from(["bot", "office_bot", "nobody", "", "a b"]) | json_values,
        "intent_id": st.text(max_size=10) | json_values,
        "deadline": st.text(max_size=30) | json_values,
        "reply_to": st.text(max_size=10) | json_values,
        "context": json_values,
        "idempotency_key": json_values,
    },
)


def _check_one(catalog: Catalog, raw: RawMessage) -> Any:
    decision = router(catalog).decide(raw)  # must never raise
    assert isinstance(decision, (Answer, Dispatch))
    if isinstance(decision, Dispatch):
        # only a fully valid intent of a bound action gets through
        ref = catalog.refs[(decision.job.connector, decision.job.action)]
        assert catalog.allows(decision.job.agent_id, ref)
        cleaned, problems = ref.validator.validate(decision.job.params)
        assert problems == []
    else:
        receipt = decision.receipt
        assert receipt.status == "rejected" or receipt.success  # list_tools answers succeed
        json.loads(receipt.to_json())
    return decision


@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=st.binary(max_size=200), header_agent=st.sampled_from([None, "bot", "\x00bad"]))
def test_random_bytes_never_crash_and_get_one_answer(catalog: Catalog, body: bytes, header_agent: str | None) -> None:
    headers = {"agent_id": header_agent} if header_agent else {}
    decision = _check_one(catalog, message(body, headers=headers))
    if (
        isinstance(decision, Answer)
        and header_agent == "bot"
        and decision.receipt.error is not None
        and decision.receipt.error.code is ErrorCode.INVALID_INTENT
    ):
        assert decision.routing_key == "bot" and decision.dead_letter_reason


def _check_generated(catalog: Catalog, doc: dict[str, Any], header_agent: str | None) -> None:
    headers = {"agent_id": header_agent} if header_agent else {}
    _check_one(catalog, message(doc, headers=headers))


# ~10 ms an example: 400 in the default run; the soak variant (`-m soak`) tries 3000
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=intent_like, header_agent=st.sampled_from([None, "bot"]))
def test_generated_intents_never_crash_and_invalid_ones_never_dispatch(
    catalog: Catalog, doc: dict[str, Any], header_agent: str | None
) -> None:
    _check_generated(catalog, doc, header_agent)


@pytest.mark.soak
@settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=intent_like, header_agent=st.sampled_from([None, "bot"]))
def test_soak_generated_intents_never_crash_and_invalid_ones_never_dispatch(
    catalog: Catalog, doc: dict[str, Any], header_agent: str | None
) -> None:
    _check_generated(catalog, doc, header_agent)
