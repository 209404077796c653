"""Deciding on parked intents: what ``reach approvals`` and the console both call.

An approver approves (or denies) one approval id as a named person. The checks, in order: the
approval exists and still waits, has not expired, the person is not an owner of the agent
(``agent_app.owners``), is a member of one of its approver groups (``approvers:`` documents, as
they were when the intent was parked), and — when the caller passes the ``payload_hash`` the
person was shown — the parked payload is still exactly that. The decision is then claimed
atomically in Redis (one approval id is decided once) and carried out at once: the parked job is
dispatched to its connector's queue, or the APPROVAL_DENIED receipt is sent. Who, when, the hash
and the reason go to the audit trail (``reach trace INTENT_ID``).

Listing is fair to every agent: one agent's many waiting approvals never push another's off the
page. The order is each agent's soonest-to-expire approval first, then each agent's second, and so
on (by expiry within a round); pages reach all of them, and the counts per agent come with every page.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import redis
from kombu import Connection
from kombu.pools import producers

from connectors.spec import PERSON_PATTERN
from workers.observability.audit import LoggedAudit
from workers.router.approval_settling import PublisherOutlet, Settler
from workers.settings import Settings
from workers.state.approval_store import ApprovalRecord, ApprovalStore, Waiting
from workers.transport.app import JobMessages, create_app
from workers.transport.dispatch import Dispatcher
from workers.transport.job import JobDecodeError, parse_job_json
from workers.transport.publisher import Publisher
from workers.transport.receipts import ReceiptSink, iso
from workers.transport.topology import connector_queue

log = logging.getLogger("reach.audit")

RECEIPT_TTL_SECONDS = int(Settings.model_fields["receipt_ttl_seconds"].default)  # REACH_RECEIPT_TTL's default
REASON_CHARS = 1000
LIST_SCAN = 50_000  # entries of the due list a listing looks at (agents x REACH_MAX_PENDING_APPROVALS)


def named(person: str, people: list[str]) -> bool:
    """Whether ``person`` is one of ``people``, case-folded: "Bob" is bob, so an owner cannot
    approve their own agent's intent by typing their name in another case."""
    folded = person.casefold()
    return any(folded == other.casefold() for other in people)


@dataclass(frozen=True)
class PendingApproval:
    """One parked intent, as people are shown it (sensitive params redacted)."""

    approval_id: str
    intent_id: str
    agent_id: str
    connector: str
    action: str
    params: Any  # redacted
    payload_hash: str
    approvers: list[str]  # groups
    created_at: str
    expires_at: str
    summary: str
    state: str  # pending, or how it was decided: approved, denied, expired (approving... while carried out)
    decided_by: str = ""
    decided_at: str = ""
    reason: str = ""
    people: list[str] = dataclasses.field(default_factory=list)  # who may decide (members of the groups)
    owners: list[str] = dataclasses.field(default_factory=list)  # the agent's owners: never deciders

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def may_decide(self, person: str) -> bool:
        """Whether ``person`` could approve or deny this: for showing (``approve``/``deny`` decide
        from the stored record, not from this copy). Names compare case-folded (``named``)."""
        return named(person, self.people) and not named(person, self.owners)


DecisionCode = Literal[
    "approved",
    "denied",
    "expired",
    "not_found",
    "already_decided",
    "self_approval",
    "not_an_approver",
    "hash_mismatch",
    "invalid_person",
    "not_run",
]


@dataclass(frozen=True)
class Decision:
    ok: bool
    code: DecisionCode
    message: str


def _view(record: ApprovalRecord) -> PendingApproval:
    return PendingApproval(
        approval_id=record.approval_id,
        intent_id=record.intent_id,
        agent_id=record.agent,
        connector=record.connector,
        action=record.action,
        params=record.redacted_params,
        payload_hash=record.payload_hash,
        approvers=record.approvers,
        created_at=iso(record.created_ms / 1000),
        expires_at=iso(record.expires_ms / 1000),
        summary=record.summary,
        state=record.state,
        decided_by=record.decided_by,
        decided_at=iso(record.decided_at_ms / 1000) if record.decided_at_ms else "",
        reason=record.reason,
        people=list(record.people),
        owners=list(record.owners),
    )


@dataclass(frozen=True)
class Listing:
    """One page of the waiting approvals, fair to every agent, and the counts behind it."""

    rows: list[PendingApproval]
    total: int  # waiting approvals (of ``agent`` when one is chosen)
    per_agent: dict[str, int]  # waiting approvals of every agent, whatever the page or the choice
    page: int  # 1-based, within 1..pages
    pages: int
    per_page: int
    agent: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "approvals": [r.to_dict() for r in self.rows],
            "total": self.total,
            "per_agent": self.per_agent,
            "page": self.page,
            "pages": self.pages,
            "per_page": self.per_page,
            "agent": self.agent,
        }


def fair_order(entries: Sequence[Waiting]) -> list[Waiting]:
    """Each agent's soonest-to-expire entry first, then each agent's second, and so on; within
    one round, the soonest to expire first."""
    rank: Counter[str] = Counter()
    keyed = []
    for entry in sorted(entries, key=lambda e: (e.expires_ms, e.created_ms, e.approval_id)):
        keyed.append((rank[entry.agent], entry.expires_ms, entry.created_ms, entry.approval_id, entry))
        rank[entry.agent] += 1
    return [k[-1] for k in sorted(keyed, key=lambda k: k[:4])]


def pending_page(client: redis.Redis, per_page: int = 100, page: int = 1, agent: str | None = None) -> Listing:
    """A page of the approvals that still wait, in :func:`fair_order`, with the count per agent.

    Args:
        per_page: Rows per page.
        page: 1 for the first; past the last, the last.
        agent: Only this agent's approvals (the counts still cover every agent).
    """
    store = ApprovalStore(client)
    seconds, micros = client.time()
    now_ms = int(seconds) * 1000 + int(micros) // 1000
    waiting = [w for w in store.waiting(LIST_SCAN) if w.state == "pending" and w.expires_ms > now_ms]
    per_agent = dict(sorted(Counter(w.agent for w in waiting).items()))
    if agent is not None:
        waiting = [w for w in waiting if w.agent == agent]
    ordered = fair_order(waiting)
    per_page = max(1, per_page)
    pages = max(1, math.ceil(len(ordered) / per_page))
    page = min(max(1, page), pages)
    chosen = ordered[(page - 1) * per_page : page * per_page]
    # read again: one may have been decided in between (then it is left out of this page)
    rows = [_view(r) for r in store.records([w.approval_id for w in chosen]) if r.state == "pending"]
    return Listing(rows, len(ordered), per_agent, page, pages, per_page, agent)


def list_pending(client: redis.Redis, limit: int = 100) -> list[PendingApproval]:
    """The first ``limit`` approvals that still wait, fair to every agent (:func:`pending_page`)."""
    return pending_page(client, limit).rows


def waiting_per_agent(client: redis.Redis) -> dict[str, int]:
    """How many approvals of each agent wait (the pending bound's own counts: one Redis read)."""
    return ApprovalStore(client).per_agent()


def get_approval(client: redis.Redis, approval_id: str) -> PendingApproval | None:
    """One approval, pending or decided (kept a day after its decision or expiry)."""
    record = ApprovalStore(client).get(approval_id)
    return None if record is None else _view(record)


def approve(
    client: redis.Redis,
    broker_url: str,
    approval_id: str,
    approver: str,
    reason: str | None = None,
    *,
    payload_hash: str | None = None,
    receipt_ttl_seconds: int = RECEIPT_TTL_SECONDS,
) -> Decision:
    """Approve as ``approver``: the parked job is dispatched to its connector's queue and runs.

    ``payload_hash``: the hash the approver was shown; the approval is refused if the parked
    payload is not that one. ``receipt_ttl_seconds``: REACH_RECEIPT_TTL (how long a receipt this
    sends is kept)."""
    return _decide(client, broker_url, approval_id, approver, reason, "approving", payload_hash, receipt_ttl_seconds)


def deny(
    client: redis.Redis,
    broker_url: str,
    approval_id: str,
    approver: str,
    reason: str | None = None,
    *,
    payload_hash: str | None = None,
    receipt_ttl_seconds: int = RECEIPT_TTL_SECONDS,
) -> Decision:
    """Deny as ``approver``: the agent gets APPROVAL_DENIED with the reason; nothing runs."""
    return _decide(client, broker_url, approval_id, approver, reason, "denying", payload_hash, receipt_ttl_seconds)


def _decide(
    client: redis.Redis,
    broker_url: str,
    approval_id: str,
    approver: str,
    reason: str | None,
    claim: Literal["approving", "denying"],
    shown_hash: str | None,
    receipt_ttl_seconds: int = RECEIPT_TTL_SECONDS,
) -> Decision:
    verb = "approve" if claim == "approving" else "deny"
    if not isinstance(approver, str) or not PERSON_PATTERN.match(approver):
        return Decision(False, "invalid_person", "the approver must be a person's name: letters, digits, . _ @ + -")
    reason = (reason or "").strip()[:REASON_CHARS]
    store = ApprovalStore(client)
    record = store.get(approval_id)
    if record is None:
        return Decision(False, "not_found", f"no approval {approval_id!r} (unknown, or decided more than a day ago)")
    if record.state in ("expiring", "expired"):
        return Decision(False, "expired", f"approval {approval_id} expired at {iso(record.expires_ms / 1000)}")
    if record.state != "pending":
        by = f" by {record.decided_by}" if record.decided_by else ""
        return Decision(False, "already_decided", f"approval {approval_id} was already decided{by}: {record.state}")
    if named(approver, record.owners):
        return Decision(
            False, "self_approval", f"{approver} owns agent {record.agent} and may not decide on its intents"
        )
    if not named(approver, record.people):
        groups = ", ".join(record.approvers)
        return Decision(False, "not_an_approver", f"{approver} is not in the approver groups of this action ({groups})")
    try:
        job = parse_job_json(record.job_json)
    except JobDecodeError as exc:
        return Decision(False, "hash_mismatch", f"the parked job cannot be read: {exc.reason}")
    if shown_hash is not None and shown_hash != record.payload_hash:
        return Decision(False, "hash_mismatch", "the parked payload is not the one shown; look at it again")
    if claim == "approving" and job.payload_hash() != record.payload_hash:
        return Decision(False, "hash_mismatch", "the parked payload does not match its hash; it is not run")
    outcome = store.decide(approval_id, claim, approver, reason, record.payload_hash)
    if outcome == "expired":
        return Decision(False, "expired", f"approval {approval_id} expired at {iso(record.expires_ms / 1000)}")
    if outcome == "not_found":
        return Decision(False, "not_found", f"no approval {approval_id!r}")
    if outcome == "hash_mismatch":
        return Decision(False, "hash_mismatch", "the parked payload changed; it is not run")
    if outcome != "ok":
        return Decision(False, "already_decided", f"approval {approval_id} was decided by someone else just now")
    audit = LoggedAudit(client, "approvals")
    decided: DecisionCode = "approved" if claim == "approving" else "denied"
    audit.events(
        job.intent_id,
        [
            (
                f"approval_{decided}",
                {
                    "agent": job.agent_id,
                    "action": job.action,
                    "connector": job.connector,
                    "trace_id": job.trace_id,
                    "approval_id": approval_id,
                    "decided_by": approver,
                    "payload_hash": record.payload_hash,
                    "reason": reason or None,
                },
            )
        ],
        agent=job.agent_id,
    )
    claimed = dataclasses.replace(record, state=claim, decided_by=approver, reason=reason)
    try:
        finished = Settler(store, _outlet(broker_url, client, receipt_ttl_seconds), audit).settle(claimed, claim)
    except Exception as exc:  # the claim stands: the routers' sweep carries it out after its grace
        log.warning("approval %s: could not %s at once (%s); the router's sweep will", approval_id, verb, exc)
        return Decision(
            True,
            decided,
            f"{decided} by {approver}; carrying it out failed for now ({type(exc).__name__}: {exc}), "
            "the router retries within a minute",
        )
    if claim == "approving" and finished == "failed":  # answered by another message with its id just before
        return Decision(
            False,
            "not_run",
            f"{decided} by {approver}, but intent {job.intent_id} was not run: it already had its receipt "
            "(or its parked job could not be read); its agent was answered APPROVAL_DENIED, its budget given back",
        )
    joined = len(record.followers)
    also = f" (and the {joined} repeat{'s' if joined != 1 else ''} of its request that joined it)" if joined else ""
    if claim == "approving":
        return Decision(
            True, "approved", f"approved by {approver}: intent {job.intent_id} dispatched to {job.connector}{also}"
        )
    return Decision(True, "denied", f"denied by {approver}: intent {job.intent_id} answered APPROVAL_DENIED{also}")


@functools.lru_cache(maxsize=8)
def _publishing(broker_url: str) -> tuple[Publisher, JobMessages]:
    """One publisher (connections per thread) and job template per broker, for the process's life."""
    connection = Connection(broker_url, connect_timeout=5, transport_options={"confirm_publish": True})
    app = create_app(Settings.from_env({"REACH_BROKER_URL": broker_url}), [connector_queue("_approvals")])
    return Publisher(producers[connection]), JobMessages(app)


def _outlet(broker_url: str, client: redis.Redis, receipt_ttl_seconds: int) -> PublisherOutlet:
    publisher, jobs = _publishing(broker_url)
    # a connector queue found missing is not declared from here (this tool does not know the
    # fleet's queue type): the decision stands, and a router's sweep dispatches it, declaring it
    return PublisherOutlet(Dispatcher(publisher, jobs), ReceiptSink(publisher, client, receipt_ttl_seconds))
