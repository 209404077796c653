"""The body of an HTTP action's request, in the kind its ``body:`` key names.

    json       (default) the ``in: body`` fields as one JSON object, or the one ``in: whole_body``
               field's value as the whole body (a JSON array, usually)
    form       the ``in: body`` fields as application/x-www-form-urlencoded (a list repeats its name)
    multipart  multipart/form-data: ``in: body`` fields as text parts, ``in: file`` fields as file parts
    binary     the one ``in: file`` field's bytes as the whole body

A file field's value is base64 text. Its length is checked against the field's ``max_bytes``
before it is decoded, and a file part's name and file name are the catalog's, never the agent's:
an agent cannot name a path or break out of the part's header.
"""

from __future__ import annotations

import base64
import binascii
import json
import secrets
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

from connectors.adapters.common import scalar_text
from connectors.adapters.errors import Unsendable
from connectors.spec import DEFAULT_FILE_BYTES, FieldSpec, base64_chars

OCTET_STREAM = "application/octet-stream"
_ABSENT = object()


def file_bytes(value: Any, spec: FieldSpec, name: str) -> bytes:
    """A file field's base64 text as bytes, within its ``max_bytes``.

    Raises:
        Unsendable: not base64 text (``format``), or more than ``max_bytes`` once decoded (``max_length``).
    """
    limit = spec.max_bytes or DEFAULT_FILE_BYTES
    smaller = f"Send a file of at most {limit} bytes as {name}."
    if not isinstance(value, str):
        raise Unsendable(f"{name} must be base64 text", name, "type")
    if len(value) > base64_chars(limit):  # bounded before any decoding
        raise Unsendable(
            f"{name} is more than {limit} bytes once decoded (at most {base64_chars(limit)} base64 characters)",
            name,
            "max_length",
            smaller,
        )
    try:
        data = base64.b64decode(value.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError) as exc:
        raise Unsendable(
            f"{name} is not base64 text (A-Z, a-z, 0-9, + and /, padded with =)",
            name,
            "format",
            f"Send {name} as the file's bytes in standard base64, without line breaks.",
        ) from exc
    if len(data) > limit:
        raise Unsendable(
            f"{name} is {len(data)} bytes once decoded; at most {limit} are sent", name, "max_length", smaller
        )
    return data


@dataclass
class Body:
    """What one call's params put in the body, gathered field by field, then encoded once."""

    kind: str
    fields: list[tuple[str, Any]] = field(default_factory=list)  # (wire name, value) of ``in: body``
    files: list[tuple[str, FieldSpec, bytes]] = field(default_factory=list)  # (wire name, spec, bytes)
    whole: Any = _ABSENT

    def add(self, place: str, wire: str, value: Any, spec: FieldSpec, name: str) -> None:
        if place == "file":
            if value is not None:
                self.files.append((wire, spec, file_bytes(value, spec, name)))
        elif place == "whole_body":
            self.whole = value
        else:
            self.fields.append((wire, value))

    def empty(self) -> bool:
        return not self.fields and not self.files and self.whole is _ABSENT

    def encode(self, headers: dict[str, str]) -> bytes:
        """The body's bytes; sets its Content-Type in ``headers``. Raises Unsendable."""
        if self.kind == "form":
            headers["Content-Type"] = "application/x-www-form-urlencoded"
            return urlencode(self._texts()).encode("ascii")
        if self.kind == "binary":
            wire, spec, data = self.files[0] if self.files else ("", None, b"")
            headers["Content-Type"] = (spec.content_type if spec else None) or OCTET_STREAM
            return data
        if self.kind == "multipart":
            return self._multipart(headers)
        value = dict(self.fields) if self.whole is _ABSENT else self.whole
        try:
            content = json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()
        except RecursionError as exc:
            raise Unsendable("the params nest too deeply to be written as JSON", code="max_length") from exc
        except ValueError as exc:  # text UTF-8 cannot carry (a lone surrogate)
            raise Unsendable(f"the params cannot be written as JSON: {exc}") from exc
        headers["Content-Type"] = "application/json"
        return content

    def _texts(self) -> list[tuple[str, str]]:
        texts: list[tuple[str, str]] = []
        for wire, value in self.fields:
            if value is None:
                continue  # a form has no null: the field is left out, as a query param is
            for item in value if isinstance(value, list) else [value]:
                text = scalar_text(item)
                try:
                    text.encode("utf-8")
                except UnicodeEncodeError as exc:  # a lone surrogate
                    raise Unsendable(f"the value of {wire!r} cannot be written as UTF-8", code="unsendable") from exc
                texts.append((wire, text))
        return texts

    def _multipart(self, headers: dict[str, str]) -> bytes:
        # a random boundary: an agent's text or file cannot guess it to end its part early
        boundary = secrets.token_hex(16).encode("ascii")
        out: list[bytes] = []
        for wire, text in self._texts():
            out += [b"--", boundary, b'\r\nContent-Disposition: form-data; name="', _quoted(wire), b'"\r\n\r\n']
            out += [text.encode("utf-8"), b"\r\n"]
        for wire, spec, content in self.files:
            out += [b"--", boundary, b'\r\nContent-Disposition: form-data; name="', _quoted(wire)]
            out += [b'"; filename="', _quoted(spec.filename or wire), b'"\r\n']
            out += [b"Content-Type: ", (spec.content_type or OCTET_STREAM).encode("ascii"), b"\r\n\r\n"]
            out += [content, b"\r\n"]
        out += [b"--", boundary, b"--\r\n"]
        headers["Content-Type"] = f"multipart/form-data; boundary={boundary.decode('ascii')}"
        return b"".join(out)


def _quoted(name: str) -> bytes:
    """A part's name or file name inside its quotes, escaped as HTML forms do (the catalog's words,
    checked when it loads; escaped all the same)."""
    return name.replace('"', "%22").replace("\r", "%0D").replace("\n", "%0A").encode("utf-8")
