"""The audit trail: one structured JSON line per stage of an intent, and the recent stages of
each intent in Redis for ``reach trace``.

Stages: received, rejected | dispatched (router); attempt (one per downstream call), receipt
(pool, or router for rejections). Params never appear: only their names and a digest taken
after sensitive fields were redacted. A binding's ``audit_level`` chooses how much is written:
``full`` every stage, ``summary`` the receipt only, ``none`` nothing.
"""
from __future__ import annotations

import hashlib
import json
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import redis

TRACE_KEY = "reach:trace:"
TRACE_TTL_SECONDS = 24 * 3600
TRACE_MAX_EVENTS = 50

_stdout_lock = threading.Lock()


def write_stdout(lines: list[str]) -> None:
    """Audit lines go to stdout as bare JSON, one per line, whatever the log format. Written
    directly, one write per batch: through ``logging`` (caller lookup, a handler lock per line)
    they cost more CPU than everything else the audit does."""
    text = "\n".join(lines) + "\n"
    with _stdout_lock:
        sys.stdout.write(text)
        sys.stdout.flush()


def params_digest(redacted_params: Any) -> str:
    canonical = json.dumps(redacted_params, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


class Audit:
    def __init__(self, client: redis.Redis | None, process: str,
                 write: Callable[[list[str]], None] = write_stdout) -> None:
        self._client = client
        self._process = process
        self._write = write

    def event(self, stage: str, intent_id: str, *, level: str = "full", **fields: Any) -> None:
        self.events(intent_id, [(stage, fields)], level=level)

    def events(self, intent_id: str, stages: list[tuple[str, dict[str, Any]]], *, level: str = "full") -> None:
        """Several stages at once: one log line each, one Redis round trip for all."""
        if self._client is None:
            self.queue(None, intent_id, stages, level=level)
            return
        pipe = self._client.pipeline(transaction=False)
        if self.queue(pipe, intent_id, stages, level=level):
            try:
                pipe.execute()
            except redis.RedisError:
                pass  # the log lines are the record of truth; `reach trace` just misses these stages

    def queue(self, pipe: Any, intent_id: str, stages: list[tuple[str, dict[str, Any]]], *, level: str = "full") -> bool:
        """Log the stages now and add their Redis writes to ``pipe`` (sent with the caller's other
        writes). False when nothing was to be written."""
        lines = []
        now = round(time.time(), 6)
        for stage, fields in stages:
            if level == "none" or (level == "summary" and stage != "receipt"):
                continue
            doc = {"ts": fields.pop("ts", now), "event": "reach.audit", "stage": stage, "intent_id": intent_id,
                   "process": self._process, **{k: v for k, v in fields.items() if v is not None}}
            lines.append(json.dumps(doc, separators=(",", ":"), ensure_ascii=True, default=str))
        if not lines:
            return False
        self._write(lines)
        if pipe is None:
            return False
        pipe.rpush(TRACE_KEY + intent_id, *lines)
        pipe.ltrim(TRACE_KEY + intent_id, -TRACE_MAX_EVENTS, -1)
        pipe.expire(TRACE_KEY + intent_id, TRACE_TTL_SECONDS)
        return True


def read_trace(client: redis.Redis, intent_id: str) -> list[dict[str, Any]]:
    """The recorded stages in time order (router and pool write concurrently)."""
    return sorted((json.loads(raw) for raw in client.lrange(TRACE_KEY + intent_id, 0, -1)), key=lambda e: e["ts"])
