"""Value budgets: the sum of a param over a sliding window, shared by every router through Redis.

A binding's ``budget: {param: amount, max: 500, per: 1d}`` keeps, per (agent, connector, param,
window), a sorted set of the intents counted (scored by the time they were counted) and a hash of
their amounts. One Lua script forgets what left the window, checks every budget of the intent
(and reports every one it exceeds) and counts it in all of them, or in none: no race between
routers, and the clock is Redis's own.

Each count is bound to the intent's *tag* (``budget_tag``: the SHA-256 of what it asks, the same
hash a parked approval keeps). The amount is counted when the router dispatches the intent (every
other check passed) and given back, once, when its receipt says it did not take effect
(``refund_into``, called by the pool before it publishes the receipt), or when a person denied it (``release_intent``): only by the
same id *and* tag — the refund deletes the intent's entry, so a second refund finds nothing. An
intent counted again under the same id and tag (the router decides it again after a failed
publish) is counted once; the same id with another tag is refused (``BudgetVerdict.reused``), so a
reused id can neither pass uncounted nor give back the amount of the intent that first used it.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import redis

from connectors.catalog import ALL_ACTIONS, Catalog
from connectors.spec import BudgetSpec
from producers.wire import Receipt
from workers.state import keys
from workers.state.approval_store import RETENTION_MS as APPROVALS_KEPT_MS
from workers.state.approval_store import payload_hash
from workers.state.client import eval_into, text

__all__ = [
    "MIN_AMOUNT_SHARE",
    "AmountProblem",
    "BudgetCounter",
    "BudgetIndex",
    "BudgetVerdict",
    "Exceeded",
    "NoBudgets",
    "RedisBudgets",
    "Spend",
    "amount_problem",
    "budget_index",
    "budget_tag",
    "gives_back",
    "refund_into",
    "release_intent",
    "repeat_window_ms",
]

# In the scripts: at most 1000 entries that left the window are forgotten per call (the rest on
# the next calls, counted meanwhile: never too little); at most the 1000 oldest are walked to say
# when enough frees; the keys outlive their newest entry by a minute. What a window holds is summed
# from its entries on every call (no running total: a float total cancels, 400 + 1e300 - 1e300 is
# 0, and drifts; the sum is bounded by the entries, each at most the budget's max).
# KEYS: per budget i, KEYS[2i-1] the counted intents (zset), KEYS[2i] their amounts (hash); last,
# the intent's record: "<tag> <the keys it was counted in>"
# ARGV[1] intent id, ARGV[2] "1" to count without checking (parked past its budget), ARGV[3] the
# intent's tag (budget_tag), then per budget: ARGV[3i+1] window (ms), ARGV[3i+2] max, ARGV[3i+3]
# amount (text, > 0); last, ARGV[3n+4] how long (ms) a repeat of a counted intent is one (0: always)
# returns {1} counted (or counted before under the same tag), {2} the id was counted with another
# tag, {3} counted under the same tag longer ago than a repeat can be (its outcome is forgotten, so
# it would run again uncounted), {0, i, retry_after_ms, used, ...} every budget i that the amount does
# not fit
_RESERVE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local id = ARGV[1]
local n = (#KEYS - 1) / 2
local held = KEYS[#KEYS]
for i = 1, n do
  local times = KEYS[2 * i - 1]
  local amounts = KEYS[2 * i]
  local gone = redis.call('ZRANGEBYSCORE', times, '-inf', now - tonumber(ARGV[3 * i + 1]), 'LIMIT', 0, 1000)
  for _, member in ipairs(gone) do
    redis.call('HDEL', amounts, member)
    redis.call('ZREM', times, member)
  end
  redis.call('HDEL', amounts, '#total')  -- the running total of earlier versions
end
local record = redis.call('GET', held)
if record then
  if string.match(record, '^%S+') ~= ARGV[3] then return {2} end
  local first_times = KEYS[1]
  local first = KEYS[2]
  if redis.call('HEXISTS', first, id) == 1 then
    local horizon = tonumber(ARGV[3 * n + 4]) or 0
    local counted = tonumber(redis.call('ZSCORE', first_times, id) or now)
    if horizon > 0 and now - counted > horizon then return {3} end
    return {1}
  end
end
if ARGV[2] ~= '1' then
  local over = {0}
  for i = 1, n do
    local times = KEYS[2 * i - 1]
    local amounts = KEYS[2 * i]
    local per = tonumber(ARGV[3 * i + 1])
    local max = tonumber(ARGV[3 * i + 2])
    local amount = tonumber(ARGV[3 * i + 3])
    local used = 0
    for _, v in ipairs(redis.call('HVALS', amounts)) do used = used + tonumber(v) end
    -- a relative 1e-12 of slack: decimal amounts summed as binary floats
    if used + amount > max * (1 + 1e-12) then
      local need = used + amount - max
      local freed, wait = 0, per
      local oldest = redis.call('ZRANGE', times, 0, 999, 'WITHSCORES')
      for j = 1, #oldest, 2 do
        freed = freed + tonumber(redis.call('HGET', amounts, oldest[j]) or '0')
        wait = tonumber(oldest[j + 1]) + per - now
        if freed >= need then break end
      end
      if wait < 1 then wait = 1 end
      over[#over + 1] = i
      over[#over + 1] = wait
      over[#over + 1] = string.format('%.17g', used)
    end
  end
  if #over > 1 then return over end
end
local longest = 0
local names = {ARGV[3]}
for i = 1, n do
  local times = KEYS[2 * i - 1]
  local amounts = KEYS[2 * i]
  local keep = tonumber(ARGV[3 * i + 1]) + 60000
  redis.call('ZADD', times, now, id)
  redis.call('HSET', amounts, id, ARGV[3 * i + 3])
  redis.call('PEXPIRE', times, keep)
  redis.call('PEXPIRE', amounts, keep)
  names[#names + 1] = times
  names[#names + 1] = amounts
  if keep > longest then longest = keep end
end
-- the tag, and where the intent was counted, so that what holds only its id and tag can give it
-- back (release_intent)
redis.call('SET', held, table.concat(names, ' '), 'PX', longest)
return {1}
"""

# KEYS as _RESERVE; ARGV[1] intent id, ARGV[2] its tag. Returns 1 if an amount was given back, 0 if
# none was held for that tag (given back before, never counted, out of the window, or counted for
# another payload that reused the id: that one's amount stays)
_REFUND = """
local id = ARGV[1]
local held = KEYS[#KEYS]
local record = redis.call('GET', held)
if not record or string.match(record, '^%S+') ~= ARGV[2] then return 0 end
local gave = 0
redis.call('DEL', held)
for i = 1, (#KEYS - 1) / 2 do
  local times = KEYS[2 * i - 1]
  local amounts = KEYS[2 * i]
  if redis.call('HDEL', amounts, id) == 1 then gave = 1 end
  redis.call('ZREM', times, id)
end
return gave
"""


@dataclass(frozen=True)
class Spend:
    """What one intent asks of one budget."""

    budget: BudgetSpec
    amount: int | float


@dataclass(frozen=True)
class Exceeded:
    """One budget that an intent's amount does not fit."""

    budget: BudgetSpec
    retry_after_ms: int  # when enough of its window frees
    used: float  # what its window holds now


@dataclass(frozen=True)
class BudgetVerdict:
    allowed: bool
    over: tuple[Exceeded, ...] = ()  # every budget exceeded, in the order of the spends
    reused: bool = False  # the intent id was counted before for another payload (not counted now)
    stale: bool = False  # counted for this payload longer ago than a repeat is answered (not counted now)


# the smallest amount a budget counts, as a share of its max: far above the scripts' relative 1e-12
# of slack, so an amount counted into a full window always overflows it, and never so small that
# adding it leaves the window's float sum unchanged (it would run uncounted, again and again)
MIN_AMOUNT_SHARE = 1e-10


@dataclass(frozen=True)
class AmountProblem:
    """Why an amount cannot be counted against a budget: a VALIDATION_FAILED answer."""

    message: str
    suggestion: str
    detail: dict[str, str]


def amount_problem(budget: BudgetSpec, amount: int | float) -> AmountProblem | None:
    """Why ``amount`` (a number the params validator let through) cannot be counted against
    ``budget``, or None. Refused whatever the window holds: not finite, zero (``-0.0`` too) or
    negative (it would count nothing, or give the window room it never had), smaller than
    ``MIN_AMOUNT_SHARE`` of the budget or subnormal (it would vanish in the window's sum), and more
    than the whole budget (no window could ever hold it)."""
    shown = repr(amount)[:40]
    field = budget.param
    if isinstance(amount, int) and amount.bit_length() > 1023:  # no float holds it: math.isfinite would raise
        amount = sys.float_info.max  # more than any budget: refused as such below
    if not math.isfinite(amount):
        return AmountProblem(
            f"{field} is {shown}: a budget counts finite amounts only",
            f"Send {field} as a finite number.",
            {"field": field, "code": "type", "message": "must be a finite number (a budget counts it)"},
        )
    if amount <= 0:
        return AmountProblem(
            f"{field} is {shown}: an amount counted against a budget must be more than 0",
            f"Send {field} as a positive amount; leave out an intent that spends nothing.",
            {"field": field, "code": "min", "message": "must be more than 0 (a budget counts it)"},
        )
    smallest = max(budget.max * MIN_AMOUNT_SHARE, sys.float_info.min)
    if amount < smallest:
        return AmountProblem(
            f"{field} is {shown}: too small to count against a budget of {budget.max:g} per {budget.per} "
            f"(at least {smallest:g})",
            f"Send {field} as at least {smallest:g}.",
            {"field": field, "code": "min", "message": f"must be at least {smallest:g} (a budget counts it)"},
        )
    if amount > budget.max:
        return AmountProblem(
            f"{field} is {shown}, more than the whole budget of {budget.max:g} per {budget.per}",
            f"No single intent may exceed {budget.max:g}; ask your user before splitting it.",
            {"field": field, "code": "max", "message": f"must be at most {budget.max:g}"},
        )
    return None


def budget_tag(agent: str, connector: str, action: str, params: Any, idempotency_key: str) -> str:
    """What a count is bound to: the hash of what the intent asks (the approvals' payload hash)."""
    return payload_hash(agent, connector, action, params, idempotency_key)


def repeat_window_ms(idempotency_ttl_seconds: int) -> int:
    """How long a repeat of a counted intent counts as counted already (``RedisBudgets``'
    ``repeat_within_ms``): while the pools answer it from their ledger (REACH_IDEMPOTENCY_TTL)
    *and* an approval it had is still on record (``workers.state.approval_store.RETENTION_MS``),
    whichever ends first. Past the ledger's time it would run again; past the approval's, it
    would be parked, and given back, again."""
    return min(idempotency_ttl_seconds * 1000, APPROVALS_KEPT_MS)


class BudgetCounter(Protocol):
    def reserve(
        self,
        agent: str,
        connector: str,
        intent_id: str,
        tag: str,
        spends: Sequence[Spend],
        *,
        force: bool = False,
    ) -> BudgetVerdict: ...

    def refund(self, agent: str, connector: str, intent_id: str, tag: str, budgets: Sequence[BudgetSpec]) -> bool: ...


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


def refund_into(pipe: Any, agent: str, connector: str, intent_id: str, tag: str, budgets: Sequence[BudgetSpec]) -> None:
    """Queue the giving back of ``intent_id``'s amounts on a pipeline (a no-op if given back
    before, or if they were counted for another tag)."""
    eval_into(pipe, _REFUND, _keys(agent, connector, intent_id, budgets), intent_id, tag)


def release_intent(client: redis.Redis, agent: str, intent_id: str, tag: str) -> bool:
    """Give back what ``intent_id`` was counted for ``tag``, knowing only its id and tag: for an
    intent that never ran after it was counted (an approval denied or expired, a parking refused).
    Once, like every refund."""
    held = keys.budget_held(agent, intent_id)
    names = text(client.get(held)).split()[1:]  # the first is the tag, checked by the script
    if not names:
        return False
    return bool(client.eval(_REFUND, len(names) + 1, *names, held, intent_id, tag))


class RedisBudgets:
    """The running fleet's budgets (the router reserves, the pool gives back)."""

    def __init__(self, client: redis.Redis, repeat_within_ms: int = 0) -> None:
        """``repeat_within_ms``: how long the pools answer a repeated intent from their ledger
        (REACH_IDEMPOTENCY_TTL). An intent counted longer ago would run again, so its repeat is not
        waved through as already counted (0: no limit)."""
        self._client = client
        self._repeat_within_ms = repeat_within_ms
        self._reserve = client.register_script(_RESERVE)
        self._refund = client.register_script(_REFUND)

    def reserve(
        self,
        agent: str,
        connector: str,
        intent_id: str,
        tag: str,
        spends: Sequence[Spend],
        *,
        force: bool = False,
    ) -> BudgetVerdict:
        """Count ``intent_id`` (bound to ``tag``) in every budget of ``spends`` if all have room
        (``force``: even if not — an intent parked for a person past its budget is counted while
        it waits)."""
        if not spends:
            return BudgetVerdict(True)
        args: list[Any] = [intent_id, "1" if force else "0", tag]
        for spend in spends:
            args += [spend.budget.per_ms, repr(float(spend.budget.max)), _amount_text(spend.amount)]
        args.append(self._repeat_within_ms)
        answer = self._reserve(keys=_keys(agent, connector, intent_id, [s.budget for s in spends]), args=args)
        if int(answer[0]) == 1:
            return BudgetVerdict(True)
        if int(answer[0]) == 2:
            return BudgetVerdict(False, reused=True)
        if int(answer[0]) == 3:
            return BudgetVerdict(False, stale=True)
        over = tuple(
            Exceeded(spends[int(answer[j]) - 1].budget, int(answer[j + 1]), float(text(answer[j + 2]) or 0))
            for j in range(1, len(answer), 3)
        )
        return BudgetVerdict(False, over)

    def refund(self, agent: str, connector: str, intent_id: str, tag: str, budgets: Sequence[BudgetSpec]) -> bool:
        return bool(self._refund(keys=_keys(agent, connector, intent_id, budgets), args=[intent_id, tag]))


class NoBudgets:
    """For tools and tests that route without Redis: nothing is counted."""

    def reserve(
        self,
        agent: str,
        connector: str,
        intent_id: str,
        tag: str,
        spends: Sequence[Spend],
        *,
        force: bool = False,
    ) -> BudgetVerdict:
        return BudgetVerdict(True)

    def refund(self, agent: str, connector: str, intent_id: str, tag: str, budgets: Sequence[BudgetSpec]) -> bool:
        return False
