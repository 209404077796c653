"""What agent-reach registers: the entry point ``graphql`` of the group ``agent_reach.adapters``
names this module, whose ``manifest`` says what the plugin is and whose ``build`` makes the adapter.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from connectors.adapters.base import Adapter, AdapterOptions
from connectors.adapters.plugin import CONTRACT_VERSION, Guarantees, Manifest
from connectors.spec import ConnectorSpec
from producers.wire import ErrorCode


class GraphqlConnector(BaseModel):
    """A connector's ``config``: where the endpoint's credential is, and how much of an answer to read."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    token_env: str | None = Field(default=None, description="Env variable holding a bearer token.")
    max_response_bytes: int = Field(default=1 << 20, ge=1024, le=64 << 20)


class GraphqlAction(BaseModel):
    """An action's ``config``: the operation it sends (the params are its variables) and the
    top-level field of the answer that becomes the receipt's ``data``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    query: str = Field(min_length=1, max_length=20_000)
    result: str = Field(pattern=r"^[_A-Za-z][_0-9A-Za-z]*$")


manifest = Manifest(
    type="graphql",
    contract_version=CONTRACT_VERSION,
    description="A GraphQL API over HTTP: one query or mutation per action, the params as its variables.",
    connector_config=GraphqlConnector,
    action_config=GraphqlAction,
    guarantees=Guarantees(idempotency_key=True, timeout_may_land=True),
    errors={
        "no connection (nothing sent)": ErrorCode.DOWNSTREAM_UNREACHABLE,
        "no answer in time, repeating is safe": ErrorCode.DOWNSTREAM_TIMEOUT,
        "no answer in time to a mutation": ErrorCode.OUTCOME_UNKNOWN,
        "HTTP 5xx, or a GraphQL error without a known extensions.code": ErrorCode.DOWNSTREAM_ERROR,
        "HTTP 401 / 403, extensions.code UNAUTHENTICATED / FORBIDDEN": ErrorCode.DOWNSTREAM_AUTH_FAILED,
        "HTTP 429": ErrorCode.DOWNSTREAM_RATE_LIMITED,
        "extensions.code BAD_USER_INPUT / GRAPHQL_VALIDATION_FAILED": ErrorCode.DOWNSTREAM_VALIDATION_FAILED,
        "extensions.code NOT_FOUND": ErrorCode.DOWNSTREAM_NOT_FOUND,
        "extensions.code CONFLICT": ErrorCode.DOWNSTREAM_CONFLICT,
        "an answer too large, too deep, not JSON or without the result field": ErrorCode.DOWNSTREAM_CONTRACT_VIOLATION,
        "a param the client cannot send": ErrorCode.VALIDATION_FAILED,
    },
    conformance="reach_graphql.kit:fixture",
    demo="reach_graphql.demo:scene",  # `reach demo` runs a product API and sends it a write and a read
)


def build(connector: ConnectorSpec, config: Any, options: AdapterOptions) -> Adapter:
    from reach_graphql.adapter import GraphqlAdapter

    return GraphqlAdapter(connector, config, options)
