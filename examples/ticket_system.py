"""The demo's ticket system, runnable from a checkout: ``python examples/ticket_system.py [PORT]``.

Its code ships inside the package, so ``reach demo`` finds it after a plain ``pip install``:
``workers/ops/demo_assets/ticket_system.py`` is the source (read that one); this file only runs it.
"""

from __future__ import annotations

import sys
from pathlib import Path

try:
    from workers.ops.demo_assets.ticket_system import TicketState, TicketSystem, main
except ModuleNotFoundError:  # a checkout where agent-reach is not installed: the package is beside examples/
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from workers.ops.demo_assets.ticket_system import TicketState, TicketSystem, main

__all__ = ["TicketState", "TicketSystem", "main"]

if __name__ == "__main__":
    main()
