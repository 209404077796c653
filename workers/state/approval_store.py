"""Intents parked for a person's approval, kept in Redis so they outlive any router.

One hash per parked intent holds the job exactly as the router checked it (its JSON), the SHA-256
of its payload, who may decide and, once decided, who did, when and why. Its ``state`` moves once,
atomically (each step is one Lua script)::

    pending ──approve──► approving ──dispatched──► approved
            ──deny─────► denying ───receipt sent──► denied
            ──expiry───► expiring ──receipt sent──► expired
            (a claim whose parked job is corrupt ──receipt sent──► failed)

The middle states are claims: whoever moved the intent there carries the decision out (publishes
the job or the receipt) and then finishes it. A claim not finished within ``GRACE_MS`` (its
process died) is carried out again by the sweep, which the receipt's sent mark and the pool's
ledger make harmless. ``reach:approvals-due`` orders every entry by when the sweep must look
at it: a pending one at its expiry, a claimed one at its grace's end; a sweep claims an entry by
moving its time forward, so two sweepers never act on one entry at once.

One request, one approval: ``reach:approval-key`` names the approval of an (agent, connector,
action, idempotency key). Another intent with that key and the same payload while it waits
*joins* it (a follower: its job kept in the record, settled with it: dispatched once approved —
the pool's ledger runs the request once and answers the others from it — or answered as denied
or expired); once approved, a repeat is ``granted`` (answered from the approved one's outcome);
with other params it is ``reused``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import redis

from workers.state import keys
from workers.state.client import text

RETENTION_MS = 24 * 3600 * 1000  # a decided (or expired) approval is kept this long, for `show` and audits
GRACE_MS = 60_000  # a claim not finished by then is carried out again by the sweep
MAX_FOLLOWERS = 20  # intents that may join one waiting approval (repeats of its key), then refused
FOLLOWER_PREFIX = "follower:"
IN_PROGRESS = ("approving", "denying", "expiring")
DONE = {"approving": "approved", "denying": "denied", "expiring": "expired"}

State = Literal["pending", "approving", "denying", "expiring", "approved", "denied", "expired", "failed"]

_NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

# KEYS[1] record, [2] due, [3] intent index, [4] per-agent count, [5] key index, [6] the record
# the key index named when the caller read it (any key of the tag when it named none)
# ARGV[1] approval id, [2] agent, [3] expires in (ms), [4] max pending per agent, [5] retention (ms),
# [6] payload hash, [7] the approval id KEYS[6] belongs to ('' for none), [8] intent id, [9] the job
# (JSON), [10] max followers, [11...] the record's field/value pairs
# 'retry': the key index changed since the caller read it (read it again and call again)
_PARK = (
    _NOW
    + """
local existing = redis.call('GET', KEYS[3])
if existing then
  return {'exists', existing, 0, 0}
end
local named = redis.call('GET', KEYS[5]) or ''
if named ~= ARGV[7] then
  return {'retry', named, 0, 0}
end
if named ~= '' then
  local f = redis.call('HMGET', KEYS[6], 'state', 'hash', 'expires', 'followers', 'created')
  if f[1] then
    local same = f[2] == ARGV[6]
    if f[1] == 'pending' and now < tonumber(f[3]) then
      if not same then
        return {'reused', named, 0, 0}
      end
      local n = tonumber(f[4] or '0')
      if n >= tonumber(ARGV[10]) then
        return {'crowded', named, 0, tonumber(f[3])}
      end
      redis.call('HSET', KEYS[6], 'followers', n + 1, 'follower:' .. ARGV[8], ARGV[9])
      redis.call('SET', KEYS[3], named, 'PXAT', tonumber(f[3]) + tonumber(ARGV[5]))
      return {'joined', named, tonumber(f[5]), tonumber(f[3])}
    end
    if f[1] == 'approving' or f[1] == 'approved' then
      if not same then
        return {'reused', named, 0, 0}
      end
      return {'granted', named, 0, 0}
    end
  end
end
local pending = tonumber(redis.call('HGET', KEYS[4], ARGV[2]) or '0')
if pending >= tonumber(ARGV[4]) then
  return {'full', '', 0, 0}
end
local expires = now + tonumber(ARGV[3])
redis.call('HSET', KEYS[1], 'state', 'pending', 'created', now, 'expires', expires, unpack(ARGV, 11))
redis.call('PEXPIREAT', KEYS[1], expires + tonumber(ARGV[5]))
redis.call('ZADD', KEYS[2], expires, ARGV[1])
redis.call('SET', KEYS[3], ARGV[1], 'PXAT', expires + tonumber(ARGV[5]))
redis.call('SET', KEYS[5], ARGV[1], 'PXAT', expires + tonumber(ARGV[5]))
redis.call('HINCRBY', KEYS[4], ARGV[2], 1)
return {'parked', ARGV[1], now, expires}
"""
)

# KEYS[1] record, [2] due, [3] per-agent count
# ARGV[1] approval id, [2] the claim (approving | denying), [3] person, [4] reason, [5] payload hash,
# [6] grace (ms), [7] retention (ms)
_DECIDE = (
    _NOW
    + """
local f = redis.call('HMGET', KEYS[1], 'state', 'expires', 'hash', 'agent')
if not f[1] then
  return {'not_found', ''}
end
if f[1] ~= 'pending' then
  return {'already_decided', f[1]}
end
if now >= tonumber(f[2]) then
  return {'expired', f[1]}
end
if f[3] ~= ARGV[5] then
  return {'hash_mismatch', f[1]}
end
redis.call('HSET', KEYS[1], 'state', ARGV[2], 'decided_by', ARGV[3], 'decided_at', now, 'reason', ARGV[4])
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[7]))
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[6]), ARGV[1])
redis.call('HINCRBY', KEYS[3], f[4], -1)
return {'ok', ARGV[2]}
"""
)

# KEYS[1] record, [2] due, [3] per-agent count; ARGV[1] approval id, [2] grace (ms), [3] retention (ms)
_CLAIM_DUE = (
    _NOW
    + """
local score = redis.call('ZSCORE', KEYS[2], ARGV[1])
if not score or tonumber(score) > now then
  return 'skip'
end
local f = redis.call('HMGET', KEYS[1], 'state', 'agent')
if not f[1] then
  redis.call('ZREM', KEYS[2], ARGV[1])
  return 'gone'
end
if f[1] == 'pending' then
  redis.call('HSET', KEYS[1], 'state', 'expiring', 'decided_at', now)
  redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[3]))
  redis.call('HINCRBY', KEYS[3], f[2], -1)
  redis.call('ZADD', KEYS[2], now + tonumber(ARGV[2]), ARGV[1])
  return 'expiring'
end
if f[1] == 'approving' or f[1] == 'denying' or f[1] == 'expiring' then
  redis.call('ZADD', KEYS[2], now + tonumber(ARGV[2]), ARGV[1])
  return f[1]
end
redis.call('ZREM', KEYS[2], ARGV[1])
return 'skip'
"""
)

# KEYS[1] record, [2] due; ARGV[1] approval id, [2] from state, [3] to state. The parked job and its
# followers' jobs (each up to the intent size limit, unredacted) go: what is kept for `show` and
# audits is the hash and the redacted params.
_FINISH = (
    _NOW
    + """
if redis.call('HGET', KEYS[1], 'state') ~= ARGV[2] then
  return 0
end
redis.call('HSET', KEYS[1], 'state', ARGV[3], 'finished_at', now)
redis.call('HDEL', KEYS[1], 'job')
for _, name in ipairs(redis.call('HKEYS', KEYS[1])) do
  if string.sub(name, 1, 9) == 'follower:' then
    redis.call('HDEL', KEYS[1], name)
  end
end
redis.call('ZREM', KEYS[2], ARGV[1])
return 1
"""
)


def payload_hash(agent: str, connector: str, action: str, params: Any, idempotency_key: str) -> str:
    """SHA-256 of the canonical JSON of what an approval is for (sorted keys, no spaces, UTF-8)."""
    doc = {
        "agent": agent,
        "connector": connector,
        "action": action,
        "params": params,
        "idempotency_key": idempotency_key,
    }
    canonical = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass(frozen=True)
class Parked:
    """What the router parks: the checked job (JSON) and who may decide."""

    approval_id: str
    job_json: str
    payload_hash: str
    agent: str
    connector: str
    action: str
    intent_id: str
    reply_to: str
    trace_id: str
    approvers: Sequence[str]  # the groups
    people: Sequence[str]  # their members, as the catalog said when the intent was parked
    owners: Sequence[str]  # the agent's owners: never approvers of its intents
    summary: str
    redacted_params: Any  # what people are shown (sensitive fields redacted)
    expires_in_ms: int
    idempotency_key: str = ""  # "": the intent id (the router's default key)


ParkOutcome = Literal["parked", "exists", "full", "joined", "granted", "reused", "crowded"]


@dataclass(frozen=True)
class ParkResult:
    """``parked`` (a new approval), ``exists`` (this intent id has one), ``full`` (the agent's
    bound), or for a repeat of a waiting or approved request's key: ``joined`` (it follows that
    approval), ``granted`` (approved already), ``reused`` (the key with another payload),
    ``crowded`` (``MAX_FOLLOWERS`` follow it already). ``approval_id`` names the approval."""

    outcome: ParkOutcome
    approval_id: str
    created_ms: int
    expires_ms: int


@dataclass(frozen=True)
class Waiting:
    """An entry of the due list as the listing orders it (no job, no params: cheap to read)."""

    approval_id: str
    agent: str
    connector: str
    state: str
    created_ms: int
    expires_ms: int


@dataclass(frozen=True)
class ApprovalRecord:
    """A parked intent as Redis holds it."""

    approval_id: str
    state: str
    job_json: str
    payload_hash: str
    agent: str
    connector: str
    action: str
    intent_id: str
    reply_to: str
    trace_id: str
    approvers: list[str]
    people: list[str]
    owners: list[str]
    summary: str
    redacted_params: Any
    created_ms: int
    expires_ms: int
    decided_by: str
    decided_at_ms: int | None
    reason: str
    # intents that joined it (same agent, action, idempotency key and payload): (intent id, job JSON)
    followers: list[tuple[str, str]] = dataclasses.field(default_factory=list)


def _record(approval_id: str, raw: dict[bytes, bytes]) -> ApprovalRecord | None:
    if not raw:
        return None
    field = {k.decode(): text(v) for k, v in raw.items()}
    decided = field.get("decided_at", "")
    followers = sorted(
        (name[len(FOLLOWER_PREFIX) :], value) for name, value in field.items() if name.startswith(FOLLOWER_PREFIX)
    )
    return ApprovalRecord(
        approval_id=approval_id,
        state=field.get("state", ""),
        job_json=field.get("job", ""),
        payload_hash=field.get("hash", ""),
        agent=field.get("agent", ""),
        connector=field.get("connector", ""),
        action=field.get("action", ""),
        intent_id=field.get("intent", ""),
        reply_to=field.get("reply_to", ""),
        trace_id=field.get("trace_id", ""),
        approvers=json.loads(field.get("approvers") or "[]"),
        people=json.loads(field.get("people") or "[]"),
        owners=json.loads(field.get("owners") or "[]"),
        summary=field.get("summary", ""),
        redacted_params=json.loads(field.get("params") or "{}"),
        created_ms=int(field.get("created") or 0),
        expires_ms=int(field.get("expires") or 0),
        decided_by=field.get("decided_by", ""),
        decided_at_ms=int(decided) if decided else None,
        reason=field.get("reason", ""),
        followers=followers,
    )


class ApprovalStore:
    """The parked intents in Redis (every key from ``workers.state.keys``, tag ``{approvals}``)."""

    def __init__(self, client: redis.Redis, grace_ms: int = GRACE_MS) -> None:
        self._client = client
        self._grace_ms = grace_ms
        self._park = client.register_script(_PARK)
        self._decide = client.register_script(_DECIDE)
        self._claim_due = client.register_script(_CLAIM_DUE)
        self._finish = client.register_script(_FINISH)

    @property
    def client(self) -> redis.Redis:
        """Its Redis (a denied or expired intent's budget is given back there: workers.state.budgets)."""
        return self._client

    def park(self, parked: Parked, max_per_agent: int, max_followers: int = MAX_FOLLOWERS) -> ParkResult:
        """Keep ``parked`` unless the agent's intent already is (a redelivery: ``exists`` with
        that approval's id), its request's key has a waiting or approved approval (``joined``,
        ``granted``, ``reused``, ``crowded``: ``ParkResult``), or the agent has ``max_per_agent``
        pending already (``full``)."""
        fields = {
            "job": parked.job_json,
            "hash": parked.payload_hash,
            "agent": parked.agent,
            "connector": parked.connector,
            "action": parked.action,
            "intent": parked.intent_id,
            "reply_to": parked.reply_to,
            "trace_id": parked.trace_id,
            "approvers": json.dumps(list(parked.approvers)),
            "people": json.dumps(sorted(parked.people)),
            "owners": json.dumps(sorted(parked.owners)),
            "summary": parked.summary,
            "params": json.dumps(parked.redacted_params, ensure_ascii=False),
        }
        key_index = keys.approval_of_key(
            parked.agent, parked.connector, parked.action, parked.idempotency_key or parked.intent_id
        )
        named = text(self._client.get(key_index))
        for _ in range(5):  # (the key index changes only when an approval is parked for it: bounded)
            args: list[Any] = [
                parked.approval_id,
                parked.agent,
                parked.expires_in_ms,
                max_per_agent,
                RETENTION_MS,
                parked.payload_hash,
                named,
                parked.intent_id,
                parked.job_json,
                max_followers,
            ]
            for name, value in fields.items():
                args += [name, value]
            outcome, approval_id, created, expires = self._park(
                keys=[
                    keys.approval(parked.approval_id),
                    keys.approvals_due(),
                    keys.approval_of_intent(parked.agent, parked.intent_id),
                    keys.approvals_count(),
                    key_index,
                    keys.approval(named) if named else keys.approval(parked.approval_id),
                ],
                args=args,
            )
            if text(outcome) != "retry":
                return ParkResult(text(outcome), text(approval_id), int(created), int(expires))  # type: ignore[arg-type]
            named = text(approval_id)
        raise redis.RedisError(f"the approval of intent {parked.intent_id} kept changing; not parked")

    def approval_of(self, agent: str, intent_id: str) -> str | None:
        """The approval an agent's intent id waits for (or waited for, a day after its decision)."""
        found = self._client.get(keys.approval_of_intent(agent, intent_id))
        return None if found is None else text(found)

    def get(self, approval_id: str) -> ApprovalRecord | None:
        if not _plausible(approval_id):
            return None
        return _record(approval_id, self._client.hgetall(keys.approval(approval_id)))

    def entries(self, limit: int) -> list[ApprovalRecord]:
        """Entries of the due list (pending and claimed ones), soonest first, at most ``limit``."""
        ids = [text(i) for i in self._client.zrange(keys.approvals_due(), 0, max(0, limit - 1))]
        return self.records(ids)

    def records(self, ids: Sequence[str]) -> list[ApprovalRecord]:
        """These approvals (those still kept), in the order given, in one round trip."""
        pipe = self._client.pipeline(transaction=False)
        for approval_id in ids:
            pipe.hgetall(keys.approval(approval_id))
        found = [_record(i, raw) for i, raw in zip(ids, pipe.execute())]
        return [r for r in found if r is not None]

    def waiting(self, limit: int) -> list[Waiting]:
        """Up to ``limit`` entries of the due list, soonest first, with only what ordering and
        counting them needs (the listing reads the full records of one page only)."""
        ids = [text(i) for i in self._client.zrange(keys.approvals_due(), 0, max(0, limit - 1))]
        pipe = self._client.pipeline(transaction=False)
        for approval_id in ids:
            pipe.hmget(keys.approval(approval_id), "state", "agent", "connector", "created", "expires")
        found = []
        for approval_id, (state, agent, connector, created, expires) in zip(ids, pipe.execute()):
            if state is not None:
                found.append(
                    Waiting(
                        approval_id, text(agent), text(connector), text(state), int(created or 0), int(expires or 0)
                    )
                )
        return found

    def expiring(self, within_ms: int, limit: int) -> Counter[str]:
        """Pending approvals that expire within ``within_ms`` (by Redis's clock), per connector;
        at most ``limit`` are looked at."""
        seconds, micros = self._client.time()
        now_ms = int(seconds) * 1000 + int(micros) // 1000
        ids = self._client.zrangebyscore(keys.approvals_due(), now_ms, now_ms + within_ms, start=0, num=limit)
        pipe = self._client.pipeline(transaction=False)
        for approval_id in ids:
            pipe.hmget(keys.approval(text(approval_id)), "state", "connector")
        return Counter(text(connector) for state, connector in pipe.execute() if text(state) == "pending")

    def per_agent(self) -> dict[str, int]:
        """Pending approvals per agent (the bound's counts), agents with none left out."""
        counts = {text(agent): int(n) for agent, n in self._client.hgetall(keys.approvals_count()).items()}
        return {agent: n for agent, n in sorted(counts.items()) if n > 0}

    def decide(
        self, approval_id: str, claim: Literal["approving", "denying"], person: str, reason: str, hash_: str
    ) -> str:
        """Claim a pending approval for a decision: ``ok``, or why not (``not_found``,
        ``already_decided``, ``expired``, ``hash_mismatch``)."""
        if not _plausible(approval_id):
            return "not_found"
        outcome, _ = self._decide(
            keys=[keys.approval(approval_id), keys.approvals_due(), keys.approvals_count()],
            args=[approval_id, claim, person, reason, hash_, self._grace_ms, RETENTION_MS],
        )
        return text(outcome)

    def due(self, limit: int) -> list[str]:
        """Ids whose time in the due list has come (by Redis's clock)."""
        seconds, micros = self._client.time()
        now_ms = int(seconds) * 1000 + int(micros) // 1000
        return [text(i) for i in self._client.zrangebyscore(keys.approvals_due(), "-inf", now_ms, start=0, num=limit)]

    def claim_due(self, approval_id: str) -> str:
        """Claim one due entry for the sweep: ``expiring`` (a pending one expired), a claimed state
        left unfinished (carry it out again), or ``skip``/``gone``."""
        return text(
            self._claim_due(
                keys=[keys.approval(approval_id), keys.approvals_due(), keys.approvals_count()],
                args=[approval_id, self._grace_ms, RETENTION_MS],
            )
        )

    def finish(self, approval_id: str, claim: str, failed: bool = False) -> bool:
        """The claimed decision was carried out: ``approving`` -> ``approved`` and so on; ``failed``:
        it could not be (the parked job was corrupt) and its intent was answered instead."""
        done = self._finish(
            keys=[keys.approval(approval_id), keys.approvals_due()],
            args=[approval_id, claim, "failed" if failed else DONE[claim]],
        )
        return bool(done)

    def pending_count(self, agent: str) -> int:
        return int(self._client.hget(keys.approvals_count(), agent) or 0)

    def pending_total(self) -> int:
        """Intents waiting for a decision, over every agent."""
        return sum(int(v) for v in self._client.hvals(keys.approvals_count()))


def _plausible(approval_id: str) -> bool:
    """Approval ids are the fleet's own (32 hex digits); anything else is not looked up."""
    return isinstance(approval_id, str) and len(approval_id) == 32 and all(c in "0123456789abcdef" for c in approval_id)
