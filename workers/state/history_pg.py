"""History records in PostgreSQL (REACH_HISTORY_URL), for retention longer than Redis memory allows.

One table, ``reach_history``: a row per index entry of a record (the action's, and one per entity
value), each carrying the record's jsonb, so every question is one index range scan on
``(agent, entity, value_hash, at_ms)``. The action's entry has ``entity`` ``@action`` and the
digest of ``connector.action``; an entity's has the entity's name and the digest of its value
(connectors.history.value_digest: no agent text in an indexed column). The table is partitioned
by month of ``at_ms``; ``reach history migrate`` creates it, the partitions of this month and the
next, and drops those wholly past the longest retention. A write into a month that has no partition
yet creates it. A record past its own retention (``expires_ms``) is never answered.

The schema is created by the command, never at import or on start: a fleet whose database user
may only read and write rows works as well.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg import sql

from connectors.history import INDEX_CAP, Record, value_digest
from workers.state.history import HistoryError, Page, Query, collect, parse_cursor

TABLE = "reach_history"
ACTION_ENTITY = "@action"  # never an entity name: those start with a letter

SCHEMA = f"""
CREATE TABLE IF NOT EXISTS {TABLE} (
    agent text NOT NULL,
    entity text NOT NULL,
    value_hash text NOT NULL,
    at_ms bigint NOT NULL,
    intent_id text NOT NULL,
    connector text NOT NULL,
    action text NOT NULL,
    status text NOT NULL,
    expires_ms bigint NOT NULL,
    record jsonb NOT NULL
) PARTITION BY RANGE (at_ms);
CREATE INDEX IF NOT EXISTS {TABLE}_lookup ON {TABLE} (agent, entity, value_hash, at_ms DESC, intent_id DESC);
CREATE INDEX IF NOT EXISTS {TABLE}_intent ON {TABLE} (agent, intent_id);
"""


def month_bounds(at_ms: int) -> tuple[str, int, int]:
    """The partition of the month holding ``at_ms``: (name, first ms, first ms of the next month)."""
    day = datetime.fromtimestamp(at_ms / 1000, UTC)
    start = datetime(day.year, day.month, 1, tzinfo=UTC)
    end = datetime(day.year + (day.month == 12), day.month % 12 + 1, 1, tzinfo=UTC)
    return f"{TABLE}_y{day.year:04d}m{day.month:02d}", int(start.timestamp() * 1000), int(end.timestamp() * 1000)


class PostgresHistory:
    """The history store of a fleet with REACH_HISTORY_URL set. One connection, shared by the
    process's threads one at a time, opened on first use and again after it broke."""

    def __init__(self, url: str, connect_timeout: int = 5) -> None:
        self.url = url.replace("postgresql+psycopg://", "postgresql://", 1)
        self.connect_timeout = connect_timeout
        self._conn: psycopg.Connection[Any] | None = None
        self._lock = threading.Lock()
        self._partitions: set[str] = set()

    def _run(self, work: Callable[[psycopg.Cursor[Any]], Any]) -> Any:
        with self._lock:
            if self._conn is None or self._conn.closed:
                self._conn = psycopg.connect(self.url, autocommit=True, connect_timeout=self.connect_timeout)
            try:
                with self._conn.cursor() as cur:
                    return work(cur)
            except psycopg.OperationalError:
                self._conn.close()
                self._conn = None
                raise

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    # -- schema ----------------------------------------------------------------------------

    def migrate(self, longest_retention_seconds: int, now_ms: int | None = None) -> list[str]:
        """Create the table and this month's and next month's partitions; drop partitions whose
        every record is past ``longest_retention_seconds``. Returns what it did, for people."""
        now = now_ms if now_ms is not None else int(time.time() * 1000)
        done: list[str] = []

        def work(cur: psycopg.Cursor[Any]) -> None:
            cur.execute(SCHEMA)
            for at in (now, month_bounds(now)[2]):
                done.append(self._create_partition(cur, at))
            cutoff = now - longest_retention_seconds * 1000
            cur.execute(
                "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
                "JOIN pg_class p ON p.oid = i.inhparent WHERE p.relname = %s",
                (TABLE,),
            )
            for (name,) in cur.fetchall():
                bounds = _parse_partition(name)
                if bounds is not None and bounds[1] <= cutoff:
                    cur.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(name)))
                    done.append(f"dropped {name}")

        self._run(work)
        return done

    def _create_partition(self, cur: psycopg.Cursor[Any], at_ms: int) -> str:
        name, start, end = month_bounds(at_ms)
        cur.execute(
            sql.SQL("CREATE TABLE IF NOT EXISTS {} PARTITION OF {} FOR VALUES FROM ({}) TO ({})").format(
                sql.Identifier(name), sql.Identifier(TABLE), sql.Literal(start), sql.Literal(end)
            )
        )
        self._partitions.add(name)
        return f"partition {name}"

    # -- writing -----------------------------------------------------------------------------

    def write(self, records: Sequence[Record]) -> None:
        rows = [row for rec in records for row in _rows(rec)]
        if not rows:
            return

        def work(cur: psycopg.Cursor[Any]) -> None:
            for rec in records:
                if month_bounds(rec.at_ms)[0] not in self._partitions:
                    self._create_partition(cur, rec.at_ms)
            cur.executemany(
                f"INSERT INTO {TABLE} (agent, entity, value_hash, at_ms, intent_id, connector, action, status, "
                "expires_ms, record) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s::jsonb)",
                rows,
            )

        self._run(work)

    # -- reading -----------------------------------------------------------------------------

    def query(self, agent: str, query: Query, visible: Callable[[str, str], bool]) -> Page:
        if query.entity is not None:
            entity, digest = query.entity[0], value_digest(query.entity[1])
        elif query.action is not None:
            entity, digest = ACTION_ENTITY, value_digest(".".join(query.action))
        else:
            raise HistoryError("ask by an entity and its id, or by an action")
        after = parse_cursor(query.cursor) if query.cursor is not None else None
        return collect(self._walk(agent, entity, digest, after, query, int(time.time() * 1000)), query, visible)

    def _walk(
        self, agent: str, entity: str, digest: str, after: tuple[int, str] | None, query: Query, now: int
    ) -> Iterator[tuple[int, str, dict[str, Any]]]:
        """Rows newest first, in pages that follow the index (the first just big enough for the
        answer); at most INDEX_CAP read, as the Redis store does."""
        where = ["agent = %s", "entity = %s", "value_hash = %s", "expires_ms > %s"]
        args: list[Any] = [agent, entity, digest, now]
        if query.since_ms is not None:
            where.append("at_ms >= %s")
            args.append(query.since_ms)
        if query.status is not None:
            where.append("status = %s")
            args.append(query.status)
        select = f"SELECT at_ms, intent_id, record FROM {TABLE} WHERE {' AND '.join(where)} "
        order = "ORDER BY at_ms DESC, intent_id DESC LIMIT %s"
        seen: set[str] = set()
        read, size = 0, query.limit + 1
        while read < INDEX_CAP:
            size = min(size, INDEX_CAP - read)
            if after is None:
                statement, values = select + order, [*args, size]
            else:  # keyset: on from the last row, through the index
                statement, values = select + "AND (at_ms, intent_id) < (%s, %s) " + order, [*args, *after, size]
            rows = self._run(lambda cur: cur.execute(statement, values).fetchall())
            read += len(rows)
            for at_ms, intent_id, record in rows:
                after = (int(at_ms), str(intent_id))
                if intent_id in seen:
                    continue
                seen.add(intent_id)
                yield int(at_ms), str(intent_id), record if isinstance(record, dict) else json.loads(record)
            if len(rows) < size:
                return
            size = min(size * 4, 200)  # filtered out more than expected: read on in bigger pages

    # -- erasing -----------------------------------------------------------------------------

    def purge(self, agent: str, entity: tuple[str, str] | None = None) -> int:
        if entity is None:
            return int(self._run(lambda cur: cur.execute(f"DELETE FROM {TABLE} WHERE agent = %s", (agent,)).rowcount))
        statement = (
            f"DELETE FROM {TABLE} WHERE agent = %s AND intent_id IN "
            f"(SELECT intent_id FROM {TABLE} WHERE agent = %s AND entity = %s AND value_hash = %s)"
        )
        args = (agent, agent, entity[0], value_digest(entity[1]))
        return int(self._run(lambda cur: cur.execute(statement, args).rowcount))


def _rows(rec: Record) -> list[tuple[Any, ...]]:
    body = rec.body.decode()
    expires = rec.at_ms + rec.retain_seconds * 1000
    common = (rec.at_ms, rec.intent_id, rec.connector, rec.action, rec.status, expires, body)
    index = [(ACTION_ENTITY, value_digest(f"{rec.connector}.{rec.action}"))]
    index += [(name, value_digest(value)) for name, value in rec.entities]
    return [(rec.agent, name, digest, *common) for name, digest in index]


def _parse_partition(name: str) -> tuple[int, int] | None:
    """The (first ms, end ms) of a partition this module named, else None."""
    prefix = f"{TABLE}_y"
    if not name.startswith(prefix) or len(name) != len(prefix) + 7:
        return None
    try:
        year, month = int(name[len(prefix) : len(prefix) + 4]), int(name[-2:])
        start = datetime(year, month, 1, tzinfo=UTC)
    except ValueError:
        return None
    _, first, end = month_bounds(int(start.timestamp() * 1000))
    return first, end
