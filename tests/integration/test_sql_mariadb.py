"""The sql adapter's second dialect against a real MariaDB (the Debian package ``mariadb-server``,
started by this file in a temp dir, never mocked): the URL picks the dialect; procedures with OUT,
INOUT and result sets, functions, SIGNAL, integrity, the statement timeout, read-only transactions,
lost connections around COMMIT, hostile params; and, through a real fleet, receipts and the
idempotency ledger. ``reach validate`` refuses a database the adapter does not speak."""

from __future__ import annotations

import os
import secrets
import select
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pymysql
import pytest
import redis
from click.testing import CliRunner

from connectors.adapters.base import AdapterOptions, CallContext, Outcome
from connectors.adapters.factory import build_adapter
from connectors.adapters.sql.mariadb import MariadbAdapter
from connectors.spec import ConnectorSpec
from producers.client import ReachClient
from producers.wire import ErrorCode
from tests.fleet import BROKER_URL, REDIS_URL, Fleet
from tests.waiting import wait_for
from workers.cli import main as reach_cli
from workers.ops.local_fleet import free_port
from workers.state import keys

INSTALL = "apt-get install mariadb-server (the tests start their own server)"


class MariadbServer:
    """One throwaway MariaDB server (mariadb-install-db + mariadbd in a temp dir, 127.0.0.1 on a free
    port), a database ``shop`` and a user ``shop`` with a password; root only over the unix socket."""

    def __init__(self) -> None:
        self.password = secrets.token_hex(12)
        self.port = 0
        self.dir = Path()
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> MariadbServer:
        install, server = shutil.which("mariadb-install-db"), shutil.which("mariadbd") or "/usr/sbin/mariadbd"
        if install is None or not os.access(server, os.X_OK):
            pytest.fail(f"no MariaDB server binaries (mariadb-install-db, mariadbd); {INSTALL}")
        self.dir = Path(tempfile.mkdtemp(prefix="reach-mariadb-"))
        as_user = ["--user=mysql"] if os.geteuid() == 0 else []  # mariadbd refuses to run as root
        if as_user:
            shutil.chown(self.dir, "mysql", "mysql")
        result = subprocess.run(
            [install, "--no-defaults", f"--datadir={self.dir / 'data'}", *as_user]
            + ["--auth-root-authentication-method=normal", "--skip-test-db"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if result.returncode != 0:
            raise RuntimeError(f"mariadb-install-db failed: {result.stderr.strip() or result.stdout.strip()}")
        self.port = free_port()
        self._process = subprocess.Popen(
            [server, "--no-defaults", f"--datadir={self.dir / 'data'}", f"--socket={self.socket}"]
            + [f"--port={self.port}", "--bind-address=127.0.0.1", f"--log-error={self.dir / 'server.log'}"]
            + [f"--pid-file={self.dir / 'server.pid'}", "--skip-log-bin", "--innodb-buffer-pool-size=16M"]
            + ["--innodb-flush-log-at-trx-commit=0", "--skip-name-resolve", *as_user],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        wait_for(self._ready, 60, f"MariaDB on port {self.port}:\n{self.log_tail()}")
        self.run_sql(
            "CREATE DATABASE shop",
            f"CREATE USER 'shop'@'127.0.0.1' IDENTIFIED BY '{self.password}'",
            "GRANT ALL PRIVILEGES ON shop.* TO 'shop'@'127.0.0.1'",
            database=None,
        )
        return self

    def stop(self) -> None:
        """SIGTERM to the server's own PID (SIGKILL after 30 s), then its directory goes."""
        if self._process is not None and self._process.poll() is None:
            self._process.send_signal(signal.SIGTERM)
            try:
                self._process.wait(30)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)

    @property
    def socket(self) -> Path:
        return self.dir / "server.sock"

    def url(self, *, password: str | None = None, port: int | None = None) -> str:
        return f"mariadb+pymysql://shop:{password or self.password}@127.0.0.1:{port or self.port}/shop"

    @property
    def dsn(self) -> str:
        return self.url()

    def log_tail(self) -> str:
        try:
            return "\n".join((self.dir / "server.log").read_text(errors="replace").splitlines()[-20:])
        except OSError:
            return ""

    def _ready(self) -> bool:
        if self._process is not None and self._process.poll() is not None:
            raise RuntimeError(f"mariadbd exited ({self._process.returncode}):\n{self.log_tail()}")
        try:
            self.run_sql("SELECT 1", database=None)
        except pymysql.err.Error:
            return False
        return True

    def run_sql(self, *statements: str, params: Any = None, database: str | None = "shop") -> list[tuple[Any, ...]]:
        """Each statement as root over the unix socket, autocommit; the last one's rows."""
        conn = pymysql.connect(unix_socket=str(self.socket), user="root", database=database, autocommit=True)
        try:
            with conn.cursor() as cursor:
                for statement in statements:
                    cursor.execute(statement, params)
                return list(cursor.fetchall())
        finally:
            conn.close()

    def scalar(self, statement: str, params: Any = None) -> Any:
        rows = self.run_sql(statement, params=params)
        return rows[0][0] if rows else None


SCHEMA = [
    """CREATE TABLE orders (
        id INT AUTO_INCREMENT PRIMARY KEY, customer VARCHAR(100) NOT NULL, amount DECIMAL(12, 2) NOT NULL,
        title VARCHAR(200) NOT NULL UNIQUE, placed_at DATETIME NOT NULL DEFAULT CURRENT_TIMESTAMP) ENGINE=InnoDB""",
    "CREATE TABLE items (id INT AUTO_INCREMENT PRIMARY KEY, title VARCHAR(300) NOT NULL) ENGINE=InnoDB",
    # executions of add_item, committed or not: MyISAM is not transactional, so nothing rolls it back
    "CREATE TABLE item_calls (title VARCHAR(300) NOT NULL) ENGINE=MyISAM",
    """CREATE PROCEDURE place_order(IN customer VARCHAR(100), IN amount DECIMAL(12, 2), IN title VARCHAR(200),
                                    OUT order_id INT)
    BEGIN
        DECLARE complaint VARCHAR(200);
        IF amount <= 0 THEN
            SET complaint = CONCAT('amount must be positive, got ', amount);
            SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = complaint;
        END IF;
        INSERT INTO orders (customer, amount, title) VALUES (customer, amount, title);
        SET order_id = LAST_INSERT_ID();
    END""",
    """CREATE PROCEDURE tag(INOUT label VARCHAR(100), IN suffix VARCHAR(50), OUT size INT)
    BEGIN SET label = CONCAT(label, '-', suffix); SET size = CHAR_LENGTH(label); END""",
    """CREATE PROCEDURE orders_of(IN who VARCHAR(100))
    BEGIN SELECT id AS order_id, amount, title, placed_at FROM orders WHERE customer = who ORDER BY id; END""",
    """CREATE PROCEDURE series(IN n INT)
    BEGIN SELECT seq AS n FROM seq_1_to_1000 WHERE seq <= n; END""",
    """CREATE FUNCTION order_total(who VARCHAR(100)) RETURNS DECIMAL(12, 2) READS SQL DATA
    RETURN (SELECT COALESCE(SUM(amount), 0) FROM orders WHERE customer = who)""",
    """CREATE PROCEDURE add_item(IN title VARCHAR(300), OUT item_id INT)
    BEGIN
        INSERT INTO item_calls VALUES (title);
        INSERT INTO items (title) VALUES (title);
        SET item_id = LAST_INSERT_ID();
    END""",
    # 2 s of SLEEP, then the insert: MariaDB's timer interrupts the SLEEP, which returns normally
    """CREATE PROCEDURE add_item_slowly(IN title VARCHAR(300), OUT item_id INT)
    BEGIN DO SLEEP(2); CALL add_item(title, item_id); END""",
    "CREATE FUNCTION nap(seconds DOUBLE) RETURNS INT NO SQL BEGIN DO SLEEP(seconds); RETURN 1; END",
    # declared as a read by a (wrong) catalog: it writes
    "CREATE PROCEDURE count_and_log(IN title VARCHAR(300)) BEGIN INSERT INTO items (title) VALUES (title); END",
    """CREATE PROCEDURE whoami()
    BEGIN
        SELECT @reach_intent_id AS intent, @reach_agent_id AS agent, @reach_idempotency_key AS `key`,
               @@max_statement_time AS timeout;
    END""",
]

WRITE = {"permission": "write", "idempotent": False}
TITLE = {"title": {"type": "string", "required": True}}
ACTIONS: list[dict[str, Any]] = [
    {
        "action": "place_order",
        "procedure": "shop.place_order",
        "input": {"customer": {"type": "string"}, "amount": {"type": "number"}, "title": {"type": "string"}},
        **WRITE,
    },
    {
        "action": "place_secret_order",
        "procedure": "place_order",  # the URL's database
        "input": {
            "customer": {"type": "string"},
            "amount": {"type": "number"},
            "title": {"type": "string", "sensitive": True},
        },
        **WRITE,
    },
    {"action": "tag", "procedure": "shop.tag", "input": {"label": {"type": "string"}, "suffix": {"type": "string"}}},
    {"action": "orders_of", "procedure": "shop.orders_of", "input": {"who": {"type": "string"}}},
    {"action": "series", "procedure": "shop.series", "input": {"n": {"type": "integer"}}},
    {"action": "order_total", "function": "shop.order_total", "input": {"who": {"type": "string"}}},
    {"action": "add_item", "procedure": "shop.add_item", "input": TITLE, **WRITE},
    {
        "action": "add_item_safely",
        "procedure": "shop.add_item",
        "input": TITLE,
        "permission": "write",
        "idempotent": True,
    },
    {"action": "add_item_slowly", "procedure": "shop.add_item_slowly", "input": TITLE, "timeout": "300ms", **WRITE},
    {"action": "nap", "function": "shop.nap", "input": {"seconds": {"type": "number"}}, "timeout": "300ms"},
    {"action": "count_and_log", "procedure": "shop.count_and_log", "input": TITLE},
    {"action": "whoami", "procedure": "shop.whoami"},
    {"action": "missing", "procedure": "shop.no_such_procedure", "input": {"x": {"type": "integer"}}},
]
CONNECTOR = ConnectorSpec.model_validate({"name": "shop", "type": "sql", "dsn_env": "SHOP_DSN", "actions": ACTIONS})
CTX = CallContext(intent_id="intent-1", idempotency_key="key-1", agent_id="shop_bot")


@pytest.fixture(scope="module")
def maria() -> Iterator[MariadbServer]:
    server = MariadbServer()
    try:
        server.start()
        server.run_sql(*SCHEMA)
        yield server
    finally:
        server.stop()


def make_adapter(dsn: str, **extra: Any) -> MariadbAdapter:
    adapter = build_adapter(
        CONNECTOR,
        AdapterOptions(max_connections=4, environ={"SHOP_DSN": dsn}, extra={"watchdog_grace": 0.5, **extra}),
    )
    assert isinstance(adapter, MariadbAdapter)
    return adapter


@pytest.fixture
def shop(maria: MariadbServer) -> Iterator[MariadbAdapter]:
    adapter = make_adapter(maria.dsn, max_rows=10)
    yield adapter
    adapter.close()


def call(adapter: MariadbAdapter, action: str, ctx: CallContext = CTX, **params: Any) -> Outcome:
    spec = CONNECTOR.action(action)
    assert spec is not None
    return adapter.call(spec, params, ctx)


def items(maria: MariadbServer, title: str) -> int:
    return int(maria.scalar("SELECT count(*) FROM items WHERE title = %s", (title,)))


def executions(maria: MariadbServer, title: str) -> int:
    return int(maria.scalar("SELECT count(*) FROM item_calls WHERE title = %s", (title,)))


# -- data -----------------------------------------------------------------------------------------


def test_a_procedure_answers_its_out_values_and_its_row_is_committed(
    shop: MariadbAdapter, maria: MariadbServer
) -> None:
    outcome = call(shop, "place_order", customer="ada", amount=12.5, title="proc-1")
    assert outcome.ok, outcome
    order_id = outcome.data["order_id"]
    assert outcome.data == {"order_id": order_id} and isinstance(order_id, int)
    assert maria.run_sql("SELECT customer, amount FROM orders WHERE id = %s", params=(order_id,))[0][0] == "ada"


def test_inout_values_go_in_and_come_back(shop: MariadbAdapter) -> None:
    assert call(shop, "tag", label="order", suffix="7").data == {"label": "order-7", "size": 7}


def test_a_function_answers_a_result_and_a_procedure_its_rows(shop: MariadbAdapter) -> None:
    for amount, title in ((12.5, "fn-1"), (7, "fn-2")):
        assert call(shop, "place_order", customer="grace", amount=amount, title=title).ok
    assert call(shop, "order_total", who="grace").data == {"result": 19.5}
    rows = call(shop, "orders_of", who="grace").data["rows"]
    assert [(r["amount"], r["title"]) for r in rows] == [(12.5, "fn-1"), (7, "fn-2")]
    assert all(time.strptime(r["placed_at"], "%Y-%m-%dT%H:%M:%S") for r in rows)  # ISO 8601
    assert call(shop, "orders_of", who="nobody").data == {"rows": []}


def test_rows_are_capped_and_the_cap_is_said(shop: MariadbAdapter) -> None:
    outcome = call(shop, "series", n=500)  # 500 rows sent; 10 kept, the rest read past and dropped
    assert outcome.ok and [r["n"] for r in outcome.data["rows"]] == list(range(1, 11))
    assert "more than 10 rows" in outcome.data["_reach_omitted"]
    assert call(shop, "order_total", who="grace").ok  # the connection is clean for the next call


def test_the_session_carries_the_intent_and_the_timeout(shop: MariadbAdapter) -> None:
    (row,) = call(shop, "whoami").data["rows"]
    assert row == {"intent": "intent-1", "agent": "shop_bot", "key": "key-1", "timeout": 5.0}


# -- errors the database reports: rolled back, sent=False ----------------------------------------


def test_signal_45000_is_downstream_validation_failed_with_its_message(
    shop: MariadbAdapter, maria: MariadbServer
) -> None:
    outcome = call(shop, "place_order", customer="ada", amount=-5, title="negative")
    assert outcome.code is ErrorCode.DOWNSTREAM_VALIDATION_FAILED and not outcome.sent, outcome
    assert outcome.message == "amount must be positive, got -5.00"
    assert maria.scalar("SELECT count(*) FROM orders WHERE title = 'negative'") == 0


def test_a_duplicate_key_is_downstream_conflict_and_a_sensitive_value_is_redacted(
    shop: MariadbAdapter, maria: MariadbServer
) -> None:
    assert call(shop, "place_order", customer="ada", amount=1, title="twice").ok
    outcome = call(shop, "place_order", customer="ada", amount=2, title="twice")
    assert outcome.code is ErrorCode.DOWNSTREAM_CONFLICT and not outcome.sent
    assert "Duplicate entry 'twice'" in outcome.message
    assert maria.scalar("SELECT count(*) FROM orders WHERE title = 'twice'") == 1
    secret = "card-4111-1111"
    assert call(shop, "place_secret_order", customer="ada", amount=1, title=secret).ok
    hidden = call(shop, "place_secret_order", customer="ada", amount=1, title=secret)
    assert hidden.code is ErrorCode.DOWNSTREAM_CONFLICT and secret not in hidden.message + hidden.suggestion
    assert "[redacted]" in hidden.message


def test_a_missing_routine_is_downstream_error_naming_the_mismatch(shop: MariadbAdapter) -> None:
    outcome = call(shop, "missing", x=1)
    assert outcome.code is ErrorCode.DOWNSTREAM_ERROR and not outcome.sent
    assert "shop.no_such_procedure" in outcome.message and "1305" in outcome.message
    assert "catalog and the database do not match" in outcome.suggestion


def test_a_read_action_runs_read_only_so_a_writing_routine_fails_and_writes_nothing(
    shop: MariadbAdapter, maria: MariadbServer
) -> None:
    outcome = call(shop, "count_and_log", title="read-writes")
    assert outcome.code is ErrorCode.DOWNSTREAM_CONTRACT_VIOLATION and not outcome.sent, outcome
    assert "declared read-only" in outcome.message and "shop.count_and_log" in outcome.message
    assert items(maria, "read-writes") == 0


# -- time -----------------------------------------------------------------------------------------


@pytest.fixture
def patient(maria: MariadbServer) -> Iterator[MariadbAdapter]:
    """An adapter whose watchdog waits 2 s past the timeout: what ends a call sooner is the server's timer."""
    adapter = make_adapter(maria.dsn, watchdog_grace=2.0)
    assert call(adapter, "order_total", who="ada").ok  # connected: the time below is the call's alone
    yield adapter
    adapter.close()


def test_a_slow_write_is_stopped_by_the_statement_timeout_and_rolled_back(
    patient: MariadbAdapter, maria: MariadbServer
) -> None:
    started = time.monotonic()
    outcome = call(patient, "add_item_slowly", title="too-slow")  # SLEEP(2), then an insert; timeout 300ms
    elapsed = time.monotonic() - started
    assert outcome.code is ErrorCode.DOWNSTREAM_TIMEOUT and not outcome.sent, outcome
    assert "statement timeout 0.3s" in outcome.message and "nothing was committed" in outcome.message
    assert elapsed < 1.5  # the server's timer (0.3 s), not the SLEEP (2 s) nor the watchdog (2.3 s)
    # the interrupted SLEEP returned and the procedure went on to insert: only the rollback kept it out
    assert executions(maria, "too-slow") == 1 and items(maria, "too-slow") == 0


def test_a_slow_function_is_cancelled_by_the_statement_timeout(patient: MariadbAdapter) -> None:
    started = time.monotonic()
    outcome = call(patient, "nap", seconds=5)
    assert outcome.code is ErrorCode.DOWNSTREAM_TIMEOUT and not outcome.sent
    assert time.monotonic() - started < 1.5
    assert call(patient, "nap", ctx=CallContext(intent_id="short", timeout=2), seconds=0.01).data == {"result": 1}


# -- connections ----------------------------------------------------------------------------------


def test_nothing_listening_is_downstream_unreachable_never_sent(maria: MariadbServer) -> None:
    adapter = make_adapter(maria.url(port=free_port()))
    try:
        outcome = call(adapter, "add_item", title="nowhere")
        assert outcome.code is ErrorCode.DOWNSTREAM_UNREACHABLE and outcome.sent is False, outcome
        assert "Connection refused" in outcome.message
        assert adapter.probe(1.0).healthy is False
    finally:
        adapter.close()


def test_a_wrong_password_is_downstream_auth_failed_and_never_shown(maria: MariadbServer) -> None:
    wrong = "Wr0ng-Passw0rd-123"
    adapter = make_adapter(maria.url(password=wrong))
    try:
        outcome = call(adapter, "order_total", who="ada")
    finally:
        adapter.close()
    assert outcome.code is ErrorCode.DOWNSTREAM_AUTH_FAILED and not outcome.sent, outcome
    assert "Access denied" in outcome.message and wrong not in outcome.message + outcome.suggestion


def test_a_stale_pooled_connection_is_replaced_before_the_routine_is_sent(
    shop: MariadbAdapter, maria: MariadbServer
) -> None:
    assert call(shop, "order_total", who="ada").ok and shop.probe(1.0).healthy
    ids = maria.run_sql("SELECT id FROM information_schema.PROCESSLIST WHERE user = 'shop'")
    assert ids
    for (thread_id,) in ids:  # as after a server restart
        maria.run_sql(f"KILL CONNECTION {int(thread_id)}")
    outcome = call(shop, "add_item", title="after-restart")
    assert outcome.ok, outcome
    assert items(maria, "after-restart") == 1


class CommitCutter:
    """A TCP proxy in front of MariaDB that, once armed, answers a client's COMMIT (the exact packet,
    not SET AUTOCOMMIT) with an RST. The server speaks first, so the upstream is dialled at accept
    (FaultProxy waits for the client to speak)."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self.armed = False
        self.cuts = 0
        threading.Thread(target=self._accept, daemon=True, name="commit-cutter").start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:  # stopped
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True, name="commit-cutter-conn").start()

    def _serve(self, client: socket.socket) -> None:
        try:
            with client, socket.create_connection(("127.0.0.1", self.upstream_port), timeout=5) as upstream:
                upstream.settimeout(None)
                peers = {client: upstream, upstream: client}
                while True:
                    readable, _, _ = select.select(list(peers), [], [], 1.0)
                    for sock in readable:
                        data = sock.recv(65536)
                        if not data:
                            return
                        if sock is client and self.armed and data[4:] == b"\x03COMMIT":  # COM_QUERY "COMMIT"
                            self.cuts += 1
                            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                            return  # closed with SO_LINGER 0: an RST, and COMMIT never reaches the server
                        peers[sock].sendall(data)
        except OSError:
            return

    def stop(self) -> None:
        self.listener.close()


@pytest.fixture
def cutter(maria: MariadbServer) -> Iterator[tuple[MariadbAdapter, CommitCutter]]:
    proxy = CommitCutter(maria.port)
    adapter = make_adapter(maria.url(port=proxy.port))
    yield adapter, proxy
    adapter.close()
    proxy.stop()


def test_a_connection_lost_during_commit_is_outcome_unknown_for_a_write_and_retryable_if_safe(
    cutter: tuple[MariadbAdapter, CommitCutter], maria: MariadbServer
) -> None:
    adapter, proxy = cutter
    assert call(adapter, "order_total", who="ada").ok  # through the proxy
    proxy.armed = True
    outcome = call(adapter, "add_item", title="commit-lost")
    assert outcome.code is ErrorCode.OUTCOME_UNKNOWN and outcome.sent, outcome
    assert "may or may not have been committed" in outcome.message and outcome.suggestion
    assert proxy.cuts == 1 and executions(maria, "commit-lost") == 1  # the procedure ran
    assert items(maria, "commit-lost") == 0  # in fact COMMIT never arrived: MariaDB rolled it back
    safe = call(adapter, "add_item_safely", title="commit-lost-safe")
    assert safe.code is ErrorCode.DOWNSTREAM_ERROR and safe.sent and safe.code.retryable, safe.message


# -- hostile params -------------------------------------------------------------------------------

INJECTIONS = [
    "x'); DROP TABLE items; --",
    "\\'; SELECT SLEEP(10); --",
    "' OR '1'='1",
    "%s %(title)s {0} @_reach_0 `items`",
    "\u00bf\u0027 OR 1=1 -- ",  # a multibyte lead-in before a quote
]


def test_sql_injection_in_params_arrives_as_data(shop: MariadbAdapter, maria: MariadbServer) -> None:
    for text in INJECTIONS:
        assert call(shop, "add_item", title=text).ok, text
    assert [items(maria, text) for text in INJECTIONS] == [1] * len(INJECTIONS)
    assert call(shop, "orders_of", who="' OR '1'='1").data == {"rows": []}  # not every order


# -- the URL picks the dialect --------------------------------------------------------------------


def test_an_unsupported_database_url_is_refused_by_reach_validate_and_by_the_adapter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "shop.yaml").write_text(
        "connector:\n  name: shop\n  type: sql\n  dsn_env: SHOP_DSN\n  actions:\n"
        "    - action: order_total\n      function: shop.order_total\n      input: { who: { type: string } }\n"
    )
    monkeypatch.setenv("SHOP_DSN", "sqlite:///s3cret-pw.db")
    refused = CliRunner().invoke(reach_cli, ["validate", str(tmp_path)])
    assert refused.exit_code != 0 and "names a sqlite database" in refused.output, refused.output
    assert "mariadb+pymysql://" in refused.output and "s3cret-pw" not in refused.output
    monkeypatch.setenv("SHOP_DSN", "mariadb+pymysql://u:s3cret-pw@db/shop")
    assert CliRunner().invoke(reach_cli, ["validate", str(tmp_path)]).exit_code == 0
    for dsn in ("sqlite:///s3cret-pw.db", "mysql://u:s3cret-pw@db/shop", "mysql+mysqldb://u:s3cret-pw@db/shop"):
        with pytest.raises(ValueError) as error:
            make_adapter(dsn)
        assert "s3cret-pw" not in str(error.value) and "SHOP_DSN" in str(error.value)
        assert "sqlite" in str(error.value) or "PyMySQL (mysql+pymysql://)" in str(error.value)


# -- through a real fleet -------------------------------------------------------------------------

RUN = uuid.uuid4().hex[:6]
AGENT = f"maria_{RUN}"
CATALOG = f"""
connector:
  name: shop_maria
  type: sql
  dsn_env: MARIA_DSN
  pool: {{ concurrency: 2 }}
  retry: {{ max_attempts: 3, initial_backoff: 50ms, max_backoff: 200ms }}
  actions:
    - action: place_order
      procedure: shop.place_order
      input: {{ customer: {{ type: string }}, amount: {{ type: number }}, title: {{ type: string }} }}
      permission: write
      idempotent: false
    - action: add_item
      procedure: shop.add_item
      input: {{ title: {{ type: string, required: true }} }}
      permission: write
      idempotent: false
---
agent_app:
  name: {AGENT}
  connector_bindings:
    - connector: shop_maria
      allowed_actions: ["*"]
"""


@pytest.fixture(scope="module")
def reach(maria: MariadbServer) -> Iterator[ReachClient]:
    marks = redis.Redis.from_url(REDIS_URL)  # an earlier run's breaker or health marks in this Redis database
    marks.delete(keys.breaker("shop_maria"), keys.health("shop_maria"), keys.paused("shop_maria"))
    with Fleet(CATALOG, ["shop_maria"], env={"MARIA_DSN": maria.dsn}):
        reply_to = f"{AGENT}.{uuid.uuid4().hex[:8]}"
        with ReachClient(AGENT, BROKER_URL, reply_to=reply_to, drop_duplicates=False) as client:
            yield client


def test_receipts_through_the_fleet_and_the_same_idempotency_key_executes_once(
    reach: ReachClient, maria: MariadbServer
) -> None:
    placed = reach.call("shop_maria.place_order", {"customer": "ada", "amount": 3, "title": f"{RUN}-order"})
    assert placed.status == "succeeded" and isinstance(placed.data["order_id"], int), placed
    refused = reach.call("shop_maria.place_order", {"customer": "ada", "amount": 0, "title": f"{RUN}-zero"})
    assert refused.status == "failed" and refused.error is not None, refused
    assert refused.error.code == "DOWNSTREAM_VALIDATION_FAILED" and refused.error.retryable is False
    assert refused.error.message == "amount must be positive, got 0.00" and refused.execution.attempts == 1
    title, key = f"{RUN}-once", f"{RUN}-key-1"
    first = reach.call("shop_maria.add_item", {"title": title}, idempotency_key=key)
    second = reach.call("shop_maria.add_item", {"title": title}, idempotency_key=key)
    assert first.status == second.status == "succeeded", (first, second)
    assert not first.execution.deduplicated and second.execution.deduplicated and second.data == first.data
    assert items(maria, title) == 1 and executions(maria, title) == 1
