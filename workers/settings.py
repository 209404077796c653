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


@dataclass(frozen=True)
class Settings:
    broker_url: str = DEFAULT_BROKER_URL
    redis_url: str = DEFAULT_REDIS_URL
    catalog_dir: str = "catalog"
    metrics_port: int | None = None
    max_intent_bytes: int = 256 * 1024
    receipt_ttl_seconds: int = 24 * 3600
    router_prefetch: int = 32
    router_threads: int = 8
    log_level: str = "INFO"
    require_user_id: bool = False
    idempotency_ttl_seconds: int = 24 * 3600
    max_deliveries: int = 5

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
            router_prefetch=integer("REACH_ROUTER_PREFETCH", 32, 1) or 32,
            router_threads=integer("REACH_ROUTER_THREADS", 8, 1) or 8,
            log_level=(env.get("REACH_LOG_LEVEL") or "INFO").upper(),
            require_user_id=flag("REACH_REQUIRE_USER_ID"),
            idempotency_ttl_seconds=seconds("REACH_IDEMPOTENCY_TTL", 24 * 3600),
            max_deliveries=integer("REACH_MAX_DELIVERIES", 5, 1) or 5,
        )
