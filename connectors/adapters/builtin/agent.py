"""The ``agent`` connector type (connectors/adapters/agent.py)."""

from __future__ import annotations

from typing import Any

from connectors.adapters.base import Adapter, AdapterOptions
from connectors.adapters.builtin._errors import SHARED_ERRORS
from connectors.adapters.plugin import CONTRACT_VERSION, Guarantees, Manifest
from connectors.spec import ConnectorSpec
from producers.wire import ErrorCode

manifest = Manifest(
    type="agent",
    contract_version=CONTRACT_VERSION,
    description="Another agent of the fleet answers the connector's actions over the fleet's broker.",
    guarantees=Guarantees(idempotency_key=True, timeout_may_land=True),
    errors={
        **SHARED_ERRORS,
        "the answering agent's own error code": ErrorCode.DOWNSTREAM_ERROR,
        "a call that would loop back through agents": ErrorCode.VALIDATION_FAILED,
    },
    conformance="connectors.adapters.builtin.amqp_fixture:agent_fixture",
)


def build(connector: ConnectorSpec, config: Any, options: AdapterOptions) -> Adapter:
    from connectors.adapters.agent import AgentAdapter

    return AgentAdapter(connector, options)
