"""Intents that wait for a person, the router's side: parked after every check passed.

An intent whose action (or binding) has an ``approval:`` that applies is not dispatched:
:class:`Parking` keeps its job in Redis (``workers.state.approval_store``) and tells the agent
with an ``approval_pending`` notice on its reply topic. The intent's one receipt comes later,
from ``workers.router.approval_settling``: the parked job is dispatched once approved (its pool
sends the receipt), or APPROVAL_DENIED / APPROVAL_EXPIRED is sent. ``reach approvals`` and the
console decide through ``workers.ops.approval_decisions``; ``workers.router.approval_sweep`` (a
thread in every router) expires what nobody decided and finishes decisions whose process died
before carrying them out.

An intent id that waits is held: another message with that id (a resend with other params, a
typo in the action, a redelivery) is answered with the ``approval_pending`` notice again, naming
the waiting approval, and nothing else — no receipt, no dispatch (:meth:`Parking.hold`), so the
approval still ends in the intent's one receipt. A repeat of the request's idempotency key under a
new intent id joins the waiting approval instead of asking a person twice (``workers.state.approval_store``).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

from connectors.approval_policy import ApprovalPolicy
from producers.wire import APPROVAL_PENDING, ApprovalNotice, ErrorCode, Execution, Receipt
from workers.observability import metrics
from workers.observability.audit import Audit, params_digest
from workers.state.approval_store import IN_PROGRESS, MAX_FOLLOWERS, ApprovalStore, Parked
from workers.state.budgets import release_intent
from workers.transport.job import Job
from workers.transport.publisher import Publisher
from workers.transport.receipts import ReceiptSink, iso, job_receipt
from workers.transport.topology import RECEIPTS_EXCHANGE

log = logging.getLogger("reach.approvals")

SUMMARY_CHARS = 500
FULL_RETRY_MS = 60_000  # what an agent over its pending-approval bound is told to wait


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
