"""Shapes -> catalog fields (type, bounds, defaults, nesting), for inputs and outputs.

What a field cannot say is noted (a comment above the action), never silently dropped.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from connectors.openapi.shapes import Shapes, free_form, names_in
from connectors.openapi.text import clean, described, flow_if_short, one_line, ordered, plain
from connectors.patterns import PatternError, compile_pattern
from connectors.schema import CATALOG_TYPE_OF_FORMAT, JSON_SCALARS, bound_keywords, compile_field
from connectors.spec import FieldSpec

MAX_SCHEMA_DEPTH = 8  # nested fields written per param; deeper (or circular) ones become a bare object
MAX_FIELD_DESCRIPTION = 512
_SECRET_NAME = re.compile(r"password|passwd|secret|token|api[-_]?key", re.IGNORECASE)


@dataclass
class Param:
    """One input of an operation, wherever the document declared it."""

    name: str  # the system's own name
    place: str  # path / query / header / body / file / whole_body
    schema: Any
    required: bool
    description: str | None
    deprecated: bool = False
    note: str | None = None  # how the system wants it serialised, when the adapter differs
    content_type: str | None = None  # file: the media type of its bytes, when the document names one


@dataclass(frozen=True)
class WithStack:
    """A body field's schema, with the refs followed to reach it (so a cycle through it is seen)."""

    schema: Any
    stack: tuple[str, ...]


class Fields:
    """Schemas -> catalog fields, for one operation."""

    def __init__(self, schemas: Shapes, notes: list[str], patch: bool) -> None:
        self.schemas = schemas
        self.notes = notes
        self.patch = patch

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    def input(self, param: Param, key: str) -> dict[str, Any] | None:
        """The field for one param (None for a read-only body field: the system sets it)."""
        if param.place == "file":
            return self._file(param, key)
        if isinstance(param.schema, WithStack):
            shape = self.schemas.shape(param.schema.schema, param.schema.stack)
        else:
            shape = self.schemas.shape(param.schema)
        in_body = param.place in ("body", "whole_body")
        if in_body and shape.get("readOnly") is True:
            return None
        where = key if key == param.name else f"{key} ({one_line(param.name, 60)})"
        spec = self.field(shape, where, depth=0, output=False, body=in_body)
        spec["in"] = param.place
        if key != param.name and param.place not in ("path", "whole_body"):
            spec["name"] = param.name  # the system's own name; the key is what agents send
        if param.required:
            spec["required"] = True
            spec.pop("default", None)
        if _SECRET_NAME.search(param.name) and spec["type"] == "string":
            spec["sensitive"] = True  # never in logs, audit events or receipts
        description = param.description or spec.get("description")
        if param.deprecated:
            description = "Deprecated. " + (description or "")
        if description:
            spec["description"] = described(description)
        if param.note:
            self.note(f"{key}: {param.note}")
        return flow_if_short(ordered(spec))

    def _file(self, param: Param, key: str) -> dict[str, Any]:
        """A file: base64 text the adapter sends as bytes (a multipart part, or the whole body)."""
        spec: dict[str, Any] = {"type": "string", "in": "file"}
        if key != param.name:
            spec["name"] = param.name
        if param.content_type:
            spec["content_type"] = param.content_type
        if param.required:
            spec["required"] = True
        text = "its bytes, base64-encoded" if param.description else "The file's bytes, base64-encoded."
        spec["description"] = described(f"{param.description} ({text})" if param.description else text)
        return flow_if_short(ordered(spec))

    def output(self, schema: Any) -> dict[str, Any] | None:
        """What every answer carries: the object's required fields, shallow (nested objects are not
        checked key by key, so an extra key in them never fails a call). An array or a scalar
        answer arrives as ``result``."""
        if schema is None:
            return None
        shape = self.schemas.shape(schema)
        if shape["type"] in ("array", *JSON_SCALARS):
            if not self._checkable(shape):
                return None
            return {"result": flow_if_short(self.field(shape, "result", depth=0, output=True))}
        if shape["type"] != "object" or not isinstance(shape.get("properties"), dict):
            return None
        out: dict[str, Any] = {}
        for name in names_in(shape.get("required")):
            prop = shape["properties"].get(name)
            if prop is None:
                continue
            prop_shape = self.schemas.shape(prop, shape["_stack"])
            if prop_shape.get("writeOnly") is True or not self._checkable(prop_shape):
                continue
            spec = self.field(prop_shape, name, depth=MAX_SCHEMA_DEPTH, output=True)
            out[name] = flow_if_short(spec)
        return out or None

    def _checkable(self, shape: dict[str, Any], depth: int = 0) -> bool:
        """Whether an answer's field has one type the catalog can check (no unions, no untyped items)."""
        if not shape["type"] or shape["type"] == "null" or shape.get("_others") or shape.get("_unresolved"):
            return False
        if shape["type"] == "array":
            return depth < MAX_SCHEMA_DEPTH and self._checkable(
                self.schemas.shape(shape.get("items"), shape["_stack"]), depth + 1
            )
        return True

    def field(
        self, shape: dict[str, Any], where: str, *, depth: int, output: bool, body: bool = False
    ) -> dict[str, Any]:
        """One field. ``depth`` counts nested levels; at MAX_SCHEMA_DEPTH objects stop listing fields."""
        if shape.get("_unresolved"):
            self.note(f"{where}: $ref {one_line(shape['_unresolved'], 80)} is not in the document; any value taken")
        if shape.get("_others"):
            self.note(
                f"{where}: takes {shape['type']} here; the document also allows {', '.join(map(str, shape['_others']))}"
            )
        kind = shape["type"]
        spec: dict[str, Any] = {}
        values = _enum_values(shape.get("enum"))
        if values and kind in ("", *JSON_SCALARS):
            spec["type"] = "enum"
            spec["values"] = values
        elif kind == "string":
            fmt = shape.get("format")
            spec["type"] = CATALOG_TYPE_OF_FORMAT.get(str(fmt), "string") if not output else "string"
            if fmt == "password" and not output:
                spec["sensitive"] = True
        elif kind in ("integer", "number", "boolean"):
            spec["type"] = kind
        elif kind == "array":
            spec["type"] = "array"
            items = self.schemas.shape(shape.get("items"), shape["_stack"])
            if not items["type"] or items["type"] == "null":
                items = {**items, "type": "string"}
                self.note(f"{where}: the document gives its items no type; strings assumed")
            item = self.field(items, f"{where}[]", depth=depth + 1, output=output, body=body)
            item.pop("description", None)
            item.pop("default", None)  # the fleet fills in defaults of fields, not of items
            spec["items"] = flow_if_short(item)
        elif kind == "object":
            spec["type"] = "object"
            if shape.get("_cycle"):
                if not output:
                    self.note(
                        f"{where}: refers to itself ({one_line(shape['_cycle'], 80)}); its inner fields are not checked"
                    )
            elif not output and not free_form(shape):
                if depth >= MAX_SCHEMA_DEPTH:
                    self.note(
                        f"{where}: nested deeper than {MAX_SCHEMA_DEPTH} levels; its inner fields are not checked"
                    )
                else:
                    spec["properties"] = self._properties(shape, where, depth, body)
        else:
            spec["type"] = "string"
            if not output:
                self.note(
                    f"{where}: the document gives no type; a string is assumed (edit it if the system takes another)"
                )
        if shape.get("nullable"):
            spec["nullable"] = True
        if not output:
            self._bounds(shape, spec, where)
            self._default(shape, spec, where, body)
        description = clean(shape.get("description") or shape.get("title"), MAX_FIELD_DESCRIPTION)
        fmt = shape.get("format")
        if isinstance(fmt, str) and fmt not in (*CATALOG_TYPE_OF_FORMAT, "password") and kind == "string":
            description = (
                f"{description} (format: {one_line(fmt, 30)})" if description else f"Format: {one_line(fmt, 30)}."
            )
        if shape.get("deprecated") is True:
            description = "Deprecated. " + (description or "")
        if description:
            spec["description"] = described(description)
        return ordered(spec)

    def _properties(self, shape: dict[str, Any], where: str, depth: int, body: bool) -> dict[str, Any]:
        properties: dict[str, Any] = {}
        wanted = set(names_in(shape.get("required")))
        declared = shape.get("properties")
        for name, prop in list(declared.items() if isinstance(declared, dict) else ())[:500]:
            if not isinstance(name, str) or len(name) > 200:
                continue
            sub = self.schemas.shape(prop, shape["_stack"])
            if sub.get("readOnly") is True:
                continue
            spec = self.field(sub, f"{where}.{name}", depth=depth + 1, output=False, body=body)
            if _SECRET_NAME.search(name) and spec["type"] == "string":
                spec["sensitive"] = True  # a password inside an object (a whole-body array of users) too
            if name in wanted:
                spec.pop("default", None)
                spec["required"] = True
            properties[name] = flow_if_short(ordered(spec))
        return properties

    def _bounds(self, shape: dict[str, Any], spec: dict[str, Any], where: str) -> None:
        kind = spec["type"]
        keyword = bound_keywords(kind)
        if kind in ("integer", "number"):
            low, high = _number(shape.get(keyword["min"])), _number(shape.get(keyword["max"]))
            low = _exclusive(low, shape.get("exclusiveMinimum"), kind, +1)
            high = _exclusive(high, shape.get("exclusiveMaximum"), kind, -1)
            if low is not None and high is not None and low > high:
                self.note(f"{where}: minimum is above maximum in the document; neither kept")
                low = high = None
            if low is not None:
                spec["min"] = low
            if high is not None:
                spec["max"] = high
        if kind in ("string", "array"):
            lengths = keyword["min_length"], keyword["max_length"]
            low_n, high_n = (_count(shape.get(k)) for k in lengths)
            if low_n is not None and high_n is not None and low_n > high_n:
                self.note(f"{where}: {lengths[0]} is above {lengths[1]} in the document; neither kept")
                low_n = high_n = None
            if low_n:
                spec["min_length"] = low_n
            if high_n is not None:
                spec["max_length"] = high_n
        pattern = shape.get("pattern")
        if kind == "string" and isinstance(pattern, str):
            try:
                compile_pattern(pattern)
                spec["pattern"] = pattern
            except PatternError as exc:
                self.note(f"{where}: {exc}; left out")

    def _default(self, shape: dict[str, Any], spec: dict[str, Any], where: str, body: bool) -> None:
        if "default" not in shape or shape["default"] is None or spec["type"] == "object":
            return
        value = shape["default"]
        if self.patch and body:
            # the fleet would send it, and a PATCH would then change what the agent left alone
            shown = one_line(json.dumps(value, default=str), 40)
            self.note(f"{where}: the system's default {shown} is not sent by the fleet (PATCH)")
            return
        try:
            field_spec = FieldSpec.model_validate(plain({k: v for k, v in spec.items() if k != "properties"}))
        except ValidationError:
            return
        problems: list[Any] = []
        compile_field(field_spec)(value, where, problems)
        if problems:
            self.note(f"{where}: the document's default does not fit its own schema; left out")
            return
        spec["default"] = value


def _enum_values(enum: Any) -> list[Any]:
    if not isinstance(enum, list):
        return []
    values = [
        v
        for v in enum
        if isinstance(v, (str, int, float, bool)) and not (isinstance(v, float) and not math.isfinite(v))
    ]
    return list(dict.fromkeys(values))[:500] if len(values) == len([v for v in enum if v is not None]) else []


def _number(value: Any) -> float | int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return value if math.isfinite(value) else None


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63 else None


def _exclusive(bound: float | int | None, exclusive: Any, kind: str, step: int) -> float | int | None:
    """A 3.0 boolean or 3.1 numeric exclusive bound as the inclusive one the catalog has: exact for
    integers; for numbers the edge itself is let in. ``step`` is +1 for a minimum, -1 for a maximum."""
    edge = bound if exclusive is True else _number(exclusive)
    if edge is None:
        return bound
    if kind == "integer":
        edge = (math.floor(edge) + 1) if step > 0 else (math.ceil(edge) - 1)
    if bound is None or exclusive is True:
        return edge
    return max(bound, edge) if step > 0 else min(bound, edge)  # both given (3.1): the stricter
