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

A workflow is a tool named as the workflow (:func:`connectors.catalog.workflow_tool`), whose call
starts a run and whose result is the run's final receipt. Its hints come from its steps: a write
among them makes it destructive, and it is never idempotent (a second call is a second run, even
with the same ``_meta.idempotency_key``). It has no ``outputSchema``: the catalog checks the
types its output reads at load time, but declares none for the workflow itself.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import mcp_types as types
from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

from connectors.catalog import ActionRef, Catalog, tool_spec, workflow_tool
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
    outputs: Mapping[str, Draft202012Validator]


def agent_tools(catalog: Catalog, agent: str) -> AgentTools:
    """The tools ``agent`` may call (none for an agent the catalog does not know): its actions in
    catalog order, then the workflows it is bound to."""
    refs: list[ActionRef] = [ref for ref in catalog.refs.values() if catalog.allows(agent, ref)]
    tools: list[types.Tool] = []
    outputs: dict[str, Draft202012Validator] = {}
    for ref, doc in zip(refs, export([tool_spec(ref) for ref in refs], "mcp"), strict=True):
        schema = output_schema(ref.action)
        tools.append(
            types.Tool(
                name=doc["name"],
                description=doc["description"],
                input_schema=doc["inputSchema"],
                output_schema=schema,
                annotations=tool_annotations(ref.action),
            )
        )
        if schema is not None:
            outputs[doc["name"]] = Draft202012Validator(schema)
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
    return AgentTools(tools, outputs)


def output_check(validator: Draft202012Validator) -> Callable[[dict[str, Any]], str | None]:
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
