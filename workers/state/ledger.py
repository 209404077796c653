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

from workers.ids import hex_id
from workers.state import keys
from workers.state.breaker import CLOSED
from workers.state.client import eval_into, replica_wait, text
from workers.state.replicas import execute_durably

if TYPE_CHECKING:
    from workers.state.batcher import Batcher

log = logging.getLogger("reach.idempotency")

ClaimState = Literal["claimed", "completed", "reused", "in_progress", "orphaned", "abandoned"]

# Every key a script touches comes in KEYS, and every key one script is given carries the record's
# hash tag (the agent's: workers/state/keys.py), so each script runs on one Redis Cluster node.
# A record held by another worker is judged by that worker's heartbeat key, which lives elsewhere:
# the script answers 'holder' with the owner, and the caller reads the owner's heartbeat beside the
# record's script again, in one round trip of two commands (``Ledger._judge``). That second trip
# happens only for a record someone else holds (a redelivery or a concurrent duplicate).
#
# The claim, shared by the scripts below: `rec_key` the record, `gone_key` this attempt's given-up
# mark, `n` the delivery count, `mark` '1' to mark a fresh claim "sending" (its first call is
# permitted: see Ledger.begin); ARGV: payload hash, owner, intent id, in-progress ttl ms.
# Returns {state, stored receipt or "", holder intent id or "", n, 1 if the record is marked
# sending, the holder's worker id for 'holder'}. `nonce` is new for each claim the caller makes: the
# same claim run twice (redis-py sent the command again after its answer was lost, as in a
# failover) finds its own nonce and is still claimed, where any other claim sees a holder.
_CLAIM_BODY = """
local rec = redis.call('HMGET', rec_key, 'state', 'hash', 'owner', 'receipt', 'intent', 'sending', 'nonce')
if not rec[1] then
  if redis.call('EXISTS', gone_key) == 1 then return {'abandoned', '', '', n, 0, ''} end
  redis.call('HSET', rec_key, 'state', 'in_progress', 'hash', ARGV[1], 'owner', ARGV[2], 'intent', ARGV[3],
             'attempt', attempt, 'nonce', nonce)
  if mark == '1' then redis.call('HSET', rec_key, 'sending', '1') end
  redis.call('PEXPIRE', rec_key, ARGV[4])
  return {'claimed', '', '', n, 0, ''}
end
if rec[2] ~= ARGV[1] then return {'reused', '', rec[5] or '', n, 0, ''} end
if rec[1] == 'completed' then return {'completed', rec[4] or '', rec[5] or '', n, 0, ''} end
local sending = rec[6] and 1 or 0
if rec[7] == nonce then return {'claimed', '', '', n, sending, ''} end
return {'holder', '', rec[5] or '', n, sending, rec[3] or ''}
"""

# KEYS[1] record, KEYS[2] the attempt's given-up mark; ARGV[5] the attempt, ARGV[6] the nonce
_CLAIM = (
    "local rec_key = KEYS[1]\nlocal gone_key = KEYS[2]\nlocal n = 0\nlocal mark = '0'\n"
    "local attempt = ARGV[5]\nlocal nonce = ARGV[6]\n" + _CLAIM_BODY
)

# the pool's first round trip for a job: receipt already sent? count the delivery (poison
# messages), then claim. KEYS: sent marker, delivery counter, record, the attempt's given-up mark;
# ARGV[5]: max deliveries, ARGV[6] the attempt, ARGV[7] '1' to mark a fresh claim "sending",
# ARGV[8] the nonce.
_BEGIN = (
    """
if redis.call('EXISTS', KEYS[1]) == 1 then return {'sent', '', '', 0, 0, ''} end
local n = redis.call('INCR', KEYS[2])
redis.call('EXPIRE', KEYS[2], 86400)
if n > tonumber(ARGV[5]) then return {'poison', '', '', n, 0, ''} end
local rec_key = KEYS[3]
local gone_key = KEYS[4]
local attempt = ARGV[6]
local mark = ARGV[7]
local nonce = ARGV[8]
"""
    + _CLAIM_BODY
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
    # ... and it counted no failures: the first attempt's success changes nothing there (not recorded)
    clean: bool = False


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
    """The ledger of one pool process. Every write it makes waits for the replicas
    ``workers.state.replicas`` asks for, in the same round trip: a claim, a "sending" mark or an
    outcome that a failover lost could make a redelivery call the system a second time."""

    def __init__(self, client: redis.Redis, heartbeat: Heartbeat, ttl_seconds: int) -> None:
        self._client = client
        self._wait = replica_wait(client)
        self._heartbeat = heartbeat
        self._ttl_ms = ttl_seconds * 1000
        # the state each breaker had when this process last read it: a claim made while it looked
        # closed is marked "sending" in the claim's own script (Ledger.begin)
        self._breaker_closed: dict[str, bool] = {}
        self._to_abandon: list[tuple[str, str, float]] = []  # (record, attempt, give up at) while Redis is away
        self._retry_lock = threading.Lock()
        self._retrier: threading.Thread | None = None

    def _durably(self, key: str, commands: Any) -> list[Any]:
        """``commands`` in one round trip, then the replicas' WAIT for ``key``'s node."""
        return execute_durably(self._client, self._wait, [key], commands)

    def _claim_args(self, params_hash: str, intent_id: str, attempt: str) -> list[Any]:
        """ARGV of ``_CLAIM``, with a new nonce."""
        return [params_hash, self._heartbeat.worker_id, intent_id, self._ttl_ms, attempt, hex_id(16)]

    def claim(self, key: str, params_hash: str, intent_id: str, attempt: str) -> Claim:
        args = self._claim_args(params_hash, intent_id, attempt)
        gone = keys.abandoned(key, attempt)
        (result,) = self._durably(key, lambda pipe: eval_into(pipe, _CLAIM, [key, gone], *args))
        state, receipt, holder, _, sending, owner = result
        if text(state) == "holder":
            state, receipt, holder, sending = self._judge(key, args, text(owner))
        return Claim(text(state), text(receipt), text(holder))  # type: ignore[arg-type]

    def _judge(self, key: str, args: list[Any], owner: str) -> tuple[Any, Any, Any, Any]:
        """A record someone holds: in progress while its owner's heartbeat lives, else orphaned.
        The heartbeat is read beside the claim asked again (two nodes on a cluster, one round
        trip); asked again if the record changed hands in between (bounded: each round saw a new
        owner). A heartbeat read a moment before the record answers as an atomic read would have
        a moment earlier: the owner is the same, and a dead owner's heartbeat does not come back."""
        gone = keys.abandoned(key, str(args[4]))
        for _ in range(5):

            def judged(pipe: Any, owner: str = owner) -> None:
                pipe.exists(keys.alive(owner))
                eval_into(pipe, _CLAIM, [key, gone], *args)

            alive, result = self._durably(key, judged)
            state, receipt, holder, _, sending, owner_now = result
            if text(state) != "holder":
                return state, receipt, holder, sending
            if text(owner_now) == owner:
                return ("in_progress" if alive else "orphaned"), receipt, holder, sending
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
        breaker is closed.

        The breaker lives on its connector's node, not the agent's, so it is read beside the
        script, not in it; a claim made while this process last saw the breaker closed is marked
        "sending" by the script itself (a permit needs no second round trip), and unmarked again
        in the rare case the read finds the breaker no longer closed (the acquire script then
        decides, and marks only what it lets through)."""
        names = [sent_key, deliveries_key, key, keys.abandoned(key, attempt)]
        mark = breaker_key is not None and self._breaker_closed.get(breaker_key, True)
        claim_args = self._claim_args(params_hash, intent_id, attempt)
        args = [*claim_args[:4], max_deliveries, attempt, "1" if mark else "0", claim_args[5]]

        def commands(pipe: Any) -> None:
            eval_into(pipe, _BEGIN, names, *args)
            if breaker_key is not None:
                pipe.hmget(breaker_key, "state", "failures")

        if batcher is not None:
            results = batcher.call(commands, durable=[key])
        else:
            results = self._durably(key, commands)
        state, receipt, holder, deliveries, sending, owner = results[0]
        permit = clean = False
        if breaker_key is not None:
            breaker_state, failures = results[1]
            closed = text(breaker_state) in ("", CLOSED)
            clean = closed and text(failures) in ("", "0")
            self._breaker_closed[breaker_key] = closed
            if mark and text(state) == "claimed":
                permit = closed
                if not closed:
                    self._client.hdel(key, "sending")  # ours: the record was claimed by this script
        if text(state) == "holder":
            state, receipt, holder, sending = self._judge(key, claim_args, text(owner))
        return Begin(
            cast(BeginState, text(state)),
            text(receipt),
            text(holder),
            int(deliveries),
            bool(int(sending)),
            permit,
            permit and clean,
        )

    def complete_into(self, pipe: Any, key: str, receipt_json: str) -> None:
        """Queue the outcome on a batch; the batch's call names ``key`` as durable."""
        pipe.hset(key, mapping={"state": "completed", "receipt": receipt_json})
        pipe.pexpire(key, self._ttl_ms)

    def take_over(self, key: str, intent_id: str, attempt: str) -> bool:
        """Claim an orphaned record for this worker's ``attempt`` (only used when repeating is safe)."""
        owner = self._client.hget(key, "owner")
        if owner is None:
            return False
        args = [owner, self._heartbeat.worker_id, intent_id, attempt]
        gone = keys.abandoned(key, attempt)
        return bool(self._durably(key, lambda pipe: eval_into(pipe, _TAKE_OVER, [key, gone], *args))[0])

    def abandon(self, key: str, attempt: str) -> None:
        """Give up the record ``attempt`` holds (if it still does): its outcome was not kept, and
        the job goes back to the queue. Its next delivery then finds the record orphaned — and
        answers OUTCOME_UNKNOWN, or runs again where that is safe — instead of waiting for an
        attempt that no longer runs and acking the job unanswered. Redis is what just failed, so
        this keeps trying on a thread of its own until it succeeds (for ``ABANDON_RETRY_SECONDS``)."""
        try:
            self._give_up(key, attempt)
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
                    self._give_up(key, attempt)
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

    def _give_up(self, key: str, attempt: str) -> None:
        args = [self._heartbeat.worker_id, attempt]
        gone = keys.abandoned(key, attempt)
        self._durably(key, lambda pipe: eval_into(pipe, _ABANDON, [key, gone], *args))

    def mark_sending(self, key: str) -> None:
        """Noted right before each attempt: an orphaned record without it never reached the system."""
        self._durably(key, lambda pipe: pipe.hset(key, "sending", "1"))

    def was_sending(self, key: str) -> bool:
        return self._client.hget(key, "sending") is not None

    def complete(self, key: str, receipt_json: str) -> None:
        """Keep the outcome: every later intent with this key gets it instead of a new call. (No
        MULTI: the record already expires, and a WAIT inside a transaction would not wait.)"""
        self._durably(key, lambda pipe: self.complete_into(pipe, key, receipt_json))

    def release(self, key: str) -> None:
        """Forget the attempt (nothing took effect, or repeating is safe): a re-send executes again."""
        self._durably(key, lambda pipe: pipe.delete(key))

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
