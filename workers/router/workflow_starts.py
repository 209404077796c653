"""Workflows at the router: an intent that starts a run, and the step intents a run sends.

A start (``action`` the workflow's name) is checked like an action's intent — the agent's
``workflows:`` binding, its params against the workflow's ``input``, its deadline — and dispatched
as a job to reach.workflows (``connector`` is ``topology.WORKFLOW_JOB_CONNECTOR``, never a
connector's name). The run's id is the intent's id; its owner is the agent.

A step intent comes from the fleet's own broker login with ``x-reach-on-behalf-of`` (the owner) and
``x-reach-run-id`` (intake refuses both headers from anyone else). Here it must also be a step
the runner filed under that owner's run (``WorkflowRuns.vouches``): a forged run id, or a real one
of another agent, is refused. Every other guardrail then applies to it as to the owner's own intent.
"""

from __future__ import annotations

from typing import Any, Protocol

from connectors.catalog import Catalog
from connectors.schema import ParamValidator, suggestion_for
from connectors.spec import ActionSpec
from connectors.workflows.spec import WorkflowSpec
from producers.wire import ErrorCode
from workers.router.decisions import Answer, Dispatch, refuse
from workers.router.intake import ParsedIntent
from workers.router.jobs import job_for
from workers.transport.topology import WORKFLOW_JOB_CONNECTOR


class RunVouch(Protocol):
    def vouches(self, owner: str, run_id: str, intent_id: str) -> bool: ...


class WorkflowStarts:
    """The router's part of workflows; ``runs`` (None: the broker login alone vouches) checks
    that a step intent belongs to its owner's run."""

    def __init__(self, catalog: Catalog, runs: RunVouch | None = None, max_details: int = 50) -> None:
        self.catalog = catalog
        self.runs = runs
        self.max_details = max_details
        self._validators: dict[str, ParamValidator] = {}

    def is_workflow(self, action: str) -> bool:
        return action in self.catalog.workflows

    def check_step(self, parsed: ParsedIntent, received_at: float) -> Answer | None:
        """None when ``parsed`` is no step intent, or one of a run of its owner; else the refusal."""
        run_id = parsed.run_id
        if run_id is None:
            return None
        intent = parsed.intent
        owner, intent_id = intent.agent_id or "", intent.intent_id or ""
        if self.is_workflow(intent.action):
            return refuse(
                parsed,
                received_at,
                ErrorCode.PERMISSION_DENIED,
                "a workflow's step cannot start another workflow",
                "Steps name actions (connector.action).",
            )
        if self.runs is not None and not self.runs.vouches(owner, run_id, intent_id):
            return refuse(
                parsed,
                received_at,
                ErrorCode.PERMISSION_DENIED,
                f"intent {intent_id!r} is no step of a run {run_id!r} of {owner!r}",
                "Only the workflow runner sends a run's steps.",
            )
        return None

    def start(self, parsed: ParsedIntent, received_at: float, now: float) -> Answer | Dispatch:
        """The start of a run of the workflow ``parsed.intent.action``, or why not."""
        intent = parsed.intent
        agent_id, name = intent.agent_id or "", intent.action
        workflow = self.catalog.workflows[name]
        if parsed.run_id is not None:
            return refuse(
                parsed, received_at, ErrorCode.PERMISSION_DENIED, "a workflow's step cannot start another workflow", ""
            )
        if not self.catalog.allows_workflow(agent_id, name):
            return refuse(
                parsed,
                received_at,
                ErrorCode.PERMISSION_DENIED,
                f"workflow {name!r} is not bound to agent {agent_id!r}",
                "Ask an operator to add it to your agent_app's workflows if you need it.",
            )
        params, problems = self._validator(workflow).validate(intent.params, max_problems=self.max_details - 1)
        if problems:
            summary = "; ".join(f"{p.field} {p.message}" for p in problems[:3]) + ("; …" if len(problems) > 3 else "")
            details: list[dict[str, Any]] = [p.to_detail() for p in problems]
            if problems.more:
                details.append({"field": "(more)", "code": "more_details", "message": f"and {problems.more} more"})
            return refuse(
                parsed,
                received_at,
                ErrorCode.VALIDATION_FAILED,
                f"invalid params for workflow {name}: {summary}",
                suggestion_for(problems),
                details=details,
            )
        if intent.deadline is not None and intent.deadline.timestamp() <= now:
            return refuse(
                parsed,
                received_at,
                ErrorCode.DEADLINE_EXCEEDED,
                f"the deadline {intent.deadline.isoformat()} has passed",
                "Send a new intent with a later deadline if the workflow is still wanted.",
            )
        job = job_for(
            parsed,
            connector=WORKFLOW_JOB_CONNECTOR,
            action=name,
            params=params,
            received_at=received_at,
            dispatched_at=now,
        )
        return Dispatch(job)

    def _validator(self, workflow: WorkflowSpec) -> ParamValidator:
        found = self._validators.get(workflow.name)
        if found is None:
            found = self._validators[workflow.name] = ParamValidator(
                ActionSpec(action=workflow.name, input=dict(workflow.input))
            )
        return found
