"""A small product API in GraphQL (graphql-core), served over HTTP: the system behind the plugin's
tests and its scene in ``reach demo`` (the manifest's ``demo`` hook is :func:`scene`)."""

from __future__ import annotations

import threading
from typing import Any

from graphql import GraphQLError, build_schema

from connectors.adapters.plugin import DemoIntent, DemoScene
from reach_graphql.server import GraphqlServer

TOKEN = "products-token-5b0e77"
SCHEMA = build_schema(
    """
    type Product { sku: String!, name: String!, price: Float! }
    type Query { product(sku: String!): Product }
    type Mutation { createProduct(sku: String!, name: String!, price: Float!): Product }
    """
)


class Products:
    """The products, every create by Idempotency-Key, and every request's headers."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.items: dict[str, dict[str, Any]] = {"P-1": {"sku": "P-1", "name": "Kettle", "price": 25.0}}
        self.creates = 0
        self.keys: list[str | None] = []
        self.server = GraphqlServer(SCHEMA, root=self.root, token=TOKEN)
        self.url = self.server.url

    def root(self, body: bytes, headers: Any) -> Any:
        key = headers.get("Idempotency-Key")

        def product(info: Any, sku: str) -> Any:
            if sku not in self.items:
                raise GraphQLError(f"no product {sku}", extensions={"code": "NOT_FOUND"})
            return self.items[sku]

        def create(info: Any, sku: str, name: str, price: float) -> Any:
            with self.lock:
                self.keys.append(key)
                if price <= 0:
                    raise GraphQLError("price must be positive", extensions={"code": "BAD_USER_INPUT"})
                if sku in self.items:
                    raise GraphQLError(f"{sku} exists; the token {TOKEN} was used", extensions={"code": "CONFLICT"})
                self.creates += 1
                self.items[sku] = {"sku": sku, "name": name, "price": price}
                return self.items[sku]

        return {"product": product, "createProduct": create}

    def close(self) -> None:
        self.server.close()


def catalog(url: str, name: str = "products") -> str:
    return f"""
connector:
  name: {name}
  type: graphql
  endpoint: {url}
  idempotency_header: Idempotency-Key
  config:
    token_env: PRODUCTS_TOKEN
  actions:
    - action: get_product
      description: Look a product up by its SKU
      input:
        sku: {{ type: string, required: true }}
      config:
        query: "query($sku: String!) {{ product(sku: $sku) {{ sku name price }} }}"
        result: product
    - action: create_product
      description: Create a product
      permission: write
      input:
        sku: {{ type: string, required: true }}
        name: {{ type: string, required: true }}
        price: {{ type: number, required: true }}
      config:
        query: "mutation($sku: String!, $name: String!, $price: Float!) {{ createProduct(sku: $sku, name: $name, price: $price) {{ sku name price }} }}"
        result: createProduct
"""


DEMO_AGENT = "catalog_bot"


def scene() -> DemoScene:
    """``reach demo``'s GraphQL scene: the product API, running; a connector ``products`` of type
    graphql and an agent that may read and create products; a write and a read it sends."""
    products = Products()
    text = (
        catalog(products.url)
        + f"""
---
agent_app:
  name: {DEMO_AGENT}
  description: Looks products up and adds new ones (through the GraphQL plugin).
  connector_bindings:
    - connector: products
      allowed_actions: [get_product, create_product]
      rate_limit: 60/min
"""
    )
    return DemoScene(
        system=f"product API (GraphQL) on {products.url}",
        catalog=text,
        connector="products",
        env={"PRODUCTS_TOKEN": TOKEN},
        intents=[
            DemoIntent(
                agent=DEMO_AGENT,
                action="products.create_product",
                params={"sku": "P-2", "name": "Teapot", "price": 30},
                expect="succeeded",
                data={"sku": "P-2", "name": "Teapot"},
            ),
            DemoIntent(
                agent=DEMO_AGENT,
                action="products.get_product",
                params={"sku": "P-1"},
                expect="succeeded",
                data={"sku": "P-1", "name": "Kettle", "price": 25.0},
            ),
        ],
        close=products.close,
    )
