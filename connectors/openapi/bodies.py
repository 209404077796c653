"""An operation's request body -> the action's ``body:`` kind and its fields.

JSON object                     body: json (the default), a field per property, in: body
JSON array or scalar            one field, in: whole_body (named by the 2.0 body parameter or
                                3.x x-codegen-request-body-name, else ``body``)
application/x-www-form-urlencoded   body: form, a field per property (2.0: formData params)
multipart/form-data             body: multipart; binary string properties (2.0: type file) are
                                in: file, with the part's encoding contentType
raw bytes (image/png, application/octet-stream, ... with a binary string or no schema)
                                body: binary, one field ``file``, in: file
XML or text                     not imported (Skip)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from connectors.openapi.document import Operation, Refs, Skip
from connectors.openapi.fields import MAX_FIELD_DESCRIPTION, Param, WithStack
from connectors.openapi.shapes import Shapes, names_in
from connectors.openapi.text import clean, one_line
from connectors.spec.fields import MEDIA_TYPE


class Bodies:
    """Reads the request bodies of one document's operations."""

    def __init__(self, doc: dict[str, Any], version: str, refs: Refs) -> None:
        self.doc = doc
        self.version = version
        self.refs = refs

    def of(self, op: Operation, schemas: Shapes, notes: list[str]) -> tuple[str, list[Param]]:
        """The body's kind (json, form, multipart, binary) and its fields: one per property of an
        object (a JSON object, a form, the parts of a multipart body), a JSON array or scalar as
        one ``in: whole_body`` field, raw bytes as one ``in: file`` field."""
        found = self._body_schema(op)
        if found is None:
            return "json", []
        if found.form is not None:  # Swagger 2.0 formData parameters
            return found.kind, found.form
        if found.kind == "binary":
            return "binary", [Param("file", "file", None, found.required, found.description, content_type=found.media)]
        shape = schemas.shape(found.schema)
        if found.kind == "json" and shape["type"] not in ("object", ""):
            return "json", [Param(found.name, "whole_body", found.schema, found.required, found.description)]
        if shape["type"] not in ("object", ""):
            raise Skip(f"its {found.kind} body is a {shape['type']}, not an object of fields")
        properties = shape.get("properties")
        if not isinstance(properties, dict) or not properties:
            if shape["type"] == "object" or found.required:
                notes.append(f"the request body is a free-form {found.kind} object; no fields were imported from it")
            return found.kind, []
        wanted = set(names_in(shape.get("required")))
        params = []
        for name, prop in list(properties.items())[:500]:
            if not isinstance(name, str) or len(name) > 200:
                continue
            place, media = "body", None
            if found.kind == "multipart" and _is_binary(schemas.shape(prop, shape["_stack"])):
                place, media = "file", _part_media(found.encoding.get(name), self.refs)
            params.append(
                Param(name, place, WithStack(prop, shape["_stack"]), name in wanted, None, content_type=media)
            )
        return found.kind, params

    def _body_schema(self, op: Operation) -> _BodyFound | None:
        if self.version == "2.0":
            return self._body_schema_20(op)
        request = self.refs.follow(op.spec.get("requestBody"))
        if not isinstance(request, dict):
            return None
        content = request.get("content")
        if not isinstance(content, dict) or not content:
            return None
        required = request.get("required") is True
        description = clean(request.get("description"), MAX_FIELD_DESCRIPTION)
        name = request.get("x-codegen-request-body-name")
        name = name if isinstance(name, str) and name.strip() else "body"
        kinds = {_media_kind(k): (k, v) for k, v in reversed(list(content.items())) if isinstance(k, str)}
        for kind in ("json", "form", "multipart"):
            if kind in kinds:
                media = self.refs.follow(kinds[kind][1])
                schema = media.get("schema") if isinstance(media, dict) else None
                encoding = media.get("encoding") if isinstance(media, dict) else None
                return _BodyFound(
                    kind, schema, required, description, name, encoding=encoding if isinstance(encoding, dict) else {}
                )
        for key, value in content.items():
            media = self.refs.follow(value)
            schema = self.refs.follow(media.get("schema")) if isinstance(media, dict) else None
            if isinstance(key, str) and _is_bytes(key, schema):
                concrete = key.split(";", 1)[0].strip().lower()
                return _BodyFound("binary", None, required, description, name, media=_concrete(concrete))
        kinds_text = ", ".join(str(k) for k in content)
        raise Skip(
            f"its request body is {one_line(kinds_text, 80)}; the http connector sends JSON, forms, "
            "multipart and raw bytes"
        )

    def _body_schema_20(self, op: Operation) -> _BodyFound | None:
        params = [
            self.refs.follow(p) for p in [*(op.path_item.get("parameters") or []), *(op.spec.get("parameters") or [])]
        ]
        form = [
            p for p in params if isinstance(p, dict) and p.get("in") == "formData" and isinstance(p.get("name"), str)
        ]
        consumes = [c for c in op.spec.get("consumes") or self.doc.get("consumes") or [] if isinstance(c, str)]
        if form:
            files = any(p.get("type") == "file" for p in form)
            multipart = files or any(_media_kind(c) == "multipart" for c in consumes)
            fields = [
                Param(
                    p["name"],
                    "file" if p.get("type") == "file" else "body",
                    None
                    if p.get("type") == "file"
                    else {k: v for k, v in p.items() if k not in ("name", "in", "required", "description")},
                    p.get("required") is True,
                    clean(p.get("description"), MAX_FIELD_DESCRIPTION),
                )
                for p in form
            ]
            return _BodyFound("multipart" if multipart else "form", None, False, None, "body", form=fields)
        body = next((p for p in params if isinstance(p, dict) and p.get("in") == "body"), None)
        if body is None:
            return None
        if consumes and not any(is_json(c) for c in consumes):
            raise Skip(f"its request body is {one_line(', '.join(consumes), 80)}; the http connector sends JSON here")
        name = body["name"] if isinstance(body.get("name"), str) else "body"
        description = clean(body.get("description"), MAX_FIELD_DESCRIPTION)
        return _BodyFound("json", body.get("schema"), body.get("required") is True, description, name)


@dataclass(frozen=True)
class _BodyFound:
    """What an operation's request body is: its kind, schema and how it is described."""

    kind: str  # json, form, multipart, binary
    schema: Any
    required: bool
    description: str | None
    name: str  # the input key of a whole JSON body that is not an object
    media: str | None = None  # binary: the body's media type
    encoding: dict[str, Any] = field(default_factory=dict)  # multipart: per-part encoding (contentType)
    form: list[Param] | None = None  # Swagger 2.0: its formData params


def _media_kind(media: str) -> str:
    kind = media.split(";", 1)[0].strip().lower()
    if is_json(kind):
        return "json"
    if kind == "application/x-www-form-urlencoded":
        return "form"
    if kind == "multipart/form-data":
        return "multipart"
    return "other"


def _is_bytes(media: str, schema: Any) -> bool:
    """Whether a body of this media type and schema is raw bytes: a binary string, or no schema at all."""
    kind = media.split(";", 1)[0].strip().lower()
    if kind.startswith("text/") or "xml" in kind:
        return False
    if schema is None:
        return True
    return isinstance(schema, dict) and schema.get("type") in ("string", None) and "properties" not in schema


def _is_binary(shape: dict[str, Any]) -> bool:
    """A multipart property holding a file: a binary string (3.0 ``format: binary``, 3.1 ``contentMediaType``)."""
    if shape.get("type") != "string":
        return False
    return shape.get("format") in ("binary", "byte") or "contentMediaType" in shape or "contentEncoding" in shape


def _concrete(media: str) -> str | None:
    """A media type the catalog can name (``image/*`` is none: the part is then application/octet-stream)."""
    return media if MEDIA_TYPE.match(media) and "*" not in media else None


def _part_media(encoding: Any, refs: Refs) -> str | None:
    found = refs.follow(encoding)
    kind = found.get("contentType") if isinstance(found, dict) else None
    return _concrete(kind.split(",")[0].split(";")[0].strip().lower()) if isinstance(kind, str) else None


def is_json(media: str) -> bool:
    kind = media.split(";", 1)[0].strip().lower()
    return kind in ("application/json", "*/*", "application/*") or kind.endswith("+json") or kind.endswith("/json")
