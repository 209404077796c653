"""Configuration: every ``REACH_*`` variable, read from the environment in exactly one place.

Every field is documented in the "Configuration" table of docs/operations.md;
``tests/unit/test_settings.py`` holds the two together. ``Settings.from_env()`` reads the
environment (or a mapping, in tests); ``Settings(...)`` takes its keyword arguments and nothing
else, so tests and benchmarks build it directly instead of patching the environment.
"""

from __future__ import annotations

import difflib
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, Self
from urllib.parse import urlsplit

from pydantic import BeforeValidator, Field, SecretStr, ValidationError, field_validator
from pydantic_settings import SettingsConfigDict

from connectors.durations import parse_duration
from connectors.rates import parse_rate
from producers.client_settings import DEFAULT_BROKER_URL, EnvironSettings, env_name

__all__ = ["DEFAULT_BROKER_URL", "DEFAULT_REDIS_URL", "Settings", "SettingsError"]

log = logging.getLogger(__name__)

DEFAULT_REDIS_URL = "redis://localhost:6379/0"

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


class SettingsError(ValueError):
    """An environment variable has a value the fleet cannot use."""


def _flag(value: Any) -> Any:
    if isinstance(value, str):
        text = value.strip().lower()
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
        raise ValueError("must be 1 or 0 (or true/false)")
    return value


def _seconds(value: Any) -> Any:
    """Whole seconds, or a duration like ``24h`` (connectors.durations)."""
    if isinstance(value, str) and not value.strip().isdigit():
        seconds = parse_duration(value)
        if seconds < 1:
            raise ValueError(f"{value!r} is shorter than a second")
        return int(seconds)
    return value


def _rate(value: Any) -> Any:
    if isinstance(value, str):
        value = value.strip()
        parse_rate(value)
    return value


def _http_url(value: Any) -> Any:
    """An absolute http(s) URL without query or fragment (a JWT audience, an issuer)."""
    if isinstance(value, str):
        value = value.strip()
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
            raise ValueError("must be an http:// or https:// URL with a host, without query or fragment")
    return value


# the schemes workers.state.client opens (it reads the rest of the URL when it connects)
REDIS_SCHEMES = ("redis", "rediss", "unix", "redis+cluster", "rediss+cluster", "redis+sentinel", "rediss+sentinel")


def _redis_url(value: Any) -> Any:
    if isinstance(value, str):
        value = value.strip()
        scheme, sep, _ = value.partition("://")
        if not sep or scheme.lower() not in REDIS_SCHEMES:
            raise ValueError(f"must start with one of {', '.join(s + '://' for s in REDIS_SCHEMES)}")
    return value


Flag = Annotated[bool, BeforeValidator(_flag)]
Seconds = Annotated[int, BeforeValidator(_seconds), Field(ge=1)]
SecondsOrOff = Annotated[int, BeforeValidator(_seconds), Field(ge=0)]  # 0: off
RateText = Annotated[str, BeforeValidator(_rate)]
HttpUrlText = Annotated[str, BeforeValidator(_http_url)]
RedisUrlText = Annotated[str, BeforeValidator(_redis_url)]


class Settings(EnvironSettings):
    """The fleet's configuration; each field is set by ``REACH_<FIELD>`` unless it names another."""

    model_config = SettingsConfigDict(env_prefix="REACH_")

    broker_url: str = Field(
        DEFAULT_BROKER_URL, min_length=1, description="RabbitMQ (AMQP URL; a cluster's nodes as several, split by ';')"
    )
    queue_type: Literal["quorum", "classic"] = Field(
        "quorum", description="type of the fleet's queues: quorum (replicated) or classic (one node, development)"
    )
    redis_url: RedisUrlText = Field(
        DEFAULT_REDIS_URL,
        min_length=1,
        description="Redis: one server, a Cluster (redis+cluster://) or a Sentinel master (redis+sentinel://)",
    )
    # Redis failover (docs/operations.md "Redis topologies")
    redis_wait_replicas: int = Field(
        1, ge=0, le=16, description="replicas that must have each ledger write before the pool goes on (0: none)"
    )
    redis_wait_timeout_ms: int = Field(
        100, ge=1, le=60_000, description="how long a ledger write waits for those replicas at most (ms)"
    )
    catalog_dir: str = Field("catalog", min_length=1, validation_alias="REACH_CATALOG", description="catalog directory")
    metrics_port: int | None = Field(
        None, ge=1, le=65535, description="serve Prometheus metrics and probes on this port; unset: no server"
    )
    max_intent_bytes: int = Field(256 * 1024, ge=64, description="larger intents get INVALID_INTENT")
    receipt_ttl_seconds: Seconds = Field(
        24 * 3600,
        validation_alias="REACH_RECEIPT_TTL",
        description="how long receipts stay in Redis (seconds or a duration like 24h)",
    )
    # read past a flood: fair lanes need it (workers/transport/consuming.py)
    router_prefetch: int = Field(2000, ge=1, description="intents the router reads ahead")
    router_hold_bytes: int = Field(
        64 * 1024 * 1024,
        ge=1024 * 1024,
        description="bytes of intents the router holds; past 3/4 of it, it reads one at a time",
    )
    router_fair: Flag = Field(True, description="one lane per sender; 0 routes in arrival order (for benchmarks)")
    router_threads: int = Field(8, ge=1, description="intents the router routes at once")
    # the workflow runner (reach workflows, workers/workflows/)
    workflow_threads: int = Field(8, ge=1, description="messages the workflow runner handles at once")
    workflow_retention_seconds: Seconds = Field(
        7 * 24 * 3600,
        validation_alias="REACH_WORKFLOW_RETENTION",
        description="how long a finished (or parked) workflow run stays in Redis after its last change",
    )
    workflow_crash_at: Literal["after_state_write", "after_publish", "before_ack"] | None = Field(
        None, description="tests only: the workflow runner dies as by kill -9 the first time it gets there"
    )
    # one job in hand and the rest ready: a thread that finishes one takes the next at once instead
    # of sleeping until the broker has seen the ack and sent another (workers/transport/consuming.py)
    pool_prefetch_per_thread: int = Field(
        2, ge=1, le=10, description="jobs a pool's connector holds per thread (its prefetch = threads x this)"
    )
    log_level: str = Field("INFO", description="a logging level name (DEBUG, INFO, WARNING, ERROR, CRITICAL)")
    require_user_id: Flag = Field(False, description="only accept intents with the broker-validated AMQP user_id")
    idempotency_ttl_seconds: Seconds = Field(
        24 * 3600,
        validation_alias="REACH_IDEMPOTENCY_TTL",
        description="how long idempotency records are kept (seconds or a duration)",
    )
    # at most half the quorum queues' own limit (workers/transport/topology.py DELIVERY_LIMIT): the fleet
    # answers a message that keeps coming back long before the broker drops it
    max_deliveries: int = Field(
        5, ge=1, le=100, description="deliveries of one intent before it is dead-lettered as poison"
    )
    # hostile-input bounds (docs/contract.md "Limits")
    max_depth: int = Field(32, ge=2, description="how deep params (and a system's answer in data) may nest")
    max_details: int = Field(50, ge=1, description="error details per receipt, then 'and K more'")
    max_pending_approvals: int = Field(
        100, ge=1, description="intents of one agent that may wait for approval at once (then RATE_LIMITED)"
    )
    max_receipt_bytes: int = Field(1024 * 1024, ge=4096, description="a larger receipt is cut down before it is sent")
    dlq_max_length: int = Field(10_000, ge=1, description="dead letters kept in reach.dlq (newest refused past it)")
    dlq_max_bytes: int = Field(256 * 1024 * 1024, ge=1024, description="bytes kept in reach.dlq")
    dlq_ttl_seconds: Seconds = Field(
        7 * 24 * 3600,
        validation_alias="REACH_DLQ_TTL",
        description="age after which the broker drops a dead letter (seconds or a duration)",
    )
    dlq_keep_unparsable: Flag = Field(False, description="keep the bytes of a body that could not be parsed")
    agent_invalid_rate: RateText = Field("20/sec", description="invalid intents an agent may send before they cost it")
    semantic_rate: RateText = Field(
        "20/sec", description="intents per agent that make the router run its embedding model (then RATE_LIMITED)"
    )
    # what reach.history answers from (docs/operations.md "History")
    history_ttl_seconds: Seconds = Field(
        30 * 24 * 3600,
        validation_alias="REACH_HISTORY_TTL",
        description="how long an action's history records are kept unless it says `history: {retain: ...}`",
    )
    history_url: str | None = Field(
        None,
        description="a postgresql:// URL: keep history there (schema: reach history migrate); unset: in Redis",
    )
    routing_vectors: str | None = Field(
        None,
        min_length=1,
        description="saved-vector file the router reads before Redis and `reach route warm` writes "
        "(unset: routing-vectors.npz in the catalog directory; `none`: no file)",
    )

    def routing_vectors_path(self, catalog_dir: str | None = None) -> Path | None:
        """Where semantic routing's saved vectors are (None: no file)."""
        if self.routing_vectors is None:
            return Path(catalog_dir or self.catalog_dir) / "routing-vectors.npz"
        return None if self.routing_vectors.strip().lower() == "none" else Path(self.routing_vectors)

    # the MCP facade, `reach mcp` (docs/operations.md "The MCP facade")
    mcp_url: HttpUrlText | None = Field(
        None, description="the MCP endpoint's public URL: JWT audience and resource metadata (unset: local)"
    )
    mcp_host: str = Field("127.0.0.1", min_length=1, description="address `reach mcp --http` listens on")
    mcp_port: int = Field(8808, ge=1, le=65535, description="port `reach mcp --http` listens on")
    mcp_tokens_file: str | None = Field(
        None, description="YAML or JSON file: agent -> sha256 of its static bearer token(s)"
    )
    mcp_jwt_key: SecretStr | None = Field(None, description="HS256 secret or RS256 public key (PEM) of agents' JWTs")
    mcp_jwt_algorithm: Literal["HS256", "RS256"] = Field("RS256", description="how agents' JWTs are signed")
    mcp_issuer_url: HttpUrlText | None = Field(
        None, description="the authorization server: JWTs' iss must be it; named in the resource metadata"
    )
    mcp_wait_seconds: Seconds = Field(
        60, validation_alias="REACH_MCP_WAIT", description="how long a tools/call waits for its receipt"
    )
    mcp_clients_per_agent: int = Field(
        4, ge=1, le=64, description="tools/call of one agent that run at once (the next wait)"
    )

    # the operator web page, `reach console` (docs/operations.md "Console")
    console_host: str = Field("127.0.0.1", min_length=1, description="address `reach console` listens on")
    console_port: int = Field(8090, ge=1, le=65535, description="port `reach console` listens on")
    console_users: str | None = Field(
        None, description="YAML or JSON file (a mounted Secret): user -> {password_hash, role}; unset: no one logs in"
    )
    console_session_key: SecretStr | None = Field(
        None, description="key signing the console's session cookies (unset: a random one per process)"
    )
    console_public_url: HttpUrlText | None = Field(
        None, description="the console's URL as browsers see it: the only Origin its forms are accepted from"
    )
    console_secure_cookie: Flag = Field(False, description="send the session cookie over HTTPS only (behind TLS)")
    console_session_ttl_seconds: Seconds = Field(
        8 * 3600,
        validation_alias="REACH_CONSOLE_SESSION_TTL",
        description="a console login lasts this long (seconds or a duration)",
    )
    console_login_rate: RateText = Field(
        "10/min", description="failed console logins per user name and per address, then 429 until the window passes"
    )
    # every HTTP server of the fleet: slow and half-open clients (workers/observability/http_guard.py)
    http_header_timeout_seconds: Seconds = Field(
        10,
        validation_alias="REACH_HTTP_HEADER_TIMEOUT",
        description="a request's line and headers must arrive within this of its connection or first byte",
    )
    http_body_timeout_seconds: Seconds = Field(
        30,
        validation_alias="REACH_HTTP_BODY_TIMEOUT",
        description="a request's body must arrive within this of its headers",
    )
    http_max_connections: int = Field(
        1024, ge=1, description="open connections of one MCP facade or console process (past it: 503)"
    )
    http_max_connections_per_client: int = Field(
        64, ge=1, description="open connections from one client address (past it a new one is closed at once)"
    )

    # reach beat: agents' exchange-to-exchange bindings (workers/ops/binding_sweep.py)
    binding_sweep_seconds: SecondsOrOff = Field(
        300,
        validation_alias="REACH_BINDING_SWEEP_SECONDS",
        description="reach beat removes agents' exchange-to-exchange bindings this often (0: never)",
    )
    rabbitmqctl: str = Field(
        "rabbitmqctl",
        min_length=1,
        description="how reach beat runs rabbitmqctl against the broker, e.g. 'docker exec -i rabbitmq rabbitmqctl'",
    )

    @field_validator("history_url", mode="before")
    @classmethod
    def _history_url(cls, value: Any) -> Any:
        if isinstance(value, str) and value.strip() == "":
            return None
        if isinstance(value, str) and not value.startswith(("postgresql://", "postgres://")):
            raise ValueError("must be a postgresql:// URL (or unset: history in Redis)")
        return value

    @field_validator("log_level", mode="before")
    @classmethod
    def _known_level(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = value.strip().upper()
            if value not in logging.getLevelNamesMapping():
                raise ValueError("is not a logging level (DEBUG, INFO, WARNING, ERROR or CRITICAL)")
        return value

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Self:
        """Read every ``REACH_*`` variable from ``environ`` (default: the process environment).

        Raises:
            SettingsError: a variable has a value the fleet cannot use; the message names it.
        """
        _warn_unknown(os.environ if environ is None else environ)
        try:
            return super().from_env(environ)
        except ValidationError as exc:
            raise SettingsError("; ".join(_describe(error) for error in exc.errors())) from None


def _warn_unknown(environ: Mapping[str, str]) -> None:
    """A misspelt variable would silently leave its default: say so (it is not an error, so that
    a newer deployment's variables do not stop an older fleet)."""
    known = [env_name(Settings, field) for field in Settings.model_fields]
    for name in environ:
        if name.startswith("REACH_") and name not in known and name not in _NOT_SETTINGS:
            close = difflib.get_close_matches(
                name.removeprefix("REACH_"), [k.removeprefix("REACH_") for k in known], n=1
            )
            hint = f" (did you mean REACH_{close[0]}?)" if close else ""
            log.warning("%s is not a setting and is ignored%s", name, hint)


_NOT_SETTINGS = {"REACH_TEST_ISOLATE"}  # read by the test harness (tests/fleet.py), not the fleet


def _describe(error: Any) -> str:
    """``REACH_X='raw': why`` for one pydantic error."""
    key = str(error["loc"][0]) if error["loc"] else ""
    field = next((name for name, info in Settings.model_fields.items() if key in (name, info.validation_alias)), None)
    variable = env_name(Settings, field) if field else key
    reason = str(error["msg"]).removeprefix("Value error, ")
    return f"{variable}={error['input']!r}: {reason}"
