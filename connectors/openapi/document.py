"""Reading an OpenAPI document within bounds, validating it, and following its local ``$ref``s.

Nothing outside the document is ever read: a ``$ref`` to a file or URL is refused before the
validator runs, and the validator's resolver is given no way to fetch one.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import yaml

from connectors.openapi.text import one_line

MAX_DOCUMENT_BYTES = 32 << 20  # GitHub's whole REST API is 13 MiB of JSON
MAX_VALUES = 5_000_000  # values in the document, YAML aliases expanded (an alias bomb stops here)
MAX_NESTING = 100  # how deep the document's arrays and objects nest
MAX_REF_HOPS = 32  # a $ref to a $ref to ...
MAX_PROBLEMS_SHOWN = 10
# the operation keys of a path item
_OPERATION_KEYS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")


class OpenAPIError(ValueError):
    """The document cannot be imported. ``problems`` lists what is wrong, first ones first."""

    def __init__(self, message: str, problems: list[str] | None = None) -> None:
        shown = "".join(f"\n  - {p}" for p in (problems or []))
        super().__init__(message + shown)
        self.problems = problems or []


class OptionsError(OpenAPIError):
    """The document may be fine, but the options do not fit it (a connector name, an endpoint, a filter)."""


class Skip(Exception):
    """This operation cannot become an action; the message says why (the catalog's header lists it)."""


class TooManyOperations(OptionsError):
    """More operations were chosen than ``--max`` allows."""

    def __init__(self, count: int, limit: int, tags: list[tuple[str, int]]) -> None:
        common = ", ".join(f"{tag} ({n})" for tag, n in tags[:12])
        super().__init__(
            f"the document has {count} operations to import, more than {limit}: choose some with --include TAG "
            f"or --include '/PATH-GLOB' (and --exclude), or raise the limit with --max {count}"
            + (f". Tags with the most operations: {common}" if common else "")
        )
        self.count = count


@dataclass(frozen=True)
class Operation:
    """One operation of the document, with the path item it belongs to (for shared parameters)."""

    method: str  # upper case, as in the document (HEAD, OPTIONS, TRACE too)
    path: str
    spec: dict[str, Any]
    path_item: dict[str, Any]
    tags: tuple[str, ...]

    @property
    def label(self) -> str:
        op_id = self.spec.get("operationId")
        return f"{self.method} {self.path}" + (f" ({op_id})" if isinstance(op_id, str) else "")


class _Loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """YAML as JSON sees it: keys are the text written (``200:`` is the response code "200") and
    dates stay strings, as openapi-spec-validator expects."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[str, Any]:
        self.flatten_mapping(node)  # merge keys (<<: *alias)
        mapping: dict[str, Any] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                raise yaml.constructor.ConstructorError(
                    None, None, "a mapping key must be plain text", key_node.start_mark
                )
            mapping[str(key_node.value)] = self.construct_object(value_node, deep=deep)
        return mapping


_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


for _tag in ("tag:yaml.org,2002:timestamp", "tag:yaml.org,2002:binary"):
    _Loader.add_constructor(_tag, lambda loader, node: loader.construct_scalar(node))


def read_document(data: bytes | str, *, max_bytes: int = MAX_DOCUMENT_BYTES) -> dict[str, Any]:
    """Parse a JSON or YAML OpenAPI document, within bounds.

    Args:
        data: The document's text (UTF-8 when bytes).
        max_bytes: Larger documents are refused before parsing.

    Returns:
        The document.

    Raises:
        OpenAPIError: Too large, not JSON/YAML, nested or aliased past the bounds, or it refers to
            other files or URLs (the importer reads nothing but the document).
    """
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data)
    if len(raw) > max_bytes:
        raise OpenAPIError(f"the document is {len(raw)} bytes; at most {max_bytes} are read")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise OpenAPIError(f"the document is not UTF-8 text (bad byte at offset {exc.start})") from exc
    try:
        if text.lstrip().startswith("{"):
            doc = json.loads(text)
        else:
            loader = _Loader(text)
            try:
                doc = loader.get_single_data()
            finally:
                loader.dispose()
    except RecursionError as exc:
        raise OpenAPIError(f"the document nests more than {MAX_NESTING} levels deep") from exc
    except json.JSONDecodeError as exc:
        raise OpenAPIError(f"the document is not valid JSON: {exc.msg} at line {exc.lineno}") from exc
    except ValueError as exc:  # an integer past the interpreter's digit limit
        raise OpenAPIError(f"the document is not valid JSON: {exc}") from exc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise OpenAPIError(f"the document is not valid YAML{where}: {getattr(exc, 'problem', None) or exc}") from exc
    if not isinstance(doc, dict):
        raise OpenAPIError(f"the document is {_kind(doc)}, not an OpenAPI object")
    _check_bounds(doc)
    return doc


def _check_bounds(doc: dict[str, Any]) -> None:
    """Count every value (aliases expanded), bound the nesting, and refuse outside ``$ref``s, without recursion."""
    outside: list[str] = []
    count = 0
    stack: list[tuple[Any, int]] = [(doc, 1)]
    while stack:
        value, depth = stack.pop()
        count += 1
        if count > MAX_VALUES:
            raise OpenAPIError(
                f"the document expands to more than {MAX_VALUES} values (YAML aliases used over and over?)"
            )
        if isinstance(value, dict):
            if depth > MAX_NESTING:
                raise OpenAPIError(f"the document nests more than {MAX_NESTING} levels deep")
            ref = value.get("$ref")
            if isinstance(ref, str) and not ref.startswith("#") and len(outside) < 5:
                outside.append(ref)
            stack.extend((v, depth + 1) for v in value.values())
        elif isinstance(value, list):
            if depth > MAX_NESTING:
                raise OpenAPIError(f"the document nests more than {MAX_NESTING} levels deep")
            stack.extend((v, depth + 1) for v in value)
    if outside:
        raise OpenAPIError(
            "the document refers to other files or URLs; bundle it into one document first "
            "(for example with `npx @redocly/cli bundle`): the importer reads nothing else",
            [f"$ref: {one_line(ref, 200)}" for ref in outside],
        )


def spec_version(doc: Mapping[str, Any]) -> str:
    """``"2.0"``, ``"3.0"``, ``"3.1"`` or ``"3.2"``.

    Raises:
        OpenAPIError: The document names no version this importer reads.
    """
    if doc.get("swagger") == "2.0":
        return "2.0"
    version = doc.get("openapi")
    if isinstance(version, str):
        for known in ("3.0", "3.1", "3.2"):
            if version == known or version.startswith(known + "."):
                return known
        raise OpenAPIError(f"OpenAPI {one_line(version, 20)} is not supported (2.0, 3.0 and 3.1 are)")
    raise OpenAPIError("not an OpenAPI document: it has neither `openapi: 3.x` nor `swagger: '2.0'` at the top")


class _Refused:
    def __call__(self, uri: str) -> Any:
        raise OpenAPIError(f"refused to fetch {uri}: only references inside the document are followed")


class _NoRetrieval(Mapping[str, _Refused]):
    """Every URI scheme, each refused: the validator's resolver must not read files or URLs a
    hostile document names (even through a ``$id`` that rebases a local reference)."""

    def __getitem__(self, scheme: str) -> _Refused:
        return _Refused()

    def __contains__(self, scheme: object) -> bool:
        return True

    def __iter__(self) -> Any:
        return iter(())

    def __len__(self) -> int:
        return 0


def _validator(version: str, doc: dict[str, Any]) -> Any:
    import openapi_spec_validator as osv

    base = {
        "2.0": osv.OpenAPIV2SpecValidator,
        "3.0": osv.OpenAPIV30SpecValidator,
        "3.1": osv.OpenAPIV31SpecValidator,
        "3.2": getattr(osv, "OpenAPIV32SpecValidator", osv.OpenAPIV31SpecValidator),
    }[version]
    local = type(f"Local{base.__name__}", (base,), {"resolver_handlers": _NoRetrieval()})
    return local(doc)


def document_problems(
    doc: dict[str, Any], limit: int = MAX_PROBLEMS_SHOWN, only: list[Operation] | None = None
) -> list[str]:
    """What openapi-spec-validator finds wrong with the document (the first ``limit`` problems).

    Args:
        doc: A document from :func:`read_document`.
        limit: How many problems to collect.
        only: Check just these operations and what they reach by ``$ref`` (:func:`subtree`); the
            verdicts on them are the whole document's, and nothing else is looked at (on GitHub's
            REST API, 98 % of a whole check is spent on operations not imported). None checks all.

    Returns:
        One line per problem, with where it is (a place in ``doc``); empty when valid.

    Raises:
        OpenAPIError: The document names no supported version.
    """
    from referencing.exceptions import Unresolvable

    checked = doc if only is None else subtree(doc, only)
    validator = _validator(spec_version(doc), checked)
    problems: list[str] = []
    try:
        for error in validator.iter_errors():
            # errors about default and example values carry no location: the message says what
            where = "".join(
                "/" + one_line(str(p), 80).replace("~", "~0").replace("/", "~1") for p in error.absolute_path
            )
            problems.append(one_line(error.message, 300) + (f" (at {where})" if where else ""))
            if len(problems) >= limit:
                break
    except Unresolvable as exc:
        problems.append(f"a $ref cannot be resolved inside the document: {one_line(str(exc), 200)}")
    except RecursionError:
        problems.append("the document nests too deeply to be checked")
    return problems


# top-level keys that hold reusable parts (reached by $ref), and how many pointer steps name one part
_PART_DEPTH = {"components": 3, "definitions": 2, "parameters": 2, "responses": 2, "paths": 2, "webhooks": 2}


def subtree(doc: dict[str, Any], chosen: list[Operation]) -> dict[str, Any]:
    """The document cut down to ``chosen`` operations and every part they reach by ``$ref``, each
    at its own place (so a problem is reported where it is in ``doc``).

    Kept whole: the top-level keys other than paths, webhooks, extensions and reusable parts (info,
    servers, security, securitySchemes ...). A reference that is no JSON pointer (``#anchor``) cannot be
    followed here, so the whole document is returned and checked.
    """
    # extensions (x-...) are left out: the validator reads nothing in them (GitHub's x-webhooks
    # alone reach half of its schemas)
    out: dict[str, Any] = {k: v for k, v in doc.items() if k not in _PART_DEPTH and not str(k).startswith("x-")}
    components = doc.get("components")
    if isinstance(components, dict) and "securitySchemes" in components:
        out["components"] = {"securitySchemes": components["securitySchemes"]}
    raw_paths = doc.get("paths")
    if not isinstance(raw_paths, dict):
        raw_paths = {}
    paths: dict[str, Any] = {}
    for op in chosen:
        item = raw_paths.get(op.path)
        if not isinstance(item, dict):
            continue
        if "$ref" in item:
            paths[op.path] = item  # a shared path item: its target is copied below
            continue
        kept = paths.setdefault(op.path, {k: v for k, v in item.items() if k not in _OPERATION_KEYS})
        kept[op.method.lower()] = item.get(op.method.lower())
    if isinstance(doc.get("paths"), dict):
        out["paths"] = paths
    copied: set[tuple[str, ...]] = set()
    pending: list[Any] = [out]
    while pending:
        node = pending.pop()
        if isinstance(node, list):
            pending.extend(node)
            continue
        if not isinstance(node, dict):
            continue
        for ref in _refs_in(node):
            if not ref.startswith("#/"):
                return doc
            parts = tuple(unquote(p).replace("~1", "/").replace("~0", "~") for p in ref[2:].split("/"))
            part = parts[: _PART_DEPTH.get(parts[0], 1)]
            if part in copied:
                continue
            copied.add(part)
            target = _copy_part(doc, out, part)
            if target is not None:
                pending.append(target)
        pending.extend(v for k, v in node.items() if isinstance(v, (dict, list)) and k != "$ref")
    return out


def _refs_in(node: dict[str, Any]) -> list[str]:
    """The references a node makes: ``$ref`` (``$dynamicRef`` in 3.1) and a discriminator's mapping."""
    found = [node[k] for k in ("$ref", "$dynamicRef") if isinstance(node.get(k), str)]
    discriminator = node.get("discriminator")
    mapping = discriminator.get("mapping") if isinstance(discriminator, dict) else None
    if isinstance(mapping, dict):
        found.extend(v for v in mapping.values() if isinstance(v, str) and v.startswith("#"))
    return found


def _copy_part(doc: dict[str, Any], out: dict[str, Any], part: tuple[str, ...]) -> Any:
    """Put the node at ``part`` of ``doc`` at the same place in ``out``; None when ``doc`` has none."""
    source: Any = doc
    for key in part:
        if not isinstance(source, dict) or key not in source:
            return None  # the validator reports the reference as unresolvable, as on the whole document
        source = source[key]
    target = out
    for key in part[:-1]:
        nested = target.get(key)
        if not isinstance(nested, dict):
            nested = target[key] = {}
        target = nested
    target[part[-1]] = source
    return source


def operations(doc: Mapping[str, Any]) -> list[Operation]:
    """Every operation of the document, in its order."""
    refs = Refs(doc)
    found: list[Operation] = []
    paths = doc.get("paths")
    for path, item in paths.items() if isinstance(paths, dict) else ():
        item = refs.follow(item)
        if not isinstance(item, dict) or not isinstance(path, str):
            continue
        for key, spec in item.items():  # the author's order
            if key in _OPERATION_KEYS and isinstance(spec, dict):
                tags = spec.get("tags")
                names = tuple(t for t in tags if isinstance(t, str)) if isinstance(tags, list) else ()
                found.append(Operation(key.upper(), path, spec, item, names))
    return found


class Unresolvable(Exception):
    """A ``$ref`` that does not point inside the document, or a chain of them that loops."""


class Refs:
    """Local ``$ref`` resolution (``#/components/schemas/Pet``); nothing outside the document."""

    def __init__(self, doc: Mapping[str, Any]) -> None:
        self.doc = doc

    def pointer(self, ref: str) -> Any:
        if ref == "#":
            return self.doc
        if not ref.startswith("#/"):
            raise Unresolvable(ref)
        node: Any = self.doc
        for part in ref[2:].split("/"):
            part = unquote(part).replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                raise Unresolvable(ref)
        return node

    def deref(self, node: Any) -> tuple[Any, tuple[str, ...]]:
        """Follow a chain of ``$ref`` (bounded); keys beside a ``$ref`` (3.1) win over its target's.

        Returns the target and the refs followed. Raises Unresolvable for a missing or cyclic chain.
        """
        followed: list[str] = []
        beside: list[dict[str, Any]] = []
        while isinstance(node, dict) and isinstance(node.get("$ref"), str):
            ref = node["$ref"]
            if ref in followed or len(followed) >= MAX_REF_HOPS:
                raise Unresolvable(ref)
            followed.append(ref)
            extra = {k: v for k, v in node.items() if k != "$ref"}
            if extra:
                beside.append(extra)
            node = self.pointer(ref)
        if beside and isinstance(node, dict):
            node = dict(node)
            for extra in reversed(beside):  # the outermost keys win
                node.update(extra)
        return node, tuple(followed)

    def follow(self, node: Any) -> Any:
        """The target of a ``$ref`` (or the node itself); None when it cannot be resolved."""
        try:
            return self.deref(node)[0]
        except Unresolvable:
            return None


def _kind(value: Any) -> str:
    return {list: "an array", str: "a string", type(None): "empty"}.get(type(value), f"a {type(value).__name__}")
