"""Workflow runs in Redis: one record per run, changed only by compare-and-set.

A run is a hash under its owner's tag (``keys.workflow_run``): ``v`` its version, ``doc`` the run
as JSON (the workflow runner's model, workers/workflows/model.py; this module never reads it),
``sent`` the outbound message the broker last confirmed, and ``publishing`` the outbound a
delivery is publishing right now (until when). Every transition is one script: compare the version, write the new document, and file the step intent it is about to send under the run
(``keys.workflow_step``), so a receipt finds its run and the router can check that a delegated step
intent belongs to a run of the agent it is sent for.

Two indexes, tag ``{workflows}``, hold ``<owner>:<run_id>``: every run kept, by start time (for
``reach workflow list``), and the runs the runner's sweep must look at, by when. They are written
beside the run, not in its script (another slot under Redis Cluster): the due index is written in
the transition's own round trip, ahead of its compare-and-set (on a cluster, at the same time on
another node; if that fails the write raises, the message comes again and its redrive sets the look),
so a run is never left out of the sweep, and an entry whose run is gone is dropped when the sweep or a
listing meets it.

Retention: a run's keys expire ``retention`` after its last change (a run still going is kept
until its deadline, then ``retention`` longer), so finished runs cost nothing forever. The index of
every run is trimmed by the runner's sweep (``trim``): an entry older than the retention plus twice
the longest workflow timeout names a run that has expired, bar one an operator resumed late.

Idempotency keys: a start claims (owner, workflow, idempotency key) for its run, with a digest of
its input (``claim_key``), so a start with the same key and a new intent id finds the first run
instead of starting a second one (the runner answers it, workers/workflows/runner.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis

from workers.settings import Settings
from workers.state import keys
from workers.state.client import eval_into, is_cluster

log = logging.getLogger("reach.workflow_runs")

# KEYS[1] the run, KEYS[2] (optional) a step intent's index entry;
# ARGV: expected version, new version, the document, time to live (ms), the run id
_WRITE = """
local v = redis.call('HGET', KEYS[1], 'v')
if (v or '0') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'v', ARGV[2], 'doc', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
if #KEYS > 1 then redis.call('SET', KEYS[2], ARGV[5], 'PX', ARGV[4]) end
return 1
"""
# KEYS[1] the run; ARGV: what was confirmed (never creates a run that expired meanwhile)
_MARK = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], 'sent', ARGV[1])
return 1
"""
# KEYS[1] the run; ARGV: the outbound's marker, now (ms), how long the claim holds (ms)
_CLAIM = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local held = redis.call('HGET', KEYS[1], 'publishing')
if held then
  local sep = string.find(held, '|', 1, true)
  if string.sub(held, sep + 1) == ARGV[1] and tonumber(string.sub(held, 1, sep - 1)) > tonumber(ARGV[2]) then
    return 0
  end
end
redis.call('HSET', KEYS[1], 'publishing', tostring(tonumber(ARGV[2]) + tonumber(ARGV[3])) .. '|' .. ARGV[1])
return 1
"""
# KEYS[1] the key's claim; ARGV: the run id and input digest ("<digest>|<run id>"), time to live (ms).
# Returns the claim that holds: ours, or the one made first
_CLAIM_KEY = """
local held = redis.call('GET', KEYS[1])
if held then return held end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return ARGV[1]
"""
LISTING_SCAN = 1000  # index entries looked at per page of a listing
TRIM_BATCH = 1000  # index entries the sweep removes at most per look
DEFAULT_KEY_TTL_SECONDS: int = Settings.model_fields["idempotency_ttl_seconds"].default


@dataclass(frozen=True)
class Stored:
    """A run as read: its version, its document, and the outbound message last confirmed."""

    version: int
    doc: bytes
    sent: str | None


@dataclass(frozen=True)
class KeyClaim:
    """The run an idempotency key belongs to, and the digest of the input it was started with."""

    run_id: str
    digest: str


def member(owner: str, run_id: str) -> str:
    return f"{owner}:{run_id}"


def split_member(value: bytes | str) -> tuple[str, str]:
    text = value.decode() if isinstance(value, bytes) else value
    owner, _, run_id = text.partition(":")
    return owner, run_id


class WorkflowRuns:
    """The runs of the fleet's workflows, kept ``retention_seconds`` after their last change."""

    def __init__(
        self, client: redis.Redis, retention_seconds: int, key_ttl_seconds: int = DEFAULT_KEY_TTL_SECONDS
    ) -> None:
        """``key_ttl_seconds``: how long a start's idempotency key is kept past the run's longest
        life (REACH_IDEMPOTENCY_TTL)."""
        self.client = client
        self.retention_ms = retention_seconds * 1000
        self.key_ttl_ms = key_ttl_seconds * 1000
        self._claim = client.register_script(_CLAIM)
        self._claim_key = client.register_script(_CLAIM_KEY)

    def load(self, owner: str, run_id: str) -> Stored | None:
        version, doc, sent = self.client.hmget(keys.workflow_run(owner, run_id), "v", "doc", "sent")
        if version is None or doc is None:
            return None
        return Stored(int(version), doc, sent.decode() if sent is not None else None)

    def write(
        self,
        owner: str,
        run_id: str,
        expected: int,
        doc: bytes,
        *,
        keep_until: float | None,
        step_intent: str | None = None,
        look: float | None = None,
        started_at: float | None = None,
    ) -> bool:
        """Compare-and-set: ``doc`` becomes version ``expected + 1`` if the run is still at
        ``expected`` (0: it must not exist yet). ``keep_until`` (epoch seconds): the run is still
        going and is kept until then, plus the retention; None: it is kept for the retention.
        ``step_intent``: the id of the step or undo intent this transition is about to send.

        In the same round trip, ahead of the compare-and-set: ``look``, when the sweep must look at the
        run at the latest (an earlier look already set stays), so a run is never out of its sight;
        ``started_at``, the run's entry in the index of every run (a new run)."""
        ttl_ms = self.retention_ms
        if keep_until is not None:
            ttl_ms += max(0, int((keep_until - time.time()) * 1000))
        names = [keys.workflow_run(owner, run_id)]
        if step_intent is not None:
            names.append(keys.workflow_step(owner, step_intent))
        pipe = self.client.pipeline(transaction=False)
        if started_at is not None:
            pipe.zadd(keys.workflow_runs(), {member(owner, run_id): started_at}, nx=True)
        if look is not None:
            pipe.zadd(keys.workflow_due(), {member(owner, run_id): look}, lt=True)
        eval_into(pipe, _WRITE, names, str(expected), str(expected + 1), doc, ttl_ms, run_id)
        return bool(pipe.execute()[-1])

    def claim_publish(self, owner: str, run_id: str, outbound: str, seconds: float) -> bool:
        """Whether this caller may publish ``outbound`` now: no one else claimed it within the last
        ``seconds`` (two deliveries of one message, handled at once, publish it once; a claimer
        that dies before marking it sent leaves it to the sweep once the claim has run out)."""
        now_ms = int(time.time() * 1000)
        return bool(self._claim(keys=[keys.workflow_run(owner, run_id)], args=[outbound, now_ms, int(seconds * 1000)]))

    def mark_sent(
        self,
        owner: str,
        run_id: str,
        outbound: str,
        version: int,
        when: float | None,
        also: Callable[[Any], None] | None = None,
    ) -> None:
        """The broker confirmed ``outbound`` (a marker the runner builds): a redelivery need not send
        it again; and the sweep looks next at ``when``, as ``reschedule`` sets it, in one round trip
        (with ``also``'s commands: the run's trace lines)."""
        run = keys.workflow_run(owner, run_id)
        pipe = self.client.pipeline(transaction=False)
        eval_into(pipe, _MARK, [run], outbound)
        self._look_into(pipe, owner, run_id, when)
        # the version read after the look has landed: a cluster's pipeline runs each node's share
        # at once, so there it is a round trip of its own
        ordered = not is_cluster(self.client)
        if ordered:
            pipe.hget(run, "v")
        if also is not None:
            also(pipe)  # best effort (a trace): its errors are logged, not raised
        replies = pipe.execute(raise_on_error=False)
        for reply in replies[: 3 if ordered else 2]:
            if isinstance(reply, Exception):
                raise reply
        for reply in replies[3 if ordered else 2 :]:
            if isinstance(reply, Exception):
                log.warning("run %s of %s: its trace lines were not kept: %s", run_id, owner, reply)
        current = replies[2] if ordered else self.client.hget(run, "v")
        if current is not None and int(current) != version:
            self.client.zadd(keys.workflow_due(), {member(owner, run_id): time.time()})

    def run_of(self, owner: str, intent_id: str) -> str | None:
        """The run a step or undo intent of ``owner`` belongs to."""
        found = self.client.get(keys.workflow_step(owner, intent_id))
        return found.decode() if found is not None else None

    def vouches(self, owner: str, run_id: str, intent_id: str) -> bool:
        """Whether ``intent_id`` is a step the runner filed under ``owner``'s run ``run_id`` (what
        the router checks before it accepts a delegated step intent)."""
        return self.run_of(owner, intent_id) == run_id

    def claim_key(self, owner: str, workflow: str, key: str, run_id: str, digest: str, longest_life: float) -> KeyClaim:
        """Claim ``owner``'s idempotency ``key`` of ``workflow`` for the run ``run_id`` (started with
        input of ``digest``), or find the claim made first. Kept the key TTL after the run's
        ``longest_life`` (seconds from now), but never longer than the retention, so a claim never
        outlives the run it names (a run is kept at least the retention after it was written)."""
        ttl_ms = min(self.key_ttl_ms + int(longest_life * 1000), self.retention_ms)
        held = self._claim_key(
            keys=[keys.workflow_key(owner, workflow, key)], args=[f"{digest}|{run_id}", max(1, ttl_ms)]
        )
        text = held.decode() if isinstance(held, bytes) else str(held)
        found_digest, _, found_run = text.partition("|")
        return KeyClaim(found_run, found_digest)

    # -- the indexes ----------------------------------------------------------------------------

    def remember(self, owner: str, run_id: str, started_at: float) -> None:
        self.client.zadd(keys.workflow_runs(), {member(owner, run_id): started_at}, nx=True)

    def look_at(self, owner: str, run_id: str, when: float | None) -> None:
        """The sweep looks at the run at ``when`` (epoch seconds); None: never again."""
        pipe = self.client.pipeline(transaction=False)
        self._look_into(pipe, owner, run_id, when)
        pipe.execute()

    @staticmethod
    def _look_into(pipe: Any, owner: str, run_id: str, when: float | None) -> None:
        if when is None:
            pipe.zrem(keys.workflow_due(), member(owner, run_id))
        else:
            pipe.zadd(keys.workflow_due(), {member(owner, run_id): when})

    def reschedule(self, owner: str, run_id: str, version: int, when: float | None) -> None:
        """Set when the sweep looks next (None: never) as worked out from version ``version``; if the
        run moved on meanwhile (an operator's resume, another writer), that schedule may be stale,
        so the sweep looks at once instead and works the schedule out again."""
        self.look_at(owner, run_id, when)
        current = self.client.hget(keys.workflow_run(owner, run_id), "v")
        if current is not None and int(current) != version:
            self.client.zadd(keys.workflow_due(), {member(owner, run_id): time.time()})

    def watched(self) -> int:
        """How many runs the sweep watches (the due index's size)."""
        return int(self.client.zcard(keys.workflow_due()))

    def due(self, now: float, limit: int = 100) -> list[tuple[str, str]]:
        found = self.client.zrangebyscore(keys.workflow_due(), "-inf", now, start=0, num=limit)
        return [split_member(m) for m in found]

    def listing(self, limit: int = 100) -> list[tuple[str, str]]:
        """The newest runs kept, newest first; index entries of expired runs are dropped on the way."""
        out: list[tuple[str, str]] = []
        start = 0
        while len(out) < limit:
            page = self.client.zrevrange(keys.workflow_runs(), start, start + LISTING_SCAN - 1)
            if not page:
                break
            start += len(page)
            pairs = [split_member(m) for m in page]
            pipe = self.client.pipeline(transaction=False)
            for owner, run_id in pairs:
                pipe.exists(keys.workflow_run(owner, run_id))
            gone = []
            for (owner, run_id), exists in zip(pairs, pipe.execute(), strict=True):
                if exists:
                    out.append((owner, run_id))
                else:
                    gone.append(member(owner, run_id))
            if gone:
                self.client.zrem(keys.workflow_runs(), *gone)
                start -= len(gone)
        return out[:limit]

    def trim(self, older_than: float, limit: int = TRIM_BATCH) -> int:
        """Drop at most ``limit`` entries of the index of every run started before ``older_than``
        (epoch seconds): their runs have expired. Returns how many were dropped."""
        old = self.client.zrangebyscore(keys.workflow_runs(), "-inf", f"({older_than}", start=0, num=limit)
        if not old:
            return 0
        return int(self.client.zrem(keys.workflow_runs(), *old))

    def owners_of(self, run_id: str) -> list[str]:
        """The agents with a kept run of this id (run ids are the agents' intent ids: two agents may
        share one)."""
        found = []
        for value, _ in self.client.zscan_iter(keys.workflow_runs(), match=f"*:{run_id}", count=1000):
            owner, rid = split_member(value)
            if rid == run_id:
                found.append(owner)
        return sorted(set(found))
