"""Per-binding rate limits, shared by every router replica through Redis.

Each (agent, connector) binding with ``rate_limit: N/min`` is a GCRA bucket: up to N intents
at once, then one every period/N. The check and the update are one Lua script, so one round
trip per intent and no race between replicas; the clock is Redis's own, so router clocks may
drift without changing the limit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import redis

from connectors.rates import Rate, parse_rate
from workers.state import keys
from workers.state.client import eval_into

__all__ = ["NoRateLimit", "Rate", "RateLimiter", "RedisRateLimiter", "Verdict", "parse_rate"]

# KEYS[1] bucket; ARGV[1] emission interval (ms), ARGV[2] burst (intents)
# returns {allowed (1/0), retry_after_ms}
_GCRA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local interval = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
if tat < now then tat = now end
local new_tat = tat + interval
local over = new_tat - now - burst * interval
if over > 0 then
  return {0, over}
end
redis.call('SET', KEYS[1], new_tat, 'PX', new_tat - now)
return {1, 0}
"""


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    retry_after_ms: int = 0


class RateLimiter(Protocol):
    def hit(self, agent: str, connector: str, rate: Rate) -> Verdict: ...


class RedisRateLimiter:
    """State lives in Redis under ``reach:rl:<agent>:<connector>``. The router queues the check on
    its guard pipeline (``hit_into``); ``hit`` is the same check on its own."""

    def __init__(self, client: redis.Redis) -> None:
        self._script = client.register_script(_GCRA)

    @staticmethod
    def _key_and_args(agent: str, connector: str, rate: Rate) -> tuple[str, int, int]:
        # interval in whole ms (at least 1): 1000/sec is as fine as the clock goes
        return keys.rate_limit(agent, connector), max(1, round(rate.interval_ms)), rate.count

    def hit(self, agent: str, connector: str, rate: Rate) -> Verdict:
        key, interval, count = self._key_and_args(agent, connector, rate)
        return self.verdict(self._script(keys=[key], args=[interval, count]))

    def hit_into(self, pipe: Any, agent: str, connector: str, rate: Rate) -> None:
        """Queue the check on a pipeline; read its result with ``verdict``. (EVAL, not the Script
        object: redis-py adds a SCRIPT EXISTS round trip per pipeline for Script objects.)"""
        key, interval, count = self._key_and_args(agent, connector, rate)
        eval_into(pipe, _GCRA, [key], interval, count)

    @staticmethod
    def verdict(result: Any) -> Verdict:
        allowed, retry_after = result
        return Verdict(bool(allowed), int(retry_after))


class NoRateLimit:
    """For tools and tests that route without Redis: every intent passes."""

    def hit(self, agent: str, connector: str, rate: Rate) -> Verdict:
        return Verdict(True)
