"""What every catalog model shares: the strict base, and the name rules several models check."""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict

NAME_PATTERN = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,63}$")  # action names
ROUTINE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}(\.[A-Za-z_][A-Za-z0-9_]{0,62})?$")
OPERATION_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,127}$")
# approver and owner names: people as the operators' identity system knows them (a login, an email)
PERSON_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@+-]{0,127}\Z")
HOURS_WINDOW = re.compile(r"^\s*(\d{2}):(\d{2})\s*-\s*(\d{2}):(\d{2})\s+(\S+)\s*$")


class Spec(BaseModel):
    """A catalog model: unknown keys are errors (a typo in YAML gets a line number), values frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


def check_hours(v: str | None) -> str | None:
    """``allowed_hours`` as written, if it is a window like ``08:00-22:00 Asia/Shanghai`` (else ValueError)."""
    if v is None:
        return v
    match = HOURS_WINDOW.match(v)
    if not match:
        raise ValueError(f"allowed_hours {v!r} must look like '08:00-22:00 Asia/Shanghai'")
    h1, m1, h2, m2, zone = match.groups()
    if int(h1) > 24 or int(h2) > 24 or int(m1) > 59 or int(m2) > 59:
        raise ValueError(f"allowed_hours {v!r} has an impossible time")
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    try:
        ZoneInfo(zone)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ValueError(f"allowed_hours {v!r}: unknown timezone {zone!r}") from exc
    return v
