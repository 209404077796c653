"""What the console's pages show and do, as calls to the ops functions ``reach`` itself uses.

Every function here blocks (Redis, the broker): the routes are plain functions, which Starlette
runs on its thread pool. Errors reaching the fleet become a message on the page, not a 500.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import redis

from connectors.catalog import build
from connectors.loader import load_directory
from producers.wire import INTENT_ID_PATTERN
from workers.console.security import LoginLimiter, Sessions
from workers.observability.audit import Audit, read_trace, trace_agents
from workers.ops import approval_decisions as approvals
from workers.ops.approval_decisions import Decision, PendingApproval
from workers.ops.fleet import (
    ConnectorStatus,
    DeadLetter,
    Unreachable,
    fleet_status,
    list_dead_letters,
    replay_dead_letters,
    was_redacted,
)
from workers.ops.workflow_commands import RunNotFound, RunRow, abort_run, find_run, list_runs, resume_run
from workers.settings import Settings
from workers.state.control import set_paused
from workers.state.workflow_runs import WorkflowRuns
from workers.transport.app import JobMessages, create_app
from workers.transport.topology import connector_queue
from workers.workflows.model import Run, StepRecord

NAME = re.compile(r"^[a-z][a-z0-9_]{0,62}$")  # agent and connector names (contract §9)
OPAQUE_ID = re.compile(r"^[A-Za-z0-9._:@-]{1,200}$")  # intent, approval and message ids as the console accepts them
RUN_ID = INTENT_ID_PATTERN  # a run's id is the id of the intent that started it
MAX_REASON_CHARS = 500
DEAD_LETTERS_SHOWN = 100
APPROVALS_SHOWN = 100
RUNS_SHOWN = 100  # the newest runs on the Runs page; `reach workflow list --limit N` shows more
RUN_STATES = ("running", "compensating", "parked", "succeeded", "failed", "unknown")
ACTIONABLE = ("parked", "unknown")  # the states an operator may resume or abort (workers.workflows.machine)
STATUS_TTL = 1.0  # seconds one fleet status answers every open page
DEAD_LETTERS_TTL = 3.0
RUNS_TTL = 2.0


@dataclass
class Page:
    """A live region's data, or why it could not be read."""

    rows: list[Any] = field(default_factory=list)
    error: str = ""


@dataclass
class FleetPage(Page):
    """The Fleet page: its connectors, and how many approvals of each agent wait."""

    waiting: dict[str, int] = field(default_factory=dict)
    waiting_error: str = ""


@dataclass
class ApprovalsPage(Page):
    """One page of the waiting approvals (fair to every agent) and the counts behind it."""

    per_agent: dict[str, int] = field(default_factory=dict)
    total: int = 0
    page: int = 1
    pages: int = 1
    agent: str | None = None


@dataclass
class RunsPage(Page):
    """The newest runs (at most RUNS_SHOWN; ``more``: older ones are kept too), maybe of one agent or state."""

    more: bool = False
    agent: str | None = None
    state: str | None = None


@dataclass(frozen=True)
class RunLine:
    """A run in the Runs list."""

    run_id: str
    owner: str
    workflow: str
    state: str
    started: str
    steps: int | None  # None: the run expired between the listing and its reading
    at_step: str


@dataclass(frozen=True)
class StepLine:
    """A step on a run's timeline; ``started`` and ``finished`` come from its intent's trace."""

    step: str
    action: str
    intent_id: str | None
    status: str
    code: str | None
    message: str | None
    undone: bool
    undo: str
    started: str
    finished: str


@dataclass
class RunPage:
    """One run: its record, its timeline, the operators' actions on it, or why it cannot be shown."""

    run: Run | None = None
    steps: list[StepLine] = field(default_factory=list)
    events: list[tuple[str, str, str]] = field(default_factory=list)  # (when, what, by)
    started: str = ""
    deadline: str = ""
    error: str = ""

    @property
    def may_act(self) -> bool:
        return self.run is not None and self.run.state in ACTIONABLE


class SearchBusy(Exception):
    """Another search for an intent's agent (a SCAN) is running in this console."""


class Fleet:
    """The fleet as the console sees it: one Redis client, the broker URL, the catalog's connectors."""

    def __init__(self, settings: Settings, client: redis.Redis) -> None:
        self.settings = settings
        self.client = client
        self.audit = Audit(client, "console")
        self.connectors: list[str] | None = None  # None: those found in Redis (no catalog)
        if Path(settings.catalog_dir).is_dir():
            catalog, problems = build(load_directory(settings.catalog_dir))
            if not problems:
                self.connectors = sorted(catalog.connectors)
        self._jobs: JobMessages | None = None
        # every open page polls: one answer serves them all for a moment, and this console never
        # lists reach.dlq (taking its letters unacked for a moment) while it replays from it
        self._cache: dict[str, tuple[float, Page]] = {}
        self._dlq_lock = threading.Lock()
        # a search for an intent's agent SCANs up to 1M keys: one at a time per console process
        self._search_lock = threading.Lock()
        self.workflow_runs = WorkflowRuns(client, settings.workflow_retention_seconds)

    def _cached(self, key: str, ttl: float, load: Callable[[], Page]) -> Page:
        now = time.monotonic()
        hit = self._cache.get(key)
        if hit is not None and now - hit[0] < ttl:
            return hit[1]
        page = load()
        self._cache[key] = (now, page)
        return page

    def forget(self, key: str) -> None:
        self._cache.pop(key, None)

    # fleet
    def status(self) -> Page:
        return self._cached("status", STATUS_TTL, self._status)

    def _status(self) -> Page:
        try:
            waiting, waiting_error = approvals.waiting_per_agent(self.client), ""
        except redis.RedisError as exc:
            waiting, waiting_error = {}, f"Redis did not answer: {type(exc).__name__}: {exc}"
        try:
            rows: list[ConnectorStatus] = fleet_status(self.connectors, self.settings.broker_url, self.client)
        except Unreachable as exc:
            return FleetPage(error=str(exc), waiting=waiting, waiting_error=waiting_error)
        return FleetPage(rows=rows, waiting=waiting, waiting_error=waiting_error)

    def known_connector(self, name: str) -> bool:
        if not NAME.match(name):
            return False
        if self.connectors is not None:
            return name in self.connectors
        return any(row.connector == name for row in self.status().rows)

    def set_paused(self, connector: str, paused: bool) -> None:
        set_paused(self.client, connector, paused)
        self.forget("status")

    # dead letters
    def dead_letters(self) -> Page:
        return self._cached("dead_letters", DEAD_LETTERS_TTL, self._dead_letters)

    def _dead_letters(self) -> Page:
        try:
            with self._dlq_lock:
                letters: list[DeadLetter] = list_dead_letters(self.settings.broker_url, DEAD_LETTERS_SHOWN)
        except Exception as exc:  # kombu's connection errors, or the socket's own
            return Page(error=f"RabbitMQ did not answer: {type(exc).__name__}: {exc}")
        return Page(rows=[(letter, was_redacted(letter)) for letter in letters])

    def replay(self, message_id: str | None) -> tuple[list[str], list[tuple[str, str]]]:
        """Replay one dead letter (or all): (replayed ids, (id, why) of those not replayed: kept in
        reach.dlq, or sent back and refused again by the router)."""
        if self._jobs is None:
            # the reach.execute message template only, as `reach dlq replay` builds it
            self._jobs = JobMessages(create_app(self.settings, [connector_queue("_replay")]))
        with self._dlq_lock:
            done = replay_dead_letters(
                self.settings.broker_url,
                self.client,
                {message_id} if message_id else None,
                self._jobs,
                require_user_id=self.settings.require_user_id,
            )
        self.forget("dead_letters")
        return done.replayed, done.kept + done.refused

    # trace
    def trace(self, intent_id: str, agent: str | None) -> tuple[str | None, list[str], list[dict[str, Any]]]:
        """(the agent, the agents to choose from when several, the stages) of one intent."""
        if agent is None:
            if not self._search_lock.acquire(blocking=False):
                raise SearchBusy(intent_id)
            try:
                agents = trace_agents(self.client, intent_id)
            finally:
                self._search_lock.release()
            if len(agents) != 1:
                return None, agents, []
            agent = agents[0]
        events = read_trace(self.client, agent, intent_id)
        if not events:
            return agent, [], []
        start = events[0]["ts"]
        skip = {"ts", "event", "stage", "intent_id"}
        rows = [
            {
                "offset_ms": f"{(e['ts'] - start) * 1000:.1f}",
                "stage": e.get("stage", ""),
                "details": " ".join(f"{k}={_short(v)}" for k, v in e.items() if k not in skip),
            }
            for e in events
        ]
        return agent, [], rows

    # workflow runs (workers/ops/workflow_commands.py, as `reach workflow list | show | resume | abort`)
    def runs(self, agent: str | None = None, state: str | None = None) -> Page:
        """The newest runs, newest first (``agent``, ``state``: as the query string gave them;
        anything but an agent name or a run state is no filter)."""
        chosen = agent if agent and NAME.match(agent) else None
        in_state = state if state in RUN_STATES else None
        if chosen is None and in_state is None:  # only the unfiltered list is shared: names are unbounded
            return self._cached("runs", RUNS_TTL, lambda: self._runs(None, None))
        return self._runs(chosen, in_state)

    def _runs(self, agent: str | None, state: str | None) -> Page:
        try:
            rows = list_runs(self.workflow_runs, RUNS_SHOWN + 1, agent, state)
            lines = [self._run_line(row) for row in rows[:RUNS_SHOWN]]
        except redis.RedisError as exc:
            return Page(error=f"Redis did not answer: {type(exc).__name__}: {exc}")
        return RunsPage(rows=lines, more=len(rows) > RUNS_SHOWN, agent=agent, state=state)

    def _run_line(self, row: RunRow) -> RunLine:
        stored = self.workflow_runs.load(row.owner, row.run_id)
        steps = len(Run.from_json(stored.doc).steps) if stored is not None else None
        return RunLine(row.run_id, row.owner, row.workflow, row.state, _when(row.started_at), steps, row.step or "-")

    def run(self, owner: str, run_id: str) -> RunPage:
        """One run of ``owner`` (the agent that started it), with each step's times from its trace."""
        if not NAME.match(owner) or not RUN_ID.match(run_id):
            return RunPage(error="not a run id (or agent name)")
        try:
            run = find_run(self.workflow_runs, run_id, owner)
            steps = [self._step_line(owner, record) for record in run.steps]
        except RunNotFound as exc:
            return RunPage(error=str(exc))
        except redis.RedisError as exc:
            return RunPage(error=f"Redis did not answer: {type(exc).__name__}: {exc}")
        events = [(_when(e.at), e.what, e.by or "") for e in run.events]
        return RunPage(run, steps, events, _when(run.started_at), _when(run.deadline))

    def _step_line(self, owner: str, record: StepRecord) -> StepLine:
        started = finished = ""
        if record.intent_id:  # the step's own intent went through the router: its trace has the times
            stages = read_trace(self.client, owner, record.intent_id)
            if stages:
                started = _when(stages[0]["ts"], precise=True)
                answered = [s["ts"] for s in stages if s.get("stage") == "receipt"]
                finished = _when(answered[-1], precise=True) if answered else ""
        undo = record.undo
        if record.undone:
            shown = "undone"
        elif undo is not None:
            shown = f"{undo.status} (try {undo.attempt}" + (f", {undo.code}" if undo.code else "") + ")"
        else:
            shown = "-"
        return StepLine(
            record.step,
            record.action,
            record.intent_id,
            record.status,
            record.code,
            record.message,
            record.undone,
            shown,
            started,
            finished,
        )

    def act_on_run(self, verb: str, owner: str, run_id: str, by: str) -> Run:
        """Resume or abort ``owner``'s run as ``by`` (recorded on the run; the agent gets no second
        final receipt). Raises RunNotFound, or machine.NotAllowed when the run's state forbids it."""
        act = resume_run if verb == "resume" else abort_run
        moved = act(self.workflow_runs, run_id, by, owner)
        self.forget("runs")
        return moved

    # approvals (workers/ops/approval_decisions.py)
    def pending(self, agent: str | None = None, page: str | None = None) -> Page:
        """One page of the waiting approvals, each agent's soonest first (``agent``: only its own;
        ``page``: as the query string gave it, anything but a page number is the first)."""
        chosen = agent if agent and NAME.match(agent) else None
        number = int(page) if page and page.isdigit() and len(page) <= 6 else 1
        try:
            listing = approvals.pending_page(self.client, APPROVALS_SHOWN, number, chosen)
        except redis.RedisError as exc:
            return Page(error=f"Redis did not answer: {type(exc).__name__}: {exc}")
        return ApprovalsPage(
            rows=listing.rows,
            per_agent=listing.per_agent,
            total=listing.total,
            page=listing.page,
            pages=listing.pages,
            agent=chosen,
        )

    def get_approval(self, approval_id: str) -> PendingApproval | None:
        return approvals.get_approval(self.client, approval_id)

    def decide(
        self, approval_id: str, approve: bool, approver: str, reason: str | None, shown_hash: str | None
    ) -> Decision:
        """Approve or deny as ``approver`` (the console login, a person of the catalog's groups),
        refused unless the parked payload is still the one the page showed (``shown_hash``)."""
        decide = approvals.approve if approve else approvals.deny
        return decide(
            self.client,
            self.settings.broker_url,
            approval_id,
            approver,
            reason,
            payload_hash=shown_hash,
            receipt_ttl_seconds=int(self.settings.receipt_ttl_seconds),
        )

    def login_limiter(self, limit: int, window_seconds: float) -> LoginLimiter:
        return LoginLimiter(self.client, limit, window_seconds)

    # sessions: the cookie is signed, not stored; when one ends is remembered in Redis, so that
    # every replica refuses a copy of the cookie (workers.console.security.Sessions)
    def sessions(self, key: str) -> Sessions:
        return Sessions(self.client, key)

    # audit
    def audited(
        self, user: str, role: str, action: str, *, intent_id: str = "", agent: str | None = None, **fields: Any
    ) -> None:
        """One audit line per console action, with who did it; an approval's also goes into its intent's trace."""
        stage = {"user": user, "role": role, "action": action, **fields}
        if intent_id:
            self.audit.events(intent_id, [("console", stage)], agent=agent)
        else:
            self.audit.write_lines(self.audit.render("", [("console", stage)]))


def _when(epoch: float, precise: bool = False) -> str:
    """A time as the page shows it, in UTC (``precise``: to the millisecond, without the date)."""
    moment = datetime.fromtimestamp(epoch, UTC)
    return moment.strftime("%H:%M:%S.%f")[:-3] if precise else moment.strftime("%Y-%m-%d %H:%M:%S")


def _short(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= 200 else text[:200] + "…"


def pretty_params(params: Any) -> str:
    """Params as indented JSON, as they are (already redacted by the approvals module)."""
    return json.dumps(params, indent=2, ensure_ascii=False, sort_keys=True, default=str)
