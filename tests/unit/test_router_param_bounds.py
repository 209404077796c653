"""Params too long for the wire are refused by the router before dispatch, naming the field."""

from __future__ import annotations

import pytest

from connectors.catalog import Catalog
from tests.unit.routing_catalog import routing_catalog
from tests.unit.test_router_decide import code_of, message, router


@pytest.fixture(scope="module")
def catalog(tmp_path_factory: pytest.TempPathFactory) -> Catalog:
    return routing_catalog(tmp_path_factory.mktemp("catalog"))


def test_a_100k_path_parameter_is_validation_failed_with_a_detail_for_it(catalog: Catalog) -> None:
    decision = router(catalog).decide(
        message({"agent_id": "bot", "action": "query_ticket", "params": {"tid": "x" * 100_000}})
    )
    assert code_of(decision) == "VALIDATION_FAILED"
    error = decision.receipt.error
    assert error is not None and not error.retryable
    assert [(d["field"], d["code"]) for d in error.details] == [("tid", "max_length")]


def test_an_over_long_header_param_is_validation_failed_with_a_detail_for_it(catalog: Catalog) -> None:
    decision = router(catalog).decide(
        message({"agent_id": "bot", "action": "create_ticket", "params": {"title": "t", "api_token": "t" * 10_000}})
    )
    assert code_of(decision) == "VALIDATION_FAILED"
    assert decision.receipt.error is not None
    assert [d["field"] for d in decision.receipt.error.details] == ["api_token"]
    assert "t" * 100 not in decision.receipt.to_json().decode()  # sensitive: never echoed
