"""The recovery figure of bench/recovery.py (issue 20): when a paced phase's sliding one-second p99
is back within 1.5 x of the steady state. The benchmark's numbers are only as good as this."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import recovery  # noqa: E402


def timeline(slow_until: float, slow_ms: float, fast_ms: float, seconds: float = 10.0) -> list[list[float]]:
    """100 intents a second; those sent before ``slow_until`` took ``slow_ms``."""
    return [[i / 100, slow_ms if i / 100 < slow_until else fast_ms] for i in range(int(seconds * 100))]


def test_a_tail_that_lasts_two_seconds_settles_when_its_last_window_ends() -> None:
    rec = recovery.recovery(timeline(2.0, 50.0, 5.0), 10.0, steady_p99=5.0)
    assert rec["limit_ms"] == 7.5
    assert rec["first_back_s"] == 2.0  # the first window holding only fast intents
    assert rec["settled_s"] == 2.9  # the window starting at 1.9 s still holds slow ones
    assert rec["first_windows_p99_ms"][:3] == [50.0, 50.0, 5.0]


def test_no_tail_means_no_recovery_time() -> None:
    rec = recovery.recovery(timeline(0.0, 50.0, 5.0), 10.0, steady_p99=5.0)
    assert (rec["first_back_s"], rec["settled_s"], rec["windows_over"]) == (0.0, 0.0, 0)


def test_a_tail_that_never_ends_is_not_called_recovered() -> None:
    rec = recovery.recovery(timeline(99.0, 50.0, 5.0), 10.0, steady_p99=5.0)
    assert rec["first_back_s"] is None
    assert rec["settled_s"] == 10.0


def test_one_slow_intent_in_a_hundred_does_not_move_a_window_p99() -> None:
    """Nearest-rank p99 of 100 intents is the 99th: a single outlier per second is not a tail."""
    points = [[i / 100, 500.0 if i % 100 == 0 else 5.0] for i in range(1000)]
    rec = recovery.recovery(points, 10.0, steady_p99=5.0)
    assert rec["settled_s"] == 0.0
