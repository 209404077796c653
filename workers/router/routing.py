"""The router: every intent is checked here, in the order of docs/contract.md section 6, before any
connector queue sees it.

``Router.decide`` is pure but for the Redis round trip of its guards (rate limit, breaker), so
it can be driven by property tests; ``workers.router.runtime`` carries its decisions out.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from typing import Any

from connectors.catalog import ActionRef, Candidates, Catalog, Refusal, tool_spec
from connectors.hours import parse_window
from connectors.schema import ParamValidator, suggestion_for
from connectors.spec import ActionSpec, BudgetSpec, FieldSpec
from producers.tools import EXPORT_FORMATS, export
from producers.wire import FIND_TOOLS_ACTION as FIND_TOOLS
from producers.wire import LIST_TOOLS_ACTION as LIST_TOOLS
from producers.wire import ErrorCode, Receipt
from workers.observability import metrics
from workers.observability.audit import params_digest
from workers.observability.redaction import redact_params
from workers.observability.tracing import traceparent_for
from workers.router.approval_gate import Park
from workers.router.intake import ParsedIntent, ParseFailure, RawMessage, new_trace_id, parse
from workers.router.semantic import Choice, SemanticRouting, candidate_details
from workers.state.breaker import AlwaysAvailable
from workers.state.budgets import BudgetCounter, NoBudgets, Spend, amount_problem, budget_index, budget_tag
from workers.state.guards import Guards, SeparateGuards
from workers.state.ratelimit import NoRateLimit, Rate, RateLimiter, parse_rate
from workers.transport.job import Job
from workers.transport.receipts import build_receipt
from workers.transport.topology import connector_queue_name

log = logging.getLogger("reach.router")
# rejections that mean the sender got something wrong; they count against its invalid allowance
COUNTED_AS_INVALID = frozenset(
    {ErrorCode.INVALID_INTENT, ErrorCode.UNKNOWN_ACTION, ErrorCode.PERMISSION_DENIED, ErrorCode.VALIDATION_FAILED}
)
INVALID_ALLOWANCE = "(invalid)"  # the rate limiter's "connector" for it: no connector can be named so
SEMANTIC_ALLOWANCE = "(semantic)"  # the same for the model work an agent may cause (REACH_SEMANTIC_RATE)
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


@dataclass(frozen=True)
class Dispatch:
    """A checked intent on its way to ``queue``; ``job`` is the pool task's only argument."""

    job: Job

    @property
    def intent_id(self) -> str:
        return self.job.intent_id

    @property
    def queue(self) -> str:
        return connector_queue_name(self.job.connector)


@dataclass(frozen=True)
class Answer:
    """The router answers itself: a rejection (or a built-in action), maybe with a dead letter."""

    receipt: Receipt
    routing_key: str | None
    dead_letter_reason: str | None = None
    audit: dict[str, Any] | None = None  # what the audit trail may say about the params (redacted)


Decision = Dispatch | Answer | Park


class Router:
    def __init__(
        self,
        catalog: Catalog,
        *,
        max_intent_bytes: int,
        guards: Guards | None = None,
        limiter: RateLimiter | None = None,
        availability: Any = None,
        require_user_id: bool = False,
        max_depth: int = 32,
        max_details: int = 50,
        invalid_rate: Rate | None = None,
        semantic: SemanticRouting | None = None,
        semantic_rate: Rate | None = None,
        budgets: BudgetCounter | None = None,
        clock: Callable[[], float] = time.time,
        fleet_user: str | None = None,
    ) -> None:
        """``limiter`` also keeps each agent's allowance of invalid intents (``invalid_rate``) and
        of intents that make the router run its model (``semantic_rate``)."""
        self.catalog = catalog
        # without one given (tests, tools) the index is built on first use, without a shared cache
        self.semantic = semantic or SemanticRouting(catalog)
        self.semantic_rate = semantic_rate
        # the running router passes RedisGuards (one round trip); tests may pass the parts
        self.guards = guards or SeparateGuards(limiter or NoRateLimit(), availability or AlwaysAvailable())
        self.limiter = limiter or NoRateLimit()
        self.invalid_rate = invalid_rate
        self.max_intent_bytes = max_intent_bytes
        self.max_depth = max_depth
        self.max_details = max(2, max_details)
        self.require_user_id = require_user_id
        self.fleet_user = fleet_user  # the fleet's broker login: may publish for an agent (intake.ON_BEHALF_OF_HEADER)
        self.clock = clock
        self.budgets = budgets or NoBudgets()
        self.budget_index = budget_index(catalog)  # (agent, connector, action) -> budgets; most have none

    def decide(self, raw: RawMessage) -> Decision:
        decision = self._decide(raw)
        if (
            isinstance(decision, Answer)
            and decision.receipt.error is not None
            and self.invalid_rate is not None
            and decision.receipt.error.code in COUNTED_AS_INVALID
            and decision.receipt.agent_id
        ):
            return self._count_invalid(decision, decision.receipt.agent_id, self.invalid_rate)
        return decision

    def _count_invalid(self, answer: Answer, agent_id: str, rate: Rate) -> Answer:
        """Invalid intents cost their sender too: past its allowance the answer is RATE_LIMITED
        (still saying what was wrong) and nothing is dead-lettered."""
        verdict = self.limiter.hit(agent_id, INVALID_ALLOWANCE, rate)
        if verdict.allowed:
            return answer
        error = answer.receipt.error
        assert error is not None
        if answer.dead_letter_reason is not None:
            metrics.DEAD_LETTERS_DROPPED.labels(reason="sender_over_limit").inc()
        metrics.INTENTS_REJECTED.labels(code=ErrorCode.RATE_LIMITED.value).inc()
        limited = error.model_copy(
            update={
                "code": ErrorCode.RATE_LIMITED,
                "retryable": True,
                "retry_after_ms": verdict.retry_after_ms,
                "details": [],
                "message": f"{agent_id} sent more invalid intents than {rate.count} per {_human_ms(int(rate.period_ms))}; "
                f"this one was {error.code.value}: {error.message}"[:4000],
                "suggestion": f"Fix what is wrong ({error.suggestion[:500]}) and wait {_human_ms(verdict.retry_after_ms)} "
                "before sending more.",
            }
        )
        receipt = answer.receipt.model_copy(update={"error": limited, "status": "rejected"})
        return Answer(receipt, answer.routing_key, dead_letter_reason=None, audit=answer.audit)

    def _decide(self, raw: RawMessage) -> Decision:
        received_at = raw.received_at or self.clock()
        parsed = parse(raw, self.max_intent_bytes, self.require_user_id, self.max_depth, self.fleet_user)
        if isinstance(parsed, ParseFailure):
            return self._invalid(parsed, received_at)
        metrics.INTENTS_RECEIVED.labels(format=parsed.format).inc()
        intent = parsed.intent
        agent_id = intent.agent_id
        assert agent_id is not None and intent.intent_id is not None

        refuse = partial(self._refuse, parsed, received_at)
        if intent.action == LIST_TOOLS:
            return self._list_tools(parsed, received_at)
        if intent.action == FIND_TOOLS:
            return self._find_tools(parsed, received_at)
        resolved = self.catalog.resolve_candidates(intent.action, agent_id)
        routing: dict[str, Any] | None = None
        if isinstance(resolved, Candidates):
            chosen = self._choose(parsed, received_at, resolved)
            if isinstance(chosen, Answer):
                return chosen
            resolved, routing = chosen
            refuse = partial(self._refuse, parsed, received_at, routing=routing)  # later refusals explain it too
        if isinstance(resolved, Refusal):
            return refuse(resolved.code, resolved.message, resolved.suggestion)
        ref = resolved
        refusal = self.catalog.check_permission(agent_id, ref)
        if refusal is not None:
            return refuse(refusal.code, refusal.message, refusal.suggestion, ref=ref)
        now = self.clock()
        binding = self.catalog.binding(agent_id, ref.connector.name)
        assert binding is not None  # check_permission passed
        closed = _closed_window(now, ref.action.allowed_hours, binding.allowed_hours)
        if closed is not None:
            text, wait_ms = closed
            return refuse(
                ErrorCode.OUTSIDE_TIME_WINDOW,
                f"{ref.qualified} may only run {text}",
                f"Send it again when the window opens (in about {_human_ms(wait_ms)}).",
                ref=ref,
                retry_after_ms=wait_ms,
            )
        # one round trip for the rate limit and the breaker/health state; judged in contract order
        verdict, unavailable = self.guards.check(
            agent_id, ref.connector.name, parse_rate(binding.rate_limit) if binding.rate_limit else None
        )
        if not verdict.allowed:
            return refuse(
                ErrorCode.RATE_LIMITED,
                f"rate limit {binding.rate_limit} on {ref.connector.name} reached",
                f"Wait {_human_ms(verdict.retry_after_ms)} before sending more intents to {ref.connector.name}.",
                ref=ref,
                retry_after_ms=verdict.retry_after_ms,
            )
        # bounded: past max_details - 1 problems the rest are only counted ("and K more")
        params, problems = ref.validator.validate(intent.params, max_problems=self.max_details - 1)
        if problems:
            summary = "; ".join(f"{p.field} {p.message}" for p in problems[:3]) + ("; …" if len(problems) > 3 else "")
            details = [p.to_detail() for p in problems]
            if problems.more:
                details.append({"field": "(more)", "code": "more_details", "message": f"and {problems.more} more"})
            return refuse(
                ErrorCode.VALIDATION_FAILED,
                f"invalid params for {ref.qualified}: {summary}",
                suggestion_for(problems),
                ref=ref,
                details=details,
            )
        if unavailable is not None:
            reason, retry_after_ms = unavailable
            return refuse(
                ErrorCode.CONNECTOR_UNAVAILABLE,
                reason,
                f"{ref.connector.name} is failing; send the intent again after {_human_ms(retry_after_ms)}.",
                ref=ref,
                retry_after_ms=retry_after_ms,
            )
        if intent.deadline is not None and intent.deadline.timestamp() <= now:
            return refuse(
                ErrorCode.DEADLINE_EXCEEDED,
                f"the deadline {intent.deadline.isoformat()} has passed",
                "Send a new intent with a later deadline if the action is still wanted.",
                ref=ref,
            )
        over_budget: str | None = None  # why a person must decide (`on_exceed: approval`)
        budgets = self.budget_index.get((agent_id, ref.connector.name, ref.action.action))
        if budgets is not None:  # last: only an intent that is dispatched (or parked) counts
            tag = budget_tag(
                agent_id, ref.connector.name, ref.action.action, params, intent.idempotency_key or intent.intent_id
            )
            spent = self._spend(intent.intent_id, tag, agent_id, ref, params, budgets, refuse)
            if isinstance(spent, Answer):
                return spent
            over_budget = spent
        job = Job(
            intent_id=intent.intent_id,
            agent_id=agent_id,
            connector=ref.connector.name,
            action=ref.action.action,
            params=params,
            idempotency_key=intent.idempotency_key or intent.intent_id,
            reply_to=intent.reply_to or agent_id,
            deadline=intent.deadline.timestamp() if intent.deadline else None,
            trace_id=parsed.trace_id,
            traceparent=traceparent_for(parsed.trace_id, parsed.traceparent),
            format=parsed.format,
            received_at=received_at,
            dispatched_at=now,
            hops=intent.context.hops if intent.context else 0,
            routing=routing,
        )
        policy = self.catalog.approvals.get((agent_id, ref.connector.name, ref.action.action))
        if policy is not None and over_budget is not None:
            return Park(job, policy, redact_params(params, ref.action.input), over_budget)
        if policy is not None and policy.applies(params):  # a person decides (workers/router/approval_gate.py)
            why = policy.spec.when or "approval required"
            return Park(job, policy, redact_params(params, ref.action.input), why)
        return Dispatch(job)

    def _spend(
        self,
        intent_id: str,
        tag: str,
        agent_id: str,
        ref: ActionRef,
        params: dict[str, Any],
        budgets: tuple[BudgetSpec, ...],
        refuse: Callable[..., Answer],
    ) -> Answer | str | None:
        """Count the intent's amounts against its binding's budgets (docs/contract.md "Value
        budgets"): None when they fit and are counted; over budgets that all say ``on_exceed:
        approval``, why a person must decide (counted too, until the person denies it); else the
        answer (one exceeded ``reject`` budget is a hard cap no person may approve past)."""
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
        verdict = self.budgets.reserve(agent_id, ref.connector.name, intent_id, tag, spends)
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
        gated = (agent_id, ref.connector.name, ref.action.action) in self.catalog.approvals
        if not hard and gated:
            # held while a person decides: a denial or expiry gives it back (workers/router/approval_gate.py)
            self.budgets.reserve(agent_id, ref.connector.name, intent_id, tag, spends, force=True)
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
            f"Wait {_human_ms(worst.retry_after_ms)} for the window to free enough, or ask your user.",
            ref=ref,
            retry_after_ms=worst.retry_after_ms,
        )

    def release(self, job: Job) -> None:
        """Give back what a dispatch that never happened counted (the router gave up on it)."""
        budgets = self.budget_index.get((job.agent_id, job.connector, job.action))
        if budgets is not None:
            self.budgets.refund(job.agent_id, job.connector, job.intent_id, job.payload_hash(), budgets)

    def _refuse(
        self,
        parsed: ParsedIntent,
        received_at: float,
        code: ErrorCode,
        message: str,
        suggestion: str,
        *,
        ref: ActionRef | None = None,
        details: list[dict[str, Any]] | None = None,
        retry_after_ms: int | None = None,
        routing: dict[str, Any] | None = None,
    ) -> Answer:
        """The router's own answer to a parsed intent it will not dispatch."""
        intent = parsed.intent
        agent_id = intent.agent_id or ""
        metrics.INTENTS_REJECTED.labels(code=code.value).inc()
        receipt = build_receipt(
            intent_id=intent.intent_id or "",
            agent_id=agent_id,
            action=ref.action.action if ref else intent.action,
            connector=ref.connector.name if ref else None,
            trace_id=parsed.trace_id,
            received_at=received_at,
            code=code,
            message=message,
            suggestion=suggestion,
            details=details,
            retry_after_ms=retry_after_ms,
            routing=routing,
        )
        audit: dict[str, Any] | None = None
        if ref is not None:
            redacted = redact_params(intent.params, ref.action.input)
            audit = {"param_keys": sorted(redacted), "params_digest": params_digest(redacted)}
        if routing is not None:
            audit = {**(audit or {}), "routing": routing}
        return Answer(receipt, intent.reply_to or agent_id, audit=audit)

    def _choose(
        self, parsed: ParsedIntent, received_at: float, candidates: Candidates
    ) -> tuple[ActionRef, dict[str, Any]] | Answer:
        """One of several connectors offering a bare action (workers/router/semantic.py), or the
        answer that none can be chosen."""
        intent = parsed.intent
        agent_id = intent.agent_id or ""
        context = intent.context
        now = self.clock()
        choice = self.semantic.choose(
            candidates,
            agent_id,
            context.description if context else None,
            context.domain if context else None,
            runnable=partial(self._cannot_run, intent.params, agent_id, now),
            allowance=partial(self._model_allowance, agent_id),
        )
        if choice.ref is not None:
            return choice.ref, choice.note
        if choice.retry_after_ms is not None:
            return self._refuse(
                parsed,
                received_at,
                ErrorCode.RATE_LIMITED,
                f"{agent_id} sent more intents that need semantic routing than {self.semantic_rate}",
                f"Wait {_human_ms(choice.retry_after_ms)}, or send a qualified action name (connector.action), "
                "which needs no ranking.",
                retry_after_ms=choice.retry_after_ms,
                routing=choice.note,
            )
        return self._ambiguous(parsed, received_at, candidates, choice)

    def _ambiguous(self, parsed: ParsedIntent, received_at: float, candidates: Candidates, choice: Choice) -> Answer:
        """AMBIGUOUS_ACTION with the best candidates in ``details``: the agent should ask its user."""
        refs = [s.ref for s in choice.ranking.ranked] if choice.ranking else candidates.refs
        names = ", ".join(r.qualified for r in refs[:10]) + (f" and {len(refs) - 10} more" if len(refs) > 10 else "")
        context = parsed.intent.context
        if context is not None and context.description and choice.ranking and len(choice.ranking.ranked) > 1:
            first, second = choice.ranking.ranked[:2]
            message = (
                f"{len(refs)} connectors offer {candidates.action!r} and the description does not single one out: "
                f"{first.ref.qualified} scores {first.score:.3f}, {second.ref.qualified} {second.score:.3f} "
                f"(a lead of {self.semantic.spec.margin:g} is needed)"
            )
        else:
            message = f"{len(refs)} connectors offer {candidates.action!r}: {names}"
        suggestion = (
            f"Ask the user which system they mean (the candidates are in details, with what each is for), then send "
            f'the qualified action, e.g. "{refs[0].qualified}"; or describe the request in context.description, '
            f"or set context.domain to the connector's domain. Candidates: {names}."
        )
        return self._refuse(
            parsed,
            received_at,
            ErrorCode.AMBIGUOUS_ACTION,
            message,
            suggestion,
            details=candidate_details(choice, candidates),
            routing=choice.note,
        )

    def _cannot_run(self, params: dict[str, Any], agent_id: str, now: float, ref: ActionRef) -> str | None:
        """Why ``ref`` could not run this intent now (the rule checks that remove a candidate)."""
        binding = self.catalog.binding(agent_id, ref.connector.name)
        closed = _closed_window(now, ref.action.allowed_hours, binding.allowed_hours if binding else None)
        if closed is not None:
            return f"may only run {closed[0]}"
        _, problems = ref.validator.validate(params, max_problems=3)
        if problems:
            return "params: " + "; ".join(f"{p.field} {p.message}" for p in problems[:3])
        return None

    def _model_allowance(self, agent_id: str) -> int | None:
        """None when the agent may make the router run its model now, else ms until it may."""
        if self.semantic_rate is None:
            return None
        verdict = self.limiter.hit(agent_id, SEMANTIC_ALLOWANCE, self.semantic_rate)
        return None if verdict.allowed else verdict.retry_after_ms

    def _find_tools(self, parsed: ParsedIntent, received_at: float) -> Answer:
        """reach.find_tools: the agent's best-matching tools for a description, in the format asked."""
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
        if agent_id not in self.catalog.agents:
            return Answer(
                answer(
                    code=ErrorCode.PERMISSION_DENIED,
                    message=f"agent {agent_id!r} is not registered in the catalog",
                    suggestion="Use the agent id your operator registered as an agent_app.",
                ),
                reply_to,
            )
        params, problems = FIND_TOOLS_PARAMS.validate(intent.params, max_problems=self.max_details - 1)
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
        wait_ms = self._model_allowance(agent_id)
        if wait_ms is not None:
            metrics.INTENTS_REJECTED.labels(code=ErrorCode.RATE_LIMITED.value).inc()
            return Answer(
                answer(
                    code=ErrorCode.RATE_LIMITED,
                    message=f"{agent_id} sent more intents that need semantic routing than {self.semantic_rate}",
                    suggestion=f"Wait {_human_ms(wait_ms)} before asking for tools again.",
                    retry_after_ms=wait_ms,
                ),
                reply_to,
            )
        found = self.semantic.find_tools(agent_id, params["description"], params["k"])
        data = {
            "tools": export([tool_spec(s.ref) for s in found], params["format"]),
            "scores": [{"name": s.ref.tool_name, "score": round(s.score, 4)} for s in found],
            "model": self.semantic.model_name(),
        }
        return Answer(answer(data=data), reply_to)

    def undecided(self, raw: RawMessage, deliveries: int) -> Answer:
        """The answer to a message delivered ``deliveries`` times without a decision: each delivery
        ended with its router's process or broker link before the router answered, so it is not
        decided again (REACH_MAX_DELIVERIES). Only the bounded parse runs, for the identity."""
        received_at = raw.received_at or self.clock()
        parsed = parse(raw, self.max_intent_bytes, self.require_user_id, self.max_depth, self.fleet_user)
        if isinstance(parsed, ParseFailure):
            return self._invalid(parsed, received_at)
        reason = f"delivered {deliveries} times without a decision"
        answer = self._refuse(
            parsed,
            received_at,
            ErrorCode.INVALID_INTENT,
            f"this intent was {reason}: each time, the router handling it stopped or lost the broker "
            "before answering, so it is not decided again",
            "Do not resend it as it is; operators can find it in the dead-letter queue with this trace id.",
        )
        return Answer(answer.receipt, answer.routing_key, dead_letter_reason=reason, audit=answer.audit)

    def _invalid(self, failure: ParseFailure, received_at: float) -> Answer:
        metrics.INTENTS_RECEIVED.labels(format="invalid").inc()
        metrics.INTENTS_REJECTED.labels(code=failure.code.value).inc()
        suggestion = (
            "Send a UTF-8 JSON object with at least an 'action' (see the intent contract), within the size limit."
            if failure.code is ErrorCode.INVALID_INTENT
            else "Send intents only under your own identity: the AMQP user_id property set to your broker login."
        )
        receipt = build_receipt(
            intent_id=failure.intent_id,
            agent_id=failure.agent_id,
            action=None,
            connector=None,
            trace_id=new_trace_id(),
            received_at=received_at,
            code=failure.code,
            message=failure.reason,
            suggestion=suggestion,
            details=failure.details,
        )
        return Answer(receipt, failure.reply_to, dead_letter_reason=failure.reason if failure.dead_letter else None)

    def _list_tools(self, parsed: ParsedIntent, received_at: float) -> Answer:
        intent = parsed.intent
        agent_id = intent.agent_id or ""
        if agent_id not in self.catalog.agents:
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
            tools = [t.to_dict() for t in self.catalog.tools_for(agent_id)]
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


def _closed_window(now: float, *windows: str | None) -> tuple[str, int] | None:
    """The first of the action's and the binding's time windows that is closed now, and the ms
    until it opens."""
    moment = datetime.fromtimestamp(now, UTC)
    for text in windows:
        if text:
            window = parse_window(text)
            if not window.is_open(moment):
                return text, window.ms_until_open(moment)
    return None


def _human_ms(ms: int) -> str:
    if ms < 1000:
        return f"{ms} ms"
    if ms < 120_000:
        return f"{ms / 1000:.0f} s"
    if ms < 7_200_000:
        return f"{ms / 60_000:.0f} min"
    return f"{ms / 3_600_000:.1f} h"
