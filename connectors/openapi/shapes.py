"""Schemas settled into one shape each: ``$ref`` followed, ``allOf`` merged, one type word.

A document's schemas may refer to themselves, combine each other or nest without end; a shape
names the refs followed to reach it (a repeat is a cycle) and one operation's shapes share a
budget of steps.
"""

from __future__ import annotations

from typing import Any

from connectors.openapi.document import Refs, Unresolvable
from connectors.schema import JSON_SCALARS, common_json_type

MAX_SCHEMA_STEPS = 20_000  # schema nodes one operation may expand to, $refs followed
MAX_MEMBERS = 64  # allOf / oneOf / anyOf members read


class TooLarge(Exception):
    """One operation's schemas expand past MAX_SCHEMA_STEPS."""


class Shapes:
    """Settles schemas into one shape each ($ref followed, allOf merged, one type word), for one
    operation, within a budget of steps."""

    def __init__(self, refs: Refs) -> None:
        self.refs = refs
        self.steps = 0

    def shape(self, schema: Any, stack: tuple[str, ...] = ()) -> dict[str, Any]:
        """The schema as a dict whose ``type`` is one word (``""`` when unknown, ``"null"``), with
        ``nullable``; ``_stack`` holds the refs followed to reach it (a repeat is a cycle)."""
        self.steps += 1
        if self.steps > MAX_SCHEMA_STEPS:
            raise TooLarge
        if not isinstance(schema, dict):
            return {"type": "", "nullable": False, "_stack": stack}
        try:
            target, followed = self.refs.deref(schema)
        except Unresolvable as exc:
            return {"type": "", "nullable": False, "_stack": stack, "_unresolved": str(exc)}
        cyclic = next((ref for ref in followed if ref in stack), None)
        if cyclic is not None:
            return {"type": "object", "nullable": False, "_stack": stack, "_cycle": cyclic}
        stack = stack + followed
        if not isinstance(target, dict):
            return {"type": "", "nullable": False, "_stack": stack}
        out = dict(target)
        members = target.get("allOf")
        if isinstance(members, list) and members:
            merged: dict[str, Any] = {}
            for member in members[:MAX_MEMBERS]:
                merged = _merge(merged, self.shape(member, stack))
            out = _merge(merged, {k: v for k, v in target.items() if k != "allOf"})
        kind, nullable, others = _type_word(out)
        alternatives = out.get("oneOf") if isinstance(out.get("oneOf"), list) else out.get("anyOf")
        if isinstance(alternatives, list) and alternatives and not kind and "properties" not in out:
            return self._union(out, alternatives, nullable, stack)
        out.update(type=kind, nullable=nullable, _stack=stack)
        if others:
            out["_others"] = others
        return out

    def _union(
        self, own: dict[str, Any], alternatives: list[Any], nullable: bool, stack: tuple[str, ...]
    ) -> dict[str, Any]:
        """oneOf / anyOf: one shape that accepts what every alternative accepts, where the catalog can say so."""
        shapes = [self.shape(a, stack) for a in alternatives[:MAX_MEMBERS]]
        kept = [s for s in shapes if s["type"] != "null"]
        nullable = nullable or len(kept) < len(shapes) or any(s["nullable"] for s in kept)
        rest = {k: v for k, v in own.items() if k not in ("oneOf", "anyOf", "type")}
        kinds = {s["type"] for s in kept}
        if len(kept) == 1:
            out = {**kept[0], **rest}
        elif kinds == {"object"}:
            # the union of the alternatives' fields; required are those every alternative requires
            properties: dict[str, Any] = {}
            for s in kept:
                props = s.get("properties")
                properties.update(props if isinstance(props, dict) else {})
            required = set.intersection(*(set(names_in(s.get("required"))) for s in kept))
            free = any(free_form(s) for s in kept)
            out = {**rest, "type": "object", "properties": properties, "required": sorted(required)}
            if free:
                out["additionalProperties"] = True
        elif len(kinds) == 1 and kinds <= set(JSON_SCALARS):
            out = {**rest, "type": kinds.pop()}
            enums = [s.get("enum") for s in kept]
            if all(isinstance(e, list) for e in enums):
                out["enum"] = [v for e in enums for v in e]  # type: ignore[union-attr]
        elif kept:
            out = {**kept[0], **rest, "_others": sorted(kinds - {kept[0]["type"]})}
        else:
            out = {**rest, "type": "null"}
        out["nullable"] = nullable
        out.setdefault("_stack", stack)  # an alternative taken whole keeps the refs that led to it
        return out


def _type_word(schema: dict[str, Any]) -> tuple[str, bool, list[str]]:
    """(one type, nullable, the other types a 3.1 type list allows)."""
    declared = schema.get("type")
    nullable = schema.get("nullable") is True or schema.get("x-nullable") is True
    enum = schema.get("enum")
    if isinstance(enum, list) and None in enum:
        nullable = True
    kinds = (
        [declared]
        if isinstance(declared, str)
        else [k for k in declared if isinstance(k, str)]
        if isinstance(declared, list)
        else []
    )
    if "null" in kinds:
        nullable = True
        kinds = [k for k in kinds if k != "null"]
        if not kinds:
            return "null", True, []
    if kinds:
        return kinds[0], nullable, kinds[1:]
    if "const" in schema:
        schema["enum"] = [schema["const"]]
    if isinstance(schema.get("properties"), dict) or "additionalProperties" in schema:
        return "object", nullable, []
    if "items" in schema:
        return "array", nullable, []
    values = [v for v in schema.get("enum") or [] if v is not None] if isinstance(schema.get("enum"), list) else []
    kind = common_json_type(values)
    if kind in JSON_SCALARS:
        return kind, nullable, []  # an enum without a type: its values say which
    return "", nullable, []


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """allOf: ``extra`` over ``base``; fields and required lists are joined."""
    out = {**base, **{k: v for k, v in extra.items() if not k.startswith("_")}}
    if isinstance(base.get("properties"), dict) and isinstance(extra.get("properties"), dict):
        out["properties"] = {**base["properties"], **extra["properties"]}
    if base.get("required") or extra.get("required"):
        out["required"] = list(dict.fromkeys([*names_in(base.get("required")), *names_in(extra.get("required"))]))
    if not extra.get("type") and base.get("type"):
        out["type"] = base["type"]
    out.pop("nullable", None)
    if extra.get("nullable") is True:
        out["nullable"] = True
    return out


def names_in(value: Any) -> list[str]:
    """The strings of a list such as ``required`` (nothing when it is not a list)."""
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def free_form(shape: dict[str, Any]) -> bool:
    """An object taking keys of its own choice: ``additionalProperties`` allowed, or no fields named."""
    extra = shape.get("additionalProperties")
    return bool(extra) or (extra is None and not isinstance(shape.get("properties"), dict))
