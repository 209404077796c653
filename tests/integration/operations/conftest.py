"""The operations tests' fixtures: one fleet, its ticket systems and a Prometheus server per test module."""

from tests.integration.operations.support import (  # noqa: F401  (fixtures pytest finds here)
    client,
    fleet,
    plain,
    prometheus,
    prometheus_installed,
    systems,
    tickets,
)
