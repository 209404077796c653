"""Values in a workflow: literals, references and strings with references inside.

``$input.<path>`` reads the workflow's input, ``$steps.<id>.<path>`` the declared output of an
earlier step; ``REF ?? LITERAL`` gives a fallback when the value is missing or null; a string with
``{$...}`` parts is interpolated. There are no functions: what a step receives is always one of
these three shapes, so the catalog check can follow every value back to where it comes from.

Parsing happens once, when the catalog loads (the parsed form is what the runner resolves);
resolving a missing value without a fallback is an error that names the reference.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import yaml

SEGMENT = r"[A-Za-z_][A-Za-z0-9_]{0,63}|[0-9]{1,4}"
REFERENCE = re.compile(rf"^\$(input|steps)((?:\.(?:{SEGMENT}))+)(?:\s+\?\?\s+(.+))?$", re.DOTALL)
PLACEHOLDER = re.compile(r"\{(\$[^{}]*)\}")
MAX_TEMPLATE_PARTS = 20
MAX_VALUE_DEPTH = 8


class ReferenceError_(ValueError):
    """A value that is neither a literal nor a well-formed reference (message says why)."""


@dataclass(frozen=True)
class Reference:
    """``$input.a.b`` (source ``input``) or ``$steps.s.a`` (source ``steps``, step ``s``)."""

    source: str  # "input" or "steps"
    step: str | None  # the step id for $steps
    path: tuple[str, ...]  # the field and anything below it
    has_fallback: bool = False
    fallback: Any = None

    @property
    def text(self) -> str:
        head = "$input" if self.source == "input" else f"$steps.{self.step}"
        return ".".join((head, *self.path))


@dataclass(frozen=True)
class Template:
    """A string with ``{$...}`` references inside: always a string when resolved."""

    parts: tuple[str | Reference, ...]


Value = Any  # a literal (JSON value), a Reference, a Template, or a dict/list of Values


class Missing(LookupError):
    """A reference with no value and no fallback; ``reference`` is its text."""

    def __init__(self, reference: str, field_absent: bool = False) -> None:
        super().__init__(f"{reference} has no value")
        self.reference = reference
        # the source is there (the input, a step's kept answer) but left the field out; False when
        # the whole source is gone (a step's answer too large to keep)
        self.field_absent = field_absent


def parse_value(raw: Any, depth: int = 0) -> Value:
    """The parsed form of one value from YAML; raises ReferenceError_ naming the bad part."""
    if depth > MAX_VALUE_DEPTH:
        raise ReferenceError_(f"values nest at most {MAX_VALUE_DEPTH} levels")
    if isinstance(raw, dict):
        return {str(k): parse_value(v, depth + 1) for k, v in raw.items()}
    if isinstance(raw, list):
        return [parse_value(v, depth + 1) for v in raw]
    if not isinstance(raw, str):
        return raw
    if raw.startswith("$$"):
        return raw[1:]  # "$$..." is the literal text "$..."
    if raw.startswith("$"):
        return parse_reference(raw)
    if "{$" in raw:
        return _parse_template(raw)
    return raw


def parse_reference(text: str) -> Reference:
    match = REFERENCE.match(text.strip())
    if match is None:
        raise ReferenceError_(
            f"{text[:80]!r} is not a reference: use $input.<field> or $steps.<step>.<field>, "
            "optionally followed by ?? <literal> (write $$ for a literal $)"
        )
    source, dotted, fallback_text = match.group(1), match.group(2), match.group(3)
    segments = tuple(dotted.lstrip(".").split("."))
    step = None
    if source == "steps":
        if len(segments) < 2:
            raise ReferenceError_(f"{text[:80]!r} names a step but no field: use $steps.<step>.<field>")
        step, segments = segments[0], segments[1:]
    if fallback_text is None:
        return Reference(source, step, segments)
    return Reference(source, step, segments, True, _literal(fallback_text))


def _literal(text: str) -> Any:
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ReferenceError_(f"fallback {text[:80]!r} is not a literal") from exc
    if isinstance(value, (dict, list)) or (isinstance(value, str) and value.startswith("$")):
        raise ReferenceError_(f"fallback {text[:80]!r} must be a literal string, number, boolean or null")
    try:
        json.dumps(value)
    except (TypeError, ValueError) as exc:  # a YAML date, for one: write it as a quoted string
        raise ReferenceError_(f"fallback {text[:80]!r} must be a JSON literal (quote dates)") from exc
    return value


def _parse_template(text: str) -> Template:
    parts: list[str | Reference] = []
    position = 0
    for match in PLACEHOLDER.finditer(text):
        if match.start() > position:
            parts.append(text[position : match.start()])
        parts.append(parse_reference(match.group(1)))
        position = match.end()
    if position < len(text):
        parts.append(text[position:])
    if sum(isinstance(p, Reference) for p in parts) > MAX_TEMPLATE_PARTS:
        raise ReferenceError_(f"a string may hold at most {MAX_TEMPLATE_PARTS} references")
    if any(isinstance(p, str) and "{$" in p for p in parts):
        raise ReferenceError_(f"{text[:80]!r} has an unclosed {{$...}} reference")
    return Template(tuple(parts))


def references_in(value: Value) -> list[Reference]:
    """Every reference a value reads, in order."""
    if isinstance(value, Reference):
        return [value]
    if isinstance(value, Template):
        return [p for p in value.parts if isinstance(p, Reference)]
    if isinstance(value, dict):
        return [r for v in value.values() for r in references_in(v)]
    if isinstance(value, list):
        return [r for v in value for r in references_in(v)]
    return []


def resolve(value: Value, inputs: dict[str, Any], steps: dict[str, dict[str, Any]]) -> Any:
    """The JSON value of ``value`` for one run: ``steps`` maps step id to its receipt's ``data``.
    A missing value without a fallback raises Missing naming the reference; null takes the
    fallback when there is one. In a map of params (or outputs), a key whose value is a bare
    reference to a field the source left out is itself left out: the catalog check lets that
    happen only for an optional target (a required one needs ``??``)."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            try:
                out[key] = _resolve(item, inputs, steps)
            except Missing as exc:
                if not (isinstance(item, Reference) and exc.field_absent):
                    raise
        return out
    return _resolve(value, inputs, steps)


def _resolve(value: Value, inputs: dict[str, Any], steps: dict[str, dict[str, Any]]) -> Any:
    if isinstance(value, Reference):
        return _lookup(value, inputs, steps)
    if isinstance(value, Template):
        out = []
        for part in value.parts:
            if isinstance(part, str):
                out.append(part)
            else:
                found = _lookup(part, inputs, steps)
                out.append(found if isinstance(found, str) else json.dumps(found))
        return "".join(out)
    if isinstance(value, dict):
        return {k: _resolve(v, inputs, steps) for k, v in value.items()}
    if isinstance(value, list):
        return [_resolve(v, inputs, steps) for v in value]
    return value


def _lookup(ref: Reference, inputs: dict[str, Any], steps: dict[str, dict[str, Any]]) -> Any:
    source: Any = inputs if ref.source == "input" else steps.get(ref.step or "")
    current, present, found = source, source is not None, 0
    for segment in ref.path:
        if isinstance(current, dict) and segment in current:
            current = current[segment]
        elif isinstance(current, list) and segment.isdigit() and int(segment) < len(current):
            current = current[int(segment)]
        else:
            present = False
            break
        found += 1
    if present and current is not None:
        return current
    if ref.has_fallback:
        return ref.fallback
    if present:
        return None  # a declared null flows on as null (the check allows it only into a nullable field)
    # An input may leave out an optional field, and an output an optional part of a field; a step's
    # answer always has its declared fields (the pool refuses it otherwise), so one missing there
    # is a broken contract, as is a source that is gone (an answer too large to keep).
    absent = source is not None and (ref.source == "input" or found > 0)
    raise Missing(ref.text, field_absent=absent)
