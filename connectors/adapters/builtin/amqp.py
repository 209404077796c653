"""The ``amqp`` connector type (connectors/adapters/amqp.py)."""

from __future__ import annotations

from typing import Any

from connectors.adapters.base import Adapter, AdapterOptions
from connectors.adapters.builtin._errors import SHARED_ERRORS
from connectors.adapters.plugin import CONTRACT_VERSION, Guarantees, Manifest
from connectors.spec import ConnectorSpec

manifest = Manifest(
    type="amqp",
    contract_version=CONTRACT_VERSION,
    description="A system behind its own AMQP broker: a message per action, with a reply when the action waits for one.",
    guarantees=Guarantees(idempotency_key=True, timeout_may_land=True),
    errors=dict(SHARED_ERRORS),
    conformance="connectors.adapters.builtin.amqp_fixture:amqp_fixture",
)


def build(connector: ConnectorSpec, config: Any, options: AdapterOptions) -> Adapter:
    from connectors.adapters.amqp import AmqpAdapter

    return AmqpAdapter(connector, options)
