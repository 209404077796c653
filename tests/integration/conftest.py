"""Markers of the integration tier."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "broker_restart: restarts the RabbitMQ application (every vhost on the machine notices); "
        "short, and part of the normal suite",
    )
