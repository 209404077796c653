"""``input:`` and ``output:`` fields of an action: a type, its bounds, and where the field goes."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from connectors.patterns import compile_pattern
from connectors.spec.base import Spec, check_zone
from connectors.spec.http_parts import header_name_problem

ENTITY_NAME = re.compile(r"^[a-z][a-z0-9_]{0,62}$")
ENTITY_TYPES = ("string", "integer")  # values that name one thing: no floats, no structures
FieldType = Literal["string", "integer", "number", "boolean", "enum", "datetime", "date", "array", "object"]
# where the HTTP adapter puts a field: `file` is base64 text sent as bytes (a multipart file part, or
# the whole body of `body: binary`); `whole_body` is the entire JSON body (an array, usually)
Placement = Literal["path", "query", "body", "header", "file", "whole_body"]
DEFAULT_FILE_BYTES = 1 << 20  # a file field's decoded size when it declares no `max_bytes`
MAX_FILE_BYTES = 8 << 20  # the most `max_bytes` may say: a file rides base64 inside the intent
# the file name a multipart part carries: the catalog's word only, so no path or quote tricks
FILE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_. -]{0,127}$")
MEDIA_TYPE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,63}/[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,126}$")


def base64_chars(decoded_bytes: int) -> int:
    """How many base64 characters (padded) carry ``decoded_bytes`` bytes."""
    return 4 * ((decoded_bytes + 2) // 3)


class FieldSpec(Spec):
    """One input or output field of an action."""

    type: FieldType = "string"
    required: bool = False
    default: Any = None
    description: str | None = None
    values: list[Any] | None = None
    min: float | None = None
    max: float | None = None
    min_length: int | None = Field(default=None, ge=0)
    max_length: int | None = Field(default=None, ge=0)
    pattern: str | None = None
    nullable: bool = False
    sensitive: bool = False
    in_: Placement | None = Field(default=None, alias="in")
    name: str | None = None
    as_: Literal["string"] | None = Field(default=None, alias="as")
    format: str | None = None
    timezone: str | None = None
    null_as: Literal["", "omit", "null"] | None = None
    filename: str | None = None  # in: file, multipart: the part's file name (default: its name)
    content_type: str | None = None  # in: file: the bytes' media type (default application/octet-stream)
    max_bytes: int | None = Field(default=None, ge=1, le=MAX_FILE_BYTES)  # in: file: decoded size bound
    items: FieldSpec | None = None
    properties: dict[str, FieldSpec] | None = None
    # the business entity this field names (``order`` on ``order_id``): what ``reach.history`` is
    # asked by. Top-level input/output fields only (connectors/history.py)
    entity: str | None = None

    @field_validator("entity")
    @classmethod
    def _entity_name(cls, v: str | None) -> str | None:
        if v is not None and not ENTITY_NAME.match(v):
            raise ValueError(f"entity name {v!r} must match {ENTITY_NAME.pattern} (lowercase letters, digits, _)")
        return v

    @field_validator("pattern")
    @classmethod
    def _pattern_compiles(cls, v: str | None) -> str | None:
        if v is not None:
            compile_pattern(v)  # PatternError is a ValueError: reach validate reports it with file and line
        return v

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, v: str | None) -> str | None:
        return v if v is None else check_zone(v)

    @model_validator(mode="after")
    def _consistent(self) -> FieldSpec:
        if self.type == "enum" and not self.values:
            raise ValueError("an enum field needs a non-empty `values` list")
        if self.type == "array" and self.items is None:
            raise ValueError("an array field needs `items`")
        if self.items is not None and self.type != "array":
            raise ValueError("`items` only applies to type array")
        if self.properties is not None and self.type != "object":
            raise ValueError("`properties` only applies to type object")
        if self.as_ is not None and self.type not in ("boolean", "integer", "number"):
            raise ValueError("`as: string` only applies to boolean, integer and number fields")
        if (self.format or self.timezone) and self.type not in ("datetime", "date"):
            raise ValueError("`format` and `timezone` only apply to datetime and date fields")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError("`min` is greater than `max`")
        if self.min_length is not None and self.max_length is not None and self.min_length > self.max_length:
            raise ValueError("`min_length` is greater than `max_length`")
        if self.entity is not None and self.sensitive:
            raise ValueError("a sensitive field cannot be an `entity`: history indexes keep entity values in the clear")
        if self.entity is not None and self.type not in ENTITY_TYPES:
            raise ValueError(f"`entity` only applies to string and integer fields (this one is {self.type})")
        if (self.filename or self.content_type or self.max_bytes is not None) and self.in_ != "file":
            raise ValueError("`filename`, `content_type` and `max_bytes` only apply to fields with in: file")
        if self.in_ == "file" and self.type != "string":
            raise ValueError("a field with in: file takes base64 text: give it type: string")
        if self.filename is not None and (not FILE_NAME.match(self.filename) or ".." in self.filename):
            raise ValueError(
                f"filename {self.filename[:80]!r} must be 1-128 letters, digits, _ . - or spaces, "
                "starting with a letter, digit or _ (no /, \\, quotes or ..)"
            )
        if self.content_type is not None and not MEDIA_TYPE.match(self.content_type):
            raise ValueError(f"content_type {self.content_type[:80]!r} must be a media type like image/png")
        if self.in_ == "header" and self.name is not None and (problem := header_name_problem("`name`", self.name)):
            raise ValueError(problem)
        return self
