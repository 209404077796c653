"""What operators do to workflow runs (``reach workflow list | show | resume | abort``; the console
can call the same): read runs, and record a resume or an abort on a parked or halted run.

A resume or an abort is one compare-and-set on the run, like the runner's transitions; the
runner's sweep then publishes what it leads to (the next undo), so this module never talks to the
broker. Neither ever sends the agent a second final receipt.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from workers.state.workflow_runs import WorkflowRuns
from workers.workflows import machine
from workers.workflows.model import Run

CAS_TRIES = 20


class RunNotFound(LookupError):
    """No run of that id is kept (for that agent)."""


class RunIsShared(LookupError):
    """Several agents have a run of that id: name the agent (``owners`` lists them)."""

    def __init__(self, run_id: str, owners: list[str]) -> None:
        super().__init__(f"{len(owners)} agents have a run {run_id!r} ({', '.join(owners)}): name one with --agent")
        self.owners = owners


@dataclass(frozen=True)
class RunRow:
    run_id: str
    owner: str
    workflow: str
    state: str
    started_at: float
    step: str | None  # the step the run is at (its latest sent or failed)

    def to_dict(self) -> dict[str, Any]:
        # intent_id: a run's id is the id of the intent that started it
        return {
            "run_id": self.run_id,
            "intent_id": self.run_id,
            "agent_id": self.owner,
            "workflow": self.workflow,
            "state": self.state,
            "started_at": self.started_at,
            "step": self.step,
        }


def _row(run: Run) -> RunRow:
    current = next((r.step for r in reversed(run.steps) if r.status != "pending"), None)
    return RunRow(run.run_id, run.owner, run.workflow, run.state, run.started_at, current)


def list_runs(runs: WorkflowRuns, limit: int = 100, agent: str | None = None, state: str | None = None) -> list[RunRow]:
    """The newest runs kept, newest first (``agent``, ``state``: only those)."""
    rows = []
    for owner, run_id in runs.listing(limit if agent is None and state is None else 10 * limit):
        if agent is not None and owner != agent:
            continue
        stored = runs.load(owner, run_id)
        if stored is None:
            continue
        row = _row(Run.from_json(stored.doc))
        if state is None or row.state == state:
            rows.append(row)
        if len(rows) >= limit:
            break
    return rows


def find_run(runs: WorkflowRuns, run_id: str, agent: str | None = None) -> Run:
    """The run ``run_id`` (of ``agent``, when given: another agent's run is not found).

    Raises:
        RunNotFound: none is kept.
        RunIsShared: several agents have one and ``agent`` is None.
    """
    owners = [agent] if agent is not None else runs.owners_of(run_id)
    found = [(o, s) for o in owners if (s := runs.load(o, run_id)) is not None]
    if not found:
        raise RunNotFound(f"no run {run_id!r}" + (f" of agent {agent!r}" if agent else "") + " is kept")
    if len(found) > 1:
        raise RunIsShared(run_id, [o for o, _ in found])
    return Run.from_json(found[0][1].doc)


def resume_run(runs: WorkflowRuns, run_id: str, by: str, agent: str | None = None) -> Run:
    """Resume a parked or halted run (machine.resume); raises machine.NotAllowed otherwise."""
    return _act(runs, run_id, agent, lambda run, now: machine.resume(run, now, by))


def abort_run(runs: WorkflowRuns, run_id: str, by: str, agent: str | None = None) -> Run:
    """Abort a parked or halted run (machine.abort); raises machine.NotAllowed otherwise."""
    return _act(runs, run_id, agent, lambda run, now: machine.abort(run, now, by))


def _act(runs: WorkflowRuns, run_id: str, agent: str | None, act: Any) -> Run:
    owner = find_run(runs, run_id, agent).owner
    for _ in range(CAS_TRIES):
        stored = runs.load(owner, run_id)
        if stored is None:
            raise RunNotFound(f"run {run_id!r} is gone")
        now = time.time()
        moved: Run = act(Run.from_json(stored.doc), now)
        outbound = moved.outbound
        step_intent = outbound.intent_id if outbound is not None and outbound.kind != "final" else None
        runs.look_at(owner, run_id, now)  # the runner's sweep publishes what it leads to
        if runs.write(
            owner,
            run_id,
            stored.version,
            moved.to_json(),
            keep_until=machine.keep_until(moved),
            step_intent=step_intent,
        ):
            # again after the write: the runner may have put the run out of the sweep's sight in
            # between, from the version before (it checks the version only after its own change)
            runs.look_at(owner, run_id, time.time())
            return moved
    raise RuntimeError(f"run {run_id}: {CAS_TRIES} writers raced on it")


def describe(run: Run) -> dict[str, Any]:
    """A run as ``reach workflow show --json`` prints it: everything but the definition's body and
    the outbound message's (params may be sensitive: they are in the steps' own traces)."""
    doc = run.model_dump(mode="json", exclude={"spec", "final"})
    if run.outbound is not None:
        doc["outbound"] = {"kind": run.outbound.kind, "intent_id": run.outbound.intent_id, "step": run.outbound.step}
    for step in doc["steps"]:
        step.pop("data", None)
    doc["final_receipt"] = {k: run.final.get(k) for k in ("status", "error")} if run.final else None
    return doc
