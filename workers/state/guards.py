"""The router's Redis checks for one intent — the binding's rate limit and the connector's
breaker/health — in one round trip (one pipeline of two Lua scripts)."""

from __future__ import annotations

from typing import Protocol

import redis

from connectors.spec import ConnectorSpec
from workers.state.breaker import OPEN, SharedBreaker
from workers.state.client import text
from workers.state.ratelimit import Rate, RateLimiter, RedisRateLimiter, Verdict

Unavailable = tuple[str, int] | None  # (reason, retry_after_ms)


class AvailabilityCheck(Protocol):
    def refusal(self, connector: str) -> Unavailable: ...


class Guards(Protocol):
    def check(self, agent: str, connector: str, rate: Rate | None) -> tuple[Verdict, Unavailable]: ...


class SeparateGuards:
    """Any limiter and availability check, asked one after the other (tests, tools)."""

    def __init__(self, limiter: RateLimiter, availability: AvailabilityCheck) -> None:
        self._limiter = limiter
        self._availability = availability

    def check(self, agent: str, connector: str, rate: Rate | None) -> tuple[Verdict, Unavailable]:
        verdict = self._limiter.hit(agent, connector, rate) if rate is not None else Verdict(True)
        return verdict, self._availability.refusal(connector)


class RedisGuards:
    """What the running router uses: both scripts in one pipeline, so one round trip per intent."""

    def __init__(
        self, client: redis.Redis, connectors: dict[str, ConnectorSpec], health_interval: dict[str, float]
    ) -> None:
        self._client = client
        self._limiter = RedisRateLimiter(client)
        self._breakers = {name: SharedBreaker(client, name, spec.breaker) for name, spec in connectors.items()}
        self._interval = health_interval

    def check(self, agent: str, connector: str, rate: Rate | None) -> tuple[Verdict, Unavailable]:
        breaker = self._breakers[connector]
        pipe = self._client.pipeline(transaction=False)
        if rate is not None:
            self._limiter.hit_into(pipe, agent, connector, rate)
        breaker.peek_into(pipe)
        results = pipe.execute()
        verdict = Verdict(True)
        if rate is not None:
            verdict = self._limiter.verdict(results[0])
        state, left, health = results[-1]
        state, health = text(state), text(health)
        if state == OPEN and int(left) > 0:
            return verdict, (f"the circuit breaker of {connector} is open after repeated failures", int(left))
        if health == "down":
            return verdict, (f"{connector} failed its health checks", int(self._interval.get(connector, 10.0) * 1000))
        return verdict, None


__all__ = ["Guards", "RedisGuards", "SeparateGuards"]
