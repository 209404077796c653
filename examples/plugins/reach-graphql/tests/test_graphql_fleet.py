"""The GraphQL plugin, installed, in a real fleet (router and a pool on RabbitMQ and Redis): an
agent's intents reach the GraphQL server and come back as receipts."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from reach_graphql.demo import TOKEN, Products, catalog

from producers.client import ReachClient
from producers.wire import ErrorCode
from tests.fleet import BROKER_URL, Fleet

AGENT = f"gql_{uuid.uuid4().hex[:6]}"


@pytest.fixture(scope="module")
def products() -> Iterator[Products]:
    running = Products()
    yield running
    running.close()


@pytest.fixture(scope="module")
def fleet(products: Products) -> Iterator[Fleet]:
    text = (
        catalog(products.url)
        + f"""
---
agent_app:
  name: {AGENT}
  connector_bindings:
    - connector: products
      allowed_actions: ["*"]
"""
    )
    with Fleet(text, ["products"], env={"PRODUCTS_TOKEN": TOKEN}) as running:
        yield running


def test_intents_reach_the_graphql_server_through_the_fleet(fleet: Fleet, products: Products) -> None:
    sku = f"F-{uuid.uuid4().hex[:6]}"
    with ReachClient(AGENT, BROKER_URL, reply_to=f"{AGENT}.{uuid.uuid4().hex[:8]}") as reach:
        made = reach.call("products.create_product", {"sku": sku, "name": "Teapot", "price": 30}, timeout=60)
        read = reach.call("products.get_product", {"sku": sku}, timeout=60)
        missing = reach.call("products.get_product", {"sku": "none"}, timeout=60)
    assert made.status == "succeeded", made
    assert read.status == "succeeded" and read.data == {"sku": sku, "name": "Teapot", "price": 30.0}
    assert missing.error is not None and missing.error.code == ErrorCode.DOWNSTREAM_NOT_FOUND
    assert products.items[sku]["name"] == "Teapot"
