"""The audit trail: one structured JSON line per stage of an intent, and the recent stages of
each intent in Redis for ``reach trace``, under the intent's agent (``keys.trace``).

Stages: received, rejected | dispatched (router); attempt (one per downstream call), receipt
(pool, or router for rejections). Params never appear: only their names and a digest taken
after sensitive fields were redacted. A binding's ``audit_level`` chooses how much is written:
``full`` every stage, ``summary`` the receipt only, ``none`` nothing.

The trace in Redis keeps each stage once: a line equal to one already kept but for its time and
process (the same receipt published again for a redelivered job, the same attempt) is not added
again. Beside each trace, an index names the agents that have a trace for the intent id
(``keys.trace_agents``), so ``reach trace`` without ``--agent`` reads one small set instead of
scanning the keyspace.
"""

from __future__ import annotations

import itertools
import json
import logging
import time
from typing import Any

import redis

from workers.state import keys
from workers.state.batcher import Batcher, write_stdout
from workers.state.client import eval_into
from workers.state.ledger import params_hash

log = logging.getLogger("reach.audit")

TRACE_TTL_SECONDS = 24 * 3600
TRACE_MAX_EVENTS = 50
# agents read from an intent id's index at most (several agents may use one intent id)
TRACE_AGENTS_READ = 100

# KEYS[1] the trace list; ARGV[1] how many lines it keeps, ARGV[2] its TTL, ARGV[3..] new lines.
# A line's identity is the line without its "ts" and "process" fields, which render() writes
# first and fifth: a stage written again (a redelivery) differs from the kept one only there.
_PUSH_ONCE = """
local trace = KEYS[1]
local function ident(line)
  local id = string.gsub(line, '^{"ts":[^,]*,', '{', 1)
  id = string.gsub(id, ',"process":"[^"]*"', '', 1)
  return id
end
local seen = {}
for _, line in ipairs(redis.call('LRANGE', trace, 0, -1)) do
  seen[ident(line)] = true
end
local added = 0
for i = 3, #ARGV do
  local id = ident(ARGV[i])
  if not seen[id] then
    redis.call('RPUSH', trace, ARGV[i])
    seen[id] = true
    added = added + 1
  end
end
if added > 0 then
  redis.call('LTRIM', trace, -tonumber(ARGV[1]), -1)
end
redis.call('EXPIRE', trace, ARGV[2])
return added
"""


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
        """Queue the lines on ``pipe``: each stage kept once in the trace, and the agent in the
        intent id's index (a key of its own: another slot on a cluster, so not in the script)."""
        eval_into(pipe, _PUSH_ONCE, [keys.trace(agent, intent_id)], TRACE_MAX_EVENTS, TRACE_TTL_SECONDS, *lines)
        index = keys.trace_agents(intent_id)
        pipe.sadd(index, agent or keys.NO_AGENT)
        pipe.expire(index, TRACE_TTL_SECONDS)


def read_trace(client: redis.Redis, agent: str | None, intent_id: str) -> list[dict[str, Any]]:
    """The stages recorded for this agent's intent, in time order (router and pool write concurrently)."""
    raw_lines = client.lrange(keys.trace(agent, intent_id), 0, -1)
    return sorted((json.loads(raw) for raw in raw_lines), key=lambda e: e["ts"])


def trace_agents(client: redis.Redis, intent_id: str, limit: int = 10) -> list[str]:
    """The agents that have a trace for this intent id (at most ``limit``), from its index: at most
    ``TRACE_AGENTS_READ`` of its members are looked at, whatever it holds. ``-`` stands for an
    intent whose agent was never known. Traces written before the index existed are found with
    ``--agent`` only."""
    members = [
        m.decode() if isinstance(m, bytes) else str(m)
        for m in itertools.islice(
            client.sscan_iter(keys.trace_agents(intent_id), count=TRACE_AGENTS_READ), TRACE_AGENTS_READ
        )
    ]
    if not members:
        return []
    pipe = client.pipeline(transaction=False)
    for agent in members:
        pipe.exists(keys.trace(agent, intent_id))
    # a trace that expired before its index (a later push renewed the index) is left out
    return sorted(agent for agent, kept in zip(members, pipe.execute(), strict=True) if kept)[:limit]


class LoggedAudit(Audit):
    """The audit trail of a tool run by people (approval decisions, operators' commands): lines
    through logging (not onto the tool's own output), always in full, and the stages into the
    intent's trace in Redis as everywhere else."""

    def events(
        self, intent_id: str, stages: list[tuple[str, dict[str, Any]]], *, level: str = "full", agent: str | None = None
    ) -> None:
        lines = self.render(intent_id, stages, level="full")
        for line in lines:
            log.info(line)
        if self._client is None or not lines:
            return
        pipe = self._client.pipeline(transaction=False)
        self.push_into(pipe, agent, intent_id, lines)
        try:
            pipe.execute()
        except redis.RedisError as exc:
            log.error("could not keep the stages of %s in its trace in Redis: %s", intent_id, exc)
