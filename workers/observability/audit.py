"""The audit trail: one structured JSON line per stage of an intent, and the recent stages of
each intent in Redis for ``reach trace``, under the intent's agent (``keys.trace``).

Stages: received, rejected | dispatched (router); attempt (one per downstream call), receipt
(pool, or router for rejections). Params never appear: only their names and a digest taken
after sensitive fields were redacted. A binding's ``audit_level`` chooses how much is written:
``full`` every stage, ``summary`` the receipt only, ``none`` nothing.
"""

from __future__ import annotations

import json
import time
from typing import Any

import redis

from workers.state import keys
from workers.state.batcher import Batcher, write_stdout
from workers.state.client import scan_keys
from workers.state.ledger import params_hash

TRACE_TTL_SECONDS = 24 * 3600
TRACE_MAX_EVENTS = 50


def params_digest(redacted_params: Any) -> str:
    """What the audit trail shows of the params: a prefix of their hash, taken after redaction."""
    return params_hash(redacted_params)[:16]


class Audit:
    """Writes each stage as a JSON line and keeps it in the intent's trace list in Redis. With a
    ``batcher`` (the running fleet) both happen on its thread, batched with other intents' writes;
    without one (tests, tools) they happen on the calling thread."""

    def __init__(self, client: redis.Redis | None, process: str, batcher: Batcher | None = None) -> None:
        self._client = client
        self._process = process
        self._batcher = batcher

    def events(
        self, intent_id: str, stages: list[tuple[str, dict[str, Any]]], *, level: str = "full", agent: str | None = None
    ) -> None:
        """Several stages at once: one line each; their Redis writes in one round trip (or batch).

        The trace is kept under ``agent``, by default the ``agent`` field of the stages."""
        if agent is None:
            agent = next((fields["agent"] for _, fields in stages if fields.get("agent")), None)
        lines = self.render(intent_id, stages, level=level)
        if not lines:
            return
        if self._batcher is not None:
            # best effort, as below: the lines are the record of truth
            self._batcher.submit(lambda pipe: self.push_into(pipe, agent, intent_id, lines), lines)
            return
        write_stdout(lines)
        if self._client is None:
            return
        pipe = self._client.pipeline(transaction=False)
        self.push_into(pipe, agent, intent_id, lines)
        try:
            pipe.execute()
        except redis.RedisError:
            pass  # the log lines are the record of truth; `reach trace` just misses these stages

    def render(self, intent_id: str, stages: list[tuple[str, dict[str, Any]]], *, level: str = "full") -> list[str]:
        """The JSON lines of the stages the audit level keeps."""
        lines = []
        now = round(time.time(), 6)
        for stage, fields in stages:
            if level == "none" or (level == "summary" and stage != "receipt"):
                continue
            doc = {
                "ts": fields.pop("ts", now),
                "event": "reach.audit",
                "stage": stage,
                "intent_id": intent_id,
                "process": self._process,
                **{k: v for k, v in fields.items() if v is not None},
            }
            lines.append(json.dumps(doc, separators=(",", ":"), ensure_ascii=True, default=str))
        return lines

    def write_lines(self, lines: list[str]) -> None:
        if self._batcher is not None:
            self._batcher.lines(lines)
        else:
            write_stdout(lines)

    @staticmethod
    def push_into(pipe: Any, agent: str | None, intent_id: str, lines: list[str]) -> None:
        key = keys.trace(agent, intent_id)
        pipe.rpush(key, *lines)
        pipe.ltrim(key, -TRACE_MAX_EVENTS, -1)
        pipe.expire(key, TRACE_TTL_SECONDS)


def read_trace(client: redis.Redis, agent: str | None, intent_id: str) -> list[dict[str, Any]]:
    """The stages recorded for this agent's intent, in time order (router and pool write concurrently)."""
    raw_lines = client.lrange(keys.trace(agent, intent_id), 0, -1)
    return sorted((json.loads(raw) for raw in raw_lines), key=lambda e: e["ts"])


def trace_agents(client: redis.Redis, intent_id: str, limit: int = 10, max_scanned: int = 1_000_000) -> list[str]:
    """The agents that have a trace for this intent id: a SCAN over ``reach:trace:{*}:<id>`` (every
    node of a cluster) that stops after ``limit`` matches or ``max_scanned`` keys looked at, whichever comes first."""
    found: set[str] = set()
    for key in scan_keys(client, keys.trace_pattern(intent_id), count=1000, max_scanned=max_scanned):
        agent = keys.agent_of_trace(key, intent_id)
        if agent:
            found.add(agent)
            if len(found) >= limit:
                break
    return sorted(found)[:limit]
