"""Pins the public surface of the producer SDK: changing it is a deliberate act."""

from __future__ import annotations

import producers


def test_public_surface_is_exactly_the_curated_names() -> None:
    assert sorted(producers.__all__) == [
        "ApprovalPending",
        "ErrorCode",
        "ErrorInfo",
        "Execution",
        "FormatError",
        "Intent",
        "Normalized",
        "ReachClient",
        "ReachError",
        "Receipt",
        "ReceiptTimeout",
        "ToolSpec",
        "export",
        "normalize",
        "to_anthropic",
        "to_mcp",
        "to_openai",
    ]


def test_every_exported_name_is_importable_and_public_modules_own_them() -> None:
    for name in producers.__all__:
        member = getattr(producers, name)
        assert member.__module__.startswith("producers."), name


def test_producers_imports_nothing_from_the_fleet_or_the_catalog() -> None:
    import subprocess
    import sys
    from pathlib import Path

    code = (
        "import sys, producers, producers.client, producers.formats, producers.tools\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('workers', 'connectors'))\n"
        "assert not bad, bad\n"
    )
    # a fresh interpreter: in this one, other tests may already have imported the fleet
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[2])
