"""History's pure part: what of a receipt is remembered for ``reach.history``, and what it is found by.

An action's contract decides it. Only declared fields are kept (the input's, and the output's when
the action declares one), sensitive ones as ``[redacted]``; the fields marked ``entity: NAME``
index the record under ``NAME`` and their value. Bounds, whatever an agent sends or a system
answers: a record is at most ``MAX_RECORD_BYTES`` of JSON (the data, then the params, give way to
a note), values over ``MAX_INDEXED_BYTES`` are not indexed, and one receipt is indexed under at
most ``MAX_ENTITIES`` entity values. The stores (workers/state/history.py, the PostgreSQL one) keep
records and indexes; the router answers ``reach.history`` with them.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from connectors.schema import ParamValidator, object_json_schema
from connectors.spec import ActionSpec, FieldSpec
from producers.tools import ToolSpec

REDACTED = "[redacted]"  # as workers.observability.redaction writes it
OMITTED_KEY = "_reach_omitted"  # as a receipt's data says a part was left out
MAX_RECORD_BYTES = 8 * 1024
MAX_INDEXED_BYTES = 256
MAX_ENTITIES = 16
INDEX_CAP = 1000  # records kept per index key (an entity value, an action), the newest
MAX_LIMIT = 50  # records per answer
READ_BUDGET = 200  # records one answer reads at most (filters may skip many): then it says where to go on
TOOL_NAME = "reach__history"

# reach.history's params, checked like an action's; `since` is parsed by the stores' caller
PARAMS_SPEC = ActionSpec(
    action="history",
    input={
        "entity": FieldSpec(type="string", max_length=63, description="an entity name, e.g. order"),
        "id": FieldSpec(
            type="string", min_length=1, max_length=MAX_INDEXED_BYTES, description="the entity's value, e.g. 123"
        ),
        "action": FieldSpec(type="string", max_length=200, description="connector.action, or a workflow's name"),
        "since": FieldSpec(type="datetime", description="only records at or after this time (ISO 8601)"),
        "status": FieldSpec(
            type="enum",
            values=["succeeded", "failed", "rejected", "unknown"],
            description="only records with this status",
        ),
        "limit": FieldSpec(type="integer", default=20, min=1, max=MAX_LIMIT, description="records per answer"),
        "cursor": FieldSpec(type="string", max_length=300, description="next_cursor of the previous answer"),
    },
)
PARAMS = ParamValidator(PARAMS_SPEC)


def tool() -> ToolSpec:
    """``reach.history`` as a tool (its name ``reach__history``)."""
    return ToolSpec(
        name=TOOL_NAME,
        description=(
            "What you already did: your own earlier actions' receipts, newest first. Ask by an entity "
            "and its id (entity 'order', id '123') or by an action ('connector.action', or a workflow's name); optionally since "
            "a time (ISO 8601), by status, limit (at most 50), cursor (next_cursor of the last answer)."
        ),
        input_schema=object_json_schema(PARAMS_SPEC.input),
    )


def retention(action: ActionSpec, default_seconds: int) -> int | None:
    """Seconds an action's records are kept; None when its history is off."""
    spec = action.history
    if spec is None:
        return default_seconds
    if spec.off or spec.retain is None:
        return None
    return max(1, int(spec.retain))


def longest_retention(actions: Iterable[ActionSpec], default_seconds: int) -> int:
    """The longest any of ``actions`` keeps its records: how long an index keeps a member."""
    kept = [r for r in (retention(a, default_seconds) for a in actions) if r is not None]
    return max(kept, default=default_seconds)


def project(values: Any, fields: dict[str, FieldSpec] | None) -> Any:
    """``values`` with only the declared ``fields`` (at every declared level), sensitive ones
    replaced by ``[redacted]``; None when nothing is declared (an action without ``output``)."""
    if fields is None or not isinstance(values, dict):
        return None
    out: dict[str, Any] = {}
    for key, spec in fields.items():
        if key in values:
            out[key] = _field(values[key], spec)
    return out


def _field(value: Any, spec: FieldSpec) -> Any:
    if spec.sensitive:
        return REDACTED
    if spec.properties is not None and isinstance(value, dict):
        return project(value, spec.properties)
    if spec.items is not None and isinstance(value, list):
        return [_field(item, spec.items) for item in value]
    return value


def entity_fields(action: ActionSpec) -> list[tuple[str, str, str]]:
    """(side, field, entity) of each top-level field marked ``entity``: input first."""
    found = [("params", k, f.entity) for k, f in action.input.items() if f.entity]
    found += [("data", k, f.entity) for k, f in (action.output or {}).items() if f.entity]
    return found


def entity_values(action: ActionSpec, params: Any, data: Any) -> list[tuple[str, str]]:
    """(entity, value) pairs a record is indexed under: strings and integers (not booleans) of
    at most ``MAX_INDEXED_BYTES`` bytes, each pair once, at most ``MAX_ENTITIES``."""
    found: list[tuple[str, str]] = []
    for side, key, entity in entity_fields(action):
        source = params if side == "params" else data
        if not isinstance(source, dict):
            continue
        value = index_value(source.get(key))
        if value is not None and (entity, value) not in found:
            found.append((entity, value))
            if len(found) == MAX_ENTITIES:
                break
    return found


def index_value(value: Any) -> str | None:
    """The text a value is indexed by, or None when it is not indexed."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        text = str(value)
    elif isinstance(value, str):
        text = value
    else:
        return None
    try:
        size = len(text.encode())
    except UnicodeEncodeError:  # a lone surrogate: not a value anyone can ask for
        return None
    return text if 0 < size <= MAX_INDEXED_BYTES else None


def value_digest(value: str) -> str:
    """What an entity value is keyed by: its digest, so no agent text becomes a key or a column."""
    return hashlib.sha256(value.encode()).hexdigest()[:32]


def action_version(action: ActionSpec) -> str:
    """A short digest of the action's contract: which catalog version projected a record."""
    text = action.model_dump_json(by_alias=True, exclude_none=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


@dataclass(frozen=True)
class Record:
    """One remembered receipt, as a store keeps it; ``body`` is its JSON (at most MAX_RECORD_BYTES)."""

    agent: str
    intent_id: str
    connector: str
    action: str
    status: str
    at_ms: int
    retain_seconds: int
    entities: list[tuple[str, str]]
    body: bytes


def record(
    *,
    agent: str,
    intent_id: str,
    connector: str,
    action: ActionSpec,
    status: str,
    code: str | None,
    at: str,
    at_ms: int,
    trace_id: str,
    params: Any,
    data: Any,
    retain_seconds: int,
    version: str,
    run_id: str | None = None,
) -> Record:
    """The record of one receipt: its params and data projected, the whole cut to the bound."""
    entities = entity_values(action, params, data)
    doc: dict[str, Any] = {
        "intent_id": intent_id,
        "action": action.action,
        "connector": connector or None,  # a workflow run has none
        "status": status,
        "code": code,
        "at": at,
        "trace_id": trace_id,
        "run_id": run_id,
        "catalog_version": version,
        "params": project(params, action.input),
        "data": project(data, action.output),
        "entities": [list(pair) for pair in entities],  # what it is indexed under (a purge unlinks them)
    }
    body = _dumps(doc)
    for part in ("data", "params"):  # the answer gives way first: the request says what was done
        if len(body) <= MAX_RECORD_BYTES:
            break
        if doc[part] is not None:
            doc[part] = {OMITTED_KEY: f"left out: the record was {len(body)} bytes, at most {MAX_RECORD_BYTES}"}
            body = _dumps(doc)
    if len(body) > MAX_RECORD_BYTES:  # (only an intent id or trace id that long; both are bounded upstream)
        doc.update(params=None, data=None, trace_id=doc["trace_id"][:200], intent_id=intent_id[:500])
        body = _dumps(doc)
    return Record(
        agent=agent,
        intent_id=intent_id,
        connector=connector,
        action=action.action,
        status=status,
        at_ms=at_ms,
        retain_seconds=retain_seconds,
        entities=entities,
        body=body,
    )


def _dumps(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":"), default=str).encode("utf-8", "replace")
