"""Intents that wait for a person: parked by the router, settled once decided or expired.

After every check passed, an intent whose action (or binding) has an ``approval:`` that applies is
not dispatched: :class:`Parking` keeps its job in Redis (``workers.state.approvals``) and tells
the agent with an ``approval_pending`` notice on its reply topic. The intent's one receipt comes
later, from :class:`Settler`: the parked job is dispatched once approved (its pool sends the
receipt), or APPROVAL_DENIED / APPROVAL_EXPIRED is sent. ``reach approvals`` and the console decide
through ``workers.ops.approvals``; :class:`Sweeper` (a thread in every router) expires what
nobody decided and finishes decisions whose process died before carrying them out.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, Protocol

from connectors.approvals import ApprovalPolicy
from producers.wire import APPROVAL_PENDING, ApprovalNotice, ErrorCode, Receipt
from workers.observability import metrics
from workers.observability.audit import Audit, params_digest
from workers.state.approvals import IN_PROGRESS, ApprovalRecord, ApprovalStore, Parked
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
    """Where a settled decision goes: the parked job to its pool, or the intent's receipt."""

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


class Settler:
    """Carries out a claimed decision (``approving``, ``denying``, ``expiring``) and finishes it."""

    def __init__(self, store: ApprovalStore, outlet: Outlet, audit: Audit) -> None:
        self.store = store
        self.outlet = outlet
        self.audit = audit

    def settle(self, record: ApprovalRecord, claim: str) -> None:
        """Raises when the broker refused: the claim stays, and the sweep carries it out later."""
        if claim not in IN_PROGRESS:
            raise ValueError(f"not a claim: {claim!r}")
        try:
            job = parse_job_json(record.job_json)
        except JobDecodeError as exc:  # never readable again: answer now rather than retry until it is dropped
            self._corrupt(record, claim, f"the parked job cannot be read: {exc.reason}")
            return
        if claim == "approving":
            # the parked copy, checked against the hash the approver approved
            if job.payload_hash() != record.payload_hash:
                self._corrupt(record, claim, "the parked job does not match the hash that was approved")
                return
            now = time.time()
            self.outlet.dispatch(job.model_copy(update={"dispatched_at": now}))
            self._audit(job, "dispatched", {"ts": round(now, 6), "approval_id": record.approval_id, "from": "approval"})
        elif claim == "denying":
            reason = record.reason or "no reason given"
            self.outlet.answer(
                self._receipt(
                    job,
                    ErrorCode.APPROVAL_DENIED,
                    f"the approval of {job.connector}.{job.action} was denied: {reason}",
                    "Do not resend this intent as it is; tell your user it was denied and why.",
                    [{"field": "(approval)", "code": "denied", "approval_id": record.approval_id, "reason": reason}],
                ),
                job.reply_to,
            )
            # it never runs: its budget gets it back
            release_intent(self.store.client, job.agent_id, job.intent_id, job.payload_hash())
        elif claim == "expiring":
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
            self._audit(
                job, "approval_expired", {"approval_id": record.approval_id, "payload_hash": record.payload_hash}
            )
            release_intent(self.store.client, job.agent_id, job.intent_id, job.payload_hash())
        self.store.finish(record.approval_id, claim)

    def _corrupt(self, record: ApprovalRecord, claim: str, why: str) -> None:
        """A parked job that can never be carried out: its one receipt, its budget back, and the
        record finished as ``failed``. APPROVAL_DENIED (reason "parked job corrupt"), not INTERNAL:
        the code table makes INTERNAL retryable, and this intent must not be resent as it is."""
        log.error("approval %s (%s): %s; answering APPROVAL_DENIED", record.approval_id, claim, why)
        receipt = build_receipt(
            intent_id=record.intent_id,
            agent_id=record.agent,
            action=record.action,
            connector=record.connector,
            trace_id=record.trace_id,
            received_at=record.created_ms / 1000,
            code=ErrorCode.APPROVAL_DENIED,
            message=f"{record.connector}.{record.action} was not run: {why} (no person denied it)",
            suggestion="Tell the operators; send a new intent if it is still wanted.",
            details=[
                {"field": "(approval)", "code": "denied", "approval_id": record.approval_id, "reason": CORRUPT_REASON}
            ],
        )
        self.outlet.answer(receipt, record.reply_to or record.agent)
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
        self.store.finish(record.approval_id, claim, failed=True)

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

    def park(self, decision: Park, received: dict[str, Any]) -> None:
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
            ),
            self.max_pending,
        )
        if result.outcome == "full":
            self.sink.send(self._full(job), job.reply_to)
            release_intent(self.store.client, job.agent_id, job.intent_id, hash_)  # (its budget tag)
            return
        if result.outcome == "exists":
            # a redelivery of a parked intent: tell the agent again while it still waits
            record = self.store.get(result.approval_id)
            if record is not None and record.state == "pending":
                self._notify(job, record.approval_id, record.expires_ms, record.summary)
            return
        metrics.APPROVALS_PARKED.labels(connector=job.connector).inc()
        self._notify(job, result.approval_id, result.expires_ms, summary)
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
                    },
                ),
            ],
            agent=job.agent_id,
        )

    def _notify(self, job: Job, approval_id: str, expires_ms: int, summary: str) -> None:
        """Best effort: the intent is parked (and counted) whether or not the agent hears of it;
        raising here would make the router give up on it and release its budget while the
        approval stays pending. Its receipt still comes once it is decided or expired."""
        notice = ApprovalNotice(
            intent_id=job.intent_id, approval_id=approval_id, expires_at=iso(expires_ms / 1000), summary=summary
        )
        try:
            self.publisher.publish(
                notice.to_json(),
                exchange=RECEIPTS_EXCHANGE,
                routing_key=job.reply_to,
                headers={"type": APPROVAL_PENDING},
                correlation_id=job.intent_id,
                type=APPROVAL_PENDING,
            )
        except Exception as exc:
            log.warning(
                "approval %s: the notice to %s was not delivered (%s: %s); the intent stays parked",
                approval_id,
                job.reply_to,
                type(exc).__name__,
                str(exc)[:300],
            )
            metrics.APPROVAL_NOTICES_LOST.inc()

    def _full(self, job: Job) -> Receipt:
        return build_receipt(
            intent_id=job.intent_id,
            agent_id=job.agent_id,
            action=job.action,
            connector=job.connector,
            trace_id=job.trace_id,
            received_at=job.received_at,
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

    def sweep(self) -> int:
        """One round; returns how many entries it settled."""
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
