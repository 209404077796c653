"""Durations as connector authors write them: ``50ms``, ``5s``, ``2m``, ``1h``, ``90d``."""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BeforeValidator, PlainSerializer

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}  # d: history retention


def parse_duration(text: str) -> float:
    """Return the duration in seconds.

    Raises:
        ValueError: the text is not a number followed by ms, s, m or h.
    """
    match = _DURATION.match(text) if isinstance(text, str) else None
    if not match:
        raise ValueError(f"{text!r} is not a duration; write it like 50ms, 5s, 2m, 1h or 30d")
    seconds = float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    if seconds <= 0:
        raise ValueError(f"{text!r} must be longer than zero")
    return seconds


def format_duration(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1000:g}ms"
    return f"{seconds:g}s"


def _coerce(value: Any) -> float:
    if isinstance(value, float) and not isinstance(value, bool):
        return value  # already parsed (model_copy, tests)
    if not isinstance(value, str):
        raise ValueError(f"{value!r} is not a duration; durations are strings like 50ms, 5s, 2m")
    return parse_duration(value)


Duration = Annotated[float, BeforeValidator(_coerce), PlainSerializer(format_duration, return_type=str)]
"""Seconds as a float in code, a string like ``5s`` in YAML."""
