"""The benchmark's downstream "business system": the tests' fake downstream
(tests/integration/counting_system.py), run as a process of its own so its CPU is counted apart.

    POST /tickets, POST /anything     201 {"item_id": "IT-<n>", "title": ..., "status": "open"}
    any path under /slow/...          the same, after SLOW_SECONDS (default 2 s), +- up to the jitter
    GET /health                       200 {"ok": true}
    GET /_stats                       200 {"requests": <calls answered>, "slow": <slow calls>}

    python bench/downstream.py [PORT] [--slow SECONDS] [--slow-jitter SECONDS]    # prints "READY <port>" when listening
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.integration.counting_system import main  # noqa: E402

if __name__ == "__main__":
    main()
