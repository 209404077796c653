"""What ``reach import openapi`` does: choose the operations, guard their number, validate, convert."""

from __future__ import annotations

import fnmatch
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from connectors.openapi.actions import Actions, action_name, check_connector_name
from connectors.openapi.document import (
    MAX_PROBLEMS_SHOWN,
    OpenAPIError,
    Operation,
    OptionsError,
    Skip,
    TooManyOperations,
    document_problems,
    operations,
    read_document,
    spec_version,
)
from connectors.openapi.render import render, self_check

DEFAULT_MAX_OPERATIONS = 200  # more than this needs --include/--exclude or a higher --max


@dataclass(frozen=True)
class ImportOptions:
    """What ``reach import openapi`` was asked.

    Attributes:
        connector: The connector's name (``^[a-z][a-z0-9_]{0,62}$``); env variable names derive from it.
        endpoint: The system's base URL; overrides the document's servers (needed when they are relative).
        include: Tags or path globs (starting with ``/``) to import; empty means all.
        exclude: Tags or path globs to leave out.
        max_operations: More chosen operations than this are refused.
        source: Where the document came from, for the header comment.
        whole_document: Validate every operation, not only the chosen ones and what they reach.
    """

    connector: str
    endpoint: str | None = None
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    max_operations: int = DEFAULT_MAX_OPERATIONS
    source: str = ""
    whole_document: bool = False


@dataclass(frozen=True)
class ImportResult:
    """The catalog text and what became of the chosen operations."""

    text: str
    actions: int
    chosen: int
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (operation, why)
    env: list[str] = field(default_factory=list)  # credentials to set


def _matches(op: Operation, pattern: str) -> bool:
    """A pattern starting with ``/`` is a path glob; anything else a tag (glob characters allowed)."""
    if pattern.startswith("/"):
        return fnmatch.fnmatchcase(op.path, pattern)
    return any(fnmatch.fnmatchcase(tag, pattern) for tag in op.tags)


def plan(doc: Mapping[str, Any], options: ImportOptions) -> list[Operation]:
    """The operations to import: those ``--include`` names (all when none), less ``--exclude``.

    Raises:
        TooManyOperations: More than ``options.max_operations`` remain.
    """
    chosen = [
        op
        for op in operations(doc)
        if (not options.include or any(_matches(op, p) for p in options.include))
        and not any(_matches(op, p) for p in options.exclude)
    ]
    if len(chosen) > options.max_operations:
        tags = Counter(tag for op in chosen for tag in op.tags).most_common()
        raise TooManyOperations(len(chosen), options.max_operations, tags)
    return chosen


def import_openapi(data: bytes | str, options: ImportOptions) -> ImportResult:
    """Read, check and convert a document: what ``reach import openapi`` does.

    The ``--max`` guard runs before the validator, which checks only the chosen operations and what
    they reach by ``$ref`` (the whole document with ``options.whole_document``).

    Raises:
        OpenAPIError: The document cannot be read, is invalid (its first problems listed), or
            cannot be imported as asked.
    """
    check_connector_name(options.connector)
    doc = read_document(data)
    spec_version(doc)
    chosen = plan(doc, options)
    problems = document_problems(doc, only=None if options.whole_document else chosen)
    if problems:
        more = " (the first ones)" if len(problems) >= MAX_PROBLEMS_SHOWN else ""
        raise OpenAPIError(f"the document is not valid OpenAPI{more}:", problems)
    return build_catalog(doc, options)


def build_catalog(doc: dict[str, Any], options: ImportOptions) -> ImportResult:
    """Convert a (validated) document into catalog YAML: one connector, one action per operation.

    Args:
        doc: A document from :func:`read_document`, best checked by :func:`document_problems` first.
        options: The connector's name and what to import.

    Returns:
        The YAML text (it loads as a catalog and passes ``reach validate``) and a summary.

    Raises:
        OpenAPIError: The connector name, endpoint or version cannot be used, no operation could be
            imported, or (a bug) the text does not load as a catalog.
        TooManyOperations: As :func:`plan`.
    """
    check_connector_name(options.connector)
    chosen = plan(doc, options)
    if not chosen:
        every = operations(doc)
        if not every:
            raise OpenAPIError("the document has no operations (nothing under `paths`)")
        tags = ", ".join(tag for tag, _ in Counter(t for op in every for t in op.tags).most_common(12))
        raise OptionsError(
            f"--include / --exclude left none of the {len(every)} operations" + (f" (tags: {tags})" if tags else "")
        )
    built = Actions(doc, options.connector, options.endpoint, chosen)
    limit = max(16, min(64, 62 - len(options.connector)))  # connector__action fits a 64-character tool name
    taken: set[str] = set()
    actions: list[tuple[dict[str, Any], list[str], Operation]] = []
    skipped: list[tuple[str, str]] = []
    for op in chosen:
        try:
            action, notes = built.action(op, action_name(op, limit, set(taken)))
        except Skip as exc:
            skipped.append((op.label, str(exc)))
            continue
        taken.add(action["action"])
        actions.append((action, notes, op))
    if not actions:
        reasons = [f"{label}: {why}" for label, why in skipped[:MAX_PROBLEMS_SHOWN]]
        raise OpenAPIError(f"none of the {len(chosen)} chosen operations can be imported", reasons)
    text = render(doc, built, actions, skipped, len(chosen), options.source)
    self_check(text)
    return ImportResult(text, len(actions), len(chosen), skipped, built.env)
