"""A bare action that several connectors offer: one is chosen for the intent (ranked by
``workers.router.semantic``, among the candidates that could run it now), or the intent is
answered AMBIGUOUS_ACTION so the agent can ask its user: in the confirm tier one yes/no question
about the best two (the first suggested), in the open tier a choice among the best candidates."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from connectors.catalog import ActionRef, Candidates, Catalog
from producers.wire import ErrorCode
from workers.router.allowances import closed_window
from workers.router.decisions import Answer, human_ms, refuse
from workers.router.intake import ParsedIntent
from workers.router.semantic import Choice, SemanticRouting, candidate_details, describe
from workers.state.ratelimit import Rate


def choose(
    catalog: Catalog,
    semantic: SemanticRouting,
    parsed: ParsedIntent,
    received_at: float,
    candidates: Candidates,
    *,
    now: float,
    allowance: Callable[[str], int | None],
    semantic_rate: Rate | None,
) -> tuple[ActionRef, dict[str, Any]] | Answer:
    """One of several connectors offering a bare action, with the note of how it was chosen, or
    the answer that none can be chosen. ``allowance``: may the agent make the router run its
    model now (None), or in how many ms (``semantic_rate``)."""
    intent = parsed.intent
    agent_id = intent.agent_id or ""
    context = intent.context
    choice = semantic.choose(
        candidates,
        agent_id,
        context.description if context else None,
        context.domain if context else None,
        runnable=partial(cannot_run, catalog, intent.params, agent_id, now),
        allowance=partial(allowance, agent_id),
    )
    if choice.ref is not None:
        return choice.ref, choice.note
    if choice.retry_after_ms is not None:
        return refuse(
            parsed,
            received_at,
            ErrorCode.RATE_LIMITED,
            f"{agent_id} sent more intents that need semantic routing than {semantic_rate}",
            f"Wait {human_ms(choice.retry_after_ms)}, or send a qualified action name (connector.action), "
            "which needs no ranking.",
            retry_after_ms=choice.retry_after_ms,
            routing=choice.note,
        )
    return ambiguous(semantic, parsed, received_at, candidates, choice)


def ambiguous(
    semantic: SemanticRouting, parsed: ParsedIntent, received_at: float, candidates: Candidates, choice: Choice
) -> Answer:
    """AMBIGUOUS_ACTION with the candidates in ``details``, best first: the agent should ask its user."""
    refs = [s.ref for s in choice.ranking.ranked] if choice.ranking else candidates.refs
    names = ", ".join(r.qualified for r in refs[:10]) + (f" and {len(refs) - 10} more" if len(refs) > 10 else "")
    context = parsed.intent.context
    spec = semantic.spec
    if context is not None and context.description and choice.ranking and len(choice.ranking.ranked) > 1:
        first, second = choice.ranking.ranked[:2]
        message = (
            f"{len(refs)} connectors offer {candidates.action!r} and the description does not single one out: "
            f"{first.ref.qualified} scores {first.score:.3f}, {second.ref.qualified} {second.score:.3f} "
            f"(a lead of {spec.margin:g} is needed)"
        )
    else:
        message = f"{len(refs)} connectors offer {candidates.action!r}: {names}"
    if choice.tier == "confirm":
        suggestion = confirm_suggestion(refs[0], refs[1])
    else:
        suggestion = (
            f"Ask the user which system they mean (the candidates are in details, best first, with what each is "
            f'for), then send the qualified action, e.g. "{refs[0].qualified}"; or describe the request in '
            f"context.description, or set context.domain to the connector's domain. Candidates: {names}."
        )
    return refuse(
        parsed,
        received_at,
        ErrorCode.AMBIGUOUS_ACTION,
        message,
        suggestion,
        details=candidate_details(choice, candidates),
        routing=choice.note,
    )


def confirm_suggestion(suggested: ActionRef, other: ActionRef) -> str:
    """The confirm tier's suggestion: one yes/no question, and what to send for each answer."""
    return (
        f"Ask the user one yes/no question: is this for {suggested.connector.name} "
        f"({describe(suggested) or suggested.qualified})? If yes, send the qualified action "
        f'"{suggested.qualified}"; if no, send "{other.qualified}" ({describe(other) or other.connector.name}). '
        "Both are in details, the suggested one first; resend the same params. If the user means neither, "
        "every candidate is in execution.routing.candidates: ask which."
    )


def cannot_run(catalog: Catalog, params: dict[str, Any], agent_id: str, now: float, ref: ActionRef) -> str | None:
    """Why ``ref`` could not run this intent now (the rule checks that remove a candidate)."""
    binding = catalog.binding(agent_id, ref.connector.name)
    closed = closed_window(now, ref.action.allowed_hours, binding.allowed_hours if binding else None)
    if closed is not None:
        return f"may only run {closed[0]}"
    _, problems = ref.validator.validate(params, max_problems=3)
    if problems:
        return "params: " + "; ".join(f"{p.field} {p.message}" for p in problems[:3])
    return None
