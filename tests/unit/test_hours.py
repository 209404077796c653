"""allowed_hours windows."""

from __future__ import annotations

from datetime import datetime

import pytest

from connectors.hours import parse_window


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text + "+00:00")


@pytest.mark.parametrize(
    "window, moment, open_",
    [
        ("08:00-22:00 Asia/Shanghai", "2026-01-10T00:00:00", True),  # 08:00 local
        ("08:00-22:00 Asia/Shanghai", "2026-01-09T23:59:00", False),  # 07:59 local
        ("08:00-22:00 Asia/Shanghai", "2026-01-10T14:00:00", False),  # 22:00 local: end is exclusive
        ("22:00-06:00 Europe/Berlin", "2026-01-10T22:30:00", True),  # 23:30 local (winter, +01:00)
        ("22:00-06:00 Europe/Berlin", "2026-01-10T04:59:00", True),  # 05:59 local
        ("22:00-06:00 Europe/Berlin", "2026-01-10T05:00:00", False),  # 06:00 local
        ("08:00-24:00 UTC", "2026-01-10T23:59:00", True),
        ("08:00-24:00 UTC", "2026-01-10T07:00:00", False),
        ("00:00-24:00 UTC", "2026-01-10T03:00:00", True),
    ],
)
def test_window_is_open(window: str, moment: str, open_: bool) -> None:
    assert parse_window(window).is_open(utc(moment)) is open_


def test_ms_until_open_counts_to_the_next_opening_across_midnight() -> None:
    window = parse_window("22:00-06:00 UTC")
    assert window.ms_until_open(utc("2026-01-10T21:00:00")) == 3600 * 1000
    assert window.ms_until_open(utc("2026-01-10T23:00:00")) == 0
    morning = parse_window("08:00-09:00 UTC")
    assert morning.ms_until_open(utc("2026-01-10T10:00:00")) == 22 * 3600 * 1000


def test_ms_until_open_on_a_daylight_saving_day() -> None:
    # Berlin springs forward on 2026-03-29 at 02:00 local: 01:00 UTC -> 03:00 local
    window = parse_window("08:00-09:00 Europe/Berlin")
    # 2026-03-29T00:00Z is 01:00 local (+01:00); 08:00 local that day is 06:00Z (+02:00)
    assert window.ms_until_open(utc("2026-03-29T00:00:00")) == 6 * 3600 * 1000
