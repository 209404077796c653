"""A lone surrogate in a system's answer: never a crash, never an INTERNAL that hides a write which
took effect, never a write without a receipt (found beside the generated hostile-input run, issue 30).

Agents cannot send one (the router refuses unpaired surrogates as INVALID_INTENT), but a system's
JSON answer can: ``{"ticket_id": "\\ud800"}`` decodes to a str that is not valid Unicode text, and
RE2 (which matches UTF-8) raised UnicodeEncodeError on it. Under a declared ``output`` pattern the
adapter failed after the system had answered: the pool called that an adapter bug, ``INTERNAL``
("nothing was sent", retryable) for a write that had taken effect, so the agent was told to resend it.
"""

from __future__ import annotations

import json

import httpx

from connectors.adapters.base import CallContext
from connectors.adapters.http import HttpAdapter
from connectors.patterns import compile_pattern
from connectors.schema import compile_field
from connectors.spec import ConnectorSpec
from connectors.spec.fields import FieldSpec
from producers.client.bodies import read_reply
from producers.wire import ErrorCode, Execution, Receipt


def test_a_lone_surrogate_never_matches_and_never_raises() -> None:
    for source in (r"^[A-Z]+-[0-9]+$", r"^\P{Cc}*$", r".*", ""):
        pattern = compile_pattern(source)
        for value in ("\ud800", "TK-1\udfff", "\udc00\ud800"):
            assert pattern.search(value) is False, (source, value)
    assert compile_pattern(r"^TK-\d+$").search("TK-12") is True


def test_a_field_check_reports_a_lone_surrogate_as_a_pattern_problem() -> None:
    check = compile_field(FieldSpec.model_validate({"type": "string", "pattern": "^[A-Z]+-[0-9]+$"}))
    problems: list = []
    check("TK-\ud800", "ticket_id", problems)
    assert [p.code for p in problems] == ["pattern"]


def test_a_write_answered_with_a_lone_surrogate_under_an_output_pattern_is_a_contract_violation() -> None:
    spec = ConnectorSpec.model_validate(
        {
            "name": "desk",
            "endpoint": "http://desk.example",
            "actions": [
                {
                    "action": "create_ticket",
                    "path": "POST /tickets",
                    "permission": "write",
                    "idempotent": False,
                    "input": {"title": {}},
                    "output": {"ticket_id": {"type": "string", "pattern": "^TK-[0-9]+$"}},
                }
            ],
        }
    )
    sent: list[httpx.Request] = []

    def system(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(201, content=b'{"ticket_id": "TK-\\ud800"}')

    adapter = HttpAdapter(spec, environ={}, transport=httpx.MockTransport(system))
    try:
        action = spec.action("create_ticket")
        assert action is not None
        outcome = adapter.call(action, {"title": "t"}, CallContext("intent-1"))
    finally:
        adapter.close()
    assert len(sent) == 1
    # the system answered: the write may have taken effect, and is never reported as unsent
    assert outcome.code is ErrorCode.DOWNSTREAM_CONTRACT_VIOLATION, outcome
    assert outcome.sent


def test_a_receipt_whose_data_has_a_lone_surrogate_in_a_key_is_still_written() -> None:
    """pydantic cannot serialize such a key: the pool gave up on the job, and a write that had
    taken effect got no receipt at all. A lone surrogate in a value went out as a JSON escape,
    which the SDK's parser refuses: that receipt was never read. Each becomes U+FFFD."""
    receipt = Receipt(
        intent_id="i-1",
        agent_id="a",
        action="create_thing",
        connector="desk",
        status="succeeded",
        success=True,
        data={"thing_id": "T-\ud800", "nested": {"k\udc00": ["\ud83d"]}},
        execution=Execution(trace_id="t", received_at="2026-01-01T00:00:00Z", finished_at="2026-01-01T00:00:00Z"),
    )
    body = receipt.to_json()
    assert json.loads(body)["data"] == {"thing_id": "T-\ufffd", "nested": {"k\ufffd": ["\ufffd"]}}
    # the SDK's strict parser reads it (it refuses lone surrogate escapes: the agent never saw its receipt)
    assert read_reply(body, "application/json", None) == receipt.model_copy(
        update={"data": {"thing_id": "T-\ufffd", "nested": {"k\ufffd": ["\ufffd"]}}}
    )


def test_a_receipt_keeps_surrogate_pairs_and_escaped_backslashes_as_they_are() -> None:
    data = {"emoji": "\U0001f600", "text": "\\ud800 is how JSON writes it", "k\U0001f600": 1}
    receipt = Receipt(
        intent_id="i-1",
        agent_id="a",
        action="x",
        connector="c",
        status="succeeded",
        success=True,
        data=data,
        execution=Execution(trace_id="t", received_at="2026-01-01T00:00:00Z", finished_at="2026-01-01T00:00:00Z"),
    )
    assert json.loads(receipt.to_json())["data"] == data
