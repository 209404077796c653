"""The agent adapter's second loop guard: concurrent loops per pair of agents, shared through Redis.

The hop limit (``MAX_AGENT_HOPS``) bounds how deep one chain of agent-to-agent calls goes, but every
level of a chain holds a handler thread of the agent it waits in. Several loops between the same two
agents at once (A asks B, B asks A back, ...) take all of both agents' threads, every request then
times out, and the timeouts open the connectors' breakers for everyone. So a chain may only start
looping between two agents while fewer than ``max_loops`` other chains loop between them.

A chain is named by its trace id (the pool passes the intent's traceparent on, and an agent's
``request.call`` passes it to the intents it sends while handling a request; an intent without
one gets the router's). A call from X to Y *loops* when the same chain has a call from Y to X in
flight. Each call is recorded while it runs, in one sorted set per pair of agents, with a lease
(its timeout and a margin), so a pool process that dies leaves nothing behind for long::

    reach:agent-calls:{<a>|<b>}   zset  "<chain> <caller> <call id>" -> when its lease ends (ms)

(``a`` < ``b``: both directions in one key; agent names are ``[a-z0-9_]``, so ``|`` cannot be in one.)
A refused call is never published: DOWNSTREAM_VALIDATION_FAILED with ``sent`` False, as the hop limit.
"""

from __future__ import annotations

import logging
import re
import uuid
from dataclasses import dataclass
from typing import Any

from redis.exceptions import RedisError

log = logging.getLogger("reach.agent")

DEFAULT_MAX_LOOPS_PER_PAIR = 1  # one loop fits AgentServer's default 4 threads under MAX_AGENT_HOPS 8
LEASE_MARGIN_MS = 5_000
_PREFIX = "reach:"  # listed with every other key in workers/state/keys.py, which this layer cannot import
KEY_PREFIX = _PREFIX + "agent-calls:"
_TRACE = re.compile(r"^[0-9a-f]{2}-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}$")

# KEYS[1] the pair's calls; ARGV[1] chain, ARGV[2] caller, ARGV[3] callee, ARGV[4] member,
# ARGV[5] lease (ms), ARGV[6] max loops. Returns {1} recorded, {0, loops} refused.
_ENTER = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local self_pair = ARGV[2] == ARGV[3]
local chains = {}
for _, m in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  local chain, caller = string.match(m, '^(%S+) (%S+) ')
  if chain then
    local c = chains[chain] or {n = 0, callers = 0}
    if not c[caller] then c.callers = c.callers + 1 end
    c[caller] = true
    c.n = c.n + 1
    chains[chain] = c
  end
end
-- a chain loops between the two when it has calls in flight both ways (an agent calling itself: two)
local function loops_now(c)
  if self_pair then return c.n > 1 end
  return c.callers > 1
end
local mine = chains[ARGV[1]]
if mine ~= nil and mine[ARGV[3]] and not loops_now(mine) then
  -- this call would start a loop of its chain between the two: only while fewer others loop
  local loops = 0
  for _, c in pairs(chains) do
    if loops_now(c) then loops = loops + 1 end
  end
  if loops >= tonumber(ARGV[6]) then return {0, loops} end
end
local lease = tonumber(ARGV[5])
redis.call('ZADD', KEYS[1], now + lease, ARGV[4])
if redis.call('PTTL', KEYS[1]) < lease then redis.call('PEXPIRE', KEYS[1], lease) end
return {1}
"""


def pair_key(a: str, b: str) -> str:
    """The sorted set of calls in flight between agents ``a`` and ``b`` (either direction)."""
    first, second = sorted((a, b))
    return KEY_PREFIX + "{" + first + "|" + second + "}"


def chain_of(traceparent: str | None, intent_id: str) -> str:
    """The chain a call belongs to: its trace id, or (no usable traceparent) the intent's own id."""
    found = _TRACE.match(traceparent or "")
    return found.group(1) if found else "i:" + intent_id


@dataclass(frozen=True)
class Entered:
    """A call recorded as in flight (``allowed``), or refused because ``loops`` chains loop already."""

    allowed: bool
    member: str = ""
    loops: int = 0


class PairLoops:
    """Records each agent-to-agent call while it runs and refuses a new loop past ``max_loops``."""

    def __init__(self, redis: Any, max_loops: int = DEFAULT_MAX_LOOPS_PER_PAIR) -> None:
        if max_loops < 1:
            raise ValueError(f"max_loops must be at least 1, not {max_loops!r}")
        self._redis = redis
        self._max = max_loops
        self._enter = redis.register_script(_ENTER)

    def enter(self, caller: str, callee: str, chain: str, lease_seconds: float) -> Entered:
        """Record a call from ``caller`` to ``callee`` in ``chain``; refused when it would be one loop too
        many. Redis failing is not the agents' fault: the call goes ahead unrecorded (the hop limit holds)."""
        member = f"{chain} {caller} {uuid.uuid4().hex}"
        lease_ms = int(lease_seconds * 1000) + LEASE_MARGIN_MS
        try:
            answer = self._enter(
                keys=[pair_key(caller, callee)], args=[chain, caller, callee, member, lease_ms, self._max]
            )
        except RedisError as exc:
            log.warning("agent loop guard unavailable (%s); calling %s unrecorded", exc, callee)
            return Entered(True)
        if int(answer[0]) == 1:
            return Entered(True, member)
        return Entered(False, loops=int(answer[1]))

    def leave(self, caller: str, callee: str, entered: Entered) -> None:
        if not entered.member:
            return
        try:
            self._redis.zrem(pair_key(caller, callee), entered.member)
        except RedisError as exc:  # its lease ends it
            log.warning("agent loop guard: could not end a call's record (%s)", exc)


__all__ = ["DEFAULT_MAX_LOOPS_PER_PAIR", "Entered", "PairLoops", "chain_of", "pair_key"]
