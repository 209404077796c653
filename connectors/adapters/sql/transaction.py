"""What every SQL dialect shares: the pool, one transaction per call under the watchdog, the phases
of a failure, the shape and bounds of ``data`` (results.py), and scrubbing. A dialect (postgres.py,
mariadb.py) says how to begin, call a routine and read its driver's errors.

What ``sent`` means here: False when the transaction certainly did not commit. An error the database
reports for a statement aborts the transaction, which is rolled back, and a connection lost before
COMMIT was sent leaves nothing either (the server rolls back); a statement timeout is such an
error: cancelled and rolled back, so it did not happen and is safe to retry, even for a write.
Only a connection lost, or silent, *during* COMMIT leaves the outcome unknown: OUTCOME_UNKNOWN for a
write that is not safe to repeat. (Effects outside the transaction, such as sequences, dblink or
files a routine writes, are not rolled back; give such a routine ``retry: {max_attempts: 1}``.)

Bounds: the server's statement timeout ends a slow statement; a watchdog shuts the socket of a
connection that has not answered ``WATCHDOG_GRACE`` seconds after the action's timeout (a hung
server or proxy). Instead of pool_pre_ping (a round trip outside any time bound) the transaction's
first statement is the ping: a pooled connection found dead there (a server restart) renews the
pool and the call moves to a new connection once, before anything of the routine was sent. Rows
are capped, the result's JSON by ``max_result_bytes`` and its nesting by ``max_depth``. The DSN's
password is never logged or put in a message.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from sqlalchemy import Engine, create_engine
from sqlalchemy.engine import URL
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.pool import PoolProxiedConnection

from connectors.adapters.base import AdapterOptions, CallContext, Outcome, ProbeResult
from connectors.adapters.errors import Unsendable, refused_outcome
from connectors.adapters.sql.results import Shape, result_data
from connectors.adapters.sql.watchdog import Watchdog
from connectors.spec import ActionSpec, ConnectorSpec, FieldSpec
from producers.wire import ErrorCode

log = logging.getLogger("reach.sql")

DEFAULT_MAX_ROWS = 1000
DEFAULT_MAX_RESULT_BYTES = 1 << 20
DEFAULT_MAX_DEPTH = 32  # as REACH_MAX_DEPTH's default
WATCHDOG_GRACE = 1.0  # seconds past the action's timeout before the adapter gives up on the connection
MAX_MESSAGE = 500

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
        max_depth = ctx.max_depth if ctx.max_depth is not None else self._max_depth
        return result_data(cursor, shape, max_rows=self._max_rows, max_bytes=self._max_bytes, max_depth=max_depth)

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


def _ms(started: float) -> float:
    return (time.perf_counter() - started) * 1000
