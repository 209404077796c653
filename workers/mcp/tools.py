"""The catalog as MCP tools: exactly the actions and workflows an agent is bound to, as
``reach.list_tools`` lists them (its actions, then its workflows).

Each tool is the action's :func:`connectors.catalog.tool_spec` (the same name, description and
input schema ``reach.list_tools`` and ``reach catalog --format mcp`` give) plus what MCP adds:

- ``annotations``: ``readOnlyHint`` for a read, ``destructiveHint`` for a write (the catalog knows
  only read and write, so every write counts as one that may destroy), ``idempotentHint`` from the
  action's ``idempotent`` (a connector's ``idempotency_header`` does not count: a second
  ``tools/call`` is a new intent with a new key unless the caller sends the same one).
- ``outputSchema`` when the action declares ``output``: the pool refuses a success that lacks a
  declared field, so every field is required, and other keys are allowed, as the pool allows them.
  A success whose answer was too large to pass on carries ``{"_reach_omitted": "why"}`` instead
  of the fields (docs/contract.md §4), so the schema admits that marker as the one alternative.
  The fields' ``pattern`` keywords are left out of what clients are given (see below).

Patterns are RE2's (connectors.patterns): the catalog checks them with RE2 and the pool checks a
success's data with RE2 before it is a receipt. The facade checks that data again against the
declared output (the catalog it loaded may be newer than the pool's) with the same engine, through
a JSON Schema validator whose ``pattern`` keyword runs on RE2: jsonschema's own runs Python's
``re``, which cannot read some patterns RE2 and the catalog accept (``\\p{L}``, ``\\Q..\\E``, a POSIX
class) and backtracks on others copied from vendors' documents (``^([a-zA-Z0-9]+\\s?)*$``), so one
answer could fail a success or hold the event loop for minutes. Clients check ``structuredContent``
against ``outputSchema`` with engines of their own (the official Python SDK uses ``re``, browsers
ECMA-262); given a catalog pattern they could refuse the schema, stall, or read the pattern
differently and report a success that took effect as a failure, which invites a second call. So
the published ``outputSchema`` has no ``pattern``: every other keyword stays, and the fleet has
checked the patterns already.

A workflow is a tool named as the workflow (:func:`connectors.catalog.workflow_tool`), whose call
starts a run and whose result is the run's final receipt. Its hints come from its steps: a write
among them makes it destructive, and it is never idempotent (a second call is a second run, even
with the same ``_meta.idempotency_key``). It has no ``outputSchema``: the catalog checks the
types its output reads at load time, but declares none for the workflow itself.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import mcp_types as types
from jsonschema import Draft202012Validator, ValidationError, validators
from jsonschema.exceptions import best_match
from jsonschema.protocols import Validator

from connectors import history
from connectors.catalog import ActionRef, Catalog, tool_spec, workflow_tool
from connectors.patterns import Pattern, compile_pattern
from connectors.schema import field_json_schema
from connectors.spec import ActionSpec
from connectors.workflows.spec import WorkflowSpec
from producers.tools import export

OMITTED_KEY = "_reach_omitted"


def output_schema(action: ActionSpec) -> dict[str, Any] | None:
    """The JSON Schema of a success's ``data`` for an action that declares ``output``, else None."""
    if action.output is None:
        return None
    properties = {name: field_json_schema(spec) for name, spec in action.output.items()}
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if properties:
        properties[OMITTED_KEY] = {
            "type": "string",
            "description": "Present instead of the fields when the answer was too large to pass on.",
        }
        schema["anyOf"] = [{"required": list(action.output)}, {"required": [OMITTED_KEY]}]
    return schema


# the keywords of field_json_schema's output whose values are schemas (or lists or maps of them)
_SUBSCHEMAS = ("items", "additionalProperties")
_SUBSCHEMA_LISTS = ("anyOf", "allOf", "oneOf")


def without_patterns(schema: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``schema`` without its ``pattern`` keywords, at every level (a property that is
    named ``pattern`` stays: only the keyword goes)."""
    out = {key: value for key, value in schema.items() if key != "pattern"}
    if isinstance(out.get("properties"), dict):
        out["properties"] = {name: without_patterns(sub) for name, sub in out["properties"].items()}
    for key in _SUBSCHEMAS:
        if isinstance(out.get(key), dict):
            out[key] = without_patterns(out[key])
    for key in _SUBSCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [without_patterns(sub) if isinstance(sub, dict) else sub for sub in out[key]]
    return out


@lru_cache(maxsize=4096)  # the catalog's patterns, each compiled once (RE2 caps each one's memory)
def _pattern(source: str) -> Pattern:
    return compile_pattern(source)  # the catalog compiled it at load time: it does not fail here


def _re2_pattern(validator: Validator, source: str, instance: Any, schema: dict[str, Any]) -> Iterator[ValidationError]:
    """JSON Schema's ``pattern`` (a search, not a full match) on RE2, in time linear in the value.
    The value is not echoed: it may be long, and the message ends up in the text a model reads."""
    if validator.is_type(instance, "string") and not _pattern(source).search(instance):
        yield ValidationError(f"does not match the pattern {source}")


#: Draft 2020-12 with ``pattern`` on RE2, as the pool checks the same data
OutputValidator = validators.extend(Draft202012Validator, {"pattern": _re2_pattern})


def output_validator(schema: dict[str, Any]) -> Validator:
    """The validator the facade checks a success's data with (``pattern`` on RE2)."""
    return OutputValidator(schema)


def tool_annotations(action: ActionSpec) -> types.ToolAnnotations:
    """MCP's behaviour hints from the action's permission and idempotency."""
    return types.ToolAnnotations(
        read_only_hint=not action.is_write,
        destructive_hint=action.is_write,
        idempotent_hint=action.is_idempotent,
    )


def workflow_annotations(catalog: Catalog, workflow: WorkflowSpec) -> types.ToolAnnotations:
    """MCP's behaviour hints for a workflow: as its steps' actions, never idempotent."""
    writes = any(
        ref is None or ref.action.is_write
        for ref in (catalog.refs.get((step.connector, step.action_name)) for step in workflow.steps)
    )
    return types.ToolAnnotations(read_only_hint=not writes, destructive_hint=writes, idempotent_hint=False)


@dataclass(frozen=True)
class AgentTools:
    """One agent's tools and, by tool name, the validators of the declared outputs."""

    tools: list[types.Tool]
    outputs: Mapping[str, Validator]


def agent_tools(catalog: Catalog, agent: str) -> AgentTools:
    """The tools ``agent`` may call (none for an agent the catalog does not know): its actions in
    catalog order, then the workflows it is bound to."""
    refs: list[ActionRef] = [ref for ref in catalog.refs.values() if catalog.allows(agent, ref)]
    tools: list[types.Tool] = []
    outputs: dict[str, Validator] = {}
    for ref, doc in zip(refs, export([tool_spec(ref) for ref in refs], "mcp"), strict=True):
        schema = output_schema(ref.action)
        tools.append(
            types.Tool(
                name=doc["name"],
                description=doc["description"],
                input_schema=doc["inputSchema"],
                output_schema=None if schema is None else without_patterns(schema),
                annotations=tool_annotations(ref.action),
            )
        )
        if schema is not None:
            outputs[doc["name"]] = output_validator(schema)
    found = catalog.agents.get(agent)
    flows = [catalog.workflows[n] for n in (found.workflows if found else []) if catalog.allows_workflow(agent, n)]
    for flow, doc in zip(flows, export([workflow_tool(w) for w in flows], "mcp"), strict=True):
        tools.append(
            types.Tool(
                name=doc["name"],
                description=doc["description"],
                input_schema=doc["inputSchema"],
                annotations=workflow_annotations(catalog, flow),
            )
        )
    if catalog.keeps_history_for(agent):  # reach.history, answered by the router like any tool call
        doc = export([history.tool()], "mcp")[0]
        tools.append(
            types.Tool(
                name=doc["name"],
                description=doc["description"],
                input_schema=doc["inputSchema"],
                annotations=types.ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True),
            )
        )
    return AgentTools(tools, outputs)


def output_check(validator: Validator) -> Callable[[dict[str, Any]], str | None]:
    """A check of a success's data against a tool's output schema: None when it conforms, else
    where and why not (short: it ends up in the text the model reads)."""

    def check(data: dict[str, Any]) -> str | None:
        if validator.is_valid(data):  # the usual case, without collecting errors to rank
            return None
        error = best_match(validator.iter_errors(data))
        if error is None:
            return None
        where = "/".join(str(p) for p in error.absolute_path) or "data"
        return f"{where}: {error.message}"[:300]

    return check
