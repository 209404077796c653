"""How patiently a connector is called: retries, its breaker, its pool and its health probe."""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from connectors.durations import Duration
from connectors.spec.base import Spec
from connectors.spec.http_parts import split_path


class RetryPolicy(Spec):
    """How often and how patiently a transient failure is retried."""

    max_attempts: int = Field(default=3, ge=1, le=20)
    initial_backoff: Duration = 0.1
    max_backoff: Duration = 5.0

    @model_validator(mode="after")
    def _ordered(self) -> RetryPolicy:
        if self.initial_backoff > self.max_backoff:
            raise ValueError("initial_backoff is longer than max_backoff")
        return self


class BreakerSpec(Spec):
    fail_max: int = Field(default=5, ge=1)
    reset_timeout: Duration = 30.0


class PoolSpec(Spec):
    concurrency: int = Field(default=20, ge=1, le=1000)


class HealthSpec(Spec):
    path: str = "GET /"
    interval: Duration = 10.0

    @field_validator("path")
    @classmethod
    def _path(cls, v: str) -> str:
        split_path(v)
        return v
