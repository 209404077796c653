"""History records in Redis, and the small interface every history store offers.

A record (connectors/history.py: one dispatched intent's receipt, projected to its action's
declared fields) is a string under ``keys.history_record`` that expires with its retention. It is
found through sorted sets scored by the record's time in ms, one per entity value
(``keys.history_entity``: the value's digest, never its text) and one per action
(``keys.history_action``). Every key is under the agent's tag: one Lua script writes a record and
its indexes together, in the pool's round trip that stores the receipt, and nothing of one agent
reaches another's keys. Each index write trims the index to the longest retention of the catalog
and to ``INDEX_CAP`` members, and keeps it expiring; an index may still name a record whose shorter
retention ran out, which a query skips.

A query reads one index newest first, in batches, and stops after ``INDEX_CAP`` members however
many it skipped: an answer's cost is bounded whatever the records say.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import redis

from connectors.history import INDEX_CAP, READ_BUDGET, Record, value_digest
from workers.state import keys
from workers.state.client import eval_into

# KEYS: the record, then its indexes. ARGV: body, record ttl ms, score (ms), index cutoff (ms,
# members scored below it go), cap per index, member (the intent id), index ttl ms
_WRITE = """
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
for i = 2, #KEYS do
  redis.call('ZADD', KEYS[i], ARGV[3], ARGV[6])
  redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', '(' .. ARGV[4])
  redis.call('ZREMRANGEBYRANK', KEYS[i], 0, -(tonumber(ARGV[5]) + 1))
  if redis.call('PTTL', KEYS[i]) < tonumber(ARGV[7]) then
    redis.call('PEXPIRE', KEYS[i], ARGV[7])
  end
end
return 1
"""

BATCH = 100  # index members read per round trip while answering
CURSOR = re.compile(r"^(\d{1,15}):(.{1,256})$", re.DOTALL)


class HistoryError(ValueError):
    """A query the store cannot answer as asked (a cursor that is not one of its own)."""


@dataclass(frozen=True)
class Query:
    """What ``reach.history`` asks: one entity value, or one action (``connector.action``)."""

    entity: tuple[str, str] | None = None  # (name, value)
    action: tuple[str, str] | None = None  # (connector, action); ("", name) for a workflow's runs
    since_ms: int | None = None
    status: str | None = None
    limit: int = 20
    cursor: str | None = None


@dataclass(frozen=True)
class Page:
    records: list[dict[str, Any]]
    next_cursor: str | None = None


@dataclass
class _Position:
    """Where a query goes on: the score and member of the last record it gave."""

    score: int | None = None
    member: str = ""
    seen: set[str] = field(default_factory=set)


def parse_cursor(cursor: str) -> tuple[int, str]:
    match = CURSOR.match(cursor)
    if match is None:
        raise HistoryError("not a cursor this fleet gave; send next_cursor of the previous answer as it was")
    return int(match.group(1)), match.group(2)


def make_cursor(score: int, member: str) -> str:
    return f"{score}:{member}"


class HistoryStore(Protocol):
    """What the fleet asks of a history store (Redis here, PostgreSQL in workers/state/history_pg.py)."""

    def write(self, records: Sequence[Record]) -> None: ...

    def query(self, agent: str, query: Query, visible: Callable[[str, str], bool]) -> Page: ...

    def purge(self, agent: str, entity: tuple[str, str] | None = None) -> int: ...


class RedisHistory:
    """History records and their indexes in the fleet's Redis.

    ``index_retention_seconds``: how long an index keeps a member, the catalog's longest retention
    (an index may hold records of actions kept for different times)."""

    def __init__(self, client: redis.Redis, index_retention_seconds: int) -> None:
        self.client = client
        self.index_retention_seconds = index_retention_seconds

    # -- writing -------------------------------------------------------------------------------

    def write_into(self, pipe: Any, rec: Record) -> None:
        """Queue the record and its indexes on a pipeline (the pool's round trip with the receipt)."""
        index_keys = [keys.history_action(rec.agent, rec.connector, rec.action)]
        index_keys += [keys.history_entity(rec.agent, name, value_digest(value)) for name, value in rec.entities]
        index_ms = max(rec.retain_seconds, self.index_retention_seconds) * 1000
        eval_into(
            pipe,
            _WRITE,
            [keys.history_record(rec.agent, rec.intent_id), *index_keys],
            rec.body,
            rec.retain_seconds * 1000,
            rec.at_ms,
            rec.at_ms - self.index_retention_seconds * 1000,
            INDEX_CAP,
            rec.intent_id,
            index_ms,
        )

    def write(self, records: Sequence[Record]) -> None:
        pipe = self.client.pipeline(transaction=False)
        for rec in records:
            self.write_into(pipe, rec)
        pipe.execute()

    # -- reading -------------------------------------------------------------------------------

    def query(self, agent: str, query: Query, visible: Callable[[str, str], bool]) -> Page:
        """The agent's records for ``query``, newest first, at most ``query.limit``; only those
        ``visible(connector, action)`` allows (the actions still bound to the agent)."""
        if query.entity is not None:
            index = keys.history_entity(agent, query.entity[0], value_digest(query.entity[1]))
        elif query.action is not None:
            index = keys.history_action(agent, *query.action)
        else:
            raise HistoryError("ask by an entity and its id, or by an action")
        position = _Position()
        if query.cursor is not None:
            position.score, position.member = parse_cursor(query.cursor)
        return collect(self._walk(agent, index, position, query.since_ms, query.limit + 1), query, visible)

    def _walk(
        self, agent: str, index: str, position: _Position, since_ms: int | None, first: int = BATCH
    ) -> Iterator[tuple[int, str, dict[str, Any]]]:
        """(score, member, record) of the index from the position on, newest first, records that
        are gone skipped; at most INDEX_CAP members read, ``first`` of them in the first round trip
        (what an answer needs when nothing is filtered out), then BATCH at a time."""
        low: int | str = since_ms if since_ms is not None else "-inf"
        high: int | str = position.score if position.score is not None else "+inf"
        offset = 0
        read = 0
        size = min(first, BATCH)
        while read < INDEX_CAP:
            batch = self.client.zrevrangebyscore(index, high, low, start=offset, num=size, withscores=True)
            if not batch:
                return
            offset += len(batch)
            read += len(batch)
            members = [(m.decode() if isinstance(m, bytes) else str(m), int(s)) for m, s in batch]
            if position.score is not None:
                # same ms as the cursor: only members after it (the index orders ties by member, reversed)
                members = [(m, s) for m, s in members if s < position.score or m < position.member]
            members = [(m, s) for m, s in members if m not in position.seen]
            if not members:
                if len(batch) < size:
                    return
                size = BATCH
                continue
            bodies = self.client.mget([keys.history_record(agent, m) for m, _ in members])
            for (member, score), body in zip(members, bodies, strict=True):
                position.seen.add(member)
                if body is None:
                    continue
                try:
                    doc = json.loads(body)
                except ValueError:
                    continue
                if isinstance(doc, dict):
                    yield score, member, doc
            if len(batch) < size:
                return
            size = BATCH

    # -- erasing -------------------------------------------------------------------------------

    def purge(self, agent: str, entity: tuple[str, str] | None = None) -> int:
        """Delete the agent's history (all of it, or one entity value's records and their index
        entries everywhere). Returns how many keys were deleted."""
        if entity is None:
            # the pattern's * could also run across another agent's intent id: keep only this agent's
            own = keys.history_prefixes(agent)
            found = [
                k
                for k in self.client.scan_iter(match=keys.history_match(agent), count=1000)
                if (k.decode() if isinstance(k, bytes) else str(k)).startswith(own)
            ]
            return self._delete(found)
        index = keys.history_entity(agent, entity[0], value_digest(entity[1]))
        members = [m.decode() if isinstance(m, bytes) else str(m) for m in self.client.zrange(index, 0, -1)]
        records = [keys.history_record(agent, m) for m in members]
        bodies = self.client.mget(records) if records else []
        pipe = self.client.pipeline(transaction=False)
        for member, body in zip(members, bodies, strict=True):
            doc = _loads(body)
            if doc is None:
                continue
            pipe.zrem(keys.history_action(agent, str(doc.get("connector") or ""), str(doc.get("action"))), member)
            for pair in doc.get("entities") or []:
                if isinstance(pair, list) and len(pair) == 2:
                    pipe.zrem(keys.history_entity(agent, str(pair[0]), value_digest(str(pair[1]))), member)
        pipe.execute()
        return self._delete([index, *records])

    def _delete(self, names: Sequence[Any]) -> int:
        deleted = 0
        for start in range(0, len(names), 500):
            pipe = self.client.pipeline(transaction=False)
            for name in names[start : start + 500]:
                pipe.delete(name)  # one key a command: a Cluster routes each to its own node
            deleted += sum(int(n) for n in pipe.execute())
        return deleted


def collect(walk: Iterator[tuple[int, str, dict[str, Any]]], query: Query, visible: Callable[[str, str], bool]) -> Page:
    """The answer from a store's walk (newest first): the first ``query.limit`` records that match,
    reading at most READ_BUDGET; ``next_cursor`` where to go on (after the last record given, or
    the last one read when the budget ran out first), None when the index is exhausted."""
    found: list[dict[str, Any]] = []
    last: tuple[int, str] | None = None
    read = 0
    for score, member, doc in walk:
        if read == READ_BUDGET or len(found) == query.limit:
            return Page(found, make_cursor(*last) if last is not None else None)
        read += 1
        last = (score, member)
        if _matches(doc, query, visible):
            found.append(doc)
    return Page(found, None)


def _loads(body: Any) -> dict[str, Any] | None:
    if body is None:
        return None
    try:
        doc = json.loads(body)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def _matches(doc: dict[str, Any], query: Query, visible: Callable[[str, str], bool]) -> bool:
    connector, action = str(doc.get("connector") or ""), str(doc.get("action"))  # "": a workflow run
    if not visible(connector, action):
        return False
    if query.action is not None and (connector, action) != query.action:
        return False
    return query.status is None or doc.get("status") == query.status
