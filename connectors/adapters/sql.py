"""SQL adapter: one semantic action -> one PostgreSQL stored procedure or function, in a transaction
of its own -> one Outcome.

The DSN's scheme picks the dialect (sql_dialects.py): ``postgresql://`` is this module's SqlAdapter,
``mariadb+pymysql://`` / ``mysql+pymysql://`` is sql_mariadb.py; anything else is refused
(``database_url``), by the adapter and by ``reach validate``. SqlAdapterBase holds what the dialects share:
the pool, one transaction per call under the watchdog, the phases of a failure (below), the shape and
bounds of ``data``, and scrubbing; a dialect says how to begin, call a routine and read its errors.
What follows is PostgreSQL's side.

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

What ``sent`` means here: False when the transaction certainly did not commit. An error PostgreSQL
reports for a statement aborts the transaction, which is rolled back, and a connection lost before
COMMIT was sent leaves nothing either (the server rolls back); a statement timeout (57014) is such
an error: cancelled and rolled back, so it did not happen and is safe to retry, even for a write.
Only a connection lost, or silent, *during* COMMIT leaves the outcome unknown: OUTCOME_UNKNOWN for a
write that is not safe to repeat. (Effects outside the transaction, such as sequences, dblink or
files a routine writes, are not rolled back; give such a routine ``retry: {max_attempts: 1}``.)

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

Bounds: the server's ``statement_timeout`` ends a slow statement; a watchdog shuts the socket of a
connection that has not answered ``WATCHDOG_GRACE`` seconds after the action's timeout (a hung
server or proxy); connecting is bounded by libpq's ``connect_timeout``. Instead of pool_pre_ping (a
round trip outside any time bound) the transaction's first statement is the ping: a pooled
connection found dead there (a server restart) renews the pool and the call moves to a new
connection once, before anything of the routine was sent. Rows are capped by ``LIMIT``, the
result's JSON by ``max_result_bytes`` and its nesting by ``max_depth``. The DSN's password is never
logged or put in a message.
"""

from __future__ import annotations

import base64
import json
import logging
import math
import os
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from datetime import time as time_of_day
from decimal import Decimal
from typing import Any, Generic, Literal, TypeVar

import psycopg
from psycopg import sql
from psycopg.types.json import set_json_loads
from sqlalchemy import Engine, create_engine, event, make_url
from sqlalchemy.engine import URL
from sqlalchemy.exc import ArgumentError, SQLAlchemyError
from sqlalchemy.pool import ConnectionPoolEntry, PoolProxiedConnection

from connectors.adapters.auth import read_secret
from connectors.adapters.base import AdapterOptions, CallContext, Outcome, ProbeResult
from connectors.adapters.errors import Unsendable, refused_outcome
from connectors.spec import ActionSpec, ConnectorSpec, FieldSpec
from producers.formats import json_depth, value_depth
from producers.wire import ErrorCode

log = logging.getLogger("reach.sql")

DEFAULT_MAX_ROWS = 1000
DEFAULT_MAX_RESULT_BYTES = 1 << 20
DEFAULT_MAX_DEPTH = 32  # as REACH_MAX_DEPTH's default
WATCHDOG_GRACE = 1.0  # seconds past the action's timeout before the adapter gives up on the connection
CONNECT_TIMEOUT = 5  # libpq connect_timeout, seconds (whole seconds; libpq treats 1 as 2)
MAX_MESSAGE = 500
# libpq settings a DSN may set itself; these are the defaults when it does not
_CONNECT_DEFAULTS = {
    "connect_timeout": CONNECT_TIMEOUT,
    # a peer that vanished (host down, network cut) is noticed within ~20 s even mid-statement
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 2,
}

Shape = Literal["call", "rows", "scalar", "record", "void"]

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

SUGGESTIONS = {
    ErrorCode.DOWNSTREAM_VALIDATION_FAILED: "The database rejected the params; fix them as its message says and send again.",
    ErrorCode.DOWNSTREAM_AUTH_FAILED: "The connector's database credentials or privileges were refused; do not retry. "
    "Tell an operator.",
    ErrorCode.DOWNSTREAM_NOT_FOUND: "The record does not exist; check the id (for example with a search or list action).",
    ErrorCode.DOWNSTREAM_CONFLICT: "The record already exists or breaks a constraint; read its current state before "
    "trying again.",
    ErrorCode.DOWNSTREAM_ERROR: "The database failed; nothing was committed. Retry later.",
    ErrorCode.DOWNSTREAM_TIMEOUT: "Nothing was committed; retry later, or with less work per call.",
    ErrorCode.DOWNSTREAM_UNREACHABLE: "The database is unreachable; retry later.",
    ErrorCode.DOWNSTREAM_CONTRACT_VIOLATION: "The action is declared read-only but its routine writes; tell an operator.",
}
MISMATCH = (
    "The catalog and the database do not match (a routine, table or type is missing or different); "
    "tell an operator. Retrying may help once the database is migrated."
)


class SetupFailed(Exception):
    """The transaction could not be begun on any connection: nothing of the routine was sent."""

    def __init__(self, error: Exception, lost: bool, timed_out: bool) -> None:
        super().__init__(str(error))
        self.error, self.lost, self.timed_out = error, lost, timed_out


@dataclass(frozen=True)
class Settings:
    """What one call's transaction carries: the statement timeout (seconds), the intent's ids, and
    whether it is read-only."""

    timeout: float
    intent: str
    agent: str
    key: str
    read_only: bool


@dataclass(frozen=True)
class _Routine:
    """How to call one action's routine: its statement (without params) and its result's shape."""

    statement: sql.Composed
    shape: Shape


RoutineT = TypeVar("RoutineT")


class SqlAdapterBase(Generic[RoutineT]):
    """What every dialect shares: the pool, one transaction per call, the watchdog, the phases of a
    failure (before COMMIT: nothing happened; during COMMIT: unknown), the shape and bounds of
    ``data``, and scrubbing. A dialect says how to begin a transaction, run a routine, and read its
    driver's errors (the methods that raise NotImplementedError)."""

    #: the driver's exception classes; anything else a call raises is a bug, not the database's doing
    driver_errors: tuple[type[Exception], ...] = ()

    def __init__(
        self, connector: ConnectorSpec, options: AdapterOptions, url: URL, connect_args: dict[str, Any]
    ) -> None:
        self.connector = connector
        self._password = url.password or ""
        self._max_rows = int(options.extra.get("max_rows", DEFAULT_MAX_ROWS))
        self._max_bytes = int(options.extra.get("max_result_bytes", DEFAULT_MAX_RESULT_BYTES))
        self._max_depth = options.max_depth if options.max_depth is not None else DEFAULT_MAX_DEPTH
        self._grace = float(options.extra.get("watchdog_grace", WATCHDOG_GRACE))
        self._engine: Engine = create_engine(
            url,
            pool_size=max(1, options.max_connections),
            max_overflow=0,  # one connection per thread is all a pool ever needs
            pool_timeout=30,
            # no pool_pre_ping: its ping is a round trip outside any time bound; the transaction's
            # first statement (the settings) is the ping, under the watchdog (see _begin)
            pool_pre_ping=False,
            connect_args=connect_args,
        )
        self._routines: dict[tuple[str, int], RoutineT] = {}  # read once per (routine, number of params)
        self._connect_errors: tuple[type[Exception], ...] = (SQLAlchemyError, *self.driver_errors)

    # -- what a dialect says --------------------------------------------------------------------

    def _setup(self, conn: Any, settings: Settings | None) -> None:
        """Begin the call's transaction with ``settings`` (``None``: the probe's ``SELECT 1``)."""
        raise NotImplementedError

    def _run(self, conn: Any, action: ActionSpec, args: list[Any], ctx: CallContext) -> Any:
        """Call the action's routine with ``args`` in the open transaction; its answer as ``data``."""
        raise NotImplementedError

    def _bind(self, value: Any, spec: FieldSpec) -> Any:
        """An agent's value as a query parameter of this driver."""
        raise NotImplementedError

    def _unsendable(self, exc: BaseException) -> bool:
        """``exc`` (raised by executing a statement with the params) is the driver refusing a param
        before sending it, not the database's answer."""
        raise NotImplementedError

    @contextmanager
    def _sending_params(self) -> Iterator[None]:
        """Around a statement that carries the agent's params: the driver's refusal of a value
        becomes Unsendable (the agent's input, never the database's health)."""
        refusals: tuple[type[Exception], ...] = (UnicodeError, *self.driver_errors)
        try:
            yield
        except refusals as exc:
            if not self._unsendable(exc):
                raise
            raise Unsendable(f"the database driver refused a param before sending it: {exc}") from exc

    def _server_error(
        self, exc: Exception, action: ActionSpec, params: dict[str, Any], timeout: float, started: float
    ) -> Outcome:
        """An error the database reported: the transaction was rolled back."""
        raise NotImplementedError

    def _is_mismatch(self, exc: Exception) -> bool:
        """The error says the routine is not what was read of it (it is read again next time)."""
        raise NotImplementedError

    def _auth_refused(self, exc: Exception, reason: str) -> bool:
        """A failed connect was the login or its privileges being refused."""
        raise NotImplementedError

    def _reason(self, exc: BaseException) -> str:
        """The driver's reason for a failure, without the host part or the password."""
        raise NotImplementedError

    def _lost(self, conn: Any) -> bool:
        """The connection is broken (closed, reset) and must leave the pool."""
        raise NotImplementedError

    def _socket(self, conn: Any) -> int:
        """The connection's socket (file descriptor), for the watchdog."""
        raise NotImplementedError

    # -- the protocol ---------------------------------------------------------------------------

    def call(self, action: ActionSpec, params: dict[str, Any], ctx: CallContext) -> Outcome:
        """One attempt in one transaction. Never raises for anything the database or network does."""
        started = time.perf_counter()
        timeout = ctx.timeout if ctx.timeout is not None else action.timeout_seconds
        settings = Settings(timeout, ctx.intent_id, ctx.agent_id or "", ctx.idempotency_key or "", not action.is_write)
        args = [self._bind(params.get(name), spec) for name, spec in action.input.items()]
        try:
            proxy, conn, watchdog = self._begin(settings, timeout + self._grace)
        except SetupFailed as exc:
            return self._setup_failed(exc, action, params, started)
        except self._connect_errors as exc:  # the pool's checkout raises the driver's own
            return self._unreachable(exc, started)
        phase = "statement"
        try:
            try:
                data = self._run(conn, action, args, ctx)
                phase = "commit"
                if action.is_write:
                    conn.commit()
                else:
                    phase = "done"  # a read's result is in hand: its rollback cannot change it
                    conn.rollback()
            finally:
                watchdog.stop()
        except Unsendable as exc:
            return refused_outcome(exc, started=started)
        except self.driver_errors as exc:
            if phase == "done":
                return Outcome(True, data=data, downstream_ms=_ms(started))
            if self._is_mismatch(exc):  # the routine may have changed: read its signature again
                self._routines.pop((action.procedure or action.function or "", len(args)), None)
            return self._failed(exc, conn, phase, watchdog.fired, action, params, timeout, started)
        finally:
            self._release(proxy, conn)
        return Outcome(True, data=data, downstream_ms=_ms(started))

    def probe(self, timeout: float) -> ProbeResult:
        """``SELECT 1`` on a pooled connection, given ``timeout`` seconds once connected."""
        try:
            proxy, conn, watchdog = self._begin(None, timeout)
        except SetupFailed as exc:
            return ProbeResult(False, "no answer" if exc.timed_out else self._reason(exc.error))
        except self._connect_errors as exc:
            return ProbeResult(False, self._reason(exc))
        watchdog.stop()
        try:
            conn.rollback()
        except self.driver_errors:
            pass  # it answered; the pool drops the connection if it is broken
        finally:
            self._release(proxy, conn)
        return ProbeResult(True, "SELECT 1")

    def close(self) -> None:
        self._engine.dispose()

    # -- one transaction ------------------------------------------------------------------------

    def _begin(self, settings: Settings | None, seconds: float) -> tuple[PoolProxiedConnection, Any, Watchdog]:
        """A pooled connection whose transaction has begun with ``settings``, under a watchdog of
        ``seconds``.

        A connection lost on this first statement was stale (the server restarted, a firewall
        dropped it): the pool is renewed and a new connection tried, once. Nothing of the routine
        has been sent at this point. Raises SQLAlchemyError or the driver's error (cannot connect),
        or SetupFailed."""
        for last in (False, True):
            proxy = self._engine.raw_connection()
            conn = proxy.driver_connection
            watchdog = Watchdog(self._socket(conn), seconds)
            try:
                self._setup(conn, settings)
                return proxy, conn, watchdog
            except self.driver_errors as exc:
                watchdog.stop()
                lost = self._lost(conn)
                self._release(proxy, conn)
                if not lost or last or watchdog.fired:
                    raise SetupFailed(exc, lost, watchdog.fired) from exc
                log.info(
                    "%s: a pooled connection was dead (%s); renewing the pool", self.connector.name, self._reason(exc)
                )
                self._engine.dispose()  # after one stale connection every idle one is suspect
        raise AssertionError("unreachable")

    def _release(self, proxy: PoolProxiedConnection, conn: Any) -> None:
        """Back to the pool (which rolls back), or out of it when the connection broke."""
        if self._lost(conn):
            proxy.invalidate()
        proxy.close()

    def _data(self, cursor: Any, shape: Shape, ctx: CallContext) -> Any:
        """The routine's answer (a DB-API cursor) as JSON-safe ``data``, bounded in rows, size and nesting."""
        names = [column[0] for column in cursor.description or []]
        omitted: str | None = None
        if shape == "rows":
            rows: list[dict[str, Any]] = []
            size = 0
            for row in cursor.fetchmany(self._max_rows + 1):
                if len(rows) == self._max_rows:
                    omitted = (
                        f"the function returned more than {self._max_rows} rows; these are the first {self._max_rows}"
                    )
                    break
                item = {name: jsonable(value) for name, value in zip(names, row, strict=True)}
                size += len(json.dumps(item, ensure_ascii=False))
                if size > self._max_bytes:
                    omitted = f"the rows are larger than {self._max_bytes} bytes; these are the first {len(rows)}"
                    break
                rows.append(item)
            data: dict[str, Any] = {"rows": rows}
            if omitted:
                data["_reach_omitted"] = omitted
        else:
            row = cursor.fetchone() if names else None
            record = {n: jsonable(v) for n, v in zip(names, row, strict=True)} if row is not None else None
            if shape == "call":
                data = record or {}
            elif shape == "record":
                data = {"result": record}
            else:
                data = {"result": record[names[0]] if record and shape == "scalar" else None}
            size = len(json.dumps(data, ensure_ascii=False))
            if size > self._max_bytes:
                return {
                    "_reach_omitted": f"the result is larger than {self._max_bytes} bytes, the limit",
                    "bytes": size,
                }
        max_depth = ctx.max_depth if ctx.max_depth is not None else self._max_depth
        depth = value_depth(data)
        if depth > max_depth:
            return {"_reach_omitted": f"the result nests {depth} levels; the limit is {max_depth}"}
        return data

    # -- failures -------------------------------------------------------------------------------

    def _failed(
        self,
        exc: Exception,
        conn: Any,
        phase: str,
        timed_out: bool,
        action: ActionSpec,
        params: dict[str, Any],
        timeout: float,
        started: float,
    ) -> Outcome:
        name = self.connector.name
        lost = self._lost(conn)
        if phase == "commit" and (lost or timed_out):
            # COMMIT may or may not have been carried out: only a repeatable action may say "retry"
            what = "did not answer COMMIT in time" if timed_out else "lost the connection during COMMIT"
            if self.connector.safe_to_repeat(action):
                code = ErrorCode.DOWNSTREAM_TIMEOUT if timed_out else ErrorCode.DOWNSTREAM_ERROR
                return self._outcome(code, f"{name} {what}", "Retry; the action is safe to repeat.", started, sent=True)
            return self._outcome(
                ErrorCode.OUTCOME_UNKNOWN,
                f"{name} {what}; the transaction may or may not have been committed",
                self.connector.check_first_suggestion(action.action),
                started,
                sent=True,
            )
        if timed_out:
            return self._outcome(
                ErrorCode.DOWNSTREAM_TIMEOUT,
                f"{name} did not answer within {timeout:g}s; the connection was closed before COMMIT, "
                "so nothing was committed",
                SUGGESTIONS[ErrorCode.DOWNSTREAM_TIMEOUT],
                started,
            )
        if lost:
            return self._outcome(
                ErrorCode.DOWNSTREAM_ERROR,
                f"the connection to {name} was lost before COMMIT ({self._reason(exc)}); nothing was committed",
                SUGGESTIONS[ErrorCode.DOWNSTREAM_ERROR],
                started,
            )
        return self._server_error(exc, action, params, timeout, started)

    def _setup_failed(self, exc: SetupFailed, action: ActionSpec, params: dict[str, Any], started: float) -> Outcome:
        if exc.timed_out:
            return self._outcome(
                ErrorCode.DOWNSTREAM_TIMEOUT,
                f"{self.connector.name} did not answer the start of the transaction",
                SUGGESTIONS[ErrorCode.DOWNSTREAM_TIMEOUT],
                started,
            )
        if exc.lost:
            return self._outcome(
                ErrorCode.DOWNSTREAM_UNREACHABLE,
                f"the connection to {self.connector.name} was lost: {self._reason(exc.error)}",
                SUGGESTIONS[ErrorCode.DOWNSTREAM_UNREACHABLE],
                started,
            )
        return self._server_error(exc.error, action, params, 0.0, started)

    def _unreachable(self, exc: Exception, started: float) -> Outcome:
        """The pool could not give a connection: nothing was sent."""
        reason = self._reason(exc)
        if self._auth_refused(getattr(exc, "orig", None) or exc, reason):
            return self._outcome(
                ErrorCode.DOWNSTREAM_AUTH_FAILED,
                f"{self.connector.name} refused the connector's login: {reason}",
                SUGGESTIONS[ErrorCode.DOWNSTREAM_AUTH_FAILED],
                started,
            )
        return self._outcome(
            ErrorCode.DOWNSTREAM_UNREACHABLE,
            f"could not connect to {self.connector.name}: {reason}",
            SUGGESTIONS[ErrorCode.DOWNSTREAM_UNREACHABLE],
            started,
        )

    def _scrub(self, text: str, action: ActionSpec, params: dict[str, Any]) -> str:
        """Databases quote values in their messages (``Key (email)=(...)``, ``Duplicate entry '...'``):
        a sensitive param's value, and the DSN's password, never reach a receipt."""
        for name, spec in action.input.items():
            value = params.get(name)
            if spec.sensitive and value not in (None, "", [], {}):
                for form in {str(value), json.dumps(value, ensure_ascii=False)}:
                    text = text.replace(form, "[redacted]")
        if self._password:
            text = text.replace(self._password, "***")
        return text[:MAX_MESSAGE]

    def _outcome(
        self, code: ErrorCode, message: str, suggestion: str, started: float, *, sent: bool = False
    ) -> Outcome:
        return Outcome(False, code=code, message=message, suggestion=suggestion, sent=sent, downstream_ms=_ms(started))


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


def database_url(dsn: str, connector: ConnectorSpec) -> URL:
    """The connector's SQLAlchemy URL with its driver: psycopg 3 for PostgreSQL, PyMySQL for MariaDB
    and MySQL. Raises ValueError for anything else; never echoes the DSN (it holds a password)."""
    try:
        url = make_url(dsn.strip())
    except (ArgumentError, ValueError):
        raise ValueError(
            f"connector {connector.name}: {connector.dsn_env} is not a SQLAlchemy URL "
            "(postgresql://user:password@host:5432/database or mysql+pymysql://user:password@host:3306/database)"
        ) from None
    backend = url.get_backend_name()
    if backend == "postgresql":
        if "+" not in url.drivername:
            url = url.set(drivername="postgresql+psycopg")
        elif url.drivername != "postgresql+psycopg":
            raise ValueError(
                f"connector {connector.name}: {connector.dsn_env} asks for the driver {url.drivername}; "
                "the sql adapter uses psycopg 3 (postgresql+psycopg://)"
            )
        return url
    if backend in ("mysql", "mariadb"):
        # named, not implied: a bare mysql:// means mysqlclient to SQLAlchemy, which is not installed
        if url.get_driver_name() != "pymysql":
            raise ValueError(
                f"connector {connector.name}: {connector.dsn_env} asks for the driver {url.drivername}; "
                f"the sql adapter reaches MariaDB and MySQL through PyMySQL ({backend}+pymysql://)"
            )
        return url
    raise ValueError(
        f"connector {connector.name}: {connector.dsn_env} names a {backend} database; the sql adapter speaks "
        "PostgreSQL (postgresql://) and MariaDB or MySQL (mariadb+pymysql://, mysql+pymysql://)"
    )


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


def jsonable(value: Any) -> Any:
    """A value psycopg loaded, as JSON: numerics stay numbers when that is exact (else a string),
    times ISO 8601, intervals seconds, bytea base64, anything else (uuid, inet, ranges) its text."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else _NON_FINITE[str(value)]
    if isinstance(value, Decimal):
        return _decimal(value)
    if isinstance(value, (datetime, date, time_of_day)):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return str(value)


_NON_FINITE = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}


def _decimal(value: Decimal) -> int | float | str:
    if not value.is_finite():
        return "NaN" if value.is_nan() else ("Infinity" if value > 0 else "-Infinity")
    if value == value.to_integral_value() and abs(value) < 10**18:
        return int(value)
    number = float(value)
    return number if math.isfinite(number) and Decimal(repr(number)) == value else str(value)


def _ms(started: float) -> float:
    return (time.perf_counter() - started) * 1000


class Watchdog:
    """Ends a call the server's statement_timeout did not end (a hung server or proxy): after
    ``seconds`` it shuts the connection's socket down, so the blocked read returns an error. The
    socket is shut, never closed: the driver still owns the descriptor."""

    def __init__(self, fd: int, seconds: float) -> None:
        self._fd = fd
        self._lock = threading.Lock()
        self._done = False
        self.fired = False
        self._timer = threading.Timer(max(0.0, seconds), self._fire)
        self._timer.daemon = True
        self._timer.start()

    def _fire(self) -> None:
        with self._lock:
            if self._done:
                return
            self.fired = True
            try:
                with socket.socket(fileno=os.dup(self._fd)) as sock:
                    sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def stop(self) -> None:
        with self._lock:
            self._done = True
        self._timer.cancel()
