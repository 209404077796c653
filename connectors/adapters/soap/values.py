"""A SOAP operation's result as plain JSON ``data``, bounded in nesting; texts bounded for a receipt."""

from __future__ import annotations

import base64
from datetime import date, datetime, timedelta
from datetime import time as clock_time
from decimal import Decimal
from typing import Any

import isodate
from lxml import etree

MAX_MESSAGE_CHARS = 500


class TooDeep(Exception):
    pass


def plain(value: Any, limit: int, depth: int) -> Any:
    """``value`` (zeep's result as dicts and lists) as JSON-safe values; raises TooDeep past
    ``limit`` levels of nesting (recursion bounded by the limit, not by the answer)."""
    if isinstance(value, dict):
        if depth >= limit:
            raise TooDeep
        return {str(k): plain(v, limit, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        if depth >= limit:
            raise TooDeep
        return [plain(v, limit, depth + 1) for v in value]
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if value == value and value not in (float("inf"), float("-inf")) else str(value)
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, (datetime, date, clock_time)):
        return value.isoformat()
    if isinstance(value, timedelta):
        return str(isodate.duration_isoformat(value))
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, etree._Element):  # xsd:any content: passed on as its XML text
        return str(etree.tostring(value, encoding="unicode"))
    return str(value)


def bounded(text: str) -> str:
    text = text.strip()
    return text if len(text) <= MAX_MESSAGE_CHARS else text[: MAX_MESSAGE_CHARS - 1] + "…"
