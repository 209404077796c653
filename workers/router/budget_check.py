"""The router's last check: an intent's amounts against its binding's value budgets
(docs/contract.md "Value budgets"). Only an intent that is dispatched (or parked) is counted."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from connectors.catalog import ActionRef, Catalog
from connectors.spec import BudgetSpec
from producers.wire import ErrorCode
from workers.router.decisions import Answer, human_ms
from workers.state.budgets import BudgetCounter, Spend, amount_problem


def spend(
    counter: BudgetCounter,
    catalog: Catalog,
    intent_id: str,
    tag: str,
    agent_id: str,
    ref: ActionRef,
    params: dict[str, Any],
    budgets: tuple[BudgetSpec, ...],
    refuse: Callable[..., Answer],
) -> Answer | str | None:
    """Count the intent's amounts against its binding's budgets: None when they fit and are
    counted; over budgets that all say ``on_exceed: approval``, why a person must decide (counted
    too, until the person denies it); else the answer (one exceeded ``reject`` budget is a hard
    cap no person may approve past)."""
    spends = []
    for budget in budgets:
        amount = params.get(budget.param)
        if amount is None:  # an optional param left out (a budget's param may not be nullable)
            continue
        problem = amount_problem(budget, amount)  # for every on_exceed: zero, subnormal, past the max...
        if problem is not None:
            return refuse(
                ErrorCode.VALIDATION_FAILED, problem.message, problem.suggestion, ref=ref, details=[problem.detail]
            )
        spends.append(Spend(budget, amount))
    verdict = counter.reserve(agent_id, ref.connector.name, intent_id, tag, spends)
    if verdict.allowed:
        return None
    if verdict.reused:
        # counting it once more, or not at all, would let a reused id spend uncounted or give
        # back what the intent that first used the id was counted
        return refuse(
            ErrorCode.INVALID_INTENT,
            f"intent id {intent_id[:80]} reused with a different payload",
            "Send each new intent with a new intent_id.",
            ref=ref,
        )
    if verdict.stale:
        # its outcome is no longer kept: it would run again, and a repeat is not counted again
        return refuse(
            ErrorCode.INVALID_INTENT,
            f"intent id {intent_id[:80]} was used longer ago than its outcome is kept",
            "Send each new intent with a new intent_id.",
            ref=ref,
        )
    hard = [e for e in verdict.over if e.budget.on_exceed == "reject"]
    gated = (agent_id, ref.connector.name, ref.action.action) in catalog.approvals
    if not hard and gated:
        # held while a person decides: a denial or expiry gives it back (workers/router/approval_settling.py)
        counter.reserve(agent_id, ref.connector.name, intent_id, tag, spends, force=True)
        return "; ".join(
            f"over the budget of {e.budget.max:g} {e.budget.param} per {e.budget.per} ({e.used:g} counted)"
            for e in verdict.over
        )
    # the reject budget (else any) that frees last says when to retry
    worst = max(hard or verdict.over, key=lambda e: e.retry_after_ms)
    over = worst.budget
    return refuse(
        ErrorCode.BUDGET_EXCEEDED,
        f"budget of {over.max:g} {over.param} per {over.per} on {ref.connector.name}: {worst.used:g} already "
        f"counted, {repr(params[over.param])[:40]} more does not fit",
        f"Wait {human_ms(worst.retry_after_ms)} for the window to free enough, or ask your user.",
        ref=ref,
        retry_after_ms=worst.retry_after_ms,
    )
