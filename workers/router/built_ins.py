"""The router's built-in actions, answered by the router itself: ``reach.list_tools`` (the
agent's tools) and ``reach.find_tools`` (its best-matching tools for a description, ranked by
the semantic model, in the format asked). An agent's tools are the actions it may use and the
workflows it is bound to (a workflow's tool name is its own name)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

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


def list_tools(catalog: Catalog, parsed: ParsedIntent, received_at: float) -> Answer:
    """reach.list_tools: every tool the agent may use."""
    intent = parsed.intent
    agent_id = intent.agent_id or ""
    if agent_id not in catalog.agents:
        code = ErrorCode.PERMISSION_DENIED
        receipt = build_receipt(
            intent_id=intent.intent_id or "",
            agent_id=agent_id,
            action=LIST_TOOLS,
            connector=None,
            trace_id=parsed.trace_id,
            received_at=received_at,
            code=code,
            message=f"agent {agent_id!r} is not registered in the catalog",
            suggestion="Use the agent id your operator registered as an agent_app.",
        )
    else:
        tools = [t.to_dict() for t in catalog.tools_for(agent_id)]
        receipt = build_receipt(
            intent_id=intent.intent_id or "",
            agent_id=agent_id,
            action=LIST_TOOLS,
            connector=None,
            trace_id=parsed.trace_id,
            received_at=received_at,
            data={"tools": tools},
        )
    return Answer(receipt, intent.reply_to or agent_id)


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
    answer = partial(
        build_receipt,
        intent_id=intent.intent_id or "",
        agent_id=agent_id,
        action=FIND_TOOLS,
        connector=None,
        trace_id=parsed.trace_id,
        received_at=received_at,
    )
    reply_to = intent.reply_to or agent_id
    if agent_id not in catalog.agents:
        return Answer(
            answer(
                code=ErrorCode.PERMISSION_DENIED,
                message=f"agent {agent_id!r} is not registered in the catalog",
                suggestion="Use the agent id your operator registered as an agent_app.",
            ),
            reply_to,
        )
    params, problems = FIND_TOOLS_PARAMS.validate(intent.params, max_problems=max_details - 1)
    if problems:
        metrics.INTENTS_REJECTED.labels(code=ErrorCode.VALIDATION_FAILED.value).inc()
        return Answer(
            answer(
                code=ErrorCode.VALIDATION_FAILED,
                message="invalid params for reach.find_tools: "
                + "; ".join(f"{p.field} {p.message}" for p in problems[:3]),
                suggestion='Send {"description": "<what the user asked>", "k": 1-50, "format": '
                + "|".join(EXPORT_FORMATS)
                + "}.",
                details=[p.to_detail() for p in problems],
            ),
            reply_to,
        )
    wait_ms = allowance(agent_id)
    if wait_ms is not None:
        metrics.INTENTS_REJECTED.labels(code=ErrorCode.RATE_LIMITED.value).inc()
        return Answer(
            answer(
                code=ErrorCode.RATE_LIMITED,
                message=f"{agent_id} sent more intents that need semantic routing than {semantic_rate}",
                suggestion=f"Wait {human_ms(wait_ms)} before asking for tools again.",
                retry_after_ms=wait_ms,
            ),
            reply_to,
        )
    found = semantic.find_tools(agent_id, params["description"], params["k"])
    data = {
        "tools": export([f.tool for f in found], params["format"]),
        "scores": [{"name": f.tool.name, "score": round(f.score, 4)} for f in found],
        "model": semantic.model_name(),
    }
    return Answer(answer(data=data), reply_to)
