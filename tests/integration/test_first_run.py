"""A new user's first run: the package as pip installs it, a broker that never saw the fleet, an
operator's shell with only REACH_BROKER_URL and REACH_REDIS_URL."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
import zipfile
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

import pytest

from tests.fleet import BROKER_URL, REDIS_URL, REPO, Fleet

DEMO_ASSETS = (
    "workers/ops/demo_assets/__init__.py",
    "workers/ops/demo_assets/ticket_system.py",
    "workers/ops/demo_assets/catalog/tickets.yaml",
    "workers/ops/demo_assets/catalog/warehouse.yaml",
    "workers/ops/demo_assets/warehouse.py",
    "workers/ops/demo_assets/catalog/shop.yaml",
    "workers/ops/demo_assets/shop.py",
)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(REPO), "--no-deps", "-q", "-w", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (found,) = out.glob("agent_reach-*.whl")
    return found


@pytest.fixture
def fresh_vhost() -> Iterator[str]:
    """A broker URL whose vhost was created just now: no exchange, no queue of the fleet's."""
    assert shutil.which("rabbitmqctl"), "rabbitmqctl is needed next to the broker (`bash .ci/test` installs it)"
    parts = urlsplit(BROKER_URL)
    vhost = f"reach-first-run-{uuid.uuid4().hex[:8]}"
    subprocess.run(["rabbitmqctl", "add_vhost", vhost], check=True, capture_output=True, timeout=60)
    try:
        subprocess.run(
            ["rabbitmqctl", "set_permissions", "-p", vhost, parts.username or "guest", ".*", ".*", ".*"],
            check=True,
            capture_output=True,
            timeout=60,
        )
        yield urlunsplit(parts._replace(path="/" + quote(vhost, safe="")))
    finally:
        subprocess.run(["rabbitmqctl", "delete_vhost", vhost], capture_output=True, timeout=60, check=False)


def test_the_wheel_carries_what_the_demo_needs(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    assert set(DEMO_ASSETS) <= names, sorted(set(DEMO_ASSETS) - names)


def test_the_demo_from_the_wheel_passes_in_another_directory_on_a_vhost_never_seen(
    wheel: Path, fresh_vhost: str, tmp_path: Path
) -> None:
    installed = tmp_path / "site-packages"
    zipfile.ZipFile(wheel).extractall(installed)  # a pure-Python wheel: unpacked is installed
    elsewhere = tmp_path / "somewhere-else"
    elsewhere.mkdir()
    env = dict(os.environ, PYTHONPATH=str(installed), REACH_BROKER_URL=fresh_vhost, REACH_REDIS_URL=REDIS_URL)
    env.pop("REACH_CATALOG", None)
    where = subprocess.run(
        [sys.executable, "-c", "import workers; print(workers.__file__)"],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert where.stdout.startswith(str(installed)), where  # the wheel's code, not the checkout's
    done = subprocess.run(
        [sys.executable, "-m", "workers.cli", "demo"],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert "all receipts as expected" in lines
    assert "started reach workflows" in done.stdout  # the runner came up on the new vhost too
    # the workflow: one run through, one whose last step failed and whose steps before it were undone
    assert "run 1: refund_order order_id=ORD-1001 -> succeeded; refund_id=RF-ORD-1001, amount=42.0" in lines
    (failed,) = [line for line in lines if line.startswith("run 2: refund_order order_id=ORD-1002 -> failed; ")]
    assert "STEP_FAILED" in failed and "notify" in failed and "DOWNSTREAM_VALIDATION_FAILED" in failed
    steps = [line.split() for line in lines if line.split()[:1] in (["1"], ["2"]) and len(line.split()) == 5]
    assert steps == [
        ["1", "hold", "succeeded", "-", "no"],
        ["1", "refund", "succeeded", "-", "no"],
        ["1", "notify", "succeeded", "-", "no"],
        ["2", "hold", "succeeded", "-", "yes"],
        ["2", "refund", "succeeded", "-", "yes"],
        ["2", "notify", "failed", "DOWNSTREAM_VALIDATION_FAILED", "no"],
    ]
    # the GraphQL plugin (.ci/bootstrap.sh installs it in the venv this runs in) takes part through
    # its manifest's demo hook: its system, a pool for its connector and its two rows in the table
    assert any(
        line.startswith("plugin graphql (reach-graphql ") and "product API (GraphQL) on http://127.0.0.1:" in line
        for line in lines
    ), done.stdout + done.stderr
    assert "started reach worker products" in done.stdout
    rows = [" ".join(line.split()[1:]) for line in lines if line.split()[1:2] == ["catalog_bot"]]
    assert rows == [
        "catalog_bot products.create_product sku=P-2 name=Teapot price=30 succeeded - sku=P-2, name=Teapot, price=30.0",
        "catalog_bot products.get_product sku=P-1 succeeded - sku=P-1, name=Kettle, price=25.0",
    ]
    assert lines[lines.index("all receipts as expected") - 2].endswith(
        "could not email the customer of ORD-1002, cancelled RF-ORD-1002, released H-ORD-1002"
    )


def test_status_without_a_catalog_lists_the_connectors_of_a_running_fleet(tmp_path: Path) -> None:
    names = [f"first_{uuid.uuid4().hex[:6]}", f"second_{uuid.uuid4().hex[:6]}"]
    catalog = "\n---\n".join(
        f"connector:\n  name: {name}\n  endpoint: http://127.0.0.1:9\n  actions:\n"
        f"    - {{action: ping, path: GET /ping, permission: read}}"
        for name in names
    )
    fleet = Fleet(catalog, names).start()
    try:
        operator = {k: v for k, v in fleet.env.items() if k != "REACH_CATALOG"}
        for args in (["status", "--json"], ["status"]):
            done = subprocess.run(
                [sys.executable, "-m", "workers.cli", *args],
                cwd=tmp_path,
                env=operator,
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert done.returncode == 0, done.stderr
            assert "showing the connectors found in Redis" in done.stderr
            if "--json" in args:
                rows = {row["connector"]: row for row in json.loads(done.stdout)}
                assert set(names) <= set(rows)
                assert all(rows[name]["consumers"] == 1 and rows[name]["workers"] >= 1 for name in names)
            else:
                listed = [line.split()[0] for line in done.stdout.splitlines()[2:]]
                assert set(names) <= set(listed)
    finally:
        fleet.stop()


def test_a_fleet_without_pools_starts_on_a_vhost_never_seen(fresh_vhost: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import tests.fleet as harness

    monkeypatch.setattr(harness, "BROKER_URL", fresh_vhost)
    fleet = Fleet(
        "connector:\n  name: unused\n  endpoint: http://127.0.0.1:9\n  actions:\n"
        "    - {action: ping, path: GET /ping, permission: read}\n",
        [],
    )
    try:
        fleet.start()  # waits for the router's exchanges rather than failing without them
    finally:
        fleet.stop()
