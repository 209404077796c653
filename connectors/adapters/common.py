"""What the HTTP-based adapters (http, soap) share: values shaped the way a system expects
them, header safety, a client that keeps no cookies, and the check of declared output."""

from __future__ import annotations

import json
import re
from datetime import date, datetime
from typing import Any
from zoneinfo import ZoneInfo

import httpx

from connectors.adapters.errors import Unsendable
from connectors.schema import Check, FieldProblem, Problems, compile_field
from connectors.spec import ConnectorSpec, FieldSpec

OMIT = object()  # a null the system wants left out (``null_as: omit``)


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def header_safe(text: str) -> bool:
    """What HTTP/1.1 allows in a field value: visible ASCII, inner spaces, no edges of blank."""
    return text.isascii() and text == text.strip(" \t") and _CONTROL.search(text) is None


def scalar_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return str(value)


def convert_for_system(value: Any, spec: FieldSpec, name: str | None = None) -> Any:
    """Agent value -> what the legacy system expects (null_as, format/timezone, as: string).

    Raises :class:`Unsendable` (naming the param ``name``) for a valid value that cannot be
    shaped so: a date-time at the edge of the calendar whose instant in the field's ``timezone``
    falls outside years 1-9999 (``9999-12-31T23:00:00-10:00`` in Asia/Tokyo). Nothing was sent,
    and no retry or other system could take it: it is the agent's value, not the system's health.
    """
    if value is None:
        if spec.null_as == "omit":
            return OMIT
        if spec.null_as == "":
            return ""
        return None
    if spec.type == "datetime" and (spec.format or spec.timezone):
        moment = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
        if spec.timezone:
            try:
                moment = moment.astimezone(ZoneInfo(spec.timezone))
            except OverflowError as exc:
                raise Unsendable(
                    f"{value} is outside the years 1-9999 in the time zone {spec.timezone}, "
                    "so it cannot be written for the system",
                    name,
                    "format",
                    f"Send {name or 'the date-time'} as a moment within the years 1-9999 in {spec.timezone}.",
                ) from exc
        return moment.strftime(spec.format) if spec.format else moment.isoformat()
    if spec.type == "date" and spec.format:
        return date.fromisoformat(str(value)).strftime(spec.format)
    if spec.as_ == "string":
        return scalar_text(value)
    return value


class NoCookies(httpx.Cookies):
    """A cookie jar that keeps nothing: a pool's clients carry every agent's calls, so a cookie set by
    one call's answer must not ride along on the next agent's call (and Set-Cookie is never parsed)."""

    def extract_cookies(self, response: httpx.Response) -> None:
        pass

    def set_cookie_header(self, request: httpx.Request) -> None:
        pass


class CookielessClient(httpx.Client):
    """An httpx client without a cookie jar (see ``NoCookies``)."""

    @property
    def cookies(self) -> httpx.Cookies:
        return NO_COOKIES

    @cookies.setter
    def cookies(self, cookies: Any) -> None:
        pass  # there is no jar to set (httpx's own constructor fills ``_cookies``, which is never read)


NO_COOKIES = NoCookies()


def compile_outputs(connector: ConnectorSpec) -> dict[str, dict[str, Check]]:
    return {
        action.action: {name: compile_field(spec) for name, spec in (action.output or {}).items()}
        for action in connector.actions
    }


def check_output(checks: dict[str, Check], data: dict[str, Any]) -> list[dict[str, Any]]:
    problems = Problems()  # bounded: an answer with many stray keys must not cost a detail each
    for name, check in checks.items():
        if name not in data:
            problems.append(FieldProblem(name, "required", "is missing from the response"))
            continue
        check(data[name], name, problems)
    return [p.to_detail() for p in problems]
