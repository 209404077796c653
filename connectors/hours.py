"""``allowed_hours: "08:00-22:00 Asia/Shanghai"``: when an action (or a binding) may run.

A window whose end is before its start runs across midnight ("22:00-06:00 Europe/Berlin").
"24:00" as an end means midnight at the end of the day.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import lru_cache
from zoneinfo import ZoneInfo

from connectors.spec import HOURS_WINDOW


@dataclass(frozen=True)
class TimeWindow:
    start_min: int  # minutes after local midnight
    end_min: int
    zone: ZoneInfo
    text: str

    def _minute(self, now: datetime) -> tuple[int, datetime]:
        local = now.astimezone(self.zone)
        return local.hour * 60 + local.minute, local

    def is_open(self, now: datetime) -> bool:
        minute, _ = self._minute(now)
        if self.start_min == self.end_min:
            return True  # "00:00-24:00" or an equal start and end: always
        if self.start_min < self.end_min:
            return self.start_min <= minute < self.end_min
        return minute >= self.start_min or minute < self.end_min  # across midnight

    def ms_until_open(self, now: datetime) -> int:
        """Milliseconds until the window next opens (0 when open now)."""
        if self.is_open(now):
            return 0
        _, local = self._minute(now)
        opening = local.replace(hour=self.start_min // 60, minute=self.start_min % 60, second=0, microsecond=0)
        if opening <= local:
            opening += timedelta(days=1)
        # wall-clock arithmetic in the zone, converted back: DST days are handled by zoneinfo
        opening = opening.replace(tzinfo=self.zone)
        return max(0, int((opening - now).total_seconds() * 1000))


@lru_cache(maxsize=1024)
def parse_window(text: str) -> TimeWindow:
    match = HOURS_WINDOW.match(text)
    if not match:
        raise ValueError(f"allowed_hours {text!r} must look like '08:00-22:00 Asia/Shanghai'")
    h1, m1, h2, m2, zone = match.groups()
    start, end = int(h1) * 60 + int(m1), int(h2) * 60 + int(m2)
    if start == 24 * 60:
        start = 0
    if end == 24 * 60 and start == 0:
        end = 0  # the whole day
    elif end == 24 * 60:
        end = 0  # until midnight: the across-midnight form with an empty morning
    return TimeWindow(start, end, ZoneInfo(zone), text)
