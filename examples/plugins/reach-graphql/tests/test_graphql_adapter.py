"""The GraphQL plugin against a real graphql-core server: answers, errors by extensions.code,
the idempotency key, the token kept out of messages, refusal of bad config by `reach validate`,
and the conformance kit passing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from reach_graphql.demo import TOKEN, Products, catalog

from connectors.adapters.base import AdapterOptions, CallContext, Outcome
from connectors.adapters.factory import Unavailable, build_adapter
from connectors.adapters.registry import registry
from connectors.spec import ConnectorSpec
from producers.wire import ErrorCode
from workers.cli import main
from workers.ops.conformance import check


@pytest.fixture(scope="module")
def products() -> Iterator[Products]:
    running = Products()
    yield running
    running.close()


def connector(url: str) -> ConnectorSpec:
    return ConnectorSpec.model_validate(yaml.safe_load(catalog(url))["connector"])


def call(products: Products, action: str, params: dict[str, object], key: str | None = None) -> Outcome:
    spec = connector(products.url)
    adapter = build_adapter(spec, AdapterOptions(environ={"PRODUCTS_TOKEN": TOKEN}))
    try:
        found = spec.action(action)
        assert found is not None
        return adapter.call(found, params, CallContext(intent_id="i-1", idempotency_key=key, timeout=10))
    finally:
        adapter.close()


def test_the_plugin_is_registered_from_its_own_package() -> None:
    plugin = registry().get("graphql")
    assert plugin is not None and plugin.package.startswith("reach-graphql ") and not plugin.builtin


def test_a_query_answers_its_result_field(products: Products) -> None:
    outcome = call(products, "get_product", {"sku": "P-1"})
    assert outcome.ok and outcome.data == {"sku": "P-1", "name": "Kettle", "price": 25.0}


def test_errors_map_by_their_extension_code(products: Products) -> None:
    assert call(products, "get_product", {"sku": "nope"}).code is ErrorCode.DOWNSTREAM_NOT_FOUND
    bad = call(products, "create_product", {"sku": "P-9", "name": "x", "price": -1})
    assert bad.code is ErrorCode.DOWNSTREAM_VALIDATION_FAILED and "price must be positive" in bad.message


def test_a_mutation_carries_the_idempotency_key_and_never_the_token(products: Products) -> None:
    made = call(products, "create_product", {"sku": "P-2", "name": "Mug", "price": 8.5}, key="key-2")
    assert made.ok and products.keys[-1] == "key-2"
    again = call(products, "create_product", {"sku": "P-2", "name": "Mug", "price": 8.5}, key="key-2b")
    assert again.code is ErrorCode.DOWNSTREAM_CONFLICT
    assert TOKEN not in repr(again) and "[redacted]" in again.message


def test_a_missing_token_leaves_the_connector_unavailable_with_the_reason(products: Products) -> None:
    spec = connector(products.url).model_copy(update={"config": {"token_env": "NOT_SET_ANYWHERE"}})
    with pytest.raises(ValueError, match="NOT_SET_ANYWHERE is not set"):
        build_adapter(spec, AdapterOptions(environ={}))
    wrong = connector(products.url).model_copy(update={"config": {"token_envv": "X"}})
    assert isinstance(build_adapter(wrong), Unavailable)


def test_validate_checks_the_actions_config_against_the_plugin_model(tmp_path: Path) -> None:
    text = catalog("http://127.0.0.1:9/graphql").replace("result: product\n", "result: 'not a field!'\n")
    (tmp_path / "products.yaml").write_text(text)
    result = CliRunner().invoke(main, ["validate", str(tmp_path)])
    assert result.exit_code == 1
    assert "products.yaml:16: connector products: actions.0.config.result: String should match pattern" in result.output


def test_the_conformance_kit_passes() -> None:
    rows = check("graphql")
    assert [(r.guarantee, r.detail) for r in rows if r.status != "PASS"] == []
