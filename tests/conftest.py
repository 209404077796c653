"""Shared fixtures. Integration tests need the real RabbitMQ and Redis that `bash .ci/test`
starts; when those are missing the tests FAIL (never skip), so a broken CI cannot look green."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.fleet import BROKER_URL, REDIS_URL, reachable  # noqa: E402
from workers.ops.local_fleet import LOCAL_PORTS  # noqa: E402


def _own_port_range() -> None:
    """Each xdist worker picks the ports of its fleets from a slice of its own: two workers that
    pick the same free port before either binds it would fail one start with a taken port."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")  # "gw0", "gw1", ...
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    index = int(worker[2:]) if worker[2:].isdigit() else 0
    width = (LOCAL_PORTS[1] - LOCAL_PORTS[0]) // max(count, 1)
    low = LOCAL_PORTS[0] + index * width
    os.environ.setdefault("REACH_LOCAL_PORTS", f"{low}-{low + width}")


_own_port_range()


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
