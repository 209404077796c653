"""Intents that wait for a person: parked by the router, settled once decided or expired.

After every check passed, an intent whose action (or binding) has an ``approval:`` that applies is
not dispatched: :class:`Parking` keeps its job in Redis (``workers.state.approval_store``) and tells
the agent with an ``approval_pending`` notice on its reply topic. The intent's one receipt comes
later, from :class:`Settler`: the parked job is dispatched once approved (its pool sends the
receipt), or APPROVAL_DENIED / APPROVAL_EXPIRED is sent. ``reach approvals`` and the console decide
through ``workers.ops.approval_decisions``; :class:`Sweeper` (a thread in every router) expires what
nobody decided and finishes decisions whose process died before carrying them out.

An intent id that waits is held: another message with that id (a resend with other params, a
typo in the action, a redelivery) is answered with the ``approval_pending`` notice again, naming
the waiting approval, and nothing else — no receipt, no dispatch (:meth:`Parking.hold`), so the
approval still ends in the intent's one receipt. A repeat of the request's idempotency key under a
new intent id joins the waiting approval instead of asking a person twice (``workers.state.approval_store``).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol

from connectors.approval_policy import ApprovalPolicy
from producers.wire import APPROVAL_PENDING, ApprovalNotice, ErrorCode, Execution, Receipt
from workers.observability import metrics
from workers.observability.audit import Audit, params_digest
from workers.state.approval_store import IN_PROGRESS, MAX_FOLLOWERS, ApprovalRecord, ApprovalStore, Parked
from workers.state.budgets import release_intent
from workers.transport.dispatch import Dispatcher
from workers.transport.job import Job, JobDecodeError, parse_job_json
from workers.transport.publisher import Publisher
from workers.transport.receipts import ReceiptSink, build_receipt, iso, job_receipt
from workers.transport.topology import RECEIPTS_EXCHANGE

log = logging.getLogger("reach.approvals")

SUMMARY_CHARS = 500
SWEEP_SECONDS = 1.0
SWEEP_BATCH = 100
FULL_RETRY_MS = 60_000  # what an agent over its pending-approval bound is told to wait
CORRUPT_REASON = "parked job corrupt"
ANSWERED_REASON = "intent already answered"
EXPIRING_EVERY = 10.0  # seconds between two counts of the approvals close to expiry (a metric)
EXPIRING_SCAN = 10_000  # approvals looked at per count


@dataclass(frozen=True)
class Park:
    """A checked intent that waits for a person instead of being dispatched."""

    job: Job
    policy: ApprovalPolicy
    redacted_params: dict[str, Any]
    why: str  # "required", or the condition that matched

    @property
    def intent_id(self) -> str:
        return self.job.intent_id


def summary_of(job: Job, redacted_params: dict[str, Any], why: str) -> str:
    """One line for people: who asks for what, with which (redacted) params, and why it waits."""
    shown = ", ".join(f"{k}={v!r}" for k, v in sorted(redacted_params.items()))
    text = f"{job.agent_id} asks for {job.connector}.{job.action}({shown}) [{why}]"
    return text if len(text) <= SUMMARY_CHARS else text[: SUMMARY_CHARS - 1] + "…"


class Outlet(Protocol):
    """Where a settled decision goes: the parked job to its pool, or the intent's receipt. An
    outlet that can also tell whether an intent already has its receipt has ``has_receipt(agent,
    intent_id) -> bool`` (``PublisherOutlet``)."""

    def dispatch(self, job: Job) -> None: ...

    def answer(self, receipt: Receipt, routing_key: str) -> None: ...


class PublisherOutlet:
    """Confirmed publishes: jobs through a :class:`Dispatcher`, receipts through a sink (the
    router's, or one of the operator tools')."""

    def __init__(self, dispatcher: Dispatcher, sink: ReceiptSink) -> None:
        self.dispatcher = dispatcher
        self.sink = sink

    def dispatch(self, job: Job) -> None:
        self.dispatcher.dispatch(job)  # Unroutable: the claim stays, and a router's sweep tries again

    def answer(self, receipt: Receipt, routing_key: str) -> None:
        self.sink.send(receipt, routing_key)  # once: a receipt already sent is not sent again

    def has_receipt(self, agent: str, intent_id: str) -> bool:
        return self.sink.already_sent(agent, intent_id)


class Settler:
    """Carries out a claimed decision (``approving``, ``denying``, ``expiring``) and finishes it."""

    def __init__(self, store: ApprovalStore, outlet: Outlet, audit: Audit) -> None:
        self.store = store
        self.outlet = outlet
        self.audit = audit

    def settle(self, record: ApprovalRecord, claim: str) -> str:
        """Carry the claim out for the parked intent and every intent that joined it; returns the
        state the approval finished in (``approved``, ``denied``, ``expired``, ``failed``).

        Raises when the broker refused: the claim stays, and the sweep carries it out later."""
        if claim not in IN_PROGRESS:
            raise ValueError(f"not a claim: {claim!r}")
        try:
            job = parse_job_json(record.job_json)
        except JobDecodeError as exc:  # never readable again: answer now rather than retry until it is dropped
            return self._corrupt(record, claim, f"the parked job cannot be read: {exc.reason}")
        followers = self._followers(record)
        if claim == "approving":
            # the parked copy, checked against the hash the approver approved
            if job.payload_hash() != record.payload_hash:
                return self._corrupt(record, claim, "the parked job does not match the hash that was approved")
            answered = getattr(self.outlet, "has_receipt", None)  # (an outlet without a receipt store cannot tell)
            if answered is not None and answered(job.agent_id, job.intent_id):
                # another message with this id was answered first (two routers at once): the
                # pool would ack this job unanswered, so it is not run and the approver is told
                return self._corrupt(
                    record,
                    claim,
                    f"intent {job.intent_id} already had its receipt (another message with its id)",
                    ANSWERED_REASON,
                )
            now = time.time()
            # the parked job first: of one request, the pool's ledger runs the first it claims
            for each in [job, *(f for f in followers if isinstance(f, Job))]:
                self.outlet.dispatch(each.model_copy(update={"dispatched_at": now}))
                self._audit(
                    each, "dispatched", {"ts": round(now, 6), "approval_id": record.approval_id, "from": "approval"}
                )
            self._refuse_followers(record, [f for f in followers if not isinstance(f, Job)])
        elif claim == "denying":
            reason = record.reason or "no reason given"
            for each in [job, *(f for f in followers if isinstance(f, Job))]:
                self.outlet.answer(
                    self._receipt(
                        each,
                        ErrorCode.APPROVAL_DENIED,
                        f"the approval of {each.connector}.{each.action} was denied: {reason}",
                        "Do not resend this intent as it is; tell your user it was denied and why.",
                        [
                            {
                                "field": "(approval)",
                                "code": "denied",
                                "approval_id": record.approval_id,
                                "reason": reason,
                            }
                        ],
                    ),
                    each.reply_to,
                )
                # it never runs: its budget gets it back
                release_intent(self.store.client, each.agent_id, each.intent_id, each.payload_hash())
            self._refuse_followers(record, [f for f in followers if not isinstance(f, Job)])
        elif claim == "expiring":
            for each in [job, *(f for f in followers if isinstance(f, Job))]:
                self._expire(record, each)
            self._refuse_followers(record, [f for f in followers if not isinstance(f, Job)])
        self.store.finish(record.approval_id, claim)
        return {"approving": "approved", "denying": "denied", "expiring": "expired"}[claim]

    def _expire(self, record: ApprovalRecord, job: Job) -> None:
        if job.deadline is not None and job.deadline <= max(time.time(), record.expires_ms / 1000):
            # the intent's deadline (which capped the approval's expiry) has passed: resending cannot help
            code, message, suggestion = (
                ErrorCode.DEADLINE_EXCEEDED,
                f"{job.connector}.{job.action} was not approved before the intent's deadline {iso(job.deadline)}",
                "Send a new intent with a later deadline if it is still wanted.",
            )
        else:
            code, message, suggestion = (
                ErrorCode.APPROVAL_EXPIRED,
                f"nobody approved {job.connector}.{job.action} before {iso(record.expires_ms / 1000)}",
                "Send the intent again to ask for approval again, or ask an approver to look sooner.",
            )
        self.outlet.answer(
            self._receipt(
                job,
                code,
                message,
                suggestion,
                [{"field": "(approval)", "code": "expired", "approval_id": record.approval_id}],
            ),
            job.reply_to,
        )
        self._audit(job, "approval_expired", {"approval_id": record.approval_id, "payload_hash": record.payload_hash})
        release_intent(self.store.client, job.agent_id, job.intent_id, job.payload_hash())

    @staticmethod
    def _followers(record: ApprovalRecord) -> list[Job | str]:
        """The jobs of the intents that joined the approval; the intent id of one that cannot be
        read or is not the approved request (never dispatched: answered as a corrupt one)."""
        found: list[Job | str] = []
        for intent_id, job_json in record.followers:
            try:
                job = parse_job_json(job_json)
            except JobDecodeError:
                found.append(intent_id)
                continue
            found.append(job if job.payload_hash() == record.payload_hash and job.intent_id == intent_id else intent_id)
        return found

    def _refuse_followers(self, record: ApprovalRecord, intent_ids: list[str], reason: str = CORRUPT_REASON) -> None:
        for intent_id in intent_ids:
            log.error(
                "approval %s: the job of follower %s is corrupt; answering APPROVAL_DENIED",
                record.approval_id,
                intent_id,
            )
            self.outlet.answer(self._unrun(record, intent_id, "its kept job cannot be read", reason), record.agent)
            release_intent(self.store.client, record.agent, intent_id, record.payload_hash)

    @staticmethod
    def _unrun(record: ApprovalRecord, intent_id: str, why: str, reason: str) -> Receipt:
        """APPROVAL_DENIED for an intent of this approval that is not run though no person denied it."""
        return build_receipt(
            intent_id=intent_id,
            agent_id=record.agent,
            action=record.action,
            connector=record.connector,
            trace_id=record.trace_id,
            received_at=record.created_ms / 1000,
            code=ErrorCode.APPROVAL_DENIED,
            message=f"{record.connector}.{record.action} was not run: {why} (no person denied it)",
            suggestion="Tell the operators; send a new intent if it is still wanted.",
            details=[{"field": "(approval)", "code": "denied", "approval_id": record.approval_id, "reason": reason}],
        )

    def _corrupt(self, record: ApprovalRecord, claim: str, why: str, reason: str = CORRUPT_REASON) -> str:
        """A parked job that can never be carried out: its one receipt (unless it has one), its
        followers', the budgets back, and the record finished as ``failed``. APPROVAL_DENIED
        (reason "parked job corrupt"), not INTERNAL: the code table makes INTERNAL retryable, and
        this intent must not be resent as it is."""
        log.error("approval %s (%s): %s; answering APPROVAL_DENIED", record.approval_id, claim, why)
        receipt = self._unrun(record, record.intent_id, why, reason)
        self.outlet.answer(receipt, record.reply_to or record.agent)  # (not sent again if it had one)
        common = {"agent": record.agent, "action": record.action, "connector": record.connector}
        self.audit.events(
            record.intent_id,
            [
                (
                    "approval_failed",
                    {**common, "trace_id": record.trace_id, "approval_id": record.approval_id, "why": why},
                ),
                (
                    "receipt",
                    {**common, "trace_id": record.trace_id, "status": receipt.status, "code": "APPROVAL_DENIED"},
                ),
            ],
            agent=record.agent,
        )
        # it never runs; its count is bound to the payload hash (budget_tag is that hash)
        release_intent(self.store.client, record.agent, record.intent_id, record.payload_hash)
        followers = self._followers(record)
        for job in followers:
            if isinstance(job, Job):
                self.outlet.answer(self._unrun(record, job.intent_id, why, reason), job.reply_to)
                release_intent(self.store.client, job.agent_id, job.intent_id, job.payload_hash())
        self._refuse_followers(record, [f for f in followers if not isinstance(f, Job)])
        self.store.finish(record.approval_id, claim, failed=True)
        return "failed"

    def _receipt(
        self, job: Job, code: ErrorCode, message: str, suggestion: str, details: list[dict[str, Any]]
    ) -> Receipt:
        receipt = job_receipt(job, code=code, message=message, suggestion=suggestion, details=details)
        self._audit(job, "receipt", {"status": receipt.status, "code": code.value})
        return receipt

    def _audit(self, job: Job, stage: str, fields: dict[str, Any]) -> None:
        common = {"agent": job.agent_id, "action": job.action, "connector": job.connector, "trace_id": job.trace_id}
        self.audit.events(job.intent_id, [(stage, {**common, **fields})], agent=job.agent_id)


class Parking:
    """The router's side: keep the job, tell the agent, write the audit stage."""

    def __init__(
        self, store: ApprovalStore, publisher: Publisher, sink: ReceiptSink, audit: Audit, max_pending: int
    ) -> None:
        self.store = store
        self.publisher = publisher
        self.sink = sink
        self.audit = audit
        self.max_pending = max_pending
        self._gated: tuple[object, frozenset[str]] = (None, frozenset())

    def park(self, decision: Park, received: dict[str, Any]) -> Job | None:
        """Park the intent (or let it join the waiting approval of its request); returns a job to
        dispatch instead when a person already approved this very request (its pool answers it
        from the ledger, running the request at most once)."""
        job = decision.job
        deadline_ms = None if job.deadline is None else int((job.deadline - time.time()) * 1000)
        expires_in = int(decision.policy.spec.expires * 1000)
        if deadline_ms is not None:
            expires_in = max(1, min(expires_in, deadline_ms))  # nothing may start after the deadline anyway
        hash_ = job.payload_hash()
        summary = summary_of(job, decision.redacted_params, decision.why)
        result = self.store.park(
            Parked(
                approval_id=uuid.uuid4().hex,
                job_json=job.model_dump_json(),
                payload_hash=hash_,
                agent=job.agent_id,
                connector=job.connector,
                action=job.action,
                intent_id=job.intent_id,
                reply_to=job.reply_to,
                trace_id=job.trace_id,
                approvers=decision.policy.spec.approvers,
                people=sorted(decision.policy.people),
                owners=sorted(decision.policy.owners),
                summary=summary,
                redacted_params=decision.redacted_params,
                expires_in_ms=expires_in,
                idempotency_key=job.idempotency_key,
            ),
            self.max_pending,
        )
        if result.outcome in ("full", "reused", "crowded"):
            self.sink.send(self._refusal(job, result.outcome, result.approval_id), job.reply_to)
            release_intent(self.store.client, job.agent_id, job.intent_id, hash_)  # (its budget tag)
            return None
        if result.outcome == "exists":
            # a redelivery of a parked intent: tell the agent again while it still waits
            record = self.store.get(result.approval_id)
            if record is not None and record.state == "pending":
                self._notify(job.intent_id, job.reply_to, record.approval_id, record.expires_ms, record.summary)
            return None
        if result.outcome == "granted":
            return self._granted(job, result.approval_id, received)
        joined = result.outcome == "joined"
        if not joined:
            metrics.APPROVALS_PARKED.labels(connector=job.connector).inc()
        self._notify(job.intent_id, job.reply_to, result.approval_id, result.expires_ms, summary)
        common = {"agent": job.agent_id, "action": job.action, "connector": job.connector, "trace_id": job.trace_id}
        self.audit.events(
            job.intent_id,
            [
                ("received", {**received, **common, "format": job.format}),
                (
                    "approval_pending",
                    {
                        **common,
                        "approval_id": result.approval_id,
                        "payload_hash": hash_,
                        "expires_at": iso(result.expires_ms / 1000),
                        "approvers": ",".join(decision.policy.spec.approvers),
                        "why": decision.why,
                        "param_keys": sorted(decision.redacted_params),
                        "params_digest": params_digest(decision.redacted_params),
                        **({"joined": "the waiting approval of the same idempotency key"} if joined else {}),
                    },
                ),
            ],
            agent=job.agent_id,
        )
        return None

    def _granted(self, job: Job, approval_id: str, received: dict[str, Any]) -> Job | None:
        """A repeat (new intent id, same key and payload) of a request a person approved: the
        approved intent's outcome under this intent's id (``deduplicated``) once it has one, else
        the job, dispatched behind the approved one (the pool's ledger answers it the same way)."""
        record = self.store.get(approval_id)
        original = None if record is None else self.sink.stored(job.agent_id, record.intent_id)
        if original is None:
            if record is None or self.sink.already_sent(job.agent_id, record.intent_id):
                # its outcome is no longer kept, nor maybe the ledger's: it must not run unapproved
                self.sink.send(self._refusal(job, "forgotten", approval_id), job.reply_to)
                release_intent(self.store.client, job.agent_id, job.intent_id, job.payload_hash())
                return None
            self._audit(job, "approval_granted", {**received, "approval_id": approval_id, "format": job.format})
            return job
        now = time.time()
        execution = Execution(
            trace_id=job.trace_id,
            received_at=iso(job.received_at),
            finished_at=iso(now),
            latency_ms=round((now - job.received_at) * 1000, 3),
            deduplicated=True,
            routing=job.routing,
        )
        receipt = original.model_copy(update={"intent_id": job.intent_id, "execution": execution})
        self.sink.send(receipt, job.reply_to)
        release_intent(self.store.client, job.agent_id, job.intent_id, job.payload_hash())  # it ran once, as the other
        metrics.RECEIPTS_PUBLISHED.labels(status=receipt.status).inc()
        self._audit(job, "approval_granted", {**received, "approval_id": approval_id, "format": job.format})
        self._audit(
            job,
            "receipt",
            {
                "status": receipt.status,
                "code": receipt.error.code.value if receipt.error else None,
                "deduplicated": True,
            },
        )
        return None

    def hold(
        self, approvals: Mapping[tuple[str, str, str], object], agent: str | None, intent_id: str, reply_to: str | None
    ) -> bool:
        """Whether a message with this agent's intent id must not be answered or dispatched,
        because that intent id waits for (or was granted) an approval and has no receipt yet: its
        one receipt belongs to the approved work. A held message gets the ``approval_pending``
        notice again while the approval waits (nothing once it is decided: the receipt comes).

        ``approvals``: the catalog's policies; agents without any are never looked up (no cost)."""
        if not agent or agent not in self._gated_agents(approvals):
            return False
        approval_id = self.store.approval_of(agent, intent_id)
        if approval_id is None:
            return False
        record = self.store.get(approval_id)
        if record is None or record.state not in ("pending", *IN_PROGRESS, "approved"):
            return False  # decided and answered: as any answered intent id
        if self.sink.already_sent(agent, intent_id):
            return False
        waiting = record.state == "pending"
        if waiting:
            self._notify(intent_id, reply_to or agent, approval_id, record.expires_ms, record.summary)
        log.info(
            "intent %s of %s %s approval %s; another message with its id is not answered",
            intent_id,
            agent,
            "waits for" if waiting else "was decided by",
            approval_id,
        )
        metrics.APPROVAL_RESENDS_HELD.inc()
        fields = {"agent": agent, "trace_id": record.trace_id, "approval_id": approval_id, "state": record.state}
        self.audit.events(intent_id, [("resend_held", fields)], agent=agent)
        return True

    def _gated_agents(self, approvals: Mapping[tuple[str, str, str], object]) -> frozenset[str]:
        """The agents that have any approval policy (cached for the catalog's mapping)."""
        seen, agents = self._gated
        if seen is not approvals:
            agents = frozenset(agent for agent, _, _ in approvals)
            self._gated = (approvals, agents)
        return agents

    def _notify(self, intent_id: str, reply_to: str, approval_id: str, expires_ms: int, summary: str) -> None:
        """Best effort: the intent is parked (and counted) whether or not the agent hears of it;
        raising here would make the router give up on it and release its budget while the
        approval stays pending. Its receipt still comes once it is decided or expired."""
        notice = ApprovalNotice(
            intent_id=intent_id, approval_id=approval_id, expires_at=iso(expires_ms / 1000), summary=summary
        )
        try:
            self.publisher.publish(
                notice.to_json(),
                exchange=RECEIPTS_EXCHANGE,
                routing_key=reply_to,
                headers={"type": APPROVAL_PENDING},
                correlation_id=intent_id,
                type=APPROVAL_PENDING,
            )
        except Exception as exc:
            log.warning(
                "approval %s: the notice to %s was not delivered (%s: %s); the intent stays parked",
                approval_id,
                reply_to,
                type(exc).__name__,
                str(exc)[:300],
            )
            metrics.APPROVAL_NOTICES_LOST.inc()

    def _audit(self, job: Job, stage: str, fields: dict[str, Any]) -> None:
        common = {"agent": job.agent_id, "action": job.action, "connector": job.connector, "trace_id": job.trace_id}
        self.audit.events(job.intent_id, [(stage, {**common, **fields})], agent=job.agent_id)

    def _refusal(self, job: Job, why: str, approval_id: str) -> Receipt:
        """The receipt of an intent that is neither parked nor joined (nothing ran)."""
        receipt = partial(job_receipt, job)  # as every answer to a routed job: with the routing decision
        detail = [{"field": "idempotency_key", "code": why, "approval_id": approval_id}]
        if why == "reused":
            return receipt(
                code=ErrorCode.IDEMPOTENCY_KEY_REUSED,
                message=f"idempotency key {job.idempotency_key[:80]!r} belongs to approval {approval_id} "
                "of a request with other params",
                suggestion="Send a new idempotency key for a different request.",
                details=detail,
            )
        if why == "crowded":
            return receipt(
                code=ErrorCode.RATE_LIMITED,
                message=f"{MAX_FOLLOWERS} repeats of this request already wait for approval {approval_id}",
                suggestion="Wait for the person's decision: every repeat of the request gets its outcome.",
                retry_after_ms=FULL_RETRY_MS,
                details=detail,
            )
        if why == "forgotten":
            return receipt(
                code=ErrorCode.IDEMPOTENCY_KEY_REUSED,
                message=f"this request was approved ({approval_id}) and answered longer ago than its outcome is kept",
                suggestion="Send a new idempotency key to ask for approval again if it is still wanted.",
                details=detail,
            )
        return receipt(
            code=ErrorCode.RATE_LIMITED,
            message=f"{self.max_pending} intents of {job.agent_id} already wait for approval",
            suggestion="Wait until people have decided on the intents that wait, then send it again.",
            retry_after_ms=FULL_RETRY_MS,
        )


class Sweeper:
    """Every ``interval`` seconds: expire the approvals nobody decided in time (APPROVAL_EXPIRED)
    and carry out decisions left unfinished. Each router runs one; the store's claims make sure
    one entry is acted on by one sweeper at a time."""

    def __init__(self, store: ApprovalStore, settler: Settler, interval: float = SWEEP_SECONDS) -> None:
        self.store = store
        self.settler = settler
        self.interval = interval
        self._counted_at = 0.0  # when the approvals close to expiry were last counted (monotonic)
        self._expiring_shown: set[str] = set()  # connectors the gauge has a value for
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="reach-approval-sweep", daemon=True)

    def start(self) -> Sweeper:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.sweep()
            except Exception as exc:  # Redis or the broker away: the entries stay due for the next round
                log.warning(
                    "approval sweep failed (%s: %s); trying again in %g s", type(exc).__name__, exc, self.interval
                )

    def count_expiring(self) -> None:
        """Set ``reach_approvals_expiring_soon`` per connector (zero where none is left), at most
        every ``EXPIRING_EVERY`` seconds: an alert on it reaches people before an approval expires unseen."""
        now = time.monotonic()
        if now - self._counted_at < EXPIRING_EVERY:
            return
        self._counted_at = now
        counts = self.store.expiring(int(metrics.APPROVALS_EXPIRING_WITHIN_SECONDS * 1000), EXPIRING_SCAN)
        for connector in self._expiring_shown - set(counts):
            metrics.APPROVALS_EXPIRING.labels(connector=connector).set(0)
        for connector, n in counts.items():
            metrics.APPROVALS_EXPIRING.labels(connector=connector).set(n)
        self._expiring_shown |= set(counts)

    def sweep(self) -> int:
        """One round; returns how many entries it settled."""
        self.count_expiring()
        settled = 0
        for approval_id in self.store.due(SWEEP_BATCH):
            claim = self.store.claim_due(approval_id)
            if claim not in IN_PROGRESS:
                continue
            record = self.store.get(approval_id)
            if record is None or record.state != claim:  # finished meanwhile by the one who decided
                continue
            try:
                self.settler.settle(record, claim)
                settled += 1
            except Exception as exc:
                log.warning("could not settle approval %s (%s): %s; retried after its grace", approval_id, claim, exc)
        return settled
