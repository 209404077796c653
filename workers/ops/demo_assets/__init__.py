"""What ``reach demo`` brings along, shipped inside the package so the demo runs from any
directory after a plain ``pip install``: the demo catalog (``catalog/tickets.yaml``) and the
ticket system behind it (``ticket_system``). They are the source; ``examples/`` in the
repository points here (``examples/README.md``)."""

from __future__ import annotations

from pathlib import Path

CATALOG_DIR = Path(__file__).resolve().parent / "catalog"
