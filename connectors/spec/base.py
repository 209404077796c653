"""What every catalog model shares: the strict base, and the names and values several models check."""

from __future__ import annotations

import re
from typing import Annotated
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import AfterValidator, BaseModel, ConfigDict

from producers.wire import AGENT_ID_PATTERN, NAME_RULE

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
    try:
        check_zone(zone)
    except ValueError as exc:
        raise ValueError(f"allowed_hours {v!r}: {exc}") from exc
    return v


def check_zone(zone: str) -> str:
    """``zone`` if it names an IANA timezone (else ValueError)."""
    try:
        ZoneInfo(zone)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ValueError(f"unknown timezone {zone!r}; use an IANA name such as Asia/Shanghai") from exc
    return zone


def _approver_group(name: str) -> str:
    if not AGENT_ID_PATTERN.match(name):
        raise ValueError(f"approver group {name!r} must be {NAME_RULE}")
    return name


def _person(name: str) -> str:
    if not PERSON_PATTERN.match(name):
        raise ValueError(f"{name!r} must be 1-128 letters, digits or . _ @ + - (a login or an email)")
    return name


# an approver group's name (an ``approvers:`` document defines it, approvals name it)
ApproverGroup = Annotated[str, AfterValidator(_approver_group)]
Person = Annotated[str, AfterValidator(_person)]
