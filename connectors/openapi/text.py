"""The catalog as text: YAML people edit, and document text made safe to quote in it."""

from __future__ import annotations

import re
from typing import Any

import yaml

_CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029]")


class Flow(dict[str, Any]):
    """A field short enough to read on one line: ``{type: string, required: true}``."""


class Block(str):
    """Text of several lines, written as a literal block (``|``)."""


class _Dumper(getattr(yaml, "CSafeDumper", yaml.SafeDumper)):  # type: ignore[misc]
    def ignore_aliases(self, data: Any) -> bool:
        return True  # every field written out in full: no &id001 / *id001


_Dumper.add_representer(
    Flow, lambda dumper, data: dumper.represent_mapping("tag:yaml.org,2002:map", data.items(), flow_style=True)
)
_Dumper.add_representer(
    Block, lambda dumper, data: dumper.represent_scalar("tag:yaml.org,2002:str", str(data), style="|")
)
_Dumper.add_representer(
    dict, lambda dumper, data: dumper.represent_mapping("tag:yaml.org,2002:map", data.items(), flow_style=False)
)
_Dumper.add_representer(
    list,
    lambda dumper, data: dumper.represent_sequence(
        "tag:yaml.org,2002:seq", data, flow_style=all(not isinstance(v, (dict, list)) for v in data)
    ),
)


def dump(value: Any) -> str:
    text: str = yaml.dump(value, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=110, indent=2)
    return text


def one_line(value: Any, limit: int) -> str:
    """Text safe inside a comment or a message: one line, no control characters, bounded."""
    text = " ".join(_CONTROL.sub(" ", str(value)).split())
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def clean(value: Any, limit: int) -> str | None:
    """A description from the document: control characters gone, blank runs tidied, bounded."""
    if not isinstance(value, str):
        return None
    lines = [" ".join(_CONTROL.sub(" ", line).split()) for line in value.replace("\r\n", "\n").split("\n")]
    text = re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()
    if len(text) > limit:
        cut = text[: limit - 1]
        text = (cut.rsplit(" ", 1)[0] if " " in cut[limit // 2 :] else cut).rstrip() + "…"
    return text or None


def described(text: str | None) -> str | Block | None:
    return Block(text) if text and "\n" in text else text


_KEY_ORDER = (
    "type",
    "values",
    "in",
    "name",
    "required",
    "nullable",
    "default",
    "min",
    "max",
    "min_length",
    "max_length",
    "pattern",
    "sensitive",
    "content_type",
    "filename",
    "max_bytes",
    "description",
    "items",
    "properties",
)


def ordered(spec: dict[str, Any]) -> dict[str, Any]:
    """A field's keys in one order everywhere, nested fields last (easier to read and to diff)."""
    return {k: spec[k] for k in _KEY_ORDER if k in spec}


def flow_if_short(spec: dict[str, Any]) -> dict[str, Any]:
    """One line when it reads well there; nested fields and long texts keep a block each."""
    if any(isinstance(v, (dict, Block)) for v in spec.values()):
        return dict(spec)
    flow = Flow(spec)
    return flow if len(dump(flow)) <= 90 else dict(spec)


def plain(value: Any) -> Any:
    """The field classes (Flow, Block) as plain dicts and strings, for the models."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, str):
        return str(value)
    return value
