"""Configuration, read from the environment in exactly one place.

Every variable is documented in the README's "Configuration" table. Tests build ``Settings``
directly instead of patching the environment.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from connectors.durations import parse_duration

DEFAULT_BROKER_URL = "amqp://guest:guest@localhost:5672//"
DEFAULT_REDIS_URL = "redis://localhost:6379/0"


class SettingsError(ValueError):
    """An environment variable has a value the fleet cannot use."""


def _rate(name: str, raw: str) -> str:
    from connectors.rates import parse_rate

    try:
        parse_rate(raw)
    except ValueError as exc:
        raise SettingsError(f"{name}={raw!r}: {exc}") from None
    return raw


@dataclass(frozen=True)
class Settings:
    broker_url: str = DEFAULT_BROKER_URL
    redis_url: str = DEFAULT_REDIS_URL
    catalog_dir: str = "catalog"
    metrics_port: int | None = None
    max_intent_bytes: int = 256 * 1024
    receipt_ttl_seconds: int = 24 * 3600
    router_prefetch: int = 2000               # read past a flood: fair lanes need it (workers/transport/consuming.py)
    router_hold_bytes: int = 64 * 1024 * 1024  # bytes of intents the router holds at most
    router_fair: bool = True                  # one lane per sender; 0 = FIFO (for benchmarks)
    router_threads: int = 8
    log_level: str = "INFO"
    require_user_id: bool = False
    idempotency_ttl_seconds: int = 24 * 3600
    max_deliveries: int = 5
    # hostile-input bounds (docs/contract.md "Limits")
    max_depth: int = 32                       # nesting of params (and of a system's answer in data)
    max_details: int = 50                     # error details per receipt, then "and K more"
    max_receipt_bytes: int = 1024 * 1024      # a receipt larger than this is cut down before it is sent
    dlq_max_length: int = 10_000              # reach.dlq: messages kept (newest refused past it)
    dlq_max_bytes: int = 256 * 1024 * 1024    # reach.dlq: bytes kept
    dlq_ttl_seconds: int = 7 * 24 * 3600      # reach.dlq: age after which a dead letter is dropped
    dlq_keep_unparsable: bool = False         # keep the bytes of a body that could not be parsed
    agent_invalid_rate: str = "20/sec"        # invalid intents an agent may send before they cost it

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if environ is None else environ

        def integer(name: str, default: int | None, minimum: int = 0) -> int | None:
            raw = env.get(name, "").strip()
            if not raw:
                return default
            try:
                value = int(raw)
            except ValueError:
                raise SettingsError(f"{name}={raw!r} is not an integer") from None
            if value < minimum:
                raise SettingsError(f"{name}={raw!r} must be at least {minimum}")
            return value

        def flag(name: str) -> bool:
            raw = env.get(name, "").strip().lower()
            if raw in ("", "0", "false", "no", "off"):
                return False
            if raw in ("1", "true", "yes", "on"):
                return True
            raise SettingsError(f"{name}={raw!r} must be 1 or 0")

        def seconds(name: str, default: int) -> int:
            raw = env.get(name, "").strip()
            if not raw:
                return default
            try:
                return int(parse_duration(raw)) if not raw.isdigit() else int(raw)
            except ValueError as exc:
                raise SettingsError(f"{name}: {exc}") from None

        return cls(
            broker_url=env.get("REACH_BROKER_URL") or DEFAULT_BROKER_URL,
            redis_url=env.get("REACH_REDIS_URL") or DEFAULT_REDIS_URL,
            catalog_dir=env.get("REACH_CATALOG") or "catalog",
            metrics_port=integer("REACH_METRICS_PORT", None),
            max_intent_bytes=integer("REACH_MAX_INTENT_BYTES", 256 * 1024, 64) or 256 * 1024,
            receipt_ttl_seconds=seconds("REACH_RECEIPT_TTL", 24 * 3600),
            router_prefetch=integer("REACH_ROUTER_PREFETCH", 2000, 1) or 2000,
            router_hold_bytes=integer("REACH_ROUTER_HOLD_BYTES", 64 * 1024 * 1024, 1024 * 1024) or 64 * 1024 * 1024,
            router_fair=flag("REACH_ROUTER_FAIR") if env.get("REACH_ROUTER_FAIR", "").strip() else True,
            router_threads=integer("REACH_ROUTER_THREADS", 8, 1) or 8,
            log_level=(env.get("REACH_LOG_LEVEL") or "INFO").upper(),
            require_user_id=flag("REACH_REQUIRE_USER_ID"),
            idempotency_ttl_seconds=seconds("REACH_IDEMPOTENCY_TTL", 24 * 3600),
            max_deliveries=integer("REACH_MAX_DELIVERIES", 5, 1) or 5,
            max_depth=integer("REACH_MAX_DEPTH", 32, 2) or 32,
            max_details=integer("REACH_MAX_DETAILS", 50, 1) or 50,
            max_receipt_bytes=integer("REACH_MAX_RECEIPT_BYTES", 1024 * 1024, 4096) or 1024 * 1024,
            dlq_max_length=integer("REACH_DLQ_MAX_LENGTH", 10_000, 1) or 10_000,
            dlq_max_bytes=integer("REACH_DLQ_MAX_BYTES", 256 * 1024 * 1024, 1024) or 256 * 1024 * 1024,
            dlq_ttl_seconds=seconds("REACH_DLQ_TTL", 7 * 24 * 3600),
            dlq_keep_unparsable=flag("REACH_DLQ_KEEP_UNPARSABLE"),
            agent_invalid_rate=_rate("REACH_AGENT_INVALID_RATE", env.get("REACH_AGENT_INVALID_RATE", "").strip() or "20/sec"),
        )
