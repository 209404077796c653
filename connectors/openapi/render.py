"""The connector as YAML text: a header comment saying what to edit and what was left out, then
the actions, each with its notes; checked against the catalog models before it is returned."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml
from pydantic import ValidationError

from connectors.openapi.actions import MAX_DESCRIPTION, Actions
from connectors.openapi.document import OpenAPIError, Operation
from connectors.openapi.text import clean, described, dump, one_line
from connectors.spec import ConnectorDocument, type_problems

MAX_NOTES = 12  # comment lines above one action
MAX_SKIPPED_SHOWN = 100


def render(
    doc: Mapping[str, Any],
    built: Actions,
    actions: list[tuple[dict[str, Any], list[str], Operation]],
    skipped: list[tuple[str, str]],
    chosen: int,
    source: str,
) -> str:
    """The catalog file: header comment, connector, and each action with the notes on it."""
    info: dict[str, Any] = doc["info"] if isinstance(doc.get("info"), dict) else {}
    title = one_line(info.get("title") or "untitled", 100)
    version = one_line(info.get("version") or "", 40)
    kind = "Swagger 2.0" if built.version == "2.0" else f"OpenAPI {one_line(doc.get('openapi'), 20)}"
    source = f", {one_line(source, 120)}" if source else ""
    lines = [
        f"# Connector {built.connector}, imported by `reach import openapi` from {title!r} {version} ({kind}{source}).",
        "#",
        "# This file is yours to edit. The descriptions are what a model reads to choose an action and fill",
        "# in its params: add your business meaning there (when to use an action, what the values mean,",
        "# what must never be done). Narrow what the document allows (bounds, enums, `sensitive: true`),",
        "# delete the actions no agent should have, and bind the rest to agent apps (agent_app documents).",
        "# `output` lists the fields the document promises in every answer: an answer without one fails",
        "# the call as DOWNSTREAM_CONTRACT_VIOLATION. Check the file with `reach validate`.",
        "# Where several connectors offer one action, add `examples:` to it: a few short requests your",
        "# users make, in their languages (`examples: [my parcel never arrived, 包裹一直没到]`), which",
        "# semantic routing and reach.find_tools compare a request with (docs/contract.md, action keys).",
    ]
    if built.env:
        lines.append("#")
        lines.append(f"# Credentials are read from the environment: {', '.join(built.env)}.")
    for note in built.auth_notes:
        lines.append(f"# {one_line(note, 200)}")
    lines.append("#")
    lines.append(f"# Operations chosen: {chosen}; imported: {len(actions)}; not imported: {len(skipped)}.")
    for label, why in skipped[:MAX_SKIPPED_SHOWN]:
        lines.append(f"#   - {one_line(label, 120)}: {one_line(why, 200)}")
    if len(skipped) > MAX_SKIPPED_SHOWN:
        lines.append(f"#   … and {len(skipped) - MAX_SKIPPED_SHOWN} more")
    connector: dict[str, Any] = {"name": built.connector}
    description = clean(info.get("description"), MAX_DESCRIPTION) or (title if title != "untitled" else None)
    if description:
        connector["description"] = described(description)
    connector["endpoint"] = built.endpoint
    if built.auth is not None:
        connector["auth"] = built.auth
    out = ["\n".join(lines), dump({"connector": connector}).rstrip("\n"), "  actions:"]
    for action, notes, op in actions:
        op_id = op.spec.get("operationId")
        origin = [f"operationId {one_line(op_id, 80)}"] if isinstance(op_id, str) and op_id != action["action"] else []
        if op.tags:
            origin.append(f"tags: {one_line(', '.join(op.tags), 100)}")
        comments = [f"# {'; '.join(origin)}"] if origin else []
        comments += [f"# note: {one_line(n, 200)}" for n in notes[:MAX_NOTES]]
        if len(notes) > MAX_NOTES:
            comments.append(f"# note: … and {len(notes) - MAX_NOTES} more")
        item = dump([action]).rstrip("\n")
        out.append("\n".join("    " + line if line else line for line in [*comments, *item.split("\n")]))
    return "\n".join(out) + "\n"


def self_check(text: str) -> None:
    """The text must load as the catalog loader reads it; anything else is a bug here."""
    try:
        doc = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        connector = ConnectorDocument.model_validate(doc).connector
    except (yaml.YAMLError, ValidationError) as exc:
        raise OpenAPIError(f"internal error: the generated catalog does not load: {one_line(exc, 500)}") from exc
    problems = type_problems(doc["connector"])
    names = [a.action for a in connector.actions]
    if len(set(names)) != len(names):
        problems.append("two actions have the same name")
    if problems:
        raise OpenAPIError("internal error: the generated catalog does not load", problems)
