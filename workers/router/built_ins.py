"""The router's built-in actions, answered by the router itself: ``reach.list_tools`` (the
agent's tools) and ``reach.find_tools`` (its best-matching tools for a description, ranked by
the semantic model, in the format asked). An agent's tools are the actions it may use and the
workflows it is bound to (a workflow's tool name is its own name)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from connectors.catalog import Catalog
from connectors.schema import ParamValidator
from connectors.spec import ActionSpec, FieldSpec
from producers.tools import EXPORT_FORMATS, export
from producers.wire import FIND_TOOLS_ACTION as FIND_TOOLS
from producers.wire import LIST_TOOLS_ACTION as LIST_TOOLS
from producers.wire import ErrorCode
from workers.observability import metrics
from workers.router.decisions import Answer, human_ms
from workers.router.intake import ParsedIntent
from workers.router.semantic import SemanticRouting
from workers.state.ratelimit import Rate
from workers.transport.receipts import build_receipt

# reach.find_tools' params, checked like an action's
FIND_TOOLS_PARAMS = ParamValidator(
    ActionSpec(
        action="find_tools",
        input={
            "description": FieldSpec(type="string", required=True, min_length=1, description="what the user asked"),
            "k": FieldSpec(type="integer", default=5, min=1, max=50, description="how many tools"),
            "format": FieldSpec(type="enum", values=list(EXPORT_FORMATS), default="json"),
        },
    )
)


def built_in_answer(parsed: ParsedIntent, received_at: float, action: str, **outcome: Any) -> Answer:
    """The receipt of a built-in action the router answers itself (no connector), to the intent's
    ``reply_to`` (else its agent); ``outcome``: ``data``, or ``code``, ``message``, ``suggestion``…"""
    intent = parsed.intent
    agent_id = intent.agent_id or ""
    receipt = build_receipt(
        intent_id=intent.intent_id or "",
        agent_id=agent_id,
        action=action,
        connector=None,
        trace_id=parsed.trace_id,
        received_at=received_at,
        **outcome,
    )
    return Answer(receipt, intent.reply_to or agent_id)


def unregistered(parsed: ParsedIntent, received_at: float, action: str) -> Answer:
    """PERMISSION_DENIED for a built-in action asked by an agent the catalog does not know."""
    return built_in_answer(
        parsed,
        received_at,
        action,
        code=ErrorCode.PERMISSION_DENIED,
        message=f"agent {parsed.intent.agent_id or ''!r} is not registered in the catalog",
        suggestion="Use the agent id your operator registered as an agent_app.",
    )


def list_tools(catalog: Catalog, parsed: ParsedIntent, received_at: float) -> Answer:
    """reach.list_tools: every tool the agent may use."""
    agent_id = parsed.intent.agent_id or ""
    if agent_id not in catalog.agents:
        return unregistered(parsed, received_at, LIST_TOOLS)
    tools = [t.to_dict() for t in catalog.tools_for(agent_id)]
    return built_in_answer(parsed, received_at, LIST_TOOLS, data={"tools": tools})


def find_tools(
    catalog: Catalog,
    semantic: SemanticRouting,
    parsed: ParsedIntent,
    received_at: float,
    *,
    max_details: int,
    allowance: Callable[[str], int | None],
    semantic_rate: Rate | None,
) -> Answer:
    """reach.find_tools: the agent's best-matching tools for a description, in the format asked.
    ``allowance`` says whether the agent may make the router run its model now (None) or in how
    many ms (``semantic_rate``)."""
    intent = parsed.intent
    agent_id = intent.agent_id or ""
    answer = partial(built_in_answer, parsed, received_at, FIND_TOOLS)
    if agent_id not in catalog.agents:
        return unregistered(parsed, received_at, FIND_TOOLS)
    params, problems = FIND_TOOLS_PARAMS.validate(intent.params, max_problems=max_details - 1)
    if problems:
        metrics.INTENTS_REJECTED.labels(code=ErrorCode.VALIDATION_FAILED.value).inc()
        return answer(
            code=ErrorCode.VALIDATION_FAILED,
            message="invalid params for reach.find_tools: " + "; ".join(f"{p.field} {p.message}" for p in problems[:3]),
            suggestion='Send {"description": "<what the user asked>", "k": 1-50, "format": '
            + "|".join(EXPORT_FORMATS)
            + "}.",
            details=[p.to_detail() for p in problems],
        )
    wait_ms = allowance(agent_id)
    if wait_ms is not None:
        metrics.INTENTS_REJECTED.labels(code=ErrorCode.RATE_LIMITED.value).inc()
        return answer(
            code=ErrorCode.RATE_LIMITED,
            message=f"{agent_id} sent more intents that need semantic routing than {semantic_rate}",
            suggestion=f"Wait {human_ms(wait_ms)} before asking for tools again.",
            retry_after_ms=wait_ms,
        )
    found = semantic.find_tools(agent_id, params["description"], params["k"])
    data = {
        "tools": export([f.tool for f in found], params["format"]),
        "scores": [{"name": f.tool.name, "score": round(f.score, 4)} for f in found],
        "model": semantic.model_name(),
    }
    return answer(data=data)
