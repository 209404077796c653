"""Step contracts, checked when the catalog loads: every value a step receives must come from
something that declares it, with a type that fits, never silently empty.

Each problem is ``(location, message)``; the location is a path inside the ``workflow:`` (or
``agent_app:``) document, which the catalog turns into a file and line.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from connectors.schema import Problems, compile_field
from connectors.spec import ActionSpec, AgentApp, ApprovalSpec, Binding, ConnectorSpec, FieldSpec
from connectors.workflows.references import Reference, Template, Value, references_in
from connectors.workflows.spec import StepSpec, WorkflowSpec, _Call

Location = tuple[Any, ...]
WorkflowProblem = tuple[Location, str]
STRING_LIKE = ("string", "enum", "date", "datetime")


@dataclass(frozen=True)
class Source:
    """What a reference reads: its declared field, and whether it may be missing or null."""

    field: FieldSpec
    may_be_missing: bool
    may_be_null: bool
    sensitive: bool


def check_workflow(
    workflow: WorkflowSpec,
    connectors: Mapping[str, ConnectorSpec],
    action_names: set[str],
) -> list[WorkflowProblem]:
    """Everything wrong with one workflow against the catalog's connectors."""
    problems: list[WorkflowProblem] = []
    if workflow.name in action_names:
        problems.append(
            (("name",), f"workflow {workflow.name!r} has the name of an action: agents could not tell them apart")
        )
    actions: dict[str, tuple[ConnectorSpec, ActionSpec]] = {}
    for i, step in enumerate(workflow.steps):
        for where, call in _calls(i, step):
            found = _action(call, connectors)
            if isinstance(found, str):
                problems.append(((*where, "action"), found))
            else:
                actions[call.action] = found
    for i, step in enumerate(workflow.steps):
        problems += _step_problems(workflow, i, step, actions)
    problems += _output_problems(workflow, actions)
    return problems


def check_bindings(
    workflow: WorkflowSpec,
    agent: AgentApp,
    connectors: Mapping[str, ConnectorSpec],
    where: Location,
) -> list[WorkflowProblem]:
    """An agent bound to ``workflow`` must be allowed every step and undo action it would run, and
    no approval it would wait for may outlast the workflow's timeout."""
    problems: list[WorkflowProblem] = []
    for i, step in enumerate(workflow.steps):
        for _, call in _calls(i, step):
            binding = _binding(agent, call)
            if binding is None:
                problems.append(
                    (where, f"agent {agent.name!r} runs workflow {workflow.name!r} but may not call {call.action}")
                )
                continue
            connector = connectors.get(call.connector)
            action = connector.action(call.action_name) if connector else None
            approval: ApprovalSpec | None = binding.approval or (action.approval if action else None)
            if approval is not None and approval.expires > workflow.timeout:
                problems.append(
                    (
                        where,
                        f"{call.action} waits up to {approval.expires:g}s for approval, longer than workflow "
                        f"{workflow.name!r} may run ({workflow.timeout:g}s)",
                    )
                )
    return problems


def _calls(i: int, step: StepSpec) -> Iterator[tuple[Location, _Call]]:
    yield ("steps", i), step
    if step.compensate is not None:
        yield ("steps", i, "compensate"), step.compensate


def _binding(agent: AgentApp, call: _Call) -> Binding | None:
    for binding in agent.connector_bindings:
        if binding.connector == call.connector and (
            "*" in binding.allowed_actions or call.action_name in binding.allowed_actions
        ):
            return binding
    return None


def _action(call: _Call, connectors: Mapping[str, ConnectorSpec]) -> tuple[ConnectorSpec, ActionSpec] | str:
    connector = connectors.get(call.connector)
    if connector is None:
        return f"{call.action}: no connector {call.connector!r} in the catalog"
    action = connector.action(call.action_name)
    if action is None:
        return f"{call.action}: connector {call.connector!r} has no action {call.action_name!r}"
    return connector, action


def _step_problems(
    workflow: WorkflowSpec, i: int, step: StepSpec, actions: Mapping[str, tuple[ConnectorSpec, ActionSpec]]
) -> list[WorkflowProblem]:
    problems: list[WorkflowProblem] = []
    found = actions.get(step.action)
    if found is not None:
        connector, action = found
        problems += _params_problems(workflow, ("steps", i), step, action, earlier=i, own=None, actions=actions)
        if step.timeout is not None and step.timeout > workflow.timeout:
            problems.append((("steps", i, "timeout"), f"step {step.id!r} may take longer than the workflow's timeout"))
        later_write = next((s for s in workflow.steps[i + 1 :] if _is_write(s, actions)), None)
        if action.is_write and step.compensate is None and later_write is not None:
            problems.append(
                (
                    ("steps", i),
                    f"step {step.id!r} writes and has no compensate, but step {later_write.id!r} writes after it: "
                    "a write that cannot be undone must come last",
                )
            )
    if step.compensate is not None and (undo := actions.get(step.compensate.action)) is not None:
        connector, action = undo
        where = ("steps", i, "compensate")
        if not connector.safe_to_repeat(action):
            problems.append(
                (
                    (*where, "action"),
                    f"{step.compensate.action} undoes step {step.id!r} but is not safe to repeat: mark it "
                    f"idempotent or give connector {connector.name!r} an idempotency_header",
                )
            )
        problems += _params_problems(
            workflow, where, step.compensate, action, earlier=i + 1, own=step.id, actions=actions
        )
    return problems


def _is_write(step: StepSpec, actions: Mapping[str, tuple[ConnectorSpec, ActionSpec]]) -> bool:
    found = actions.get(step.action)
    return found is not None and found[1].is_write


def _params_problems(
    workflow: WorkflowSpec,
    where: Location,
    call: _Call,
    action: ActionSpec,
    *,
    earlier: int,
    own: str | None,
    actions: Mapping[str, tuple[ConnectorSpec, ActionSpec]],
) -> list[WorkflowProblem]:
    """A call's params against its action's input: nothing undeclared, nothing required left out,
    each value from a declared source of a type that fits."""
    problems: list[WorkflowProblem] = []
    for name, spec in action.input.items():
        if spec.required and spec.default is None and name not in call.values:
            problems.append(((*where, "params"), f"{call.action} needs param {name!r}, which is not mapped"))
    for name, value in call.values.items():
        target = action.input.get(name)
        at = (*where, "params", name)
        if target is None:
            problems.append((at, f"{call.action} has no param {name!r}"))
            continue
        problems += [(at, m) for m in _flow_problems(workflow, value, target, earlier, own, actions)]
    return problems


def _output_problems(
    workflow: WorkflowSpec, actions: Mapping[str, tuple[ConnectorSpec, ActionSpec]]
) -> list[WorkflowProblem]:
    problems: list[WorkflowProblem] = []
    for name, value in workflow.output_values.items():
        for ref in references_in(value):
            source = _source(workflow, ref, len(workflow.steps), None, actions)
            if isinstance(source, str):
                problems.append((("output", name), source))
            elif source.sensitive:
                problems.append((("output", name), f"{ref.text} is sensitive and the workflow's output is not"))
    return problems


def _flow_problems(
    workflow: WorkflowSpec,
    value: Value,
    target: FieldSpec,
    earlier: int,
    own: str | None,
    actions: Mapping[str, tuple[ConnectorSpec, ActionSpec]],
) -> list[str]:
    if isinstance(value, Reference):
        source = _source(workflow, value, earlier, own, actions)
        if isinstance(source, str):
            return [source]
        return _fits(value, source, target)
    if isinstance(value, Template):
        problems = []
        if target.type != "string":
            problems.append(f"a string with references cannot flow into a {target.type} field")
        for ref in references_in(value):
            source = _source(workflow, ref, earlier, own, actions)
            if isinstance(source, str):
                problems.append(source)
                continue
            if source.field.type not in (*STRING_LIKE, "integer", "number", "boolean"):
                problems.append(f"{ref.text} is {source.field.type} and cannot be written inside a string")
            if (source.may_be_missing or source.may_be_null) and not ref.has_fallback:
                problems.append(f"{ref.text} may be missing or null: give it a ?? fallback inside the string")
            if source.sensitive and not target.sensitive:
                problems.append(f"{ref.text} is sensitive and this field is not")
        return problems
    if references_in(value):
        if target.type not in ("object", "array"):
            return [f"a {type(value).__name__} of values cannot flow into a {target.type} field"]
        problems = []
        for ref in references_in(value):
            source = _source(workflow, ref, earlier, own, actions)
            if isinstance(source, str):
                problems.append(source)
            elif source.sensitive and not target.sensitive:
                problems.append(f"{ref.text} is sensitive and this field is not")
        return problems
    return _literal_problems(value, target)


def _literal_problems(value: Any, target: FieldSpec) -> list[str]:
    problems = Problems(limit=5)
    compile_field(target)(value, "", problems)
    return [f"the literal does not fit: {p.message}" for p in problems]


def _source(
    workflow: WorkflowSpec,
    ref: Reference,
    earlier: int,
    own: str | None,
    actions: Mapping[str, tuple[ConnectorSpec, ActionSpec]],
) -> Source | str:
    """The declared field a reference reads, or why it reads nothing. ``earlier``: how many steps
    have finished when the value is needed; ``own``: the step a compensation undoes (its output is known)."""
    if ref.source == "input":
        return _walk(ref, workflow.input, "the workflow's input")
    ids = [s.id for s in workflow.steps]
    if ref.step not in ids:
        return f"{ref.text}: there is no step {ref.step!r}"
    position = ids.index(ref.step)
    if position >= earlier and ref.step != own:
        return f"{ref.text}: step {ref.step!r} has not run yet when this value is needed"
    found = actions.get(workflow.steps[position].action)
    if found is None:
        return f"{ref.text}: step {ref.step!r} calls an unknown action"
    fields = found[1].output
    if fields is None:
        return f"{ref.text}: {workflow.steps[position].action} declares no output"
    # the pool refuses an answer without every declared output field, so those are always there
    return _walk(ref, fields, f"{workflow.steps[position].action}'s output", always_there=True)


def _walk(ref: Reference, fields: Mapping[str, FieldSpec], owner: str, always_there: bool = False) -> Source | str:
    head, rest = ref.path[0], ref.path[1:]
    field = fields.get(head)
    if field is None:
        return f"{ref.text}: {owner} declares no field {head!r}"
    missing = not always_there and not field.required and field.default is None
    null = field.nullable
    sensitive = field.sensitive
    for segment in rest:
        if field.type == "array" and segment.isdigit() and field.items is not None:
            field, missing = field.items, True  # an index may be past the end
        elif field.type == "object" and field.properties is not None and segment in field.properties:
            field = field.properties[segment]
            missing = missing or (not field.required and field.default is None)
        else:
            return f"{ref.text}: {owner} declares nothing at {segment!r}"
        null = null or field.nullable
        sensitive = sensitive or field.sensitive
    return Source(field, missing, null, sensitive)


def _fits(ref: Reference, source: Source, target: FieldSpec) -> list[str]:
    problems = []
    kind = _type_problem(source.field, target)
    if kind:
        problems.append(f"{ref.text}: {kind}")
    if not ref.has_fallback:
        if source.may_be_missing and target.required and target.default is None:
            problems.append(f"{ref.text} may be missing and the target is required: give it a ?? fallback")
        elif source.may_be_null and not target.nullable:
            problems.append(f"{ref.text} may be null and the target is not nullable: give it a ?? fallback")
    elif ref.fallback is not None:
        problems += [f"{ref.text} ?? fallback: {p}" for p in _literal_problems(ref.fallback, target)]
    if source.sensitive and not target.sensitive:
        problems.append(f"{ref.text} is sensitive and this field is not")
    return problems


def _type_problem(source: FieldSpec, target: FieldSpec) -> str | None:
    """Why a value of ``source``'s type cannot be given to ``target``, or None."""
    s, t = source.type, target.type
    if t == "enum":
        if s != "enum":
            return f"{s} cannot flow into an enum (its values are not known to be allowed)"
        extra = [v for v in source.values or [] if v not in (target.values or [])]
        return f"enum values {extra[:5]} are not allowed by the target" if extra else None
    if t == "string":
        return None if s in STRING_LIKE else f"{s} cannot flow into a string"
    if t == "number":
        return None if s in ("number", "integer") else f"{s} cannot flow into a number"
    if t == "array":
        if s != "array":
            return f"{s} cannot flow into an array"
        if source.items is not None and target.items is not None:
            inner = _type_problem(source.items, target.items)
            return f"items: {inner}" if inner else None
        return None
    return None if s == t else f"{s} cannot flow into {'an' if t[0] in 'aeiou' else 'a'} {t}"
