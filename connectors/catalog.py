"""The built catalog: connectors, agents, and the indexes the router uses per intent.

Everything per-intent is a dict lookup here; nothing scans the catalog or builds models while
routing, so the router's cost stays flat however many actions and agents exist.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from pathlib import Path

from connectors import history
from connectors.approval_policy import ApprovalPolicy, condition_problems, group_problems, policies_for
from connectors.loader import CatalogError, LoadResult, Problem, load_directory
from connectors.schema import ParamValidator, default_problems, object_json_schema
from connectors.spec import (
    ActionSpec,
    AgentApp,
    ApproversDocument,
    Binding,
    ConnectorSpec,
    RoutingSpec,
    budget_problems,
)
from connectors.workflows.check import check_bindings, check_workflow
from connectors.workflows.spec import WorkflowSpec
from producers.tools import ToolSpec
from producers.wire import ErrorCode

ALL_ACTIONS = "*"


@dataclass(frozen=True)
class ActionRef:
    connector: ConnectorSpec
    action: ActionSpec
    validator: ParamValidator = field(compare=False, repr=False)

    @property
    def qualified(self) -> str:
        return f"{self.connector.name}.{self.action.action}"

    @property
    def tool_name(self) -> str:
        return f"{self.connector.name}__{self.action.action}"


@dataclass(frozen=True)
class Refusal:
    """Why an action cannot be used, as data the router turns into a receipt."""

    code: ErrorCode
    message: str
    suggestion: str


@dataclass(frozen=True)
class Candidates:
    """A bare action that several connectors the agent is bound to offer: semantic routing
    (workers/router/semantic.py) chooses between them, or answers AMBIGUOUS_ACTION."""

    action: str
    refs: list[ActionRef]

    def refusal(self, domain: str | None = None) -> Refusal:
        """The AMBIGUOUS_ACTION answer when nothing chooses (``domain`` picks one if it can)."""
        names = ", ".join(r.qualified for r in self.refs)
        return Refusal(
            ErrorCode.AMBIGUOUS_ACTION,
            f"{len(self.refs)} connectors offer {self.action!r}: {names}",
            f'Name the connector explicitly, e.g. action "{self.refs[0].qualified}" (candidates: {names}), '
            "or set context.domain to the connector's domain.",
        )


@dataclass
class Catalog:
    connectors: dict[str, ConnectorSpec]
    agents: dict[str, AgentApp]
    refs: dict[tuple[str, str], ActionRef]
    by_action: dict[str, list[ActionRef]]
    grants: dict[str, dict[str, Binding]]
    routing: RoutingSpec = field(default_factory=RoutingSpec)
    # (agent, connector, action) -> who must approve its intents (connectors/approval_policy.py); most
    # catalogs have none, and the router's lookup then finds nothing
    approvals: dict[tuple[str, str, str], ApprovalPolicy] = field(default_factory=dict)
    # ``workflow:`` documents by name (connectors/workflows/spec.py), each checked against the rest
    workflows: dict[str, WorkflowSpec] = field(default_factory=dict)

    # -- routing ---------------------------------------------------------------------------

    def resolve(self, name: str, agent_id: str, domain: str | None = None) -> ActionRef | Refusal:
        """Find the one action an intent means (bare, ``connector.action`` or ``connector__action``)."""
        found = self.resolve_candidates(name, agent_id)
        if not isinstance(found, Candidates):
            return found
        if domain:
            in_domain = [r for r in found.refs if r.connector.domain == domain]
            if len(in_domain) == 1:
                return in_domain[0]
        return found.refusal()

    def resolve_candidates(self, name: str, agent_id: str) -> ActionRef | Refusal | Candidates:
        """Like ``resolve``, but a bare action the agent may use on several connectors comes back
        as its candidates, for the router's rules and semantic ranking to choose from."""
        connector_name, action_name = split_action_name(name)
        if connector_name is not None:
            ref = self.refs.get((connector_name, action_name))
            if ref is None:
                return self._unknown(name, agent_id)
            return ref
        candidates = self.by_action.get(action_name, [])
        if not candidates:
            return self._unknown(name, agent_id)
        if len(candidates) == 1:
            return candidates[0]
        granted = [r for r in candidates if self.allows(agent_id, r)]
        if len(granted) == 1:
            return granted[0]
        if not granted:
            # the agent may use none of them: that, not the ambiguity, is what it must hear
            refusal = self.check_permission(agent_id, candidates[0])
            assert refusal is not None
            return refusal
        return Candidates(action_name, granted)

    def shares_actions(self) -> bool:
        """Whether some bare action is offered by more than one connector (semantic routing may be needed)."""
        return any(len(refs) > 1 for refs in self.by_action.values())

    def allows(self, agent_id: str, ref: ActionRef) -> bool:
        binding = self.grants.get(agent_id, {}).get(ref.connector.name)
        return binding is not None and (
            ALL_ACTIONS in binding.allowed_actions or ref.action.action in binding.allowed_actions
        )

    def check_permission(self, agent_id: str, ref: ActionRef) -> Refusal | None:
        if agent_id not in self.agents:
            return Refusal(
                ErrorCode.PERMISSION_DENIED,
                f"agent {agent_id!r} is not registered in the catalog",
                "Use the agent id your operator registered as an agent_app; it cannot act until it is bound to connectors.",
            )
        if self.allows(agent_id, ref):
            return None
        visible = self.visible_actions(agent_id)
        return Refusal(
            ErrorCode.PERMISSION_DENIED,
            f"agent {agent_id!r} may not use {ref.qualified}",
            "Do not retry this action. "
            + (f"Actions you may use: {', '.join(visible[:15])}." if visible else "You have no actions bound yet.")
            + " Ask an operator to add it to your connector_bindings if you need it.",
        )

    def allows_workflow(self, agent_id: str, name: str) -> bool:
        agent = self.agents.get(agent_id)
        return agent is not None and name in agent.workflows and name in self.workflows

    def binding(self, agent_id: str, connector: str) -> Binding | None:
        return self.grants.get(agent_id, {}).get(connector)

    def visible_actions(self, agent_id: str) -> list[str]:
        return [r.qualified for r in self.refs.values() if self.allows(agent_id, r)]

    def tools_for(self, agent_id: str) -> list[ToolSpec]:
        """The agent's actions, then its workflows (a workflow's tool name is its own name)."""
        agent = self.agents.get(agent_id)
        names = [n for n in agent.workflows if n in self.workflows] if agent else []
        actions = [tool_spec(r) for r in self.refs.values() if self.allows(agent_id, r)]
        remembers = [history.tool()] if self.keeps_history_for(agent_id) else []
        return actions + [workflow_tool(self.workflows[n]) for n in names] + remembers

    def keeps_history_for(self, agent_id: str) -> bool:
        """Whether ``reach__history`` is one of the agent's tools: one of its actions keeps history
        and declares an ``entity`` (what a model asks history by). ``reach.history`` answers any
        agent either way; the tool is offered where the catalog made history worth asking."""
        return any(
            self.allows(agent_id, r)
            and not (r.action.history is not None and r.action.history.off)
            and history.entity_fields(r.action)
            for r in self.refs.values()
        )

    def all_tools(self) -> list[ToolSpec]:
        return [tool_spec(r) for r in self.refs.values()] + [workflow_tool(w) for w in self.workflows.values()]

    def _unknown(self, name: str, agent_id: str) -> Refusal:
        visible = self.visible_actions(agent_id)
        bare = {q.split(".", 1)[1]: q for q in visible}
        close = difflib.get_close_matches(split_action_name(name)[1], list(bare), n=3)
        hint = f" Did you mean {', '.join(bare[c] for c in close)}?" if close else ""
        listing = f" Actions you may use: {', '.join(visible[:15])}." if visible else ""
        return Refusal(
            ErrorCode.UNKNOWN_ACTION,
            f"there is no action {name!r}",
            f"Use one of the actions you were given as tools.{hint}{listing}",
        )


def split_action_name(name: str) -> tuple[str | None, str]:
    """``conn.act`` / ``conn__act`` -> (conn, act); a bare name -> (None, name)."""
    if "." in name:
        connector, _, action = name.partition(".")
        return connector, action
    if "__" in name:
        connector, _, action = name.partition("__")
        return connector, action
    return None, name


def tool_spec(ref: ActionRef) -> ToolSpec:
    description = ref.action.description or f"{ref.action.action} on {ref.connector.name}"
    return ToolSpec(name=ref.tool_name, description=description, input_schema=object_json_schema(ref.action.input))


def workflow_tool(workflow: WorkflowSpec) -> ToolSpec:
    steps = ", then ".join(s.action for s in workflow.steps)
    description = workflow.description or f"Workflow {workflow.name}: {steps}"
    return ToolSpec(name=workflow.name, description=description, input_schema=object_json_schema(workflow.input))


def build(result: LoadResult) -> tuple[Catalog, list[Problem]]:
    """Cross-check the loaded documents and build the indexes. Problems are returned, not raised."""
    problems = list(result.problems)
    connectors: dict[str, ConnectorSpec] = {}
    refs: dict[tuple[str, str], ActionRef] = {}
    by_action: dict[str, list[ActionRef]] = {}
    for doc in result.connectors:
        spec = doc.model
        assert isinstance(spec, ConnectorSpec)
        if spec.name in connectors:
            problems.append(
                Problem(
                    doc.file, result.line_of(doc, "connector", "name"), f"connector {spec.name!r} is declared twice"
                )
            )
            continue
        connectors[spec.name] = spec
        for i, action in enumerate(spec.actions):
            for field_name, message in default_problems(action):
                line = result.line_of(doc, "connector", "actions", i, "input", field_name, "default")
                problems.append(Problem(doc.file, line, f"connector.actions.{i}.input.{field_name}.default: {message}"))
            ref = ActionRef(spec, action, ParamValidator(action))
            refs[(spec.name, action.action)] = ref
            by_action.setdefault(action.action, []).append(ref)
    agents: dict[str, AgentApp] = {}
    grants: dict[str, dict[str, Binding]] = {}
    for doc in result.agents:
        agent = doc.model
        assert isinstance(agent, AgentApp)
        if agent.name in agents:
            problems.append(
                Problem(
                    doc.file, result.line_of(doc, "agent_app", "name"), f"agent_app {agent.name!r} is declared twice"
                )
            )
            continue
        agents[agent.name] = agent
        per_connector: dict[str, Binding] = {}
        for i, binding in enumerate(agent.connector_bindings):
            where = ("agent_app", "connector_bindings", i)
            connector = connectors.get(binding.connector)
            if connector is None and binding.connector in result.broken_connectors:
                continue  # its own document's problems are already reported
            if connector is None:
                known = ", ".join(sorted(connectors)) or "none"
                problems.append(
                    Problem(
                        doc.file,
                        result.line_of(doc, *where, "connector"),
                        f"binding to unknown connector {binding.connector!r} (known: {known})",
                    )
                )
                continue
            if binding.connector in per_connector:
                problems.append(
                    Problem(
                        doc.file,
                        result.line_of(doc, *where, "connector"),
                        f"agent {agent.name!r} binds connector {binding.connector!r} twice",
                    )
                )
                continue
            for j, action_name in enumerate(binding.allowed_actions):
                if action_name != ALL_ACTIONS and connector.action(action_name) is None:
                    problems.append(
                        Problem(
                            doc.file,
                            result.line_of(doc, *where, "allowed_actions", j),
                            f"connector {binding.connector!r} has no action {action_name!r}",
                        )
                    )
            for k, message in budget_problems(binding, connector):
                problems.append(Problem(doc.file, result.line_of(doc, *where, "budget"), f"{message} (budget {k + 1})"))
            per_connector[binding.connector] = binding
        grants[agent.name] = per_connector
    routing = RoutingSpec()
    for i, doc in enumerate(result.routing):
        if i == 0:
            assert isinstance(doc.model, RoutingSpec)
            routing = doc.model
        else:
            first = result.routing[0]
            problems.append(
                Problem(doc.file, doc.line, f"a second routing: document (the first is at {first.file}:{first.line})")
            )
    approvals = _approvals(result, connectors, agents, grants, problems)
    workflows = _workflows(result, connectors, agents, set(by_action), problems)
    return Catalog(connectors, agents, refs, by_action, grants, routing, approvals, workflows), problems


def _workflows(
    result: LoadResult,
    connectors: dict[str, ConnectorSpec],
    agents: dict[str, AgentApp],
    action_names: set[str],
    problems: list[Problem],
) -> dict[str, WorkflowSpec]:
    """The workflows whose step contracts hold, and a problem (file, line) for each that does not."""
    workflows: dict[str, WorkflowSpec] = {}
    for doc in result.workflows:
        spec = doc.model
        assert isinstance(spec, WorkflowSpec)
        found = check_workflow(spec, connectors, action_names)
        if spec.name in workflows:
            found.append((("name",), f"workflow {spec.name!r} is declared twice"))
        for where, message in found:
            problems.append(Problem(doc.file, result.line_of(doc, "workflow", *where), message))
        workflows.setdefault(spec.name, spec)
    for doc in result.agents:
        agent = doc.model
        assert isinstance(agent, AgentApp)
        for j, name in enumerate(agent.workflows):
            where = ("agent_app", "workflows", j)
            workflow = workflows.get(name)
            if workflow is None:
                known = ", ".join(sorted(workflows)) or "none"
                problems.append(
                    Problem(
                        doc.file, result.line_of(doc, *where), f"no workflow {name!r} in the catalog (known: {known})"
                    )
                )
                continue
            for _, message in check_bindings(workflow, agent, connectors, where):
                problems.append(Problem(doc.file, result.line_of(doc, *where), message))
    return workflows


def _approvals(
    result: LoadResult,
    connectors: dict[str, ConnectorSpec],
    agents: dict[str, AgentApp],
    grants: dict[str, dict[str, Binding]],
    problems: list[Problem],
) -> dict[tuple[str, str, str], ApprovalPolicy]:
    """Check every ``approval:`` (its condition against the params, its groups against the
    ``approvers:`` documents) and index the policies by (agent, connector, action)."""
    groups: dict[str, list[str]] = {}
    for doc in result.approvers:
        model = doc.model
        assert isinstance(model, ApproversDocument)
        for group, people in model.approvers.items():
            if group in groups:
                line = result.line_of(doc, "approvers", group)
                problems.append(Problem(doc.file, line, f"approver group {group!r} is declared twice"))
                continue
            groups[group] = people
    for doc in result.connectors:
        spec = doc.model
        assert isinstance(spec, ConnectorSpec)
        if connectors.get(spec.name) is not spec:
            continue  # a second declaration, reported above
        for i, action in enumerate(spec.actions):
            if action.approval is None:
                continue
            where = ("connector", "actions", i, "approval")
            for message in condition_problems(action.approval, [action]):
                problems.append(
                    Problem(doc.file, result.line_of(doc, *where, "when"), f"{'.'.join(map(str, where))}: {message}")
                )
            for message in group_problems(action.approval, groups):
                problems.append(Problem(doc.file, result.line_of(doc, *where, "approvers"), message))
    approvals: dict[tuple[str, str, str], ApprovalPolicy] = {}
    for doc in result.agents:
        agent = doc.model
        assert isinstance(agent, AgentApp)
        if agents.get(agent.name) is not agent:
            continue
        for i, binding in enumerate(agent.connector_bindings):
            connector = connectors.get(binding.connector)
            if connector is None or grants.get(agent.name, {}).get(binding.connector) is not binding:
                continue  # reported above
            where = ("agent_app", "connector_bindings", i, "approval")
            if binding.approval is not None:
                allowed = [
                    a
                    for a in connector.actions
                    if ALL_ACTIONS in binding.allowed_actions or a.action in binding.allowed_actions
                ]
                for message in condition_problems(binding.approval, allowed):
                    problems.append(
                        Problem(
                            doc.file, result.line_of(doc, *where, "when"), f"{'.'.join(map(str, where))}: {message}"
                        )
                    )
                for message in group_problems(binding.approval, groups):
                    problems.append(Problem(doc.file, result.line_of(doc, *where, "approvers"), message))
            for key, found in policies_for(agent, binding, connector, groups).items():
                if found.people and not found.eligible:
                    line = result.line_of(doc, "agent_app", "owners")
                    problems.append(
                        Problem(
                            doc.file,
                            line,
                            f"nobody may approve {agent.name}'s {key[1]}.{key[2]}: every approver owns the agent",
                        )
                    )
                approvals[key] = found
    return approvals


def load_catalog(directory: str | Path, environ: dict[str, str] | None = None) -> Catalog:
    """Load and build a catalog; raise CatalogError listing every problem."""
    catalog, problems = build(load_directory(directory, environ))
    if problems:
        raise CatalogError(problems)
    return catalog
