"""The runner: each message it gets is handled in one order, whatever it is::

    load the run -> transition (workers.workflows.machine) -> compare-and-set -> publish the
    outbound, confirmed -> mark it sent -> ack

A crash anywhere repeats nothing the ledger would not absorb: after the write, the message comes
again and finds its receipt recorded, so the run's outbound is published again (the same intent
id and idempotency key: the router and the pool answer it once); after the mark, the redelivery
only acks. A transition made by the sweep (an undo tried again, an overdue step) has no message to
come again: the sweep itself publishes any outbound not marked sent a few seconds after it was
written. ``crash_at`` (REACH_WORKFLOW_CRASH_AT, tests only) kills the process at one of those
points, the first time it gets there.

A start is one run per intent id and per idempotency key. The same intent id again (the agent
resent it) is that run: absorbed while it runs, and answered with its stored final receipt once
it has ended (an intent id answered without a run of its own gets its stored receipt again too). A new intent id with the key of a kept run (and the same input) is answered with
that run's outcome as its own receipt: at once if the run has ended, else when it ends (it waits
on the run as a *follower*); with other input it is refused IDEMPOTENCY_KEY_REUSED.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from pydantic import ValidationError

from connectors.catalog import Catalog
from producers.wire import APPROVAL_PENDING, INTENT_ROUTING_KEY, ApprovalNotice, ErrorCode, Receipt
from workers.observability import metrics
from workers.observability.audit import Audit
from workers.state.workflow_runs import KeyClaim, Stored, WorkflowRuns
from workers.transport.app import EXECUTE_TASK
from workers.transport.delivery import TRANSIENT_ERRORS, Delivery, Refused, Settle
from workers.transport.job import Job, JobDecodeError, parse_job
from workers.transport.publisher import Publisher
from workers.transport.receipts import ReceiptSink, iso
from workers.transport.topology import INTENTS_EXCHANGE, ON_BEHALF_OF_HEADER, RUN_ID_HEADER
from workers.workflows import machine
from workers.workflows.final import repeated
from workers.workflows.history_records import RunHistory
from workers.workflows.ids import parse_step_intent_id
from workers.workflows.keyed_starts import input_digest, key_busy, key_reused, longest_life, refusal
from workers.workflows.model import MAX_FOLLOWERS, Follower, Run, snapshot
from workers.workflows.telemetry import observe, stage

log = logging.getLogger("reach.workflows")
CAS_TRIES = 20  # writers racing on one run (a receipt and the sweep) retry this often
REQUEUE_PAUSE_SECONDS = 1.0
# the sweep publishes an outbound not confirmed this long after it was written (its writer's own
# publish usually confirms within milliseconds; a second publisher is held off by the claim)
REDRIVE_AFTER_SECONDS = 1.0
RUNS_OF_KEPT = 20_000  # step intents whose run the runner remembers (it asks Redis for the others)
CRASH_POINTS = ("after_state_write", "after_publish", "before_ack")


class Outlet(Protocol):
    """Where the runner's messages go (the broker; a list in tests)."""

    def send_intent(self, body: dict[str, Any], owner: str, run_id: str) -> None: ...

    def send_final(self, receipt: dict[str, Any], reply_to: str) -> None: ...

    def send_again(self, receipt: dict[str, Any], reply_to: str) -> None: ...

    def answered(self, owner: str, intent_id: str) -> dict[str, Any] | None: ...

    def confirmed(self, owner: str, intent_id: str) -> bool: ...


class BrokerOutlet:
    """Step intents to reach.intents as the fleet's own login, for the run's owner; final receipts
    through the receipt sink (stored, confirmed, marked sent: at most one per run id)."""

    def __init__(self, publisher: Publisher, sink: ReceiptSink, fleet_user: str) -> None:
        self.publisher = publisher
        self.sink = sink
        self.fleet_user = fleet_user

    def send_intent(self, body: dict[str, Any], owner: str, run_id: str) -> None:
        self.publisher.publish(
            json.dumps(body, separators=(",", ":")).encode(),
            exchange=INTENTS_EXCHANGE,
            routing_key=INTENT_ROUTING_KEY,
            headers={ON_BEHALF_OF_HEADER: owner, RUN_ID_HEADER: run_id},
            message_id=body["intent_id"],
            user_id=self.fleet_user,  # RabbitMQ checks it is the login: what the router trusts
        )

    def send_final(self, receipt: dict[str, Any], reply_to: str) -> None:
        self.sink.send(Receipt.model_validate(receipt), reply_to)

    def send_again(self, receipt: dict[str, Any], reply_to: str) -> None:
        """A receipt that was sent already, published once more as it was (a start resent under
        the same intent id after its answer went out)."""
        encoded, body = self.sink.encode(Receipt.model_validate(receipt))
        self.sink.publish(encoded, body, reply_to)

    def answered(self, owner: str, intent_id: str) -> dict[str, Any] | None:
        """The receipt stored for ``owner``'s intent, if it had one (kept REACH_RECEIPT_TTL)."""
        stored = self.sink.stored(owner, intent_id)
        return stored.to_doc() if stored is not None and stored.agent_id == owner else None

    def confirmed(self, owner: str, intent_id: str) -> bool:
        """Whether the broker confirmed the receipt of ``owner``'s intent (the sink's sent mark)."""
        return self.sink.already_sent(owner, intent_id)


class Crash:
    """REACH_WORKFLOW_CRASH_AT: die as by kill -9 (no cleanup, nothing flushed) at ``point``, once."""

    def __init__(self, point: str | None, die: Callable[[int], None] = os._exit) -> None:
        self.point = point
        self.die = die

    def __call__(self, point: str) -> None:
        if self.point is not None and point == self.point:
            self.point = None
            log.warning("REACH_WORKFLOW_CRASH_AT=%s: dying here", point)
            self.die(137)


class WorkflowRunner:
    def __init__(
        self,
        catalog: Catalog,
        runs: WorkflowRuns,
        outlet: Outlet,
        *,
        crash: Crash | None = None,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
        audit: Audit | None = None,
        history: RunHistory | None = None,
    ) -> None:
        self.catalog = catalog
        self.history = history  # a run's record in its owner's history (reach.history)
        self.runs = runs
        self.outlet = outlet
        self.audit = audit  # the run's stages, in the trace of its starting intent (reach trace RUN)
        self.crash = crash or Crash(None)
        self.clock = clock
        self.sleep = sleep
        self._runs_of: dict[tuple[str, str], str] = {}  # (owner, step intent) -> run, for the intents it wrote
        self._runs_of_lock = threading.Lock()

    # -- messages -------------------------------------------------------------------------------

    def handle_start(self, message: Delivery) -> Settle:
        """A run's start job (from the router, on reach.workflows)."""
        try:
            job = decode_start(message)
        except JobDecodeError as exc:
            log.error("dropping a message on the workflows queue that is not a start job: %s", exc.reason)
            return "ack"  # only the router publishes there: nothing to answer
        return self._guarded(job.intent_id, lambda: self._start(job))

    def handle_reply(self, message: Delivery) -> Settle:
        """A receipt, or an approval notice, of a step or undo intent the runner sent."""
        try:
            doc = json.loads(message.body)
        except (ValueError, RecursionError):
            log.error("dropping a reply that is not JSON (%d bytes)", len(message.body))
            return "ack"
        if isinstance(doc, dict) and doc.get("type") == APPROVAL_PENDING:
            try:
                notice = ApprovalNotice.model_validate(doc)
            except ValidationError:
                log.error("dropping an approval notice that does not parse")
                return "ack"
            return self._guarded(notice.intent_id, lambda: self._approval(notice))
        try:
            receipt = Receipt.model_validate(doc)
        except ValidationError:
            log.error("dropping a reply that is neither a receipt nor an approval notice")
            return "ack"
        return self._guarded(receipt.intent_id, lambda: self._receipt(receipt))

    def _guarded(self, what: str, handle: Callable[[], None]) -> Settle:
        try:
            handle()
        except TRANSIENT_ERRORS:
            log.exception("could not finish %s; it goes back to the queue", what)
            self.sleep(REQUEUE_PAUSE_SECONDS)
            return "requeue"
        except Exception:
            # a bug: the same message would fail again. The run is not stuck for good: the sweep
            # takes a step without an answer past the run's deadline as unknown
            log.exception("giving up on message %s", what)
            return "ack"
        self.crash("before_ack")
        return "ack"

    def _start(self, job: Job) -> None:
        owner, run_id = job.agent_id, job.intent_id
        stored = self.runs.load(owner, run_id)
        if stored is not None:  # the start came again (redelivered, or sent twice): no second run
            self._start_again(job, stored)
            return
        answered = self.outlet.answered(owner, run_id)
        if answered is not None and answered["execution"]["received_at"] != iso(job.received_at):
            # no run of its own, but answered (another run's outcome, or a refusal): the agent
            # resent it, and gets that receipt again (the same start job again only acks, below)
            self.outlet.send_again(answered, job.reply_to)
            return
        workflow = self.catalog.workflows.get(job.action)
        if workflow is None:  # the catalog the router had named it; this runner's no longer does
            self.outlet.send_final(_no_such_workflow(job), job.reply_to)
            return
        digest = input_digest(job.params)
        claim = self.runs.claim_key(owner, workflow.name, job.idempotency_key, run_id, digest, longest_life(workflow))
        if claim.run_id != run_id:  # the key is another run's
            self._repeat(job, claim, digest)
            return
        now = self.clock()
        begin = machine.Start(run_id, owner, job.params, job.reply_to, job.trace_id, job.traceparent, job.received_at)
        run = machine.start(begin, workflow, snapshot(workflow, self.catalog), now)
        if not self._write(run, 0, now, started_at=job.received_at):
            stored = self.runs.load(owner, run_id)  # another delivery of the start won the race
            if stored is not None:
                self._redrive(Run.from_json(stored.doc), stored.sent, stored.version)
            return
        observe(None, run, now)
        self._publish(run, 1)

    def _start_again(self, job: Job, stored: Stored) -> None:
        """The start of a kept run came again. The same start job (a redelivery, a copy: the
        router's receive time is the run's) only makes sure the run's outbound went out; the agent's
        own resend after the final receipt was sent gets that receipt again, as stored. While the
        run goes on, a resend is absorbed: the run's one final receipt answers it."""
        run = Run.from_json(stored.doc)
        self.runs.remember(run.owner, run.run_id, run.started_at)  # in case the first write's entry failed
        if job.received_at == run.started_at or run.final is None:
            self._redrive(run, stored.sent, stored.version)
            return
        # The agent's resend after the run ended. The final receipt may be confirmed while the
        # run's own sent mark is not written yet (the delivery that sent it is between the two,
        # holding the publish claim): the receipt sink's mark says it went out, so it goes again.
        outbound = run.outbound
        marked = outbound is not None and stored.sent == outbound.marker
        if not marked and not self.outlet.confirmed(run.owner, run.run_id):
            published = self._redrive(run, stored.sent, stored.version)  # to the run's reply_to
            if published and job.reply_to == run.reply_to:
                return
            if not self.outlet.confirmed(run.owner, run.run_id):
                return  # another delivery is sending it: that one receipt answers the resend too
        log.info(
            "run %s of %s: the start came again after the run ended; its final receipt again", run.run_id, run.owner
        )
        self.outlet.send_again(run.final, job.reply_to)

    def _repeat(self, job: Job, claim: KeyClaim, digest: str) -> None:
        """A start under a new intent id with the idempotency key of the run ``claim.run_id``: the
        same input gets that run's outcome as its own receipt (now, or when the run ends); other
        input is refused IDEMPOTENCY_KEY_REUSED."""
        owner = job.agent_id
        if claim.digest != digest:
            self.outlet.send_final(key_reused(job, claim.run_id), job.reply_to)
            return
        for _ in range(CAS_TRIES):
            stored = self.runs.load(owner, claim.run_id)
            if stored is None:  # its start is still being written (or was lost before it was)
                self.outlet.send_final(key_busy(job, claim.run_id, "is starting"), job.reply_to)
                return
            run = Run.from_json(stored.doc)
            if run.final is not None:
                self.outlet.send_final(repeated(run.final, job.intent_id, job.trace_id, job.received_at), job.reply_to)
                self._note_repeat(job, run, waits=False)
                return
            if any(f.intent_id == job.intent_id for f in run.followers):
                return  # this start came again: it waits already
            if len(run.followers) >= MAX_FOLLOWERS:
                self.outlet.send_final(key_busy(job, claim.run_id, "is still running"), job.reply_to)
                return
            follower = Follower(
                intent_id=job.intent_id, reply_to=job.reply_to, trace_id=job.trace_id, received_at=job.received_at
            )
            moved = run.model_copy(update={"followers": [*run.followers, follower]})
            if self._write(moved, stored.version, self.clock()):
                self._note_repeat(job, run, waits=True)
                return
        raise RuntimeError(f"run {claim.run_id}: {CAS_TRIES} writers raced on it")

    def _note_repeat(self, job: Job, run: Run, waits: bool) -> None:
        """In the trace of the repeated start: which run's outcome answers it."""
        if self.audit is not None:
            what = {"agent": job.agent_id, "run_id": run.run_id, "state": run.state, "waits": waits}
            self.audit.events(job.intent_id, [("workflow_same_key", what)], agent=job.agent_id)

    def _receipt(self, receipt: Receipt) -> None:
        self._transition(receipt.intent_id, lambda run, now: machine.on_receipt(run, receipt, now))

    def _approval(self, notice: ApprovalNotice) -> None:
        self._transition(
            notice.intent_id,
            lambda run, now: machine.on_approval(run, notice.intent_id, notice.approval_id, now),
            redrive=False,
        )

    def _transition(self, intent_id: str, event: Callable[[Run, float], Run | None], redrive: bool = True) -> None:
        parsed = parse_step_intent_id(intent_id)
        run_id = None
        if parsed is not None:
            run_id = self._runs_of.get((parsed.owner, intent_id)) or self.runs.run_of(parsed.owner, intent_id)
        if parsed is None or run_id is None:
            log.warning("a reply for %s, which is no step of a run kept here; dropped", intent_id[:128])
            return
        for _ in range(CAS_TRIES):
            stored = self.runs.load(parsed.owner, run_id)
            if stored is None:
                log.warning("run %s of %s is gone (expired); reply %s dropped", run_id, parsed.owner, intent_id)
                return
            run = Run.from_json(stored.doc)
            now = self.clock()
            moved = event(run, now)
            if moved is None:  # recorded already: make sure what it led to went out
                if redrive:
                    self._redrive(run, stored.sent, stored.version)
                return
            if self._write(moved, stored.version, now):
                observe(run, moved, now)
                self._publish(moved, stored.version + 1, sent=stored.sent)
                return
        raise RuntimeError(f"run {run_id}: {CAS_TRIES} writers raced on it")

    # -- the sweep ------------------------------------------------------------------------------

    def sweep(self, limit: int = 100) -> int:
        """Look at the runs that are due: undos to try again, overdue steps, outbounds not
        confirmed. Returns how many runs it looked at."""
        now = self.clock()
        metrics.WORKFLOW_RUNS_IN_FLIGHT.set(self.runs.watched())
        self.runs.trim(now - self.index_horizon())
        due = self.runs.due(now, limit)
        for owner, run_id in due:
            try:
                self._sweep_one(owner, run_id)
            except Exception:
                log.exception("sweeping run %s of %s failed; it is looked at again", run_id, owner)
        return len(due)

    def index_horizon(self) -> float:
        """How long (seconds) an entry stays in the index of every run: past the retention plus
        twice the longest workflow timeout (a run's deadline, then its time for undoing) and the
        grace on each, its run has expired."""
        longest = max((w.timeout for w in self.catalog.workflows.values()), default=0.0)
        return self.runs.retention_ms / 1000 + 2 * (longest + machine.GRACE_SECONDS)

    def _sweep_one(self, owner: str, run_id: str) -> None:
        for _ in range(CAS_TRIES):
            stored = self.runs.load(owner, run_id)
            if stored is None:
                self.runs.look_at(owner, run_id, None)
                return
            run = Run.from_json(stored.doc)
            now = self.clock()
            moved = machine.on_due(run, now)
            if moved is None:
                outbound = run.outbound
                look = machine.next_look(run, stored.sent, now)
                if outbound is not None and stored.sent != outbound.marker:
                    if now >= outbound.written_at + REDRIVE_AFTER_SECONDS:
                        self._redrive(run, stored.sent, stored.version)
                        return
                    # written by an operator's resume (ops publishes nothing), or still in its writer's hands
                    look = outbound.written_at + REDRIVE_AFTER_SECONDS
                self.runs.reschedule(owner, run_id, stored.version, look)
                return
            if self._write(moved, stored.version, now):
                observe(run, moved, now)
                self._publish(moved, stored.version + 1, sent=stored.sent)
                return

    # -- write, publish, mark ---------------------------------------------------------------------

    def _write(self, run: Run, expected: int, now: float, *, started_at: float | None = None) -> bool:
        """One compare-and-set, in one round trip with the sweep told to look first (sooner only: a
        writer that loses the race must not put off a look the winner needs), so a run is never out
        of its sight; ``started_at``: a new run's entry in the index of every run."""
        outbound = run.outbound
        step_intent = outbound.intent_id if outbound is not None and outbound.kind != "final" else None
        written = self.runs.write(
            run.owner,
            run.run_id,
            expected,
            run.to_json(),
            keep_until=machine.keep_until(run),
            step_intent=step_intent,
            look=machine.next_look(run, None, now),
            started_at=started_at,
        )
        if written:
            if step_intent is not None:  # its receipt finds the run without asking Redis
                with self._runs_of_lock:  # handler threads and the sweep write at once
                    self._runs_of[(run.owner, step_intent)] = run.run_id
                    while len(self._runs_of) > RUNS_OF_KEPT:
                        self._runs_of.pop(next(iter(self._runs_of)))
            self.crash("after_state_write")
        return written

    def _publish(self, run: Run, version: int, *, sent: str | None = None) -> bool:
        """Publish the outbound of ``run`` (as written at ``version``), confirmed, then mark it sent;
        whether this call published it. ``sent``: the outbound the broker confirmed before that
        version was written (a transition that kept it, as an approval notice does, publishes
        nothing again)."""
        outbound = run.outbound
        if outbound is None or outbound.marker == sent:
            return False
        if not self.runs.claim_publish(run.owner, run.run_id, outbound.marker, machine.RESEND_AFTER_SECONDS):
            log.info("run %s: %s is being published by another delivery", run.run_id, outbound.marker)
            return False
        if outbound.kind == "final":
            assert run.final is not None  # decided with the outbound (machine._finish)
            self.outlet.send_final(run.final, run.reply_to)
            if self.history is not None:
                self.history.remember(run)
            self._answer_followers(run)
        else:
            self.outlet.send_intent(outbound.body, run.owner, run.run_id)
        traced = None
        if self.audit is not None:  # the stage goes into the run's trace with the sent mark: no round trip of its own
            audit, lines = self.audit, self.audit.render(run.run_id, [stage(run)])
            audit.write_lines(lines)

            def traced(pipe: Any) -> None:
                audit.push_into(pipe, run.owner, run.run_id, lines)

        self.crash("after_publish")
        # the next look worked out from this version: an operator may have resumed the run
        # meanwhile (mark_sent checks, as reschedule does)
        look = machine.next_look(run, outbound.marker, self.clock())
        self.runs.mark_sent(run.owner, run.run_id, outbound.marker, version, look, also=traced)
        return True

    def _answer_followers(self, run: Run) -> None:
        """The starts that waited on the run with its idempotency key get its outcome, each as its
        own receipt (sent once per intent id: the receipt sink keeps the sent marks)."""
        assert run.final is not None
        for follower in run.followers:
            receipt = repeated(run.final, follower.intent_id, follower.trace_id, follower.received_at)
            try:
                self.outlet.send_final(receipt, follower.reply_to)
            except Refused:  # that agent's queue would not take it: the others still get theirs
                log.error("run %s: the receipt of %s was refused by its queue", run.run_id, follower.intent_id)

    def _redrive(self, run: Run, sent: str | None, version: int) -> bool:
        """Publish the run's outbound again if it may not have been confirmed; whether it was."""
        if run.outbound is not None and sent != run.outbound.marker:
            log.info("run %s: publishing %s again", run.run_id, run.outbound.marker)
            return self._publish(run, version)
        return False


def decode_start(message: Delivery) -> Job:
    """The job in a start message (a ``reach.execute`` task message, as the router builds for pools)."""
    if (message.headers or {}).get("task") != EXECUTE_TASK:
        raise JobDecodeError("not a start job")
    try:
        args = json.loads(message.body)[0]
    except (ValueError, TypeError, IndexError, KeyError, RecursionError) as exc:
        raise JobDecodeError("the body is not a task message of JSON") from exc
    if not isinstance(args, list) or len(args) != 1:
        raise JobDecodeError("the task's argument is not a job object")
    return parse_job(args[0])


def _no_such_workflow(job: Job) -> dict[str, Any]:
    return refusal(
        job,
        ErrorCode.UNKNOWN_ACTION,
        f"workflow {job.action!r} is not in this runner's catalog (reloaded meanwhile?)",
        "Ask for your tools again (reach.list_tools) and send the intent again.",
    )


def stored_run(stored: Stored | None) -> Run | None:
    return Run.from_json(stored.doc) if stored is not None else None
