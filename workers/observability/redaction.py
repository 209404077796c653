"""Removing sensitive values (fields declared ``sensitive: true``) before anything is kept."""

from __future__ import annotations

import json
from typing import Any

from connectors.catalog import Catalog, split_action_name
from connectors.spec import FieldSpec
from producers.formats import DEFAULT_MAX_DEPTH, ENVELOPE_DEPTH, FormatError, loads_strict, normalize

REDACTED = "[redacted]"
# on a dead letter whose params had sensitive values replaced: it must not be replayed as it is
REDACTED_HEADER = "x-reach-redacted"


def redact_params(params: Any, fields: dict[str, FieldSpec]) -> Any:
    """A copy of ``params`` with every sensitive value (at any depth) replaced."""
    if not isinstance(params, dict):
        return params
    out: dict[str, Any] = {}
    for key, value in params.items():
        spec = fields.get(key)
        if spec is None:
            out[key] = value
        elif spec.sensitive:
            out[key] = REDACTED
        elif spec.properties is not None:
            out[key] = redact_params(value, spec.properties)
        elif spec.items is not None and spec.items.sensitive and isinstance(value, list):
            out[key] = [REDACTED for _ in value]
        elif spec.items is not None and spec.items.properties is not None and isinstance(value, list):
            out[key] = [redact_params(v, spec.items.properties) for v in value]
        else:
            out[key] = value
    return out


def contains_redacted(value: Any) -> bool:
    """Whether the marker is ``value`` or anywhere inside it (as ``redact_params`` leaves params)."""
    if isinstance(value, dict):
        return any(contains_redacted(v) for v in value.values())
    if isinstance(value, list):
        return any(contains_redacted(v) for v in value)
    return value == REDACTED


def redact_body(body: bytes, catalog: Catalog, max_depth: int = DEFAULT_MAX_DEPTH) -> bytes | None:
    """The message as it will be dead-lettered: sensitive params of every action the intent
    could mean are replaced. None when the body cannot be parsed: then nobody can tell which of
    its values are sensitive, so the caller keeps none of it."""
    try:
        normalized = normalize(loads_strict(body, max_depth + ENVELOPE_DEPTH))
    except FormatError:
        return None
    doc = dict(normalized.intent)
    action, params = doc.get("action"), doc.get("params")
    if not isinstance(action, str) or not isinstance(params, dict):
        return body
    connector, name = split_action_name(action)
    refs = [r for (c, a), r in catalog.refs.items() if a == name and (connector is None or c == connector)]
    if not any(f.sensitive or f.properties or f.items for r in refs for f in r.action.input.values()):
        return body
    for ref in refs:
        params = redact_params(params, ref.action.input)
    doc["params"] = params
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode()
