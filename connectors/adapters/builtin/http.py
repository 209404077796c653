"""The ``http`` connector type (connectors/adapters/http.py)."""

from __future__ import annotations

from typing import Any

from connectors.adapters.base import Adapter, AdapterOptions
from connectors.adapters.builtin._errors import SHARED_ERRORS
from connectors.adapters.plugin import CONTRACT_VERSION, Guarantees, Manifest
from connectors.spec import ConnectorSpec
from producers.wire import ErrorCode

manifest = Manifest(
    type="http",
    contract_version=CONTRACT_VERSION,
    description="An HTTP/JSON API: one request per action, from the action's `path` template.",
    guarantees=Guarantees(idempotency_key=True, timeout_may_land=True),
    errors={
        **SHARED_ERRORS,
        "401 / 403": ErrorCode.DOWNSTREAM_AUTH_FAILED,
        "404": ErrorCode.DOWNSTREAM_NOT_FOUND,
        "409": ErrorCode.DOWNSTREAM_CONFLICT,
        "429": ErrorCode.DOWNSTREAM_RATE_LIMITED,
        "credentials the adapter cannot obtain": ErrorCode.CONNECTOR_UNAVAILABLE,
    },
    conformance="connectors.adapters.builtin.fixtures:http_fixture",
)


def build(connector: ConnectorSpec, config: Any, options: AdapterOptions) -> Adapter:
    from connectors.adapters.http import HttpAdapter

    kwargs: dict[str, Any] = {"environ": options.environ}
    if options.max_depth is not None:
        kwargs["max_depth"] = options.max_depth
    return HttpAdapter(connector, redis=options.redis, **kwargs, **options.extra)
