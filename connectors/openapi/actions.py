"""One operation -> one action: its params, request body and 2xx answer, with a name that fits.

An operation the http connector cannot call (HEAD, an XML or text body, a required cookie) raises
``Skip`` with the reason, which the catalog's header lists. Forms, multipart uploads, raw bytes
and JSON arrays are bodies the http adapter writes (``body:`` and ``in: file`` / ``in: whole_body``).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from pydantic import ValidationError

from connectors.openapi.access import auth_for, endpoint_of, scheme_kind, why_not_expressible
from connectors.openapi.bodies import Bodies, is_json
from connectors.openapi.document import Operation, OptionsError, Refs, Skip, spec_version
from connectors.openapi.fields import MAX_FIELD_DESCRIPTION, Fields, Param
from connectors.openapi.shapes import MAX_SCHEMA_STEPS, Shapes, TooLarge
from connectors.openapi.text import Flow, clean, described, one_line, plain
from connectors.spec import HTTP_METHODS, NAME_PATTERN, PATH_PARAM, ActionSpec, header_name_problem
from producers.wire import AGENT_ID_PATTERN

MAX_DESCRIPTION = 1024  # OpenAI's limit for a function description
# headers the fleet sets on every call (the auth header is added per document)
_FLEET_HEADERS = frozenset(
    {
        "accept",
        "authorization",
        "connection",
        "content-length",
        "content-type",
        "cookie",
        "host",
        "traceparent",
        "tracestate",
        "transfer-encoding",
    }
)
_NOT_NAME = re.compile(r"[^A-Za-z0-9_-]+")
_NOT_KEY = re.compile(r"[^A-Za-z0-9_]+")


class Actions:
    """Builds the actions of one connector from a document's chosen operations."""

    def __init__(self, doc: dict[str, Any], connector: str, endpoint: str | None, chosen: list[Operation]) -> None:
        self.doc = doc
        self.connector = connector
        self.chosen = chosen
        self.version = spec_version(doc)
        self.refs = Refs(doc)
        self.endpoint = endpoint_of(doc, self.version, endpoint)
        self.bodies = Bodies(doc, self.version, self.refs)
        self.auth, self.env, self.auth_notes, self.auth_param = self._auth()

    # -- connector level -------------------------------------------------------------------

    def _schemes(self) -> dict[str, Any]:
        found = (
            self.doc.get("securityDefinitions")
            if self.version == "2.0"
            else (self.doc.get("components") or {}).get("securitySchemes")
        )
        if not isinstance(found, dict):
            return {}
        return {name: self.refs.follow(s) for name, s in found.items() if isinstance(self.refs.follow(s), dict)}

    def _auth(self) -> tuple[dict[str, Any] | None, list[str], list[str], tuple[str, str] | None]:
        """The connector's auth: the first scheme the catalog can express, looking first at the
        document's own `security`, then at the one most operations use. Returns (auth, env
        variables, notes, the (in, name) the auth itself sets)."""
        schemes = self._schemes()
        if not schemes:
            return None, [], [], None
        used: Counter[str] = Counter()
        for op in self.chosen:
            for requirement in op.spec.get("security") or []:
                if isinstance(requirement, dict):
                    used.update(k for k in requirement if isinstance(k, str))
        top_level = [k for r in self.doc.get("security") or [] if isinstance(r, dict) for k in r]
        # the schemes the chosen operations need; only a document that requires none anywhere
        # (an oversight, usually) gets its first expressible scheme
        order = list(dict.fromkeys([*top_level, *(name for name, _ in used.most_common())])) or list(schemes)
        prefix = self.connector.upper()
        notes: list[str] = []
        for name in order:
            scheme = schemes.get(name)
            if scheme is None:
                continue
            auth, env, sets = auth_for(scheme, prefix, self.endpoint, lambda: self._scopes(name))
            if auth is not None:
                others = [n for n in order if n != name and n in schemes]
                if others:
                    notes.append(f"auth: {name} is used; the document also offers {', '.join(map(str, others))}")
                return auth, env, notes, sets
            notes.append(f"auth: {name} ({one_line(scheme_kind(scheme), 40)}) {why_not_expressible(scheme)}")
        return None, [], notes, None

    def _scopes(self, scheme: str) -> list[str]:
        """The OAuth2 scopes the document's operations ask of ``scheme``."""
        scopes: dict[str, None] = {}
        for op in self.chosen:
            for requirement in [*(op.spec.get("security") or []), *(self.doc.get("security") or [])]:
                if isinstance(requirement, dict) and isinstance(requirement.get(scheme), list):
                    scopes.update((s, None) for s in requirement[scheme] if isinstance(s, str))
        return list(scopes)[:50]

    def fleet_headers(self) -> set[str]:
        """Header params (lower case) the fleet sets itself: they are no inputs."""
        skip = set(_FLEET_HEADERS)
        if self.auth_param is not None and self.auth_param[0] == "header":
            skip.add(self.auth_param[1].lower())
        return skip

    # -- one operation ---------------------------------------------------------------------

    def action(self, op: Operation, name: str) -> tuple[dict[str, Any], list[str]]:
        """The action for one operation, and notes on what the catalog could not say."""
        if op.method not in HTTP_METHODS:
            raise Skip(f"the http connector has no {op.method} (it calls {', '.join(HTTP_METHODS)})")
        notes: list[str] = []
        schemas = Shapes(self.refs)
        params = self._params(op, notes)
        body_kind, body = self.bodies.of(op, schemas, notes)
        template, renamed = _template(op.path)
        # path params first: their keys are the template's; the others take what is left
        order = {"path": 0, "query": 1, "header": 2, "body": 3, "whole_body": 3, "file": 4}
        inputs: dict[str, Any] = {}
        reserved = dict.fromkeys(renamed.values())
        declared_path = set()
        converter = Fields(schemas, notes, patch=op.method == "PATCH")
        try:
            for param in sorted([*params, *body], key=lambda p: order[p.place]):
                if param.place == "path":
                    key = renamed.get(param.name)
                    if key is None or key in declared_path:
                        notes.append(f"path parameter {one_line(param.name, 60)} is not in the path; left out")
                        continue
                    declared_path.add(key)
                else:
                    key = _unique(_key(param.name), {**reserved, **inputs}, param.place)
                spec = converter.input(param, key)
                if spec is not None:
                    inputs[key] = spec
            for key in renamed.values():
                if key not in declared_path:
                    inputs[key] = Flow({"type": "string", "in": "path", "required": True})
                    notes.append(f"path parameter {key} is not declared by the document; taken as a string")
            output = converter.output(self._success_schema(op))
        except TooLarge:
            raise Skip(f"its schemas expand to more than {MAX_SCHEMA_STEPS} nodes") from None
        action: dict[str, Any] = {"action": name}
        description = self._description(op)
        if description:
            action["description"] = described(description)
        action["path"] = f"{op.method} {template}"
        if body_kind != "json":
            action["body"] = body_kind
        if inputs:
            action["input"] = inputs
        if output:
            action["output"] = output
        action["permission"] = "read" if op.method == "GET" else "write"
        action["idempotent"] = op.method in ("GET", "PUT", "DELETE")
        try:
            ActionSpec.model_validate(plain(action))
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise Skip(f"it does not make a valid action ({where}: {one_line(first['msg'], 160)})") from None
        return action, notes

    def _description(self, op: Operation) -> str | None:
        summary = clean(op.spec.get("summary"), MAX_DESCRIPTION)
        detail = clean(op.spec.get("description"), MAX_DESCRIPTION)
        parts = [p for p in (summary, detail) if p]
        if summary and detail and detail.startswith(summary):
            parts = [detail]
        text = "\n\n".join(parts)
        if op.spec.get("deprecated") is True:
            text = "Deprecated. " + text
        return clean(text, MAX_DESCRIPTION)

    def _params(self, op: Operation, notes: list[str]) -> list[Param]:
        """Path, query and header params: the path item's, overridden by the operation's."""
        merged: dict[tuple[str, str], dict[str, Any]] = {}
        for source in (op.path_item.get("parameters"), op.spec.get("parameters")):
            for raw in source if isinstance(source, list) else []:
                param = self.refs.follow(raw)
                if isinstance(param, dict) and isinstance(param.get("name"), str) and isinstance(param.get("in"), str):
                    merged[(param["name"], param["in"])] = param
        skip = self.fleet_headers()
        found: list[Param] = []
        for (name, place), param in merged.items():
            required = param.get("required") is True or place == "path"
            if place in ("body", "formData"):
                continue  # Swagger 2.0: read with the body
            if place == "cookie":
                if required:
                    raise Skip(f"it needs the cookie {one_line(name, 60)}, which the http connector cannot send")
                notes.append(f"cookie parameter {one_line(name, 60)} left out (the http connector sends no cookies)")
                continue
            if place not in ("path", "query", "header"):
                continue
            if place == "header" and name.lower() in skip:
                continue  # the fleet sets it (auth, content type, trace context)
            if self.auth_param == (place, name):
                continue
            if place == "header" and (problem := header_name_problem("header parameter", name)):
                # no field may send it: `reach validate` refuses such a header name
                if required:
                    raise Skip(f"its required {problem}")
                notes.append(f"{problem}; left out")
                continue
            found.append(
                Param(
                    name,
                    place,
                    self._param_schema(param),
                    required,
                    clean(param.get("description"), MAX_FIELD_DESCRIPTION),
                    param.get("deprecated") is True,
                    self._serialisation_note(param, place),
                )
            )
        return found

    def _param_schema(self, param: dict[str, Any]) -> Any:
        if self.version == "2.0":
            if param.get("type") == "file":
                raise Skip("it uploads a file")
            return {k: v for k, v in param.items() if k not in ("name", "in", "required", "description")}
        if "schema" in param:
            return param["schema"]
        content = param.get("content")
        if isinstance(content, dict) and content:
            media = self.refs.follow(next(iter(content.values())))
            return media.get("schema") if isinstance(media, dict) else None
        return None

    def _serialisation_note(self, param: dict[str, Any], place: str) -> str | None:
        """How the system wants an array or object param, when the http adapter writes it otherwise
        (it repeats a query param per item, and writes an object as JSON text)."""
        if self.version == "2.0":
            fmt = param.get("collectionFormat", "csv")
            if param.get("type") == "array" and not (place == "query" and fmt == "multi"):
                return (
                    f"the system expects the items joined as {one_line(fmt, 10)}; the adapter repeats a query "
                    "parameter per item and writes JSON text elsewhere"
                )
            return None
        schema = self.refs.follow(param.get("schema"))
        kind = schema.get("type") if isinstance(schema, dict) else None
        style = param.get("style", "form" if place == "query" else "simple")
        explode = param.get("explode", style == "form")
        if kind == "array" and not (place == "query" and style == "form" and explode is True):
            return (
                f"the system expects style {one_line(style, 20)} (explode {explode}); the adapter repeats a "
                "query parameter per item and writes JSON text elsewhere"
            )
        if kind == "object":
            return "an object param is sent as JSON text; check how the system reads it"
        return None

    def _success_schema(self, op: Operation) -> Any:
        """The JSON schema of the first 2xx answer (lowest code first), or None."""
        responses = op.spec.get("responses")
        if not isinstance(responses, dict):
            return None
        codes = sorted(str(c) for c in responses if str(c)[:1] == "2")
        if not codes:
            return None
        answer = self.refs.follow(responses.get(codes[0]))
        if not isinstance(answer, dict):
            return None
        if self.version == "2.0":
            produces = op.spec.get("produces") or self.doc.get("produces") or []
            if produces and not any(is_json(p) for p in produces if isinstance(p, str)):
                return None
            return answer.get("schema")
        content = answer.get("content")
        if not isinstance(content, dict):
            return None
        media = next((self.refs.follow(v) for k, v in content.items() if isinstance(k, str) and is_json(k)), None)
        return media.get("schema") if isinstance(media, dict) else None


def check_connector_name(name: str) -> None:
    """Raise OptionsError unless ``name`` is a valid connector name."""
    if not AGENT_ID_PATTERN.match(name) or "__" in name or name == "reach":
        raise OptionsError(
            f"connector name {name!r} must be lowercase letters, digits and _, starting with a letter "
            "(at most 63 characters, no '__', not 'reach')"
        )


def action_name(op: Operation, limit: int, taken: set[str]) -> str:
    """The operationId made to fit the action-name rule (else method and path), unique in ``taken``."""
    op_id = op.spec.get("operationId")
    base = _name_from(op_id) if isinstance(op_id, str) else ""
    if not base:
        base = _name_from(f"{op.method.lower()}_{op.path}") or op.method.lower()
    base = base[:limit].rstrip("_-") or op.method.lower()
    name, n = base, 1
    while name in taken:
        n += 1
        suffix = f"_{n}"
        name = base[: limit - len(suffix)].rstrip("_-") + suffix
    assert NAME_PATTERN.match(name) and "__" not in name, name
    taken.add(name)
    return name


def _name_from(text: str) -> str:
    name = _NOT_NAME.sub("_", text.replace(".", "_"))
    name = re.sub(r"_{2,}", "_", name)
    return re.sub(r"^[^A-Za-z]+", "", name).rstrip("_-")


def _key(name: str) -> str:
    """An input key for the system's param name: letters, digits and _ (the name: key keeps the original)."""
    key = re.sub(r"_{2,}", "_", _NOT_KEY.sub("_", name)).strip("_")
    if not key:
        key = "param"
    if key[0].isdigit():
        key = "p_" + key
    return key[:64]


def _unique(key: str, taken: Mapping[str, Any], place: str) -> str:
    """``key``, or ``<place>_key`` (numbered if need be) when another param has it."""
    if key not in taken:
        return key
    candidate = f"{place}_{key}"[:64]
    n = 1
    while candidate in taken:
        n += 1
        candidate = f"{place}_{key}"[: 64 - len(str(n)) - 1] + f"_{n}"
    return candidate


def _template(path: str) -> tuple[str, dict[str, str]]:
    """The action's path template: placeholders renamed to input keys, the rest percent-encoded.

    Returns the template and {the document's placeholder name: key}.
    """
    if any(c in path for c in " \t\r\n?#") or "://" in path or not path.startswith("/"):
        raise Skip("its path has a query, fragment, scheme or blank in it")
    renamed: dict[str, str] = {}
    parts: list[str] = []
    last = 0
    for match in PATH_PARAM.finditer(path):
        parts.append(quote(path[last : match.start()], safe="/:@!$&'()*+,;=-._~%"))
        name = match.group(1)
        key = renamed.get(name) or _unique(_key(name.strip("+*#./;?&")), {v: 1 for v in renamed.values()}, "path")
        renamed[name] = key
        parts.append("{" + key + "}")
        last = match.end()
    parts.append(quote(path[last:], safe="/:@!$&'()*+,;=-._~%"))  # a stray brace is encoded too
    return "".join(parts), renamed
