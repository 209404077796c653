"""The sql adapter's PostgreSQL dialect: a URL ``postgresql://``, driver psycopg 3. What every
dialect shares (the pool, one transaction per call, the watchdog, what a failure before or during
COMMIT means, the bounds and shape of ``data``) is in transaction.py; this module says how
PostgreSQL begins a transaction, calls a routine and reports errors.

An action names ``procedure: schema.name`` (``CALL``) or ``function: schema.name`` (``SELECT * FROM``).
The params are bound as query parameters, in the order the action's ``input`` declares them, each
as text of PostgreSQL's "unknown" type (as a quoted literal would be), so the routine's own
parameter types read them; a JSON object goes as its JSON text (for a json/jsonb argument), a
list as an array. The routine name (already restricted by the spec's ROUTINE_NAME) is composed
with ``psycopg.sql.Identifier``: always a quoted identifier, matched exactly as the catalog writes
it (a reserved word or capitals work; write lowercase for routines created without quotes). That
is psycopg's escaping for the live connection, not text spliced into SQL; SQLAlchemy's
``quoted_name`` only marks names for SQLAlchemy's own constructs, and it has none for ``CALL``.
SQLAlchemy keeps the connection pool (one engine per pool process, sized to its threads); the
statements go through psycopg 3 on the pooled connection.

Each call, on one connection::

    BEGIN
    SELECT set_config('statement_timeout', <timeout>, true), ...      reads also transaction_read_only
    CALL "schema"."name"($1, $2, NULL)  |  SELECT * FROM "schema"."name"($1, $2) LIMIT <max_rows + 1>
    COMMIT (write actions) | ROLLBACK (reads)

The transaction also carries ``reach.intent_id``, ``reach.agent_id`` and ``reach.idempotency_key``
(``current_setting('reach.idempotency_key', true)`` in a routine), so a routine can deduplicate
by key itself. ``data`` is ``{"result": v}`` for a function returning one value (one composite or
OUT record: an object), ``{"rows": [...]}`` for a set-returning one (at most ``max_rows``, then an
``_reach_omitted`` note), and the OUT/INOUT values as an object for a procedure (NULLs are passed
for its OUT arguments: the signature is read from pg_proc once).

SQLSTATE -> reach code (sent=False unless said otherwise; docs/contract.md keeps the same table):

    connect failed (refused, DNS, timeout, too many clients)   DOWNSTREAM_UNREACHABLE
    28xxx invalid authorization, 42501 insufficient privilege   DOWNSTREAM_AUTH_FAILED
    23xxx integrity constraint (unique, foreign key, check...)   DOWNSTREAM_CONFLICT
    P0001 raise_exception, 22xxx data exception                  DOWNSTREAM_VALIDATION_FAILED (its message; HINT as suggestion)
    P0002 no_data_found                                          DOWNSTREAM_NOT_FOUND
    57014 query_canceled (the statement timeout)                 DOWNSTREAM_TIMEOUT
    40001 serialization failure, 40P01 deadlock                  DOWNSTREAM_ERROR (retried: rolled back)
    25006 read_only_sql_transaction (a read action that writes)  DOWNSTREAM_CONTRACT_VIOLATION
    42xxx, 3F000 (no such routine/table/schema, wrong types)     DOWNSTREAM_ERROR (the catalog and the database differ)
    connection lost before COMMIT                                DOWNSTREAM_ERROR
    no answer by timeout + 1 s, before COMMIT                    DOWNSTREAM_TIMEOUT
    connection lost / no answer during COMMIT                    OUTCOME_UNKNOWN, sent=True
                                                                 (DOWNSTREAM_ERROR / _TIMEOUT, sent=True, if safe to repeat)
    any other SQLSTATE                                           DOWNSTREAM_ERROR
    a param the driver refuses to send (psycopg: a NUL in text,  VALIDATION_FAILED (rejected: nothing was
      a character the client encoding lacks)                     sent; not retried, not counted by the breaker)

Connecting is bounded by libpq's ``connect_timeout``; rows by ``LIMIT``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql
from psycopg.types.json import set_json_loads
from sqlalchemy import event
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.pool import ConnectionPoolEntry

from connectors.adapters.auth import read_secret
from connectors.adapters.base import AdapterOptions, CallContext, Outcome
from connectors.adapters.sql.results import Shape
from connectors.adapters.sql.transaction import MISMATCH, SUGGESTIONS, Settings, SqlAdapterBase
from connectors.adapters.sql.urls import database_url
from connectors.spec import ActionSpec, ConnectorSpec, FieldSpec
from producers.formats import json_depth
from producers.wire import ErrorCode

CONNECT_TIMEOUT = 5  # libpq connect_timeout, seconds (whole seconds; libpq treats 1 as 2)
# libpq settings a DSN may set itself; these are the defaults when it does not
_CONNECT_DEFAULTS = {
    "connect_timeout": CONNECT_TIMEOUT,
    # a peer that vanished (host down, network cut) is noticed within ~20 s even mid-statement
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 2,
}


_LOOKUP = """
SELECT p.prokind::text, p.proretset, p.prorettype::regtype::text, t.typtype::text,
       p.pronargs, p.pronargdefaults, p.proargmodes::text[], p.proargnames
FROM pg_catalog.pg_proc p
JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
JOIN pg_catalog.pg_type t ON t.oid = p.prorettype
WHERE p.proname = %(name)s
  AND CASE WHEN %(schema)s::text IS NULL THEN pg_catalog.pg_function_is_visible(p.oid)
           ELSE n.nspname = %(schema)s END
"""
_SETTINGS = (
    "SELECT pg_catalog.set_config('statement_timeout', %(timeout)s, true),"
    " pg_catalog.set_config('reach.intent_id', %(intent)s, true),"
    " pg_catalog.set_config('reach.agent_id', %(agent)s, true),"
    " pg_catalog.set_config('reach.idempotency_key', %(key)s, true)"
)
_READ_ONLY = ", pg_catalog.set_config('transaction_read_only', 'on', true)"


@dataclass(frozen=True)
class _Routine:
    """How to call one action's routine: its statement (without params) and its result's shape."""

    statement: sql.Composed
    shape: Shape


class SqlAdapter(SqlAdapterBase[_Routine]):
    """Calls one connector's PostgreSQL routines; one instance per pool process, called from many threads."""

    driver_errors = (psycopg.Error,)

    def __init__(self, connector: ConnectorSpec, options: AdapterOptions) -> None:
        url = database_url(read_secret(connector.dsn_env, connector.name, options.environ), connector)
        if url.get_backend_name() != "postgresql":
            raise ValueError(f"connector {connector.name}: {connector.dsn_env} does not name a PostgreSQL database")
        connect_args: dict[str, Any] = {k: v for k, v in _CONNECT_DEFAULTS.items() if k not in url.query}
        if "application_name" not in url.query:
            connect_args["application_name"] = f"agent-reach {connector.name}"
        super().__init__(connector, options, url, connect_args)
        event.listen(self._engine, "connect", self._on_connect)

    def _on_connect(self, dbapi_connection: Any, record: ConnectionPoolEntry) -> None:
        # json/jsonb values are parsed only when they nest within the limit (json.loads recurses)
        set_json_loads(self._loads, dbapi_connection)

    def _setup(self, conn: psycopg.Connection[Any], settings: Settings | None) -> None:
        if settings is None:
            conn.execute(b"SELECT 1")
            return
        values = {
            "timeout": str(max(1, int(settings.timeout * 1000))),
            "intent": settings.intent,
            "agent": settings.agent,
            "key": settings.key,
        }
        conn.execute((_SETTINGS + (_READ_ONLY if settings.read_only else "")).encode(), values)

    def _run(self, conn: psycopg.Connection[Any], action: ActionSpec, args: list[Any], ctx: CallContext) -> Any:
        with conn.cursor() as cursor:
            routine = self._routine(cursor, action, len(args))
            limit = [] if routine.shape == "call" else [self._max_rows + 1]
            with self._sending_params():
                cursor.execute(routine.statement, [*args, *limit])
            return self._data(cursor, routine.shape, ctx)

    def _bind(self, value: Any, spec: FieldSpec) -> Any:
        return _bind(value, spec)

    def _unsendable(self, exc: BaseException) -> bool:
        # psycopg dumps every param before it sends the statement: a DataError without a SQLSTATE
        # (a NUL in text) or an encoding error comes from there; the server's own carry a SQLSTATE
        if isinstance(exc, psycopg.DataError):
            return exc.sqlstate is None
        return isinstance(exc, UnicodeEncodeError)

    def _is_mismatch(self, exc: Exception) -> bool:
        return (getattr(exc, "sqlstate", None) or "").startswith("42")

    def _lost(self, conn: psycopg.Connection[Any]) -> bool:
        return conn.broken or conn.closed

    def _socket(self, conn: psycopg.Connection[Any]) -> int:
        return conn.pgconn.socket

    def _routine(self, cursor: psycopg.Cursor[Any], action: ActionSpec, nargs: int) -> _Routine:
        """The statement for ``action`` with ``nargs`` params. The routine's signature is read from
        pg_proc once (then cached) for the NULLs a procedure's OUT arguments need in a CALL and for
        the shape of a function's result; an overloaded name that does not resolve to one signature
        gets the params alone (and its answer as rows)."""
        kind = "procedure" if action.procedure else "function"
        name = action.procedure or action.function or ""
        cached = self._routines.get((name, nargs))
        if cached is not None:
            return cached
        schema, _, proname = name.rpartition(".")
        cursor.execute(_LOOKUP.encode(), {"name": proname, "schema": schema or None})
        candidates = cursor.fetchall()
        target = sql.Identifier(*name.split("."))
        given: list[sql.Composable] = [sql.Placeholder()] * nargs
        if kind == "procedure":
            signatures = [c[6] or ["i"] * c[4] for c in candidates if c[0] == "p"]
            fitting = [modes for modes in signatures if sum(m != "o" for m in modes) >= nargs]
            arguments = _call_arguments(fitting[0], nargs) if len(fitting) == 1 else given
            statement = sql.SQL("CALL {}({})").format(target, sql.SQL(", ").join(arguments))
            routine = _Routine(statement, "call")
        else:
            shapes = {_function_shape(c) for c in candidates if c[0] == "f" and c[4] - c[5] <= nargs <= c[4]}
            shape: Shape = shapes.pop() if len(shapes) == 1 else "rows"
            statement = sql.SQL("SELECT * FROM {}({}) LIMIT {}").format(
                target, sql.SQL(", ").join(given), sql.Placeholder()
            )
            routine = _Routine(statement, shape)
        if candidates:
            self._routines[(name, nargs)] = routine  # a missing routine is looked up again next time
        return routine

    def _loads(self, data: bytes | bytearray | memoryview | str) -> Any:
        text = data if isinstance(data, str) else bytes(data).decode("utf-8")
        if text.count("[") + text.count("{") > self._max_depth and (depth := json_depth(text)) > self._max_depth:
            return {"_reach_omitted": f"a JSON value nests {depth} levels; the limit is {self._max_depth}"}
        return json.loads(text)

    # -- failures -------------------------------------------------------------------------------

    def _server_error(
        self, exc: Exception, action: ActionSpec, params: dict[str, Any], timeout: float, started: float
    ) -> Outcome:
        """An error PostgreSQL reported: the transaction was rolled back."""
        assert isinstance(exc, psycopg.Error)
        state = exc.sqlstate or ""
        diag = exc.diag
        text = diag.message_primary or str(exc).strip() or type(exc).__name__
        hint = diag.message_hint
        code = sqlstate_code(state)
        routine = action.procedure or action.function
        mismatch = code is ErrorCode.DOWNSTREAM_ERROR and state.startswith(("42", "3F"))
        if state == "57014":
            message = f"PostgreSQL cancelled the statement (statement timeout {timeout:g}s); nothing was committed"
        elif state == "25006":
            message = f"{routine} tried to write, but {action.action} is declared read-only ({text})"
        elif mismatch:
            message = f"{routine}: {text} [SQLSTATE {state}]"
        else:
            detail = diag.message_detail if state.startswith(("23", "P0")) else None
            message = f"{text} ({detail})" if detail else text
        if mismatch:
            suggestion = MISMATCH
        elif hint and code is ErrorCode.DOWNSTREAM_VALIDATION_FAILED:
            suggestion = hint  # the routine's own advice (RAISE ... USING HINT)
        else:
            suggestion = SUGGESTIONS.get(code, "See the error message.")
        return self._outcome(
            code,
            self._scrub(message, action, params),
            self._scrub(suggestion, action, params),
            started,
        )

    def _auth_refused(self, exc: Exception, reason: str) -> bool:
        state = getattr(exc, "sqlstate", None) or ""
        return state.startswith("28") or any(words in reason for words in _AUTH_WORDS)

    def _reason(self, exc: BaseException) -> str:
        """libpq's own reason, without the host part or the password: "Connection refused",
        "password authentication failed for user "shop"", ..."""
        source = getattr(exc, "orig", None) or exc
        if isinstance(source, SQLAlchemyError):
            return type(source).__name__  # the pool's own (a checkout timeout)
        lines = str(source).strip().splitlines()
        text = lines[0].rsplit(" failed: ", 1)[-1].removeprefix("FATAL:").strip() if lines else ""
        text = text or type(source).__name__
        if self._password:
            text = text.replace(self._password, "***")
        return text[:200]


_AUTH_WORDS = ("authentication failed", "no pg_hba.conf entry", 'role "', "permission denied")


def sqlstate_code(state: str) -> ErrorCode:
    """The reach code for a SQLSTATE PostgreSQL reported (the transaction was rolled back)."""
    if state == "57014":
        return ErrorCode.DOWNSTREAM_TIMEOUT
    if state == "25006":
        return ErrorCode.DOWNSTREAM_CONTRACT_VIOLATION
    if state.startswith("28") or state == "42501":
        return ErrorCode.DOWNSTREAM_AUTH_FAILED
    if state.startswith("23"):
        return ErrorCode.DOWNSTREAM_CONFLICT
    if state == "P0002":
        return ErrorCode.DOWNSTREAM_NOT_FOUND
    if state == "P0001" or state.startswith("22"):
        return ErrorCode.DOWNSTREAM_VALIDATION_FAILED
    return ErrorCode.DOWNSTREAM_ERROR  # 40001/40P01 (retried: rolled back), 42xxx (catalog vs database), ...


def _bind(value: Any, spec: FieldSpec) -> Any:
    """An agent's value as a query parameter: text of PostgreSQL's "unknown" type, as a quoted
    literal would be, so the routine's own parameter types read it ("12.5" becomes a numeric or a
    float8, "7" an int or a bigint, "true" a boolean, "2026-01-31" a date; a value the type cannot
    hold is the database's data exception). A list becomes an array of such texts; a JSON object (or
    an array of objects or arrays) goes as its JSON text, for a json/jsonb argument."""
    if value is None:
        return None
    nested = spec.type == "array" and spec.items is not None and spec.items.type in ("object", "array")
    if spec.type == "object" or nested:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    if isinstance(value, list):
        return [_bind(v, spec.items or FieldSpec()) for v in value]
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)  # the shortest text that reads back as the same number: 0.1 stays 0.1
    return str(value)


def _call_arguments(modes: list[str], nargs: int) -> list[sql.Composable]:
    """A CALL's arguments for a procedure whose arguments have ``modes`` (``i``, ``o``, ``b`` for
    INOUT, ``v``): the params fill the input positions in order, each OUT argument gets the NULL
    PostgreSQL wants in its place, and so does an INOUT one once the params are used up. Input
    arguments past the params are left out (their defaults apply; PostgreSQL allows no OUT after them)."""
    arguments: list[sql.Composable] = []
    given = 0
    for mode in modes:
        if mode == "o" or (mode == "b" and given == nargs):
            arguments.append(sql.NULL)
        elif given < nargs:
            arguments.append(sql.Placeholder())
            given += 1
        else:
            break
    return arguments + [sql.Placeholder()] * (nargs - given)  # too many params: PostgreSQL says so


def _function_shape(signature: Sequence[Any]) -> Shape:
    _, returns_set, return_type, type_kind = signature[:4]
    if returns_set:
        return "rows"
    if return_type == "void":
        return "void"
    if type_kind == "c" or return_type == "record":
        return "record"
    return "scalar"
