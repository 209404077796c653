"""A circuit breaker per connector, shared by every router and pool process through Redis.

The states and their meaning are pybreaker's (closed / open / half-open, ``fail_max``,
``reset_timeout``). pybreaker's own ``CircuitBreaker.call`` cannot be used here: it holds a
process-wide lock for the whole call (a threads pool would make one call at a time) and its
transitions span several storage operations, so processes race (INCR then GET, every process
probing when half-open). Here every transition is one Lua script, and half-open lets at most
``trials`` calls through at a time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pybreaker
import redis

from connectors.spec import BreakerSpec
from workers.state import keys
from workers.state.client import eval_into, replica_wait, text
from workers.state.replicas import execute_durably

OPEN, CLOSED, HALF_OPEN = pybreaker.STATE_OPEN, pybreaker.STATE_CLOSED, pybreaker.STATE_HALF_OPEN

_NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

# KEYS[1] breaker hash; ARGV: reset_timeout ms, max trials, trial lease ms.
# Returns {allowed, state, retry_after_ms, is_trial}
_ACQUIRE = (
    _NOW
    + """
local state = redis.call('HGET', KEYS[1], 'state') or 'closed'
if state == 'closed' then return {1, state, 0, 0} end
local reset = tonumber(ARGV[1])
if state == 'open' then
  local opened = tonumber(redis.call('HGET', KEYS[1], 'opened_at') or '0')
  if now < opened + reset then return {0, state, opened + reset - now, 0} end
  redis.call('HSET', KEYS[1], 'state', 'half-open', 'trials', 1, 'trial_until', now + tonumber(ARGV[3]))
  return {1, 'half-open', 0, 1}
end
-- half-open: a bounded number of trial calls; a trial whose lease ran out (its worker died) frees its slot
local trials = tonumber(redis.call('HGET', KEYS[1], 'trials') or '0')
local until_ = tonumber(redis.call('HGET', KEYS[1], 'trial_until') or '0')
if now > until_ then trials = 0 end
if trials < tonumber(ARGV[2]) then
  redis.call('HSET', KEYS[1], 'trials', trials + 1, 'trial_until', now + tonumber(ARGV[3]))
  return {1, state, 0, 1}
end
return {0, state, 1000, 0}
"""
)

# KEYS[1]; ARGV: 'success' | 'failure', fail_max; returns the new state
_RECORD = (
    _NOW
    + """
local state = redis.call('HGET', KEYS[1], 'state') or 'closed'
if ARGV[1] == 'success' then
  if state ~= 'open' then
    redis.call('HSET', KEYS[1], 'state', 'closed', 'failures', 0, 'trials', 0)
    return 'closed'
  end
  return state
end
if state == 'half-open' then
  redis.call('HSET', KEYS[1], 'state', 'open', 'opened_at', now, 'trials', 0)
  return 'open'
end
if state == 'closed' then
  local failures = redis.call('HINCRBY', KEYS[1], 'failures', 1)
  if failures >= tonumber(ARGV[2]) then
    redis.call('HSET', KEYS[1], 'state', 'open', 'opened_at', now, 'failures', 0)
    return 'open'
  end
end
return state
"""
)

# KEYS[1] breaker, KEYS[2] health flag; ARGV: reset ms -> {state, retry_after_ms, health}
# without changing anything: the router's one round trip before dispatch
_PEEK = (
    _NOW
    + """
local health = redis.call('GET', KEYS[2]) or 'unknown'
local state = redis.call('HGET', KEYS[1], 'state') or 'closed'
if state ~= 'open' then return {state, 0, health} end
local opened = tonumber(redis.call('HGET', KEYS[1], 'opened_at') or '0')
local left = opened + tonumber(ARGV[1]) - now
if left < 0 then left = 0 end
return {state, left, health}
"""
)


def permit_from(result: Any) -> Permit:
    allowed, state, retry_after, trial = result
    return Permit(bool(allowed), text(state), int(retry_after), bool(trial))


@dataclass(frozen=True)
class Permit:
    allowed: bool
    state: str
    retry_after_ms: int = 0
    trial: bool = False


class SharedBreaker:
    """One connector's breaker. Only transient failures (unreachable, timeouts, 5xx) are recorded."""

    def __init__(
        self, client: redis.Redis, connector: str, spec: BreakerSpec, trials: int = 1, trial_lease_seconds: float = 30.0
    ) -> None:
        self.connector = connector
        self.key = keys.breaker(connector)
        self._client = client
        self._spec = spec
        self._trials = trials
        self._lease_ms = int(trial_lease_seconds * 1000)

    @property
    def reset_ms(self) -> int:
        return int(self._spec.reset_timeout * 1000)

    def acquire(self, mark_sending: str | None = None, pipe: Any = None) -> Permit:
        """A permit for one call, asked after whatever ``pipe`` holds (this breaker's last
        outcome) in the same round trip. When allowed, ``mark_sending`` (a ledger record, which
        lives on its agent's node, not the connector's) is then marked "sending", durably, before
        the call: a refused permit never marks it."""
        if pipe is None:
            pipe = self._client.pipeline(transaction=False)
        eval_into(pipe, _ACQUIRE, [self.key], self.reset_ms, self._trials, self._lease_ms)
        permit = permit_from(pipe.execute()[-1])
        if permit.allowed and mark_sending:
            execute_durably(
                self._client, replica_wait(self._client), [mark_sending], lambda p: p.hset(mark_sending, "sending", "1")
            )
        return permit

    def record_into(self, pipe: Any, kind: str) -> None:
        """Queue an outcome, ``success`` or ``failure``, on a pipeline (its result: the new state)."""
        eval_into(pipe, _RECORD, [self.key], kind, self._spec.fail_max)

    def peek_into(self, pipe: redis.client.Pipeline) -> None:
        """Queue the peek on a pipeline (its result: [state, retry_after_ms, health])."""
        eval_into(pipe, _PEEK, [self.key, keys.health(self.connector)], self.reset_ms)


def breaker_state(client: redis.Redis, connector: str) -> str:
    """The breaker's state as stored (closed | open | half-open), for ``reach status``. An open
    breaker whose reset timeout has passed still says open until a call asks for a trial."""
    return text(client.hget(keys.breaker(connector), "state")) or CLOSED


class AlwaysAvailable:
    """For tools and tests that route without Redis."""

    def refusal(self, connector: str) -> tuple[str, int] | None:
        return None
