"""The conformance kit's fake system in PostgreSQL: a schema of its own (dropped on close) whose
routine does what the kit's script says. A routine cannot call back into the kit, so the script is
mirrored into a table on every play, and the requests are counted by a sequence (which a rollback
does not undo: a rolled-back attempt still reached the database).

Both kit actions are writes (the read is an idempotent one): a read-only transaction could not take
its script row. A ``deep`` answer is at most 1,000 levels: PostgreSQL's own JSON parser stops past
its stack depth, and 1,000 is far past what an adapter may pass on (``REACH_MAX_DEPTH``).
"""

from __future__ import annotations

import json
import uuid
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg

from connectors.adapters.builtin.fixtures import closed_port
from connectors.adapters.kit import Downstream, Fixture, KitContext, Received, Reply

MAX_DEEP = 1000

_ROUTINES = """
CREATE SCHEMA {s};
CREATE TYPE {s}.answer AS (seen text, blob text, a json);
CREATE TABLE {s}.script (n bigserial PRIMARY KEY, kind text NOT NULL, seconds float8, message text,
    size int, depth int, data json, fallback bool NOT NULL DEFAULT false, echo bool NOT NULL DEFAULT false);
CREATE SEQUENCE {s}.attempts;
CREATE FUNCTION {s}.kit_call(q text) RETURNS {s}.answer LANGUAGE plpgsql AS $$
DECLARE r {s}.script; result {s}.answer;
BEGIN
  PERFORM nextval('{s}.attempts');
  SELECT * INTO r FROM {s}.script WHERE NOT fallback ORDER BY n LIMIT 1 FOR UPDATE SKIP LOCKED;
  IF FOUND THEN
    DELETE FROM {s}.script WHERE n = r.n;
  ELSE
    SELECT * INTO r FROM {s}.script WHERE fallback LIMIT 1;
  END IF;
  IF r.kind = 'hang' THEN PERFORM pg_sleep(r.seconds); END IF;
  IF r.kind = 'fail' THEN RAISE EXCEPTION USING ERRCODE = 'XX000', MESSAGE = r.message; END IF;
  IF r.kind = 'huge' THEN result.blob := repeat('x', r.size); RETURN result; END IF;
  IF r.kind = 'deep' THEN
    result.a := (repeat('{{"a":', least(r.depth, {deep})) || '1' || repeat('}}', least(r.depth, {deep})))::json;
    RETURN result;
  END IF;
  IF r.echo THEN result.seen := substring(q from 'kit-[0-9]+-[0-9]+'); RETURN result; END IF;
  result.seen := r.data->>'seen';
  RETURN result;
END $$;
CREATE FUNCTION {s}.kit_read(q text) RETURNS {s}.answer LANGUAGE plpgsql AS $$
BEGIN RETURN {s}.kit_call(q); END $$;
CREATE FUNCTION {s}.kit_write(q text) RETURNS {s}.answer LANGUAGE plpgsql AS $$
BEGIN RETURN {s}.kit_call(q); END $$;
"""


def _libpq(url: str) -> str:
    """A SQLAlchemy URL (``postgresql+psycopg://``) as psycopg takes it."""
    parts = urlsplit(url)
    return urlunsplit(("postgresql", *parts[1:]))


def sql_fixture(downstream: Downstream, context: KitContext) -> Fixture:
    """The sql type against the PostgreSQL database the kit is given (``--database-env``)."""
    if not context.database_url:
        raise ValueError("the sql kit needs a PostgreSQL database it may add a schema to: pass --database-env VAR")
    url = context.database_url
    schema = f"reach_kit_{uuid.uuid4().hex[:10]}"
    admin = psycopg.connect(_libpq(url), autocommit=True)
    admin.execute(_ROUTINES.format(s=schema, deep=MAX_DEEP).encode())

    def mirror(replies: list[Reply], then: Reply, echo: bool) -> None:
        rows = [(r, False) for r in replies] + [(then, True)]
        with admin.transaction():
            admin.execute(f"DELETE FROM {schema}.script".encode())
            for reply, fallback in rows:
                admin.execute(
                    f"INSERT INTO {schema}.script (kind, seconds, message, size, depth, data, fallback, echo)"
                    " VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
                    (
                        reply.kind,
                        reply.seconds,
                        reply.message,
                        reply.size,
                        reply.depth,
                        json.dumps(reply.data),
                        fallback,
                        echo and fallback,
                    ),
                )
            admin.execute(f"SELECT setval('{schema}.attempts', 1, false)".encode())

    def seen() -> list[Received]:
        row = admin.execute(f"SELECT last_value, is_called FROM {schema}.attempts".encode()).fetchone()
        count = int(row[0]) if row is not None and row[1] else 0
        return [Received(None, "")] * count

    downstream.attach(mirror, seen)
    mirror([], Reply("answer", data={"ok": True}), False)
    parts = urlsplit(url)
    dead = urlunsplit((parts.scheme, f"kit:kit@127.0.0.1:{closed_port()}", parts.path, "", ""))

    def connector(reachable: bool, idempotency: bool) -> dict[str, Any]:
        return {
            "name": "kit",
            "type": "sql",
            "dsn_env": "KIT_SQL_URL" if reachable else "KIT_DEAD_SQL_URL",
            "actions": [
                {
                    "action": "kit_read",
                    "description": "Ask the kit's routine (an idempotent write: it takes its script row).",
                    "function": f"{schema}.kit_read",
                    "permission": "write",
                    "idempotent": True,
                    "input": {"q": {"type": "string"}},
                },
                {
                    "action": "kit_write",
                    "description": "Tell the kit's routine to do something.",
                    "function": f"{schema}.kit_write",
                    "permission": "write",
                    "input": {"q": {"type": "string"}},
                },
            ],
        }

    def close() -> None:
        try:
            admin.execute(f"DROP SCHEMA {schema} CASCADE".encode())
        finally:
            admin.close()

    # the credential watched for is the database URL with its password, whole
    return Fixture(connector=connector, close=close, secret=url, environ={"KIT_SQL_URL": url, "KIT_DEAD_SQL_URL": dead})
