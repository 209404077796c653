"""The idempotency ledger: one record per (agent, connector, action, idempotency key) in Redis.

A record is *in progress* (with its owner, the id of the worker process that holds it — that
process keeps a heartbeat key alive while it runs — and the id of the attempt, one delivery's
run) or *completed* (with the receipt it produced and a hash of the params). Claiming is one Lua
script, so two deliveries can never both execute:

    claim ->  claimed       nobody had it: execute
              completed     answer the stored outcome (deduplicated), never call again
              reused        same key, other params: IDEMPOTENCY_KEY_REUSED
              in_progress   a live worker holds it: wait for its outcome
              orphaned      the holder died mid-call, or gave the attempt up (``abandon``): the
                            outcome is unknown unless repeating is safe
              abandoned     this very attempt was given up before its claim ran (late): no claim
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, cast

import redis

from workers.state import keys
from workers.state.client import text

if TYPE_CHECKING:
    from workers.state.batcher import Batcher

log = logging.getLogger("reach.idempotency")

ClaimState = Literal["claimed", "completed", "reused", "in_progress", "orphaned", "abandoned"]

# Every key a script touches comes in KEYS. A record held by another worker is judged by that
# worker's heartbeat key, which only the record names: the first script answers 'holder' with the
# owner, and the caller asks again with the owner's heartbeat key (``_JUDGE``). That second trip
# happens only for a record someone else holds (a redelivery or a concurrent duplicate).
#
# The claim, shared by the scripts below: `rec_key` the record, `gone_key` this attempt's
# given-up mark, `alive_key` the heartbeat of `known_owner` (or nil), `n` the delivery count;
# ARGV: payload hash, owner, intent id, in-progress ttl ms.
# Returns {state, stored receipt or "", holder intent id or "", n, 1 if the holder was sending,
#          the holder's worker id for 'holder'}
_CLAIM_BODY = """
local rec = redis.call('HMGET', rec_key, 'state', 'hash', 'owner', 'receipt', 'intent', 'sending')
if not rec[1] then
  if redis.call('EXISTS', gone_key) == 1 then return {'abandoned', '', '', n, 0, ''} end
  redis.call('HSET', rec_key, 'state', 'in_progress', 'hash', ARGV[1], 'owner', ARGV[2], 'intent', ARGV[3],
             'attempt', attempt)
  redis.call('PEXPIRE', rec_key, ARGV[4])
  return {'claimed', '', '', n, 0, ''}
end
if rec[2] ~= ARGV[1] then return {'reused', '', rec[5] or '', n, 0, ''} end
if rec[1] == 'completed' then return {'completed', rec[4] or '', rec[5] or '', n, 0, ''} end
if alive_key == nil or rec[3] ~= known_owner then return {'holder', '', rec[5] or '', n, 0, rec[3] or ''} end
if redis.call('EXISTS', alive_key) == 1 then return {'in_progress', '', rec[5] or '', n, 0, ''} end
return {'orphaned', '', rec[5] or '', n, rec[6] and 1 or 0, ''}
"""

# KEYS[1] record, KEYS[2] the attempt's given-up mark; ARGV[5] the attempt
_CLAIM = (
    "local rec_key = KEYS[1]\nlocal gone_key = KEYS[2]\nlocal alive_key = nil\nlocal known_owner = nil\n"
    "local n = 0\nlocal attempt = ARGV[5]\n" + _CLAIM_BODY
)

# the claim again, now knowing who holds the record: KEYS[3] is the heartbeat of ARGV[6]
_JUDGE = (
    "local rec_key = KEYS[1]\nlocal gone_key = KEYS[2]\nlocal alive_key = KEYS[3]\nlocal known_owner = ARGV[6]\n"
    "local n = 0\nlocal attempt = ARGV[5]\n" + _CLAIM_BODY
)

# the pool's first round trip for a job: receipt already sent? count the delivery (poison
# messages), then claim. KEYS: sent marker, delivery counter, record, the attempt's given-up mark,
# optional breaker hash; ARGV[5]: max deliveries, ARGV[6] the attempt. With a breaker key, a claim
# made while that breaker is closed also takes the first attempt's permit (the record is marked
# "sending", as the breaker's acquire does): the 7th value is 1 then. Open and half-open breakers
# are left to the acquire script.
_BEGIN = (
    """
if redis.call('EXISTS', KEYS[1]) == 1 then return {'sent', '', '', 0, 0, '', 0} end
local n = redis.call('INCR', KEYS[2])
redis.call('EXPIRE', KEYS[2], 86400)
if n > tonumber(ARGV[5]) then return {'poison', '', '', n, 0, '', 0} end
local rec_key = KEYS[3]
local gone_key = KEYS[4]
local alive_key = nil
local known_owner = nil
local attempt = ARGV[6]
local function claim()
"""
    + _CLAIM_BODY
    + """
end
local out = claim()
out[7] = 0
if out[1] == 'claimed' and KEYS[5] and (redis.call('HGET', KEYS[5], 'state') or 'closed') == 'closed' then
  redis.call('HSET', rec_key, 'sending', '1')
  out[7] = 1
end
return out
"""
)

# take over an orphaned record (only when repeating the call is safe); KEYS[1] record, KEYS[2] the
# attempt's given-up mark; ARGV: old owner, new owner, intent, attempt
_TAKE_OVER = """
local owner = redis.call('HGET', KEYS[1], 'owner')
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
if owner == ARGV[1] and redis.call('HGET', KEYS[1], 'state') == 'in_progress' then
  redis.call('HSET', KEYS[1], 'owner', ARGV[2], 'intent', ARGV[3], 'attempt', ARGV[4])
  return 1
end
return 0
"""


# an attempt that could not keep its outcome (Redis or the broker failed after the call) gives
# its record up, so that the job's next delivery sees it orphaned instead of waiting for an
# attempt that no longer runs (its owner then names no live worker, for workers of any version).
# The attempt is also marked given up for an hour: one of its own commands that Redis runs late
# (its caller stopped waiting for it) can then never claim the record.
# KEYS[1] record, KEYS[2] the attempt's given-up mark; ARGV: owner, attempt
_ABANDON = """
redis.call('SET', KEYS[2], '1', 'EX', 3600)
local rec = redis.call('HMGET', KEYS[1], 'state', 'owner', 'attempt')
if rec[1] == 'in_progress' and rec[2] == ARGV[1] and rec[3] == ARGV[2] then
  redis.call('HSET', KEYS[1], 'owner', 'abandoned:' .. ARGV[1])
  return 1
end
return 0
"""
ABANDON_RETRY_SECONDS = 600.0


def params_hash(params: Any) -> str:
    """SHA-256 (hex) of the params' canonical JSON: the ledger tells a reused idempotency key by
    it, and the audit trail shows a prefix of it for the redacted params (the one hashing of params)."""
    canonical = json.dumps(params, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


@dataclass(frozen=True)
class Claim:
    state: ClaimState
    receipt_json: str = ""
    holder_intent: str = ""


BeginState = Literal["sent", "poison", "claimed", "completed", "reused", "in_progress", "orphaned", "abandoned"]


@dataclass(frozen=True)
class Begin:
    """The outcome of ``Ledger.begin``: ``sent`` and ``poison`` come before any claim."""

    state: BeginState
    receipt_json: str
    holder_intent: str
    deliveries: int
    was_sending: bool
    permit: bool = False  # the first attempt may call: the breaker was closed and "sending" is marked


class Heartbeat:
    """Proves this worker process is alive: ``keys.alive(<id>)`` exists while it runs.

    A record held by an id whose heartbeat expired belongs to a dead worker (kill -9 included).
    """

    def __init__(self, client: redis.Redis, ttl_seconds: float = 3.0) -> None:
        self.worker_id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._client = client
        self._ttl_ms = int(ttl_seconds * 1000)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="reach-heartbeat", daemon=True)

    def start(self) -> Heartbeat:
        self._beat()
        self._thread.start()
        return self

    def _beat(self) -> None:
        self._client.set(keys.alive(self.worker_id), "1", px=self._ttl_ms)

    def _run(self) -> None:
        while not self._stop.wait(self._ttl_ms / 3000):
            try:
                self._beat()
            except redis.RedisError:
                pass  # the next beat retries; records stay ours while the key lives

    def stop(self) -> None:
        self._stop.set()
        try:
            self._client.delete(keys.alive(self.worker_id))
        except redis.RedisError:
            pass


class Ledger:
    def __init__(self, client: redis.Redis, heartbeat: Heartbeat, ttl_seconds: int) -> None:
        self._client = client
        self._heartbeat = heartbeat
        self._ttl_ms = ttl_seconds * 1000
        self._claim = client.register_script(_CLAIM)
        self._judge_script = client.register_script(_JUDGE)
        self._begin = client.register_script(_BEGIN)
        self._take_over = client.register_script(_TAKE_OVER)
        self._abandon = client.register_script(_ABANDON)
        self._to_abandon: list[tuple[str, str, float]] = []  # (record, attempt, give up at) while Redis is away
        self._retry_lock = threading.Lock()
        self._retrier: threading.Thread | None = None

    def claim(self, key: str, params_hash: str, intent_id: str, attempt: str) -> Claim:
        args = [params_hash, self._heartbeat.worker_id, intent_id, self._ttl_ms, attempt]
        state, receipt, holder, _, _, owner = self._claim(keys=[key, keys.abandoned(attempt)], args=args)
        if text(state) == "holder":
            state, receipt, holder, _ = self._judge(key, args, text(owner))
        return Claim(text(state), text(receipt), text(holder))  # type: ignore[arg-type]

    def _judge(self, key: str, args: list[Any], owner: str) -> tuple[Any, Any, Any, Any]:
        """A record someone holds: in progress while its owner's heartbeat lives, else orphaned.
        Asked again if the record changed hands in between (bounded: each round saw a new owner)."""
        for _ in range(5):
            state, receipt, holder, _, sending, owner_now = self._judge_script(
                keys=[key, keys.abandoned(str(args[4])), keys.alive(owner)], args=[*args, owner]
            )
            if text(state) != "holder":
                return state, receipt, holder, sending
            owner = text(owner_now)
        return "in_progress", "", "", 0  # a record changing hands this fast is held by someone

    def begin(
        self,
        sent_key: str,
        deliveries_key: str,
        key: str,
        params_hash: str,
        intent_id: str,
        attempt: str,
        max_deliveries: int,
        breaker_key: str | None = None,
        batcher: Batcher | None = None,
    ) -> Begin:
        """One round trip (of its own, or in the ``batcher``'s next one): the sent check, the
        delivery count, the claim and, with ``breaker_key``, the first attempt's permit while that
        breaker is closed."""
        names = [sent_key, deliveries_key, key, keys.abandoned(attempt)] + ([breaker_key] if breaker_key else [])
        args = [params_hash, self._heartbeat.worker_id, intent_id, self._ttl_ms, max_deliveries, attempt]
        if batcher is not None:
            # EVAL in a pipeline: a Script object would add a SCRIPT EXISTS round trip per batch
            result = batcher.call(lambda pipe: pipe.eval(_BEGIN, len(names), *names, *args))[0]
        else:
            result = self._begin(keys=names, args=args)
        state, receipt, holder, deliveries, sending, owner, permit = result
        if text(state) == "holder":
            claim_args = [params_hash, self._heartbeat.worker_id, intent_id, self._ttl_ms, attempt]
            state, receipt, holder, sending = self._judge(key, claim_args, text(owner))
        return Begin(
            cast(BeginState, text(state)),
            text(receipt),
            text(holder),
            int(deliveries),
            bool(int(sending)),
            bool(int(permit)),
        )

    def complete_into(self, pipe: Any, key: str, receipt_json: str) -> None:
        pipe.hset(key, mapping={"state": "completed", "receipt": receipt_json})
        pipe.pexpire(key, self._ttl_ms)

    def take_over(self, key: str, intent_id: str, attempt: str) -> bool:
        """Claim an orphaned record for this worker's ``attempt`` (only used when repeating is safe)."""
        owner = self._client.hget(key, "owner")
        if owner is None:
            return False
        return bool(
            self._take_over(
                keys=[key, keys.abandoned(attempt)], args=[owner, self._heartbeat.worker_id, intent_id, attempt]
            )
        )

    def abandon(self, key: str, attempt: str) -> None:
        """Give up the record ``attempt`` holds (if it still does): its outcome was not kept, and
        the job goes back to the queue. Its next delivery then finds the record orphaned — and
        answers OUTCOME_UNKNOWN, or runs again where that is safe — instead of waiting for an
        attempt that no longer runs and acking the job unanswered. Redis is what just failed, so
        this keeps trying on a thread of its own until it succeeds (for ``ABANDON_RETRY_SECONDS``)."""
        try:
            self._abandon(keys=[key, keys.abandoned(attempt)], args=[self._heartbeat.worker_id, attempt])
        except redis.RedisError:
            with self._retry_lock:
                self._to_abandon.append((key, attempt, time.monotonic() + ABANDON_RETRY_SECONDS))
                if self._retrier is None or not self._retrier.is_alive():
                    self._retrier = threading.Thread(target=self._abandon_later, name="reach-abandon", daemon=True)
                    self._retrier.start()

    def _abandon_later(self) -> None:
        """One thread retries every record still to give up, until all are done or past their time."""
        while True:
            time.sleep(0.5)
            with self._retry_lock:
                pending, self._to_abandon = self._to_abandon, []
                if not pending:
                    self._retrier = None
                    return
            for key, attempt, give_up in pending:
                try:
                    self._abandon(keys=[key, keys.abandoned(attempt)], args=[self._heartbeat.worker_id, attempt])
                except redis.RedisError:
                    if time.monotonic() < give_up:
                        with self._retry_lock:
                            self._to_abandon.append((key, attempt, give_up))
                    else:
                        log.error(
                            "could not give up the idempotency record %s for %.0f s; a redelivery of its job "
                            "waits for it and is acked without a receipt",
                            key,
                            ABANDON_RETRY_SECONDS,
                        )

    def mark_sending(self, key: str) -> None:
        """Noted right before each attempt: an orphaned record without it never reached the system."""
        self._client.hset(key, "sending", "1")

    def was_sending(self, key: str) -> bool:
        return self._client.hget(key, "sending") is not None

    def complete(self, key: str, receipt_json: str) -> None:
        """Keep the outcome: every later intent with this key gets it instead of a new call."""
        pipe = self._client.pipeline(transaction=True)
        pipe.hset(key, mapping={"state": "completed", "receipt": receipt_json})
        pipe.pexpire(key, self._ttl_ms)
        pipe.execute()

    def release(self, key: str) -> None:
        """Forget the attempt (nothing took effect, or repeating is safe): a re-send executes again."""
        self._client.delete(key)

    def wait_completed(self, key: str, timeout: float, interval: float = 0.1) -> Claim | None:
        """Poll until the record is completed or gone; None on timeout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state, receipt = self._client.hmget(key, "state", "receipt")
            if state is None:
                return Claim("claimed")  # released: the caller may claim again
            if text(state) == "completed":
                return Claim("completed", text(receipt))
            time.sleep(interval)
        return None
