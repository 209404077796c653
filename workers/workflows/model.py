"""A workflow run as kept in Redis: what it runs (the definition it started with), where it is,
and what must be published next.

The run keeps a *snapshot* of its workflow's definition, so a run finishes on the definition it
started with even when the catalog is reloaded meanwhile; what it keeps of each step's answer is
only the fields the step's action declares in ``output`` (the only ones a reference may read),
bounded in size.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from connectors.catalog import Catalog
from connectors.workflows.spec import WorkflowSpec

RunState = Literal["running", "compensating", "parked", "succeeded", "failed", "unknown"]
# a run in these states waits for nothing: only an operator changes it (parked, unknown) or nobody
SETTLED: frozenset[str] = frozenset({"parked", "succeeded", "failed", "unknown"})
StepStatus = Literal["pending", "sent", "waiting_approval", "succeeded", "rejected", "failed", "unknown", "not_sent"]
MAX_EVENTS = 50  # operator actions and notes kept per run (the oldest dropped)
MAX_FOLLOWERS = 20  # starts with the run's idempotency key waiting for its final receipt
STEP_DATA_BYTES = 256 * 1024  # what is kept of one step's answer (declared fields only)
MAX_SPECS = 256  # definitions parsed and kept per process
_SPECS: dict[str, WorkflowSpec] = {}


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Undo(_Model):
    """The latest try to undo a step."""

    intent_id: str
    attempt: int
    key: str | None = None  # the idempotency key this try was sent with (shared by the undo's tries)
    status: Literal["sent", "waiting_approval", "succeeded", "failed"] = "sent"
    code: str | None = None
    message: str | None = None


class StepRecord(_Model):
    step: str
    action: str
    intent_id: str | None = None
    status: StepStatus = "pending"
    code: str | None = None
    message: str | None = None
    retryable: bool | None = None
    data: dict[str, Any] | None = None  # the declared output fields of its answer
    approval_id: str | None = None
    undone: bool = False
    undo: Undo | None = None


class Outbound(_Model):
    """What must be published next: a step's or an undo's intent, or the final receipt."""

    kind: Literal["step", "undo", "final"]
    intent_id: str
    step: int | None = None
    # the intent document; empty for the final receipt, which is the run's ``final`` (runs written
    # before kept a copy here, which is read and ignored)
    body: dict[str, Any] = Field(default_factory=dict)
    written_at: float

    @property
    def marker(self) -> str:
        """What ``WorkflowRuns.mark_sent`` stores once the broker confirmed it."""
        return f"{self.kind}:{self.intent_id}"


class RunError(_Model):
    """Why the run did not succeed (the final receipt's error)."""

    code: str
    message: str
    retryable: bool = False
    suggestion: str = ""
    details: list[dict[str, Any]] = Field(default_factory=list)


class Follower(_Model):
    """A later start with the run's idempotency key and input, under an intent id of its own: it
    gets the run's final receipt, as its own, when the run ends."""

    intent_id: str
    reply_to: str
    trace_id: str
    received_at: float


class Event(_Model):
    at: float
    what: str
    by: str | None = None


class Run(_Model):
    run_id: str
    owner: str
    workflow: str
    spec: dict[str, Any]  # the definition it started with (WorkflowSpec as JSON)
    spec_digest: str
    outputs: dict[str, list[str]]  # step id -> the output fields its action declared when the run started
    input: dict[str, Any]
    reply_to: str
    trace_id: str
    traceparent: str | None = None
    started_at: float
    deadline: float
    state: RunState = "running"
    steps: list[StepRecord]
    outbound: Outbound | None = None
    retry_at: float | None = None  # compensating: when the failed undo is tried again
    undo_until: float | None = None  # compensating: undos are tried until then, then the run is parked
    error: RunError | None = None
    final: dict[str, Any] | None = None  # the final receipt, once decided (sent once), kept only here
    intents_sent: int = 0
    events: list[Event] = Field(default_factory=list)
    followers: list[Follower] = Field(default_factory=list)

    def to_json(self) -> bytes:
        return self.model_dump_json(exclude_defaults=False).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> Run:
        return cls.model_validate_json(raw)

    def definition(self) -> WorkflowSpec:
        """The snapshot as a WorkflowSpec, parsed once per process (runs of one definition share it)."""
        spec = _SPECS.get(self.spec_digest)
        if spec is None:
            spec = _SPECS[self.spec_digest] = WorkflowSpec.model_validate(self.spec)
            while len(_SPECS) > MAX_SPECS:
                _SPECS.pop(next(iter(_SPECS)), None)
        return spec

    def noted(self, what: str, at: float, by: str | None = None) -> list[Event]:
        return [*self.events, Event(at=at, what=what[:500], by=by)][-MAX_EVENTS:]


def snapshot(workflow: WorkflowSpec, catalog: Catalog) -> tuple[dict[str, Any], str, dict[str, list[str]]]:
    """The definition a run keeps: the workflow as JSON, its digest, and each step's declared output
    fields (from the catalog of the moment the run starts)."""
    doc = workflow.model_dump(mode="json", exclude_defaults=True)
    text = json.dumps(doc, sort_keys=True)
    outputs: dict[str, list[str]] = {}
    for step in workflow.steps:
        connector = catalog.connectors.get(step.connector)
        action = connector.action(step.action_name) if connector is not None else None
        outputs[step.id] = sorted(action.output or {}) if action is not None else []
    return doc, hashlib.sha256(text.encode()).hexdigest()[:16], outputs


def kept_data(data: Any, declared: list[str]) -> dict[str, Any] | None:
    """What a run keeps of a step's answer: its declared output fields, if they fit the bound
    (None otherwise: a later reference to them then fails the run, naming the reference)."""
    if not isinstance(data, dict):
        return {}
    kept = {name: data[name] for name in declared if name in data}
    if len(json.dumps(kept, separators=(",", ":"))) > STEP_DATA_BYTES:
        return None
    return kept
