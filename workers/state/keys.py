"""Every Redis key of the fleet, built here and nowhere else.

A key that holds anything taken from an agent's input (an intent id, an idempotency key)
starts with that agent, so one agent's input can never reach, overwrite or read another
agent's state. Agent and connector names match ``producers.wire.AGENT_ID_PATTERN``
(``^[a-z][a-z0-9_]{0,62}$``: no ``:``), so the segments before the agent's own text cannot
run into each other. An intent whose agent is not known (an unparsable message without an
identity) files under ``-``, which no agent can be named.

Keyed by agent (everything an agent's input reaches)::

    reach:receipt:<agent>:<intent_id>                 string  the receipt (JSON): redeliveries, lookups
    reach:receipt-sent:<agent>:<intent_id>            string  the broker confirmed the receipt
    reach:deliveries:<agent>:<intent_id>              counter deliveries of a job to its pool (poison)
    reach:trace:<agent>:<intent_id>                   list    the intent's audit lines (``reach trace``)
    reach:idem:<agent>:<connector>:<action>:<key>     hash    the idempotency ledger record
    reach:rl:<agent>:<connector>                      string  a binding's rate-limit bucket (GCRA)

Keyed by connector or process (names from the catalog and the fleet, never from intents)::

    reach:breaker:<connector>                         hash    the shared circuit breaker
    reach:health:<connector>                          string  up | down, from the health probe
    reach:paused:<connector>                          string  set by ``reach pause``
    reach:workers:<connector>                         hash    per-worker status for ``reach status``
    reach:last-error:<connector>                      string  the connector's last error
    reach:alive:<worker_id>                           string  a worker process's heartbeat
    reach:abandoned:<attempt>                         string  an attempt that was given up
    reach:auth:<connector>                            hash    an oauth2_refresh_token connector's newest tokens
    reach:auth:<connector>:lock                       string  held by the process spending its refresh token

Keyed by what the catalog says (no agent's input reaches them)::

    reach:embedding:<model>:<sha256 of the text>      string  an action text's embedding (float32, little-endian)

The last two are built by ``connectors.auth.state_key`` (connectors cannot import workers).

Every Lua script receives the keys it touches through KEYS, none builds a key itself. (Which
keys share a Redis Cluster slot is not arranged yet: a script's keys may hash to different slots.)
"""

from __future__ import annotations

PREFIX = "reach:"
NO_AGENT = "-"  # never an agent name: the pattern starts with a letter

RECEIPT_PREFIX = PREFIX + "receipt:"
SENT_PREFIX = PREFIX + "receipt-sent:"
DELIVERIES_PREFIX = PREFIX + "deliveries:"
TRACE_PREFIX = PREFIX + "trace:"
IDEMPOTENCY_PREFIX = PREFIX + "idem:"
RATE_LIMIT_PREFIX = PREFIX + "rl:"
BREAKER_PREFIX = PREFIX + "breaker:"
HEALTH_PREFIX = PREFIX + "health:"
PAUSED_PREFIX = PREFIX + "paused:"
WORKERS_PREFIX = PREFIX + "workers:"
LAST_ERROR_PREFIX = PREFIX + "last-error:"
ALIVE_PREFIX = PREFIX + "alive:"
ABANDONED_PREFIX = PREFIX + "abandoned:"
EMBEDDING_PREFIX = PREFIX + "embedding:"


def _agent(agent: str | None) -> str:
    return agent or NO_AGENT


# keyed by agent


def receipt(agent: str | None, intent_id: str) -> str:
    return f"{RECEIPT_PREFIX}{_agent(agent)}:{intent_id}"


def sent(agent: str | None, intent_id: str) -> str:
    return f"{SENT_PREFIX}{_agent(agent)}:{intent_id}"


def deliveries(agent: str | None, intent_id: str) -> str:
    return f"{DELIVERIES_PREFIX}{_agent(agent)}:{intent_id}"


def trace(agent: str | None, intent_id: str) -> str:
    return f"{TRACE_PREFIX}{_agent(agent)}:{intent_id}"


def trace_pattern(intent_id: str) -> str:
    """A SCAN pattern for one intent id's traces, whatever the agent (``reach trace`` without
    ``--agent``). Glob characters in the id are escaped so they match only themselves."""
    escaped = "".join("\\" + c if c in "*?[]\\" else c for c in intent_id)
    return f"{TRACE_PREFIX}*:{escaped}"


def agent_of_trace(key: str | bytes, intent_id: str) -> str | None:
    """The agent of a key built by ``trace`` for this intent id, or None when the key is another
    intent's (``*`` in ``trace_pattern`` also matches ``desk:eu`` for the id ``ORDER-1`` of
    ``reach:trace:desk:eu:ORDER-1``, which is agent ``desk``'s intent ``eu:ORDER-1``)."""
    text = key.decode() if isinstance(key, bytes) else key
    if not text.startswith(TRACE_PREFIX):
        return None
    agent, sep, rest = text[len(TRACE_PREFIX) :].partition(":")
    return agent if sep and rest == intent_id else None


def idempotency(agent: str | None, connector: str, action: str, idempotency_key: str) -> str:
    return f"{IDEMPOTENCY_PREFIX}{_agent(agent)}:{connector}:{action}:{idempotency_key}"


def rate_limit(agent: str, connector: str) -> str:
    return f"{RATE_LIMIT_PREFIX}{agent}:{connector}"


# keyed by connector or process


def breaker(connector: str) -> str:
    return BREAKER_PREFIX + connector


def health(connector: str) -> str:
    return HEALTH_PREFIX + connector


def paused(connector: str) -> str:
    return PAUSED_PREFIX + connector


def workers(connector: str) -> str:
    return WORKERS_PREFIX + connector


def last_error(connector: str) -> str:
    return LAST_ERROR_PREFIX + connector


def alive(worker_id: str) -> str:
    return ALIVE_PREFIX + worker_id


def abandoned(attempt: str) -> str:
    return ABANDONED_PREFIX + attempt


# the keys a connector's pools, probes and operators leave, by which ``reach status`` finds the
# connectors of a fleet when no catalog names them
CONNECTOR_PREFIXES = (WORKERS_PREFIX, HEALTH_PREFIX, BREAKER_PREFIX, PAUSED_PREFIX, LAST_ERROR_PREFIX)


def connector_of(key: str | bytes) -> str | None:
    """The connector a key with one of ``CONNECTOR_PREFIXES`` belongs to (None for other keys)."""
    text = key.decode() if isinstance(key, bytes) else key
    for prefix in CONNECTOR_PREFIXES:
        if text.startswith(prefix) and len(text) > len(prefix):
            return text[len(prefix) :]
    return None


def embedding(model_and_digest: str) -> str:
    """An action text's embedding: ``<model>:<sha256 hex>`` (connectors.routing.ActionIndex.cache_key);
    shared by every router, so a restart or a second replica embeds nothing again."""
    return EMBEDDING_PREFIX + model_and_digest
