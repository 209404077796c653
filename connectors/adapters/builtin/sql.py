"""The ``sql`` connector type (connectors/adapters/sql/)."""

from __future__ import annotations

from typing import Any

from connectors.adapters.base import Adapter, AdapterOptions
from connectors.adapters.builtin._errors import SHARED_ERRORS
from connectors.adapters.plugin import CONTRACT_VERSION, Guarantees, Manifest
from connectors.spec import ConnectorSpec
from producers.wire import ErrorCode

manifest = Manifest(
    type="sql",
    contract_version=CONTRACT_VERSION,
    description="A PostgreSQL or MariaDB database: one stored procedure or function per action, in a transaction.",
    # a timed-out transaction is rolled back unless the commit itself was lost (then OUTCOME_UNKNOWN)
    guarantees=Guarantees(idempotency_key=False, timeout_may_land=False),
    errors={
        **SHARED_ERRORS,
        "a constraint the row breaks (unique, foreign key)": ErrorCode.DOWNSTREAM_CONFLICT,
        "the routine raised no_data_found": ErrorCode.DOWNSTREAM_NOT_FOUND,
        "the database refused the login": ErrorCode.DOWNSTREAM_AUTH_FAILED,
    },
    conformance="connectors.adapters.builtin.sql_fixture:sql_fixture",
)


def build(connector: ConnectorSpec, config: Any, options: AdapterOptions) -> Adapter:
    from connectors.adapters.sql import sql_adapter

    return sql_adapter(connector, options)


def problems(connector: ConnectorSpec) -> list[str]:
    """The connector's URL names a database the adapter speaks."""
    from connectors.adapters.sql import sql_problems

    return sql_problems(connector)
