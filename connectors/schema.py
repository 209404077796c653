"""Checking an agent's params against an action's declared input, and describing it as JSON Schema.

A validator is compiled once per action, on the action's first intent, so the router does no
per-intent model building and a large catalog costs memory only for the actions in use. Problems
come back as data (one ``FieldProblem`` per field), never as exceptions, so the receipt can name
every mistake at once (the first ``max_problems`` of them; the rest are counted, for "and K more").
"""

from __future__ import annotations

import base64
import binascii
import difflib
import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any
from urllib.parse import quote

from connectors.patterns import compile_pattern
from connectors.spec import DEFAULT_FILE_BYTES, ActionSpec, FieldSpec, base64_chars

# Bounds on what a value may become on the wire, so an over-long one is the agent's mistake
# (VALIDATION_FAILED, named by field) and never a failed request:
MAX_PATH_SEGMENT_BYTES = (
    2048  # one path parameter, percent-encoded: URLs past ~2 KiB are refused by many proxies and CDNs
)
MAX_HEADER_VALUE_BYTES = 8192  # one header value: nginx, Apache and Node refuse a header line past 8 KiB
MAX_URL_BYTES = 8192  # path and query params together: common servers refuse a request line past 8 KiB
DEFAULT_MAX_PROBLEMS = 50  # problems kept per validation (the rest only counted), as REACH_MAX_DETAILS's default

_MISSING = object()
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


@dataclass(frozen=True)
class FieldProblem:
    field: str
    code: (
        str  # required | unknown | type | enum | min | max | min_length | max_length | pattern | null | format | header
    )
    message: str
    allowed: list[Any] | None = None

    def to_detail(self) -> dict[str, Any]:
        detail: dict[str, Any] = {"field": self.field, "code": self.code, "message": self.message}
        if self.allowed is not None:
            detail["allowed"] = self.allowed
        return detail


class Problems(list[FieldProblem]):
    """The problems found: the first ``limit`` kept, the rest only counted in ``total``.

    Params with many unknown keys must not cost a problem object each."""

    def __init__(self, limit: int | None = DEFAULT_MAX_PROBLEMS) -> None:
        super().__init__()
        self.limit = limit
        self.total = 0

    @property
    def full(self) -> bool:
        return self.limit is not None and len(self) >= self.limit

    @property
    def more(self) -> int:
        """Problems counted but not kept (the "and K more")."""
        return self.total - len(self)

    def append(self, problem: FieldProblem) -> None:
        self.total += 1
        if not self.full:
            super().append(problem)


def problem_count(problems: list[FieldProblem]) -> int:
    """All the problems found, including those a ``Problems`` only counted."""
    return problems.total if isinstance(problems, Problems) else len(problems)


Check = Callable[[Any, str, list[FieldProblem]], Any]


def compile_field(spec: FieldSpec, in_header: bool = False, hidden: bool = False) -> Check:
    """Build the check for one field: returns the (possibly normalised) value, appends problems.

    ``hidden``: an enclosing field is sensitive, so this one's values are never echoed either.
    """
    kind = spec.type
    pattern = compile_pattern(spec.pattern) if spec.pattern else None
    show = not (spec.sensitive or hidden)  # sensitive values are never echoed back
    items = compile_field(spec.items, hidden=not show) if spec.items is not None else None
    props = (
        {k: (compile_field(v, hidden=not show), v) for k, v in spec.properties.items()}
        if spec.properties is not None
        else None
    )

    def bad(
        problems: list[FieldProblem], where: str, code: str, message: str, allowed: list[Any] | None = None
    ) -> None:
        problems.append(FieldProblem(where, code, message, allowed))

    def check(value: Any, where: str, problems: list[FieldProblem]) -> Any:
        if value is None:
            if not spec.nullable:
                bad(problems, where, "null", "must not be null")
            return None
        if kind == "string":
            if not isinstance(value, str):
                return bad(problems, where, "type", f"must be a string, got {json_type(value)}")
            _check_length(value, where, problems, "characters")
            if spec.in_ == "file":
                _check_file(value, where, problems)
            if pattern is not None and not pattern.search(value):  # RE2: linear in len(value)
                bad(
                    problems,
                    where,
                    "pattern",
                    f"must match the pattern {spec.pattern}" + (f" (got {value[:60]!r})" if show else ""),
                )
            if in_header and (_CONTROL.search(value) or not value.isascii() or value != value.strip(" ")):
                bad(
                    problems,
                    where,
                    "header",
                    "must be plain ASCII without line breaks, control characters or surrounding spaces",
                )
            return value
        if kind == "integer":
            if isinstance(value, float) and not isinstance(value, bool) and value.is_integer():
                value = int(value)
            if not isinstance(value, int) or isinstance(value, bool):
                return bad(problems, where, "type", f"must be an integer, got {json_type(value)}")
            _check_range(value, where, problems)
            return value
        if kind == "number":
            if (
                not isinstance(value, (int, float))
                or isinstance(value, bool)
                or (isinstance(value, float) and not math.isfinite(value))
            ):
                return bad(problems, where, "type", f"must be a number, got {json_type(value)}")
            _check_range(value, where, problems)
            return value
        if kind == "boolean":
            if not isinstance(value, bool):
                return bad(problems, where, "type", f"must be true or false, got {json_type(value)}")
            return value
        if kind == "enum":
            values = spec.values or []
            if not any(value == v and type(value) is type(v) for v in values):
                got = f" (got {value!r})" if show and isinstance(value, (str, int, float)) else ""
                return bad(problems, where, "enum", f"must be one of {', '.join(map(str, values))}{got}", list(values))
            return value
        if kind == "datetime":
            if not isinstance(value, str):
                return bad(problems, where, "type", f"must be an ISO 8601 date-time string, got {json_type(value)}")
            try:
                parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
            except ValueError:
                return bad(problems, where, "format", "must be an ISO 8601 date-time such as 2024-06-15T10:00:00+08:00")
            if parsed.tzinfo is None:
                bad(problems, where, "format", "must include a timezone offset, e.g. 2024-06-15T10:00:00Z")
            return value
        if kind == "date":
            if not isinstance(value, str):
                return bad(problems, where, "type", f"must be a date string YYYY-MM-DD, got {json_type(value)}")
            try:
                date.fromisoformat(value)
            except ValueError:
                return bad(problems, where, "format", "must be a date such as 2024-06-15")
            return value
        if kind == "array":
            if not isinstance(value, list):
                return bad(problems, where, "type", f"must be an array, got {json_type(value)}")
            _check_length(value, where, problems, "items")
            assert items is not None
            return [items(v, f"{where}[{i}]", problems) for i, v in enumerate(value)]
        # object
        if not isinstance(value, dict):
            return bad(problems, where, "type", f"must be an object, got {json_type(value)}")
        if props is None:
            return value
        return _check_object(value, props, where + ".", problems)

    def _check_file(value: str, where: str, problems: list[FieldProblem]) -> None:
        # base64 text of at most max_bytes: its length is checked before anything decodes it
        limit = spec.max_bytes or DEFAULT_FILE_BYTES
        if len(value) > base64_chars(limit):
            bad(
                problems,
                where,
                "max_length",
                f"must be at most {limit} bytes once decoded (got {len(value)} base64 characters)",
            )
            return
        try:
            size = len(base64.b64decode(value.encode("ascii"), validate=True))
        except (binascii.Error, UnicodeEncodeError):
            bad(
                problems,
                where,
                "format",
                "must be the file's bytes as standard base64 text (A-Z a-z 0-9 + /, padded with =)",
            )
            return
        if size > limit:
            bad(problems, where, "max_length", f"must be at most {limit} bytes once decoded (got {size})")

    def _check_length(value: Any, where: str, problems: list[FieldProblem], unit: str) -> None:
        if spec.min_length is not None and len(value) < spec.min_length:
            bad(problems, where, "min_length", f"must have at least {spec.min_length} {unit}")
        if spec.max_length is not None and len(value) > spec.max_length:
            bad(problems, where, "max_length", f"must have at most {spec.max_length} {unit} (got {len(value)})")

    def _check_range(value: float, where: str, problems: list[FieldProblem]) -> None:
        if spec.min is not None and value < spec.min:
            bad(problems, where, "min", f"must be at least {spec.min:g}")
        if spec.max is not None and value > spec.max:
            bad(problems, where, "max", f"must be at most {spec.max:g}")

    return check


def _check_object(
    value: dict[str, Any], fields: dict[str, tuple[Check, FieldSpec]], prefix: str, problems: list[FieldProblem]
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in value:
        if key not in fields:
            if isinstance(problems, Problems) and problems.full:
                problems.total += 1  # counted only: no hint worked out for a problem nobody will see
                continue
            close = difflib.get_close_matches(str(key), list(fields), n=1)
            hint = f"; did you mean {close[0]}?" if close else f"; declared: {', '.join(fields) or 'none'}"
            problems.append(FieldProblem(f"{prefix}{key}", "unknown", f"is not a parameter of this action{hint}"))
    for name, (check, spec) in fields.items():
        raw = value.get(name, _MISSING)
        if raw is _MISSING:
            if spec.required:
                problems.append(FieldProblem(f"{prefix}{name}", "required", "is required"))
            elif spec.default is not None:
                out[name] = spec.default
            continue
        out[name] = check(raw, f"{prefix}{name}", problems)
    return out


class ParamValidator:
    """Compiled checks for one action's input, compiled on first use and kept for later intents.

    Compiling on demand spares each process the actions it never sees (a pool runs only its own)."""

    def __init__(self, action: ActionSpec) -> None:
        self._action = action
        self._compiled: tuple[dict[str, tuple[Check, FieldSpec]], set[str], dict[str, str]] | None = None

    def _compile(self) -> tuple[dict[str, tuple[Check, FieldSpec]], set[str], dict[str, str]]:
        # two threads may both compile on a first use; either result is the same, and kept
        fields = {
            name: (compile_field(spec, in_header=spec.in_ == "header"), spec)
            for name, spec in self._action.input.items()
        }
        path_params = set(re.findall(r"\{([^{}]*)\}", self._action.template))  # "" for non-HTTP actions
        # where the HTTP adapter puts each field, for those whose size the URL or a header bounds
        default_place = "query" if self._action.method in ("GET", "DELETE") else "body"
        places = {
            name: spec.in_ or ("path" if name in path_params else default_place)
            for name, spec in self._action.input.items()
        }
        self._compiled = fields, path_params, {n: p for n, p in places.items() if p in ("path", "query", "header")}
        return self._compiled

    def validate(
        self, params: dict[str, Any], max_problems: int | None = DEFAULT_MAX_PROBLEMS
    ) -> tuple[dict[str, Any], Problems]:
        """Check params against the action's input.

        Args:
            params: the agent's params.
            max_problems: how many problems to keep; past it they are only counted. None keeps all.

        Returns:
            The params with defaults applied, and the problems (empty when valid); ``problems.total``
            counts those not kept too.
        """
        fields, path_params, places = self._compiled or self._compile()
        problems = Problems(max_problems)
        cleaned = _check_object(params, fields, "", problems)
        for name in path_params:
            # an empty path segment would change the path's shape
            if cleaned.get(name) in ("", None) and not _has_own_problem(name, params, fields):
                problems.append(FieldProblem(name, "min_length", "is a path parameter and must not be empty"))
        _check_wire_sizes(cleaned, places, problems)
        return cleaned, problems


def _has_own_problem(name: str, params: dict[str, Any], fields: dict[str, tuple[Check, FieldSpec]]) -> bool:
    """Whether the field's own check found a problem (asked again: the kept problems may not show it)."""
    if name not in fields:
        return False
    check, spec = fields[name]
    if name not in params:
        return spec.required
    found: list[FieldProblem] = []
    check(params[name], name, found)
    return bool(found)


def _wire_text(value: Any) -> str:
    """A value as the HTTP adapter writes it into a URL or header."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return str(value)


def _encoded_bytes(value: Any, limit: int) -> int:
    """Bytes of ``value`` percent-encoded; past ``limit`` the exact figure does not matter (not worked out)."""
    try:
        text = _wire_text(value)
    except (RecursionError, ValueError, TypeError):
        return limit + 1  # cannot even be written out: over any bound
    return len(text) if len(text) > limit else len(quote(text, safe=""))


def _check_wire_sizes(cleaned: dict[str, Any], places: dict[str, str], problems: Problems) -> None:
    """Bound what path, query and header params become on the wire (see the MAX_* constants)."""
    flagged = {p.field for p in problems}
    url_bytes: dict[str, int] = {}
    for name, place in places.items():
        value = cleaned.get(name)
        if value is None or name in flagged:
            continue
        if place == "header":
            size = len(_wire_text(value).encode("utf-8", "replace"))
            if size > MAX_HEADER_VALUE_BYTES:
                problems.append(
                    FieldProblem(
                        name,
                        "max_length",
                        f"is a header value and must be at most {MAX_HEADER_VALUE_BYTES} bytes (got {size})",
                    )
                )
            continue
        size = _encoded_bytes(value, MAX_URL_BYTES)
        if place == "path" and size > MAX_PATH_SEGMENT_BYTES:
            problems.append(
                FieldProblem(
                    name,
                    "max_length",
                    f"is a path parameter and must be at most "
                    f"{MAX_PATH_SEGMENT_BYTES} bytes once URL-encoded (got {size})",
                )
            )
            continue
        url_bytes[name] = size + (len(name) + 2 if place == "query" else 0)
    if sum(url_bytes.values()) > MAX_URL_BYTES:
        biggest = max(url_bytes, key=url_bytes.__getitem__)
        problems.append(
            FieldProblem(
                biggest,
                "max_length",
                f"makes the URL too long: path and query params together "
                f"must stay within {MAX_URL_BYTES} bytes once URL-encoded "
                f"(got {sum(url_bytes.values())})",
            )
        )


def default_problems(action: ActionSpec) -> list[tuple[str, str]]:
    """(field, message) for each input whose ``default`` breaks its own declaration: such a
    default would be sent downstream for every intent that leaves the field out."""
    found: list[tuple[str, str]] = []
    for name, spec in action.input.items():
        if spec.default is None:
            continue
        problems: list[FieldProblem] = []
        compile_field(spec, in_header=spec.in_ == "header")(spec.default, name, problems)
        found.extend((name, p.message) for p in problems)
    return found


def suggestion_for(problems: list[FieldProblem]) -> str:
    parts = [f"{p.field} {p.message}" for p in problems[:8]]
    total = problem_count(problems)
    more = f" (and {total - 8} more)" if total > 8 else ""
    return "Fix these params and send the intent again: " + "; ".join(parts) + more + "."


# -- JSON Schema: how a catalog field is said there. Tool schemas are written with these words and
# the OpenAPI importer (connectors/openapi/) reads a system's own schemas with them.

JSON_SCALARS = ("string", "integer", "number", "boolean")  # the same type word in both
STRING_FORMATS = {"datetime": "date-time", "date": "date"}  # catalog type -> the format of its JSON string
CATALOG_TYPE_OF_FORMAT = {fmt: kind for kind, fmt in STRING_FORMATS.items()}


def bound_keywords(kind: str) -> dict[str, str]:
    """Each bound of a field of type ``kind`` (``min``, ``max_length``, ...) -> its JSON Schema keyword."""
    low, high = ("minItems", "maxItems") if kind == "array" else ("minLength", "maxLength")
    return {"min": "minimum", "max": "maximum", "min_length": low, "max_length": high}


def json_type(value: Any) -> str:
    """The JSON Schema type word of a decoded JSON value (the Python type's name for anything else)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def common_json_type(values: list[Any]) -> str | None:
    """The type word every one of ``values`` has (an enum's ``type``), or None when they differ or are none."""
    kinds = {json_type(v) for v in values}
    return kinds.pop() if len(kinds) == 1 else None


def field_json_schema(spec: FieldSpec) -> dict[str, Any]:
    """JSON Schema for one field, as tool schemas (OpenAI, Anthropic, MCP) expect."""
    schema: dict[str, Any]
    if spec.type in JSON_SCALARS:
        schema = {"type": spec.type}
    elif spec.type == "enum":
        values = list(spec.values or [])
        kind = common_json_type(values)
        schema = {"type": kind, "enum": values} if kind else {"enum": values}
    elif spec.type in STRING_FORMATS:
        schema = {"type": "string", "format": STRING_FORMATS[spec.type]}
    elif spec.type == "array":
        assert spec.items is not None
        schema = {"type": "array", "items": field_json_schema(spec.items)}
    else:
        schema = {"type": "object"}
        if spec.properties is not None:
            schema.update(object_json_schema(spec.properties))
    if spec.description:
        schema["description"] = spec.description
    if spec.default is not None:
        schema["default"] = spec.default
    for key, keyword in bound_keywords(spec.type).items():
        if getattr(spec, key) is not None:
            schema[keyword] = getattr(spec, key)
    if spec.pattern is not None:
        schema["pattern"] = spec.pattern
    if spec.in_ == "file":  # the agent sends the file's bytes as base64 text
        schema["contentEncoding"] = "base64"
        if spec.content_type:
            schema["contentMediaType"] = spec.content_type
        limit = base64_chars(spec.max_bytes or DEFAULT_FILE_BYTES)
        schema["maxLength"] = min(schema.get("maxLength", limit), limit)
    if spec.nullable and "type" in schema:
        schema["type"] = [schema["type"], "null"]
    return schema


def object_json_schema(fields: dict[str, FieldSpec]) -> dict[str, Any]:
    """JSON Schema for an action's input (or an object field's properties): no undeclared keys."""
    return {
        "type": "object",
        "properties": {name: field_json_schema(spec) for name, spec in fields.items()},
        "required": [name for name, spec in fields.items() if spec.required],
        "additionalProperties": False,
    }
