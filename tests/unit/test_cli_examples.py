"""examples/ keeps working for someone reading the repository, and never drifts from what
``reach demo`` ships in the package (workers/ops/demo_assets/ is the source)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from connectors.catalog import build
from connectors.loader import load_directory
from workers.ops.demo_assets import CATALOG_DIR

REPO = Path(__file__).resolve().parents[2]


def test_examples_ticket_system_help_exits_0_and_describes_the_port() -> None:
    done = subprocess.run(
        [sys.executable, "examples/ticket_system.py", "--help"],
        cwd=REPO,
        capture_output=True,
        check=False,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    assert "usage: ticket_system.py" in done.stdout and "port" in done.stdout


def test_examples_ticket_system_is_the_packaged_one() -> None:
    from examples.ticket_system import TicketSystem
    from workers.ops.demo_assets.ticket_system import TicketSystem as Packaged

    assert TicketSystem is Packaged


def test_the_examples_catalog_is_a_copy_of_the_packaged_demo_catalog() -> None:
    ours = (REPO / "examples" / "catalog" / "tickets.yaml").read_bytes()
    assert ours == (CATALOG_DIR / "tickets.yaml").read_bytes(), (
        "examples/catalog/tickets.yaml differs from workers/ops/demo_assets/catalog/tickets.yaml (the source): "
        "cp workers/ops/demo_assets/catalog/tickets.yaml examples/catalog/tickets.yaml"
    )
    assert sorted(p.name for p in (REPO / "examples" / "catalog").iterdir()) == ["tickets.yaml"]


def test_the_packaged_demo_catalog_is_valid() -> None:
    catalog, problems = build(load_directory(CATALOG_DIR))
    assert not problems
    assert set(catalog.connectors) == {"local_ticket_system", "warehouse", "shop"}
    assert catalog.connectors["warehouse"].type == "amqp"  # the demo shows a system that is not REST
    assert set(catalog.agents) == {"ticket_desk_bot", "ticket_qa_bot", "stock_bot", "refund_bot"}
    assert set(catalog.workflows) == {"refund_order"}  # and a workflow (tests/unit/test_demo_workflow.py)
