"""Intents that wait for a person, once decided: a claimed decision carried out.

:class:`Settler` carries out an approval's claim (``approving``, ``denying``, ``expiring``) for
the parked intent and every intent that joined it: the jobs go to their pools through an
:class:`Outlet` (whose receipt each pool sends), or APPROVAL_DENIED / APPROVAL_EXPIRED is sent.
A parked job that can never be carried out is answered APPROVAL_DENIED ("parked job corrupt").
Routers settle through their sweep (``workers.router.approval_sweep``), operators through
``workers.ops.approval_decisions``.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Protocol

from producers.wire import ErrorCode, Receipt
from workers.observability.audit import Audit
from workers.state.approval_store import IN_PROGRESS, ApprovalRecord, ApprovalStore
from workers.state.budgets import release_intent
from workers.transport.dispatch import Dispatcher
from workers.transport.job import Job, JobDecodeError, parse_job_json
from workers.transport.receipts import ReceiptSink, build_receipt, iso, job_receipt

log = logging.getLogger("reach.approvals")

CORRUPT_REASON = "parked job corrupt"
ANSWERED_REASON = "intent already answered"


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
