"""Tool schemas: the semantic actions an agent may call, in the shapes model APIs expect.

The fleet describes each action once as a :class:`ToolSpec` (``reach.list_tools`` returns them
as ``to_dict()`` documents); this module renders that list for OpenAI (Chat Completions or the
Responses API), Anthropic or MCP. Tool
names are ``connector__action`` because tool-name rules of those APIs forbid dots; the router
resolves them back.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "EXPORT_FORMATS",
    "ROUTING_GUIDE",
    "ToolSpec",
    "export",
    "to_anthropic",
    "to_mcp",
    "to_openai",
    "to_openai_responses",
]

EXPORT_FORMATS = ("openai", "anthropic", "mcp", "json", "openai-responses")

# What a model should do with an AMBIGUOUS_ACTION, by its routing tier (docs/contract.md §3, §6):
# the MCP facade's instructions carry it, and an SDK agent may put it in its system prompt
ROUTING_GUIDE = (
    "AMBIGUOUS_ACTION means several systems offer what was asked and the request did not single one out. "
    "If its routing tier is 'confirm', ask the user the one yes/no question its suggestion gives and call "
    "the suggested system's action on yes, the other on no; if 'open', ask the user to choose among the "
    "systems it lists. Then call the chosen system's own action (connector__action) with the same arguments."
)


@dataclass(frozen=True)
class ToolSpec:
    """One action as a tool a model can call.

    Attributes:
        name: ``connector__action``.
        description: What the action does, written for the model.
        input_schema: A JSON Schema object: ``{"type": "object", "properties": ...,
            "required": [...], "additionalProperties": false}``.
    """

    name: str
    description: str
    input_schema: dict[str, Any]

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ToolSpec:
        """Build a spec from a :meth:`to_dict` document.

        Args:
            d: ``{"name", "description", "input_schema"}``.

        Returns:
            The spec.

        Raises:
            ValueError: A key is missing or has the wrong type.
        """
        if not isinstance(d, dict):
            raise ValueError(f"a tool spec must be an object, got {type(d).__name__}")
        name, description, schema = d.get("name"), d.get("description"), d.get("input_schema")
        if not isinstance(name, str) or not name:
            raise ValueError("a tool spec needs 'name', a non-empty string")
        if not isinstance(description, str):
            raise ValueError(f"tool {name!r}: 'description' must be a string")
        if not isinstance(schema, dict):
            raise ValueError(f"tool {name!r}: 'input_schema' must be a JSON Schema object")
        return cls(name=name, description=description, input_schema=copy.deepcopy(schema))

    def to_dict(self) -> dict[str, Any]:
        """Return ``{"name", "description", "input_schema"}`` (a copy, safe to mutate)."""
        return {
            "name": self.name,
            "description": self.description,
            "input_schema": copy.deepcopy(self.input_schema),
        }


def to_openai(tools: Iterable[ToolSpec]) -> list[dict[str, Any]]:
    """Render tools for the OpenAI ``tools`` request parameter.

    Args:
        tools: The specs.

    Returns:
        ``[{"type": "function", "function": {"name", "description", "parameters"}}]``.
    """
    return [
        {
            "type": "function",
            "function": {
                "name": t.name,
                "description": t.description,
                "parameters": copy.deepcopy(t.input_schema),
            },
        }
        for t in tools
    ]


def to_openai_responses(tools: Iterable[ToolSpec]) -> list[dict[str, Any]]:
    """Render tools for the OpenAI Responses API ``tools`` parameter (flat, not nested in ``function``).

    ``strict`` is false: the Responses API defaults it to true, which demands every property be
    required, and optional params are the norm here (the router checks params either way).

    Args:
        tools: The specs.

    Returns:
        ``[{"type": "function", "name", "description", "parameters", "strict": false}]``.
    """
    return [
        {
            "type": "function",
            "name": t.name,
            "description": t.description,
            "parameters": copy.deepcopy(t.input_schema),
            "strict": False,
        }
        for t in tools
    ]


def to_anthropic(tools: Iterable[ToolSpec]) -> list[dict[str, Any]]:
    """Render tools for the Anthropic Messages API ``tools`` parameter.

    Args:
        tools: The specs.

    Returns:
        ``[{"name", "description", "input_schema"}]``.
    """
    return [t.to_dict() for t in tools]


def to_mcp(tools: Iterable[ToolSpec]) -> list[dict[str, Any]]:
    """Render tools as the entries of an MCP ``tools/list`` result.

    Args:
        tools: The specs.

    Returns:
        ``[{"name", "description", "inputSchema"}]``.
    """
    return [
        {
            "name": t.name,
            "description": t.description,
            "inputSchema": copy.deepcopy(t.input_schema),
        }
        for t in tools
    ]


def _to_json(tools: Iterable[ToolSpec]) -> list[dict[str, Any]]:
    return [t.to_dict() for t in tools]


_EXPORTERS: dict[str, Callable[[Iterable[ToolSpec]], list[dict[str, Any]]]] = {
    "openai": to_openai,
    "openai-responses": to_openai_responses,
    "anthropic": to_anthropic,
    "mcp": to_mcp,
    "json": _to_json,
}


def export(tools: Iterable[ToolSpec], fmt: str) -> list[dict[str, Any]]:
    """Render tools in the named format.

    Args:
        tools: The specs.
        fmt: One of ``"openai"`` (Chat Completions), ``"openai-responses"`` (Responses API),
            ``"anthropic"``, ``"mcp"`` or ``"json"`` (``to_dict`` documents).

    Returns:
        The rendered list.

    Raises:
        ValueError: ``fmt`` is not a known format.
    """
    try:
        exporter = _EXPORTERS[fmt]
    except (KeyError, TypeError):
        raise ValueError(f"unknown tool format {fmt!r}: expected one of {', '.join(EXPORT_FORMATS)}") from None
    return exporter(tools)
