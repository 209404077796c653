"""The sql adapter's MariaDB / MySQL dialect: a URL ``mariadb+pymysql://`` or ``mysql+pymysql://``,
driver PyMySQL. What every dialect shares (the pool, one transaction per call, the watchdog, what a
failure before or during COMMIT means, the bounds and shape of ``data``) is in transaction.py; this module
says how MariaDB begins a transaction, calls a routine and reports errors.

Each call, on one connection::

    SET SESSION max_statement_time = <timeout>, @reach_intent_id = ..., @reach_agent_id = ...,
        @reach_idempotency_key = ...
    START TRANSACTION READ ONLY  |  START TRANSACTION READ WRITE
    SET @_reach_1 = %s                                   only for INOUT arguments
    CALL `db`.`name`(%s, @_reach_1, @_reach_2)  |  SELECT `db`.`name`(%s, %s)
    SELECT @_reach_1 AS `b`, @_reach_2 AS `c`            only for OUT / INOUT arguments
    COMMIT (write actions) | ROLLBACK (reads)

Params are PyMySQL's bound parameters: each value escaped by the driver for the connection
(utf8mb4, and the server's NO_BACKSLASH_ESCAPES when set), never text we splice. Routine and
column names are backtick-quoted by SQLAlchemy's identifier preparer (and already restricted by
the spec's ROUTINE_NAME); ``db.name`` names the database, a bare ``name`` the URL's database. A
list or object param goes as its JSON text (MariaDB has no arrays), a boolean as 1 or 0.

OUT and INOUT arguments can only be session variables in MySQL's CALL: the procedure's argument
modes are read from information_schema.PARAMETERS once (then cached; read again after an error
that says the routine changed). ``data``: a procedure's OUT/INOUT values as an object, plus
``"rows"`` (its first result set, capped as a function's rows are) when it SELECTs rows; a function
``{"result": v}`` (MariaDB functions return one value). The transaction's user variables
``@reach_idempotency_key`` and the others let a routine deduplicate by key itself.

Timeout: the server's ``max_statement_time`` (MySQL: ``max_execution_time``, which covers SELECT
only). MariaDB stops a CALL at its timeout, but a SLEEP() or BENCHMARK() it interrupts returns
normally and the procedure goes on to its next statement. So the adapter keeps the deadline itself:
a statement that answers after the action's timeout is rolled back and reported as
DOWNSTREAM_TIMEOUT (nothing committed), whether or not the server said so. A hung server is ended
by the shared watchdog. A routine that COMMITs itself (or runs DDL, which commits) is outside this
transaction; give its action ``retry: {max_attempts: 1}``.

PyMySQL reports the error number, not the SQLSTATE; number -> reach code (sent=False, rolled back):

    2003 can't connect, 1040 too many connections                 DOWNSTREAM_UNREACHABLE
    1044/1045 access denied, 1142/1143/1370 command denied         DOWNSTREAM_AUTH_FAILED
    1062 duplicate, 1451/1452 foreign key, 4025/3819 CHECK, 1048   DOWNSTREAM_CONFLICT
    1644 SIGNAL SQLSTATE '45000' (its MESSAGE_TEXT), 1264, 1292,   DOWNSTREAM_VALIDATION_FAILED
      1366, 1406, 1690, 3140/4038 (bad values)
    1643 SIGNAL SQLSTATE '02000', 1329 no data                     DOWNSTREAM_NOT_FOUND
    1969/3024 statement timeout, 1317 interrupted, or late         DOWNSTREAM_TIMEOUT
    1792 write in a READ ONLY transaction                          DOWNSTREAM_CONTRACT_VIOLATION
    1305 no such routine, 1318 argument count, 1146, 1054, 1414    DOWNSTREAM_ERROR (catalog vs database)
    1205 lock wait timeout, 1213 deadlock, any other number        DOWNSTREAM_ERROR
    connection lost during COMMIT                                  OUTCOME_UNKNOWN, sent=True (as PostgreSQL)
    a param PyMySQL cannot encode for the connection's charset     VALIDATION_FAILED (nothing sent; not retried,
                                                                   not counted by the breaker)

A SIGNAL that sets its own MYSQL_ERRNO is read by that number.
"""

from __future__ import annotations

import json
import math
import re
import time
from dataclasses import dataclass
from typing import Any, Literal

import pymysql
from pymysql.cursors import Cursor, SSCursor
from sqlalchemy import event
from sqlalchemy.pool import ConnectionPoolEntry

from connectors.adapters.auth import read_secret
from connectors.adapters.base import AdapterOptions, CallContext, Outcome
from connectors.adapters.sql.transaction import MISMATCH, SUGGESTIONS, Settings, SqlAdapterBase
from connectors.adapters.sql.urls import database_url
from connectors.spec import ActionSpec, ConnectorSpec, FieldSpec
from producers.wire import ErrorCode

CONNECT_TIMEOUT = 5  # seconds, for the TCP connect and (read_timeout) the server's greeting and login
_CONNECT_DEFAULTS: dict[str, Any] = {
    "connect_timeout": CONNECT_TIMEOUT,
    "read_timeout": CONNECT_TIMEOUT,  # lifted once connected (_on_connect): a call's reads are the watchdog's
    "charset": "utf8mb4",
}

_SETTINGS = "SET SESSION {timer} = %s, @reach_intent_id = %s, @reach_agent_id = %s, @reach_idempotency_key = %s"
_PARAMETERS = (
    "SELECT PARAMETER_MODE, PARAMETER_NAME FROM information_schema.PARAMETERS"
    " WHERE SPECIFIC_SCHEMA = COALESCE(%s, DATABASE()) AND SPECIFIC_NAME = %s AND ROUTINE_TYPE = 'PROCEDURE'"
    " AND ORDINAL_POSITION > 0 ORDER BY ORDINAL_POSITION"
)

TIMEOUT_ERRORS = {1969, 3024, 1317}  # MariaDB max_statement_time, MySQL max_execution_time, KILL QUERY
_CODES: dict[int, ErrorCode] = {
    **dict.fromkeys(TIMEOUT_ERRORS, ErrorCode.DOWNSTREAM_TIMEOUT),
    1792: ErrorCode.DOWNSTREAM_CONTRACT_VIOLATION,
    **dict.fromkeys((1044, 1045, 1142, 1143, 1227, 1370, 1698), ErrorCode.DOWNSTREAM_AUTH_FAILED),
    **dict.fromkeys((1062, 1586, 1451, 1452, 1216, 1217, 4025, 3819, 1048), ErrorCode.DOWNSTREAM_CONFLICT),
    **dict.fromkeys(
        (1644, 1264, 1265, 1292, 1366, 1367, 1406, 1411, 1690, 1365, 3140, 4038),
        ErrorCode.DOWNSTREAM_VALIDATION_FAILED,
    ),
    **dict.fromkeys((1643, 1329), ErrorCode.DOWNSTREAM_NOT_FOUND),
}
_MISMATCHES = {1305, 1318, 1146, 1054, 1414}  # no such routine, argument count, table, column; OUT not a variable
_CANT_CONNECT = re.compile(r"\(\[Errno -?\d+\] ([^)]*)\)")


def errno_code(errno: int) -> ErrorCode:
    """The reach code for an error number MariaDB or MySQL reported (the transaction was rolled back)."""
    return _CODES.get(errno, ErrorCode.DOWNSTREAM_ERROR)


Slot = Literal["call", "preset"]  # where a param goes: an argument of the CALL, or an INOUT variable's SET


@dataclass(frozen=True)
class _Routine:
    """How to call one action's routine: the statements around it and which params go where."""

    statement: str  # CALL or SELECT, %s for each param it binds
    slots: tuple[Slot, ...]  # per input param: an argument of the CALL, or an INOUT variable's
    preset: str | None  # SET of the INOUT variables
    outs: str | None  # SELECT of the OUT / INOUT variables
    function: bool


class MariadbAdapter(SqlAdapterBase[_Routine]):
    """Calls one connector's MariaDB (or MySQL) routines; one instance per pool process, called from many threads."""

    driver_errors = (pymysql.err.Error,)
    product = "MariaDB"  # in messages (MySQL too: the server's name is known only once connected)

    def __init__(self, connector: ConnectorSpec, options: AdapterOptions) -> None:
        url = database_url(read_secret(connector.dsn_env, connector.name, options.environ), connector)
        if url.get_backend_name() not in ("mysql", "mariadb"):
            raise ValueError(f"connector {connector.name}: {connector.dsn_env} does not name a MariaDB database")
        connect_args = {k: v for k, v in _CONNECT_DEFAULTS.items() if k not in url.query}
        super().__init__(connector, options, url, connect_args)
        self._quote = self._engine.dialect.identifier_preparer.quote_identifier
        event.listen(self._engine, "connect", self._on_connect)

    def _on_connect(self, dbapi_connection: Any, record: ConnectionPoolEntry) -> None:
        # PyMySQL's connect_timeout covers the TCP connect only; read_timeout bounded the handshake,
        # but it would also cut every statement at CONNECT_TIMEOUT (PyMySQL has no public setter)
        dbapi_connection._read_timeout = None

    # -- the dialect ----------------------------------------------------------------------------

    def _setup(self, conn: Any, settings: Settings | None) -> None:
        with conn.cursor(Cursor) as cursor:
            if settings is None:
                cursor.execute("SELECT 1")
                return
            if "mariadb" in conn.get_server_info().lower():
                timer, limit = "max_statement_time", max(0.001, round(settings.timeout, 3))  # seconds; 0 is none
            else:
                timer, limit = "max_execution_time", max(1, int(settings.timeout * 1000))  # ms, SELECT only
            cursor.execute(_SETTINGS.format(timer=timer), (limit, settings.intent, settings.agent, settings.key))
            cursor.execute(f"START TRANSACTION {'READ ONLY' if settings.read_only else 'READ WRITE'}")

    def _run(self, conn: Any, action: ActionSpec, args: list[Any], ctx: CallContext) -> Any:
        timeout = ctx.timeout if ctx.timeout is not None else action.timeout_seconds
        begun = time.perf_counter()
        with conn.cursor(Cursor) as plain:
            routine = self._routine(plain, action, len(args))
            call_args = [a for a, slot in zip(args, routine.slots, strict=False) if slot == "call"]
            call_args += args[len(routine.slots) :]  # more params than arguments: the server says so
            if routine.preset is not None:
                with self._sending_params():
                    plain.execute(
                        routine.preset, [a for a, slot in zip(args, routine.slots, strict=False) if slot == "preset"]
                    )
        cursor = conn.cursor(SSCursor)  # unbuffered: rows are read as far as the cap, never all into memory
        try:
            with self._sending_params():
                cursor.execute(routine.statement, call_args)
            if routine.function:
                data = self._data(cursor, "scalar", ctx)
            else:
                data = self._data(cursor, "rows", ctx) if cursor.description else {}
            cursor.close()  # reads what is left of the result sets and discards it
        except BaseException:
            _discard(cursor)
            raise
        if time.perf_counter() - begun >= timeout:
            # the server's timer interrupted the routine, which may have gone on regardless (SLEEP)
            raise pymysql.err.OperationalError(1969, "the statement answered after its timeout")
        if routine.outs is not None:
            with conn.cursor(Cursor) as plain:
                plain.execute(routine.outs)
                data = {**data, **self._data(plain, "call", ctx)}
        return data

    def _routine(self, cursor: Any, action: ActionSpec, nargs: int) -> _Routine:
        """The statements for ``action`` with ``nargs`` params, cached per routine."""
        name = action.procedure or action.function or ""
        cached = self._routines.get((name, nargs))
        if cached is not None:
            return cached
        schema, _, routine_name = name.rpartition(".")
        target = ".".join(self._quote(part) for part in name.split("."))
        if action.function:
            argument: Slot = "call"
            slots = (argument,) * nargs
            routine = _Routine(f"SELECT {target}({', '.join(['%s'] * nargs)})", slots, None, None, True)
        else:
            cursor.execute(_PARAMETERS, (schema or None, routine_name))
            routine = self._call(target, [(str(mode), str(pname)) for mode, pname in cursor.fetchall()], nargs)
        self._routines[(name, nargs)] = routine  # an error that says it changed drops it (_is_mismatch)
        return routine

    def _call(self, target: str, parameters: list[tuple[str, str]], nargs: int) -> _Routine:
        """A CALL for a procedure whose arguments are ``parameters`` (mode, name): the params fill
        the IN and INOUT positions in order; each OUT and INOUT argument is a session variable."""
        arguments: list[str] = []
        slots: list[Slot] = []
        presets: list[str] = []
        outs: list[str] = []
        for position, (mode, pname) in enumerate(parameters):
            if mode == "IN":
                arguments.append("%s")
                slots.append("call")
                continue
            variable = f"@_reach_{position}"
            arguments.append(variable)
            outs.append(f"{variable} AS {self._quote(pname)}")
            if mode == "INOUT":
                if len(slots) < nargs:
                    presets.append(f"{variable} = %s")
                    slots.append("preset")
                else:
                    presets.append(f"{variable} = NULL")
        arguments += ["%s"] * (nargs - len(slots))  # params past the arguments: the server says so
        return _Routine(
            f"CALL {target}({', '.join(arguments)})",
            tuple(slots[:nargs]),
            f"SET {', '.join(presets)}" if presets else None,
            f"SELECT {', '.join(outs)}" if outs else None,
            False,
        )

    def _bind(self, value: Any, spec: FieldSpec) -> Any:
        """An agent's value for PyMySQL: scalars as themselves (escaped by the driver), lists and
        objects as JSON text, booleans as 1/0, a non-finite float as text (the server refuses it)."""
        if isinstance(value, (dict, list)):
            return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
        if isinstance(value, bool):
            return int(value)
        if isinstance(value, float) and not math.isfinite(value):
            return str(value)
        return value

    def _unsendable(self, exc: BaseException) -> bool:
        # PyMySQL escapes the params into the statement and encodes it before writing a byte
        return isinstance(exc, UnicodeEncodeError)

    def _is_mismatch(self, exc: Exception) -> bool:
        return _errno(exc) in _MISMATCHES

    def _lost(self, conn: Any) -> bool:
        return not conn.open

    def _socket(self, conn: Any) -> int:
        sock = conn._sock  # PyMySQL keeps its socket here; there is no public accessor
        return int(sock.fileno()) if sock is not None else -1  # closed: the first statement says so

    def _auth_refused(self, exc: Exception, reason: str) -> bool:
        return errno_code(_errno(exc)) is ErrorCode.DOWNSTREAM_AUTH_FAILED

    def _reason(self, exc: BaseException) -> str:
        """PyMySQL's message, without the host part or the password: "Connection refused",
        "Access denied for user 'shop'@'127.0.0.1' (using password: YES)", ..."""
        source = getattr(exc, "orig", None) or exc
        if not isinstance(source, pymysql.err.Error):
            return type(source).__name__  # the pool's own (a checkout timeout)
        text = _text(source)
        refused = _CANT_CONNECT.search(text)
        text = (refused.group(1) if refused else text).strip() or type(source).__name__
        if self._password:
            text = text.replace(self._password, "***")
        return text[:200]

    def _server_error(
        self, exc: Exception, action: ActionSpec, params: dict[str, Any], timeout: float, started: float
    ) -> Outcome:
        errno = _errno(exc)
        text = _text(exc) or type(exc).__name__  # the server's own words (a SIGNAL's MESSAGE_TEXT); scrubbed below
        code = errno_code(errno)
        routine = action.procedure or action.function
        if code is ErrorCode.DOWNSTREAM_TIMEOUT:
            message = f"{self.product} stopped the statement (statement timeout {timeout:g}s); nothing was committed"
        elif errno == 1792:
            message = f"{routine} tried to write, but {action.action} is declared read-only ({text})"
        elif errno in _MISMATCHES:
            message = f"{routine}: {text} [error {errno}]"
        else:
            message = text
        suggestion = MISMATCH if errno in _MISMATCHES else SUGGESTIONS.get(code, "See the error message.")
        return self._outcome(
            code, self._scrub(message, action, params), self._scrub(suggestion, action, params), started
        )


def _errno(exc: BaseException) -> int:
    args = getattr(getattr(exc, "orig", None) or exc, "args", ())
    return args[0] if args and isinstance(args[0], int) else 0


def _text(exc: BaseException) -> str:
    """The message of a PyMySQL error (its args are the error number and the message)."""
    args = exc.args
    return str(args[1]).strip() if len(args) > 1 else str(exc).strip()


def _discard(cursor: Any) -> None:
    """Close a cursor after a failure; the failure says more than anything its close could."""
    try:
        cursor.close()
    except Exception:
        pass  # the connection is gone or the result was already consumed
