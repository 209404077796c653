"""Shared fixtures. Integration tests need the real RabbitMQ and Redis that `bash .ci/test`
starts; when those are missing the tests FAIL (never skip), so a broken CI cannot look green."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.fleet import BROKER_URL, REDIS_URL, reachable  # noqa: E402


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "/integration/" in str(item.fspath):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(autouse=True)
def _services_for_integration(request: pytest.FixtureRequest) -> None:
    if request.node.get_closest_marker("integration") is None:
        return
    missing = [
        name
        for name, url, port in (("RabbitMQ", BROKER_URL, 5672), ("Redis", REDIS_URL, 6379))
        if not reachable(url, port)
    ]
    if missing:
        pytest.fail(
            f"{' and '.join(missing)} not reachable ({BROKER_URL}, {REDIS_URL}); "
            "run the suite with `bash .ci/test`, which starts them"
        )
