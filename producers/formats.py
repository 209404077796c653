"""Intent shapes accepted on the intent queue, and the strict JSON parser in front of them.

Agents built on model SDKs tend to forward the tool call the model produced instead of writing
a native intent, so the queue accepts those shapes too (docs/contract.md section 2) and turns them into
the native one here. Field types of the native shape are checked later by ``wire.Intent``; this
module only decides which shape a document is and reshapes it.

Every problem raises :class:`FormatError`, whose message is written for the model that sent the
document: what is wrong and what shape is expected.
"""

from __future__ import annotations

import json
import math
import re
import sys
from dataclasses import dataclass
from typing import Any

from producers.wire import INTENT_ID_PATTERN

__all__ = [
    "DEFAULT_MAX_DEPTH",
    "FORMATS",
    "FormatError",
    "Normalized",
    "TooDeep",
    "json_depth",
    "loads_strict",
    "normalize",
    "top_level_string",
    "value_depth",
]

# how deep params may nest; a document may nest a few levels more (the intent around its params,
# an MCP request around its arguments)
DEFAULT_MAX_DEPTH = 32
ENVELOPE_DEPTH = 3

FORMATS = ("native", "openai", "openai-responses", "anthropic", "mcp", "langchain")

_EXPECTED = (
    "expected an object with 'action' (or an OpenAI tool call, OpenAI Responses function_call, "
    "Anthropic tool_use, MCP tools/call or LangChain ToolCall)"
)
# a JSON escape for a UTF-16 surrogate; only then can a parsed string hold a lone surrogate
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89abcdefABCDEF]")
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")


class FormatError(ValueError):
    """A document is not valid JSON or not an intent of any accepted shape."""


class TooDeep(FormatError):
    """The JSON nests deeper than allowed; found before parsing."""

    def __init__(self, depth: int, limit: int) -> None:
        super().__init__(f"the JSON nests {depth} levels deep; at most {limit} are accepted: flatten it")
        self.depth = depth


@dataclass(frozen=True)
class Normalized:
    """A document reshaped into a native intent.

    Attributes:
        intent: The native intent (keys of docs/contract.md section 2 only), not yet type-checked.
        format: The shape it arrived in: one of :data:`FORMATS`.
    """

    intent: dict[str, Any]
    format: str


def json_depth(text: str) -> int:
    """How deep the arrays and objects of JSON text nest, found without parsing (no recursion):
    brackets inside strings do not count. Linear in the text; cheap when it holds few brackets."""
    if text.count("[") + text.count("{") <= 1:
        return text.count("[") + text.count("{")
    depth = deepest = 0
    for bracket in _NOT_BRACKET.sub("", _JSON_STRING.sub("", text)):
        if bracket in "[{":
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


def top_level_string(text: str, key: str) -> str | None:
    """The string value of ``key`` in the outermost object of JSON text that is too deep to parse
    (for identifying the sender of an intent refused for its nesting), or None. Bounded: linear."""
    pattern = re.compile(r'"' + re.escape(key) + r'"\s*:\s*"([^"\\]{1,128})"')
    for match in pattern.finditer(text):
        prefix = _NOT_BRACKET.sub("", _JSON_STRING.sub("", text[: match.start()]))
        if prefix.count("{") + prefix.count("[") - prefix.count("}") - prefix.count("]") == 1:
            return match.group(1)
    return None


def value_depth(value: Any) -> int:
    """How deep a parsed JSON value nests (``{}`` and ``[]`` count 1), without recursion."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            deepest = max(deepest, depth)
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            deepest = max(deepest, depth)
            stack.extend((v, depth + 1) for v in item)
    return deepest


def loads_strict(data: bytes | str, max_depth: int = DEFAULT_MAX_DEPTH + ENVELOPE_DEPTH) -> Any:
    """Parse JSON text, refusing what the standard json module lets through.

    Rejects NaN, Infinity and -Infinity (also as overflowing literals such as ``1e999``),
    duplicate keys in an object, unpaired UTF-16 surrogates, invalid UTF-8 and nesting deeper
    than ``max_depth`` (checked on the text before the recursive parser runs).

    Args:
        data: The JSON text; bytes must be UTF-8.
        max_depth: How deep arrays and objects may nest.

    Returns:
        The parsed value.

    Raises:
        FormatError: The text is not strict JSON; the message says why.
    """
    if isinstance(data, (bytes, bytearray, memoryview)):
        try:
            text = bytes(data).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise FormatError(
                f"the message is not valid UTF-8 (bad byte at offset {exc.start}); send JSON encoded as UTF-8"
            ) from exc
    elif isinstance(data, str):
        text = data
    else:
        raise TypeError(f"loads_strict() takes bytes or str, not {type(data).__name__}")
    # quick bound first: a text with few brackets cannot nest deeply
    if text.count("[") + text.count("{") > max_depth and (depth := json_depth(text)) > max_depth:
        raise TooDeep(depth, max_depth)
    try:
        value = json.loads(
            text,
            object_pairs_hook=_unique_object,
            parse_constant=_reject_constant,
            parse_float=_finite_float,
        )
    except FormatError:
        raise
    except RecursionError as exc:
        raise FormatError("the JSON is nested too deeply; flatten it") from exc
    except json.JSONDecodeError as exc:
        raise FormatError(f"the message is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from exc
    except ValueError as exc:
        # the only other ValueError json raises: an integer beyond the interpreter's digit limit
        raise FormatError(
            "the JSON contains an integer with too many digits (at most "
            f"{sys.get_int_max_str_digits() or 'unlimited'} are read); send a shorter number"
        ) from exc
    # decoded UTF-8 never holds a surrogate, so only escapes (or a str argument) can bring one
    if _SURROGATE_ESCAPE.search(text) or (isinstance(data, str) and not _is_encodable(text)):
        _reject_lone_surrogates(value)
    return value


def normalize(doc: Any) -> Normalized:
    """Detect which accepted shape ``doc`` has and reshape it into a native intent.

    A document with an ``action`` key is native and returned unchanged. Foreign tool calls
    become ``{"action", "params", "intent_id"?}``; their ids are kept as ``intent_id`` only
    when they fit ``wire.INTENT_ID_PATTERN`` (otherwise the router generates one). Tool names
    (``connector__action``) pass through unchanged; the router resolves them.

    Args:
        doc: A parsed JSON value, usually from :func:`loads_strict`.

    Returns:
        The native intent and the name of the shape it came in.

    Raises:
        FormatError: ``doc`` has no accepted shape, or a recognised shape has a field of the
            wrong type; the message names the field.
    """
    if not isinstance(doc, dict):
        raise FormatError(f"{_describe(doc)} is not an intent: {_EXPECTED}")
    if "action" in doc:
        return Normalized(doc, "native")
    kind = doc.get("type")
    if kind == "function" or ("function" in doc and kind is None):
        return Normalized(_from_openai(doc), "openai")
    if kind == "function_call":
        return Normalized(_from_openai_responses(doc), "openai-responses")
    if kind == "tool_use":
        return Normalized(_from_anthropic(doc), "anthropic")
    if "jsonrpc" in doc or doc.get("method") == "tools/call":
        return Normalized(_from_mcp(doc), "mcp")
    if kind == "tool_call" or (kind is None and "name" in doc and "args" in doc):
        return Normalized(_from_langchain(doc), "langchain")
    raise FormatError(f"an object without 'action' is not an intent: {_EXPECTED}")


def _from_openai(doc: dict[str, Any]) -> dict[str, Any]:
    function = doc.get("function")
    if not isinstance(function, dict):
        raise FormatError("OpenAI tool call: 'function' must be an object with 'name' and 'arguments'")
    name = _tool_name(function.get("name"), "OpenAI tool call", "function.name")
    arguments = function.get("arguments")
    if not isinstance(arguments, str):
        raise FormatError(
            f"OpenAI tool call: 'function.arguments' must be a string holding a JSON object, got {_describe(arguments)}"
        )
    try:
        params = loads_strict(arguments)
    except FormatError as exc:
        raise FormatError(f"OpenAI tool call: 'function.arguments' is not usable: {exc}") from exc
    if not isinstance(params, dict):
        raise FormatError(f"OpenAI tool call: 'function.arguments' must hold a JSON object, got {_describe(params)}")
    return _native(name, params, doc.get("id"))


def _from_openai_responses(doc: dict[str, Any]) -> dict[str, Any]:
    # a Responses API output item: {"type": "function_call", "id": "fc_…", "call_id": "call_…",
    # "name", "arguments": "<JSON text>", "status"?}; call_id is what the model pairs the result with
    shape = "OpenAI Responses function_call"
    status = doc.get("status")
    if status is not None and status != "completed":
        shown = repr(status[:20]) if isinstance(status, str) else _describe(status)
        raise FormatError(
            f"{shape}: 'status' is {shown}; only a completed call is acted on (its arguments may be cut short)"
        )
    name = _tool_name(doc.get("name"), shape, "name")
    arguments = doc.get("arguments")
    if not isinstance(arguments, str):
        raise FormatError(f"{shape}: 'arguments' must be a string holding a JSON object, got {_describe(arguments)}")
    try:
        params = loads_strict(arguments)
    except FormatError as exc:
        raise FormatError(f"{shape}: 'arguments' is not usable: {exc}") from exc
    if not isinstance(params, dict):
        raise FormatError(f"{shape}: 'arguments' must hold a JSON object, got {_describe(params)}")
    call_id = doc.get("call_id")
    return _native(name, params, call_id if call_id is not None else doc.get("id"))


def _from_anthropic(doc: dict[str, Any]) -> dict[str, Any]:
    name = _tool_name(doc.get("name"), "Anthropic tool_use", "name")
    params = doc.get("input")
    if not isinstance(params, dict):
        raise FormatError(f"Anthropic tool_use: 'input' must be an object, got {_describe(params)}")
    return _native(name, params, doc.get("id"))


def _from_mcp(doc: dict[str, Any]) -> dict[str, Any]:
    if doc.get("jsonrpc") != "2.0":
        raise FormatError(f"MCP request: 'jsonrpc' must be \"2.0\", got {_describe(doc.get('jsonrpc'))}")
    method = doc.get("method")
    if method != "tools/call":
        raise FormatError(f"MCP request: 'method' must be \"tools/call\" on the intent queue, got {_describe(method)}")
    call = doc.get("params")
    if not isinstance(call, dict):
        raise FormatError(
            f"MCP tools/call: 'params' must be an object with 'name' and 'arguments', got {_describe(call)}"
        )
    name = _tool_name(call.get("name"), "MCP tools/call", "params.name")
    params = call.get("arguments")
    if params is None:
        params = {}
    elif not isinstance(params, dict):
        raise FormatError(f"MCP tools/call: 'params.arguments' must be an object, got {_describe(params)}")
    # JSON-RPC ids count from 1 in every MCP session: as intent ids they would collide (and
    # replay old outcomes through the idempotency ledger); the AMQP message_id, or a new id, is used
    return _native(name, params, None)


def _from_langchain(doc: dict[str, Any]) -> dict[str, Any]:
    name = _tool_name(doc.get("name"), "LangChain ToolCall", "name")
    params = doc.get("args")
    if not isinstance(params, dict):
        raise FormatError(f"LangChain ToolCall: 'args' must be an object, got {_describe(params)}")
    return _native(name, params, doc.get("id"))


def _tool_name(value: Any, shape: str, field: str) -> str:
    if not isinstance(value, str) or not value:
        raise FormatError(f"{shape}: '{field}' must be a non-empty string (the tool name), got {_describe(value)}")
    return value


def _native(action: str, params: dict[str, Any], foreign_id: Any) -> dict[str, Any]:
    intent: dict[str, Any] = {"action": action, "params": params}
    # a foreign id that is not a valid intent_id is dropped rather than rejected: the model did
    # not choose it, and the router generates one
    if isinstance(foreign_id, str) and INTENT_ID_PATTERN.match(foreign_id):
        intent["intent_id"] = foreign_id
    return intent


def _describe(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _unique_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise FormatError(f"the JSON object has the key {key[:64]!r} more than once; send each key once")
            seen.add(key)
    return obj


def _reject_constant(name: str) -> Any:
    raise FormatError(f"the JSON contains {name}, which is not valid JSON; numbers must be finite")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise FormatError(f"the JSON number {text[:40]} is out of range; numbers must be finite")
    return value


def _is_encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _reject_lone_surrogates(value: Any) -> None:
    # a lone surrogate cannot be encoded as UTF-8, so it would break every receipt and log line
    # that echoes it; walked iteratively because the value may be nested deeply
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if not _is_encodable(item):
                raise FormatError(
                    "the JSON contains an unpaired UTF-16 surrogate (\\ud800-\\udfff); send valid Unicode text"
                )
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
