"""Which intents wait for a person, and who may decide: the catalog's approval policies.

An ``approval:`` on an action applies to every agent bound to it; one on a binding applies to that
agent's intents on that connector and replaces the action's own. Approver groups and their people
come from ``approvers:`` documents; an agent app's ``owners`` may never approve its intents.
The catalog keeps one :class:`ApprovalPolicy` per (agent, connector, action) that has one, so the
router's cost for every other intent is a dict lookup that finds nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from connectors.conditions import Condition, parse_condition
from connectors.spec import ActionSpec, AgentApp, ApprovalSpec, Binding, ConnectorSpec


@dataclass(frozen=True)
class ApprovalPolicy:
    """One agent's approval rule for one action, resolved against the approver groups."""

    spec: ApprovalSpec
    condition: Condition | None
    people: frozenset[str]  # members of the approver groups
    owners: frozenset[str]  # the agent's owners: never approvers of its intents

    def applies(self, params: Mapping[str, Any]) -> bool:
        """Whether an intent with these (validated) params must wait for a person."""
        return self.spec.required or (self.condition is not None and self.condition.evaluate(params))

    @property
    def eligible(self) -> frozenset[str]:
        return self.people - self.owners


def condition_problems(spec: ApprovalSpec, actions: Iterable[ActionSpec]) -> list[str]:
    """What a ``when`` condition gets wrong about the params of the actions it guards."""
    if spec.when is None:
        return []
    try:
        condition = parse_condition(spec.when)
    except ValueError:
        return []  # reported by the model with its line
    problems: list[str] = []
    for action in actions:
        problems.extend(f"approval.when of {action.action}: {p}" for p in condition.type_problems(action.input))
    return list(dict.fromkeys(problems))


def group_problems(spec: ApprovalSpec, groups: Mapping[str, list[str]]) -> list[str]:
    known = ", ".join(sorted(groups)) or "none: declare them in an approvers: document"
    return [f"approver group {g!r} is not declared (known: {known})" for g in spec.approvers if g not in groups]


def policy(spec: ApprovalSpec, agent: AgentApp, groups: Mapping[str, list[str]]) -> ApprovalPolicy:
    people = frozenset(p for g in spec.approvers for p in groups.get(g, []))
    condition = parse_condition(spec.when) if spec.when is not None else None
    return ApprovalPolicy(spec, condition, people, frozenset(agent.owners))


def policies_for(
    agent: AgentApp, binding: Binding, connector: ConnectorSpec, groups: Mapping[str, list[str]]
) -> dict[tuple[str, str, str], ApprovalPolicy]:
    """The approval policy of each action ``binding`` lets ``agent`` use that has one."""
    found = {}
    for action in connector.actions:
        if "*" not in binding.allowed_actions and action.action not in binding.allowed_actions:
            continue
        spec = binding.approval or action.approval
        if spec is not None:
            found[(agent.name, connector.name, action.action)] = policy(spec, agent, groups)
    return found
