"""Value budgets: the sum of a param over a sliding window, shared by every router through Redis.

A binding's ``budget: {param: amount, max: 500, per: 1d}`` keeps, per (agent, connector, param,
window), a sorted set of the intents counted (scored by the time they were counted) and a hash of
their amounts with the window's running total. One Lua script forgets what left the window, checks
every budget of the intent and counts it in all of them, or in none: no race between routers, and
the clock is Redis's own.

The amount is counted when the router dispatches the intent (every other check passed) and given
back, once, when its receipt says it did not take effect (``refund_into``, called by the pool), or
when a person denied it (``release_intent``): the refund deletes the intent's entry, so a second
refund for the same intent finds nothing. An
intent counted again under the same id (the router decides it again after a failed publish) is
counted once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import redis

from connectors.catalog import ALL_ACTIONS, Catalog
from connectors.spec import BudgetSpec
from producers.wire import Receipt
from workers.state import keys
from workers.state.client import eval_into, text

__all__ = [
    "BudgetCounter",
    "BudgetIndex",
    "BudgetVerdict",
    "NoBudgets",
    "RedisBudgets",
    "Spend",
    "budget_index",
    "gives_back",
    "refund_into",
    "release_intent",
]

# In the scripts: '#total' is the hash field of the running total ('#' is in no intent id); at most
# 1000 entries that left the window are forgotten per call (the rest on the next calls, counted
# meanwhile: never too little); at most the 1000 oldest are walked to say when enough frees; the
# keys outlive their newest entry by a minute.
# KEYS: per budget i, KEYS[2i-1] the counted intents (zset), KEYS[2i] their amounts (hash); last,
# the intent's record of where it was counted
# ARGV[1] intent id, ARGV[2] "1" to count without checking (parked past its budget), then per budget:
# ARGV[3i] window (ms), ARGV[3i+1] max, ARGV[3i+2] amount (text, > 0)
# returns {1, 0, 0, ""} counted (or counted before), {0, i, retry_after_ms, used} over budget i
_RESERVE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local id = ARGV[1]
local n = (#KEYS - 1) / 2
local held = KEYS[#KEYS]
for i = 1, n do
  local times = KEYS[2 * i - 1]
  local amounts = KEYS[2 * i]
  local gone = redis.call('ZRANGEBYSCORE', times, '-inf', now - tonumber(ARGV[3 * i]), 'LIMIT', 0, 1000)
  for _, member in ipairs(gone) do
    local amount = redis.call('HGET', amounts, member)
    if amount then
      redis.call('HINCRBYFLOAT', amounts, '#total', '-' .. amount)
      redis.call('HDEL', amounts, member)
    end
    redis.call('ZREM', times, member)
  end
  -- an empty window starts from zero again: no float drift survives it
  if redis.call('ZCARD', times) == 0 then redis.call('HDEL', amounts, '#total') end
end
local first = KEYS[2]
if redis.call('HEXISTS', first, id) == 1 then return {1, 0, 0, ''} end
if ARGV[2] ~= '1' then
  local worst, worst_wait, worst_used = 0, -1, '0'
  for i = 1, n do
    local times = KEYS[2 * i - 1]
    local amounts = KEYS[2 * i]
    local per = tonumber(ARGV[3 * i])
    local max = tonumber(ARGV[3 * i + 1])
    local used_text = redis.call('HGET', amounts, '#total') or '0'
    local used = math.max(0, tonumber(used_text))
    -- a relative 1e-12 of slack: decimal amounts summed as binary floats
    if used + tonumber(ARGV[3 * i + 2]) > max * (1 + 1e-12) then
      local need = used + tonumber(ARGV[3 * i + 2]) - max
      local freed, wait = 0, per
      local oldest = redis.call('ZRANGE', times, 0, 999, 'WITHSCORES')
      for j = 1, #oldest, 2 do
        freed = freed + tonumber(redis.call('HGET', amounts, oldest[j]) or '0')
        wait = tonumber(oldest[j + 1]) + per - now
        if freed >= need then break end
      end
      if wait < 1 then wait = 1 end
      if wait > worst_wait then worst, worst_wait, worst_used = i, wait, used_text end
    end
  end
  if worst > 0 then return {0, worst, worst_wait, worst_used} end
end
local longest = 0
local names = {}
for i = 1, n do
  local times = KEYS[2 * i - 1]
  local amounts = KEYS[2 * i]
  local keep = tonumber(ARGV[3 * i]) + 60000
  redis.call('ZADD', times, now, id)
  redis.call('HSET', amounts, id, ARGV[3 * i + 2])
  redis.call('HINCRBYFLOAT', amounts, '#total', ARGV[3 * i + 2])
  redis.call('PEXPIRE', times, keep)
  redis.call('PEXPIRE', amounts, keep)
  names[#names + 1] = times
  names[#names + 1] = amounts
  if keep > longest then longest = keep end
end
-- where the intent was counted, so that what holds only its id can give it back (release_intent)
redis.call('SET', held, table.concat(names, ' '), 'PX', longest)
return {1, 0, 0, ''}
"""

# KEYS as _RESERVE; ARGV[1] intent id. Returns 1 if an amount was given back, 0 if none was held
# (given back before, never counted, or already out of the window)
_REFUND = """
local id = ARGV[1]
local gave = 0
local held = KEYS[#KEYS]
redis.call('DEL', held)
for i = 1, (#KEYS - 1) / 2 do
  local times = KEYS[2 * i - 1]
  local amounts = KEYS[2 * i]
  local amount = redis.call('HGET', amounts, id)
  if amount then
    redis.call('HDEL', amounts, id)
    redis.call('ZREM', times, id)
    redis.call('HINCRBYFLOAT', amounts, '#total', '-' .. amount)
    gave = 1
  end
end
return gave
"""


@dataclass(frozen=True)
class Spend:
    """What one intent asks of one budget."""

    budget: BudgetSpec
    amount: int | float


@dataclass(frozen=True)
class BudgetVerdict:
    allowed: bool
    budget: BudgetSpec | None = None  # the budget exceeded (the one that frees last)
    retry_after_ms: int = 0
    used: float = 0.0  # what that budget's window holds now


class BudgetCounter(Protocol):
    def reserve(
        self, agent: str, connector: str, intent_id: str, spends: Sequence[Spend], *, force: bool = False
    ) -> BudgetVerdict: ...

    def refund(self, agent: str, connector: str, intent_id: str, budgets: Sequence[BudgetSpec]) -> bool: ...


BudgetIndex = dict[tuple[str, str, str], tuple[BudgetSpec, ...]]


def budget_index(catalog: Catalog) -> BudgetIndex:
    """(agent, connector, action) -> the budgets that count it: only the bound actions that declare
    the budget's param. Built once, so an intent without a budget costs the router one dict lookup."""
    index: BudgetIndex = {}
    for agent, bindings in catalog.grants.items():
        for name, binding in bindings.items():
            connector = catalog.connectors.get(name)
            if not binding.budget or connector is None:
                continue
            for action in connector.actions:
                if ALL_ACTIONS in binding.allowed_actions or action.action in binding.allowed_actions:
                    counted = tuple(b for b in binding.budget if b.param in action.input)
                    if counted:
                        index[(agent, name, action.action)] = counted
    return index


def gives_back(receipt: Receipt) -> bool:
    """Whether a dispatched intent's receipt returns its amount: it did not take effect. Rejected
    (the pool answered before calling), failed after calling, or a replayed earlier outcome. Kept:
    succeeded, unknown (it may have happened), and a failure without a call by this delivery (a
    poison job: earlier deliveries may have called the system)."""
    if receipt.execution.deduplicated or receipt.status == "rejected":
        return True
    return receipt.status == "failed" and receipt.execution.attempts > 0


def _amount_text(amount: int | float) -> str:
    return str(amount) if isinstance(amount, int) else repr(float(amount))


def _keys(agent: str, connector: str, intent_id: str, budgets: Sequence[BudgetSpec]) -> list[str]:
    pairs = [key for b in budgets for key in keys.budget(agent, connector, b.param, b.per_ms)]
    return [*pairs, keys.budget_held(agent, intent_id)]


def refund_into(pipe: Any, agent: str, connector: str, intent_id: str, budgets: Sequence[BudgetSpec]) -> None:
    """Queue the giving back of ``intent_id``'s amounts on a pipeline (a no-op if given back before)."""
    eval_into(pipe, _REFUND, _keys(agent, connector, intent_id, budgets), intent_id)


def release_intent(client: redis.Redis, agent: str, intent_id: str) -> bool:
    """Give back what ``intent_id`` was counted, knowing only its id: for an intent that never ran
    after it was counted (an approval denied or expired, a parking refused). Once, like every refund."""
    held = keys.budget_held(agent, intent_id)
    names = text(client.get(held)).split()
    if not names:
        return False
    return bool(client.eval(_REFUND, len(names) + 1, *names, held, intent_id))


class RedisBudgets:
    """The running fleet's budgets (the router reserves, the pool gives back)."""

    def __init__(self, client: redis.Redis) -> None:
        self._client = client
        self._reserve = client.register_script(_RESERVE)
        self._refund = client.register_script(_REFUND)

    def reserve(
        self, agent: str, connector: str, intent_id: str, spends: Sequence[Spend], *, force: bool = False
    ) -> BudgetVerdict:
        """Count ``intent_id`` in every budget of ``spends`` if all have room (``force``: even if
        not — an intent parked for a person past its budget is counted while it waits)."""
        if not spends:
            return BudgetVerdict(True)
        args: list[Any] = [intent_id, "1" if force else "0"]
        for spend in spends:
            args += [spend.budget.per_ms, repr(float(spend.budget.max)), _amount_text(spend.amount)]
        allowed, index, wait, used = self._reserve(
            keys=_keys(agent, connector, intent_id, [s.budget for s in spends]), args=args
        )
        if allowed:
            return BudgetVerdict(True)
        return BudgetVerdict(False, spends[int(index) - 1].budget, int(wait), float(text(used) or 0))

    def refund(self, agent: str, connector: str, intent_id: str, budgets: Sequence[BudgetSpec]) -> bool:
        return bool(self._refund(keys=_keys(agent, connector, intent_id, budgets), args=[intent_id]))


class NoBudgets:
    """For tools and tests that route without Redis: nothing is counted."""

    def reserve(
        self, agent: str, connector: str, intent_id: str, spends: Sequence[Spend], *, force: bool = False
    ) -> BudgetVerdict:
        return BudgetVerdict(True)

    def refund(self, agent: str, connector: str, intent_id: str, budgets: Sequence[BudgetSpec]) -> bool:
        return False
