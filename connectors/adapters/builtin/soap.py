"""The ``soap`` connector type (connectors/adapters/soap/)."""

from __future__ import annotations

from typing import Any

from connectors.adapters.base import Adapter, AdapterOptions
from connectors.adapters.builtin._errors import SHARED_ERRORS
from connectors.adapters.plugin import CONTRACT_VERSION, Guarantees, Manifest
from connectors.spec import ConnectorSpec
from producers.wire import ErrorCode

manifest = Manifest(
    type="soap",
    contract_version=CONTRACT_VERSION,
    description="A SOAP service: one WSDL operation per action, called with zeep.",
    guarantees=Guarantees(idempotency_key=True, timeout_may_land=True),
    errors={
        **SHARED_ERRORS,
        "HTTP 401 / 403": ErrorCode.DOWNSTREAM_AUTH_FAILED,
        "HTTP 429": ErrorCode.DOWNSTREAM_RATE_LIMITED,
        "credentials the adapter cannot obtain": ErrorCode.CONNECTOR_UNAVAILABLE,
    },
    conformance="connectors.adapters.builtin.soap_fixture:soap_fixture",
)


def build(connector: ConnectorSpec, config: Any, options: AdapterOptions) -> Adapter:
    from connectors.adapters.soap import SoapAdapter

    return SoapAdapter(connector, options)


def problems(connector: ConnectorSpec) -> list[str]:
    """The operations and params checked against the WSDL."""
    from connectors.adapters.soap import wsdl_problems

    return wsdl_problems(connector)
