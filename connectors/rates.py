"""Rate limits as the catalog writes them (``10/min``) and as the fleet counts them."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

RATE_LIMIT = re.compile(r"^\s*(\d+)\s*/\s*(sec|min|hour)\s*$")
_PERIOD_MS = {"sec": 1000, "min": 60_000, "hour": 3_600_000}


@dataclass(frozen=True)
class Rate:
    count: int
    period_ms: int

    @property
    def interval_ms(self) -> float:
        return self.period_ms / self.count


@lru_cache(maxsize=4096)
def parse_rate(text: str) -> Rate:
    """``"10/min"`` -> Rate(10, 60000); ValueError for anything else."""
    match = RATE_LIMIT.match(text)
    if not match or int(match.group(1)) < 1:
        raise ValueError(f"rate_limit {text!r} must look like 10/sec, 10/min or 10/hour")
    return Rate(int(match.group(1)), _PERIOD_MS[match.group(2)])
