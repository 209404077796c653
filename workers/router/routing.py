"""The router: every intent is checked here, in the order of docs/contract.md section 6, before any
connector queue sees it.

``Router.decide`` is pure but for the Redis round trip of its guards (rate limit, breaker), so
it can be driven by property tests; ``workers.router.runtime`` carries its decisions out. This
module holds the order of the checks; what the router may decide is in
``workers.router.decisions``, the allowances and time windows in ``workers.router.allowances``,
the value budgets in ``workers.router.budget_check``, the choice among connectors in
``workers.router.connector_choice``, the built-in actions in ``workers.router.built_ins`` and the
job a dispatch carries in ``workers.router.jobs``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from connectors.catalog import Candidates, Catalog, Refusal
from connectors.schema import suggestion_for
from producers.wire import FIND_TOOLS_ACTION as FIND_TOOLS
from producers.wire import LIST_TOOLS_ACTION as LIST_TOOLS
from producers.wire import ErrorCode
from workers.observability import metrics
from workers.observability.redaction import redact_params
from workers.router.allowances import COUNTED_AS_INVALID, closed_window, count_invalid, model_allowance
from workers.router.approval_parking import Park
from workers.router.budget_check import spend
from workers.router.built_ins import find_tools, list_tools
from workers.router.connector_choice import choose
from workers.router.decisions import Answer, Decision, Dispatch, human_ms, invalid, refuse
from workers.router.history_answers import NAMES as HISTORY_NAMES
from workers.router.history_answers import HistoryAnswers
from workers.router.intake import ParseFailure, RawMessage, parse
from workers.router.jobs import job_for
from workers.router.semantic import SemanticRouting
from workers.router.workflow_starts import RunVouch, WorkflowStarts
from workers.state.breaker import AlwaysAvailable
from workers.state.budgets import BudgetCounter, NoBudgets, budget_index, budget_tag
from workers.state.guards import Guards, SeparateGuards
from workers.state.history import HistoryStore
from workers.state.ratelimit import NoRateLimit, Rate, RateLimiter, parse_rate
from workers.transport.job import Job

log = logging.getLogger("reach.router")


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
        workflow_runs: RunVouch | None = None,
        history: HistoryStore | None = None,
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
        # workflow runs: their starts, and the check that a step belongs to its owner's run
        self.workflows = WorkflowStarts(catalog, workflow_runs, self.max_details)
        self.clock = clock
        self.history = HistoryAnswers(catalog, history, self.max_details)  # reach.history
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
            return count_invalid(self.limiter, decision, decision.receipt.agent_id, self.invalid_rate)
        return decision

    def _decide(self, raw: RawMessage) -> Decision:
        received_at = raw.received_at or self.clock()
        parsed = parse(raw, self.max_intent_bytes, self.require_user_id, self.max_depth, self.fleet_user)
        if isinstance(parsed, ParseFailure):
            return invalid(parsed, received_at)
        metrics.INTENTS_RECEIVED.labels(format=parsed.format).inc()
        intent = parsed.intent
        agent_id = intent.agent_id
        assert agent_id is not None and intent.intent_id is not None

        reject = partial(refuse, parsed, received_at)
        if intent.action == LIST_TOOLS:
            return list_tools(self.catalog, parsed, received_at)
        if intent.action == FIND_TOOLS:
            return find_tools(
                self.catalog,
                self.semantic,
                parsed,
                received_at,
                max_details=self.max_details,
                allowance=self._model_allowance,
                semantic_rate=self.semantic_rate,
            )
        if intent.action in HISTORY_NAMES:
            return self.history.answer(parsed, received_at)
        step_refused = self.workflows.check_step(parsed, received_at)
        if step_refused is not None:
            return step_refused
        if self.workflows.is_workflow(intent.action):
            return self.workflows.start(parsed, received_at, self.clock())
        resolved = self.catalog.resolve_candidates(intent.action, agent_id)
        routing: dict[str, Any] | None = None
        if isinstance(resolved, Candidates):
            chosen = choose(
                self.catalog,
                self.semantic,
                parsed,
                received_at,
                resolved,
                now=self.clock(),
                allowance=self._model_allowance,
                semantic_rate=self.semantic_rate,
            )
            if isinstance(chosen, Answer):
                return chosen
            resolved, routing = chosen
            reject = partial(refuse, parsed, received_at, routing=routing)  # later refusals explain it too
        if isinstance(resolved, Refusal):
            return reject(resolved.code, resolved.message, resolved.suggestion)
        ref = resolved
        refusal = self.catalog.check_permission(agent_id, ref)
        if refusal is not None:
            return reject(refusal.code, refusal.message, refusal.suggestion, ref=ref)
        now = self.clock()
        binding = self.catalog.binding(agent_id, ref.connector.name)
        assert binding is not None  # check_permission passed
        closed = closed_window(now, ref.action.allowed_hours, binding.allowed_hours)
        if closed is not None:
            text, wait_ms = closed
            return reject(
                ErrorCode.OUTSIDE_TIME_WINDOW,
                f"{ref.qualified} may only run {text}",
                f"Send it again when the window opens (in about {human_ms(wait_ms)}).",
                ref=ref,
                retry_after_ms=wait_ms,
            )
        # one round trip for the rate limit and the breaker/health state; judged in contract order
        verdict, unavailable = self.guards.check(
            agent_id, ref.connector.name, parse_rate(binding.rate_limit) if binding.rate_limit else None
        )
        if not verdict.allowed:
            return reject(
                ErrorCode.RATE_LIMITED,
                f"rate limit {binding.rate_limit} on {ref.connector.name} reached",
                f"Wait {human_ms(verdict.retry_after_ms)} before sending more intents to {ref.connector.name}.",
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
            return reject(
                ErrorCode.VALIDATION_FAILED,
                f"invalid params for {ref.qualified}: {summary}",
                suggestion_for(problems),
                ref=ref,
                details=details,
            )
        if unavailable is not None:
            reason, retry_after_ms = unavailable
            return reject(
                ErrorCode.CONNECTOR_UNAVAILABLE,
                reason,
                f"{ref.connector.name} is failing; send the intent again after {human_ms(retry_after_ms)}.",
                ref=ref,
                retry_after_ms=retry_after_ms,
            )
        if intent.deadline is not None and intent.deadline.timestamp() <= now:
            return reject(
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
            spent = spend(self.budgets, self.catalog, intent.intent_id, tag, agent_id, ref, params, budgets, reject)
            if isinstance(spent, Answer):
                return spent
            over_budget = spent
        job = job_for(
            parsed,
            connector=ref.connector.name,
            action=ref.action.action,
            params=params,
            received_at=received_at,
            dispatched_at=now,
            routing=routing,
        )
        policy = self.catalog.approvals.get((agent_id, ref.connector.name, ref.action.action))
        if policy is not None and over_budget is not None:
            return Park(job, policy, redact_params(params, ref.action.input), over_budget)
        if policy is not None and policy.applies(params):  # a person decides (workers/router/approval_parking.py)
            why = policy.spec.when or "approval required"
            return Park(job, policy, redact_params(params, ref.action.input), why)
        return Dispatch(job)

    def release(self, job: Job) -> None:
        """Give back what a dispatch that never happened counted (the router gave up on it)."""
        budgets = self.budget_index.get((job.agent_id, job.connector, job.action))
        if budgets is not None:
            self.budgets.refund(job.agent_id, job.connector, job.intent_id, job.payload_hash(), budgets)

    def undecided(self, raw: RawMessage, deliveries: int) -> Answer:
        """The answer to a message delivered ``deliveries`` times without a decision: each delivery
        ended with its router's process or broker link before the router answered, so it is not
        decided again (REACH_MAX_DELIVERIES). Only the bounded parse runs, for the identity."""
        received_at = raw.received_at or self.clock()
        parsed = parse(raw, self.max_intent_bytes, self.require_user_id, self.max_depth, self.fleet_user)
        if isinstance(parsed, ParseFailure):
            return invalid(parsed, received_at)
        reason = f"delivered {deliveries} times without a decision"
        answer = refuse(
            parsed,
            received_at,
            ErrorCode.INVALID_INTENT,
            f"this intent was {reason}: each time, the router handling it stopped or lost the broker "
            "before answering, so it is not decided again",
            "Do not resend it as it is; operators can find it in the dead-letter queue with this trace id.",
        )
        return Answer(answer.receipt, answer.routing_key, dead_letter_reason=reason, audit=answer.audit)

    def _model_allowance(self, agent_id: str) -> int | None:
        """None when the agent may make the router run its model now, else ms until it may."""
        return model_allowance(self.limiter, agent_id, self.semantic_rate)
