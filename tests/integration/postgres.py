"""A real PostgreSQL for tests, from the Debian binaries in /usr/lib/postgresql/<version>/bin.

``PostgresServer().start()`` runs initdb into a temporary directory (as the user ``postgres`` when
the tests run as root: initdb refuses root), starts the server with its own ``pg_ctl`` on 127.0.0.1
on a free port (unix socket in the same directory, password authentication), and creates a
database; ``stop()`` stops it with the same ``pg_ctl`` and removes the directory::

    with PostgresServer(database="shop") as pg:
        pg.run_sql("CREATE TABLE t (x int)")
        url = pg.dsn            # postgresql+psycopg://postgres:<password>@127.0.0.1:<port>/shop
        pg.run_sql("SELECT count(*) FROM t")   # -> [(0,)]

When the binaries are missing, ``start()`` raises ``PostgresMissing`` with what to install: the
fixtures turn that into a failure, never a skip.
"""

from __future__ import annotations

import atexit
import glob
import os
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg

from workers.ops.local_fleet import free_port

BINARIES = "/usr/lib/postgresql/*/bin"
SUPERUSER = "postgres"


class PostgresMissing(RuntimeError):
    """The PostgreSQL server binaries (initdb, pg_ctl) are not installed."""


def find_bindir() -> Path:
    """The newest /usr/lib/postgresql/<version>/bin that has initdb and pg_ctl."""
    found = [
        Path(d)
        for d in glob.glob(BINARIES)
        if os.access(Path(d) / "initdb", os.X_OK) and os.access(Path(d) / "pg_ctl", os.X_OK)
    ]
    if not found:
        raise PostgresMissing(
            f"no PostgreSQL server binaries in {BINARIES} (initdb, pg_ctl); "
            "install them with `apt-get install postgresql` (the tests start their own server)"
        )
    return max(found, key=lambda d: int(d.parent.name) if d.parent.name.isdigit() else 0)


class PostgresServer:
    """One throwaway PostgreSQL cluster with one database."""

    def __init__(self, database: str = "reach_test", settings: dict[str, str] | None = None) -> None:
        self.database = database
        self.password = secrets.token_hex(12)
        self.port = 0
        self.settings = {
            # a test cluster: speed over durability (the tests kill pools, never this server)
            "fsync": "off",
            "full_page_writes": "off",
            "synchronous_commit": "off",
            "max_connections": "100",
            **(settings or {}),
        }
        self.dir: Path | None = None
        self._bindir: Path | None = None
        self._running = False

    # -- where it is ---------------------------------------------------------------------------

    @property
    def dsn(self) -> str:
        """The SQLAlchemy URL of the database (psycopg 3)."""
        return self.url()

    def url(self, *, database: str | None = None, password: str | None = None, port: int | None = None) -> str:
        """The SQLAlchemy URL, with another database, password or port when given (wrong ones for tests)."""
        return (
            f"postgresql+psycopg://{SUPERUSER}:{password if password is not None else self.password}"
            f"@127.0.0.1:{port or self.port}/{database or self.database}"
        )

    @property
    def libpq_dsn(self) -> str:
        return f"host=127.0.0.1 port={self.port} user={SUPERUSER} password={self.password} dbname={self.database}"

    @property
    def log_path(self) -> Path:
        assert self.dir is not None
        return self.dir / "server.log"

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except (OSError, AssertionError):
            return ""

    # -- start and stop ------------------------------------------------------------------------

    def start(self) -> PostgresServer:
        self._bindir = find_bindir()
        self.dir = Path(tempfile.mkdtemp(prefix="reach-pg-"))
        data = self.dir / "data"
        pwfile = self.dir / "pwfile"
        pwfile.write_text(self.password + "\n")
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres", "postgres")
            shutil.chown(pwfile, "postgres", "postgres")
        atexit.register(self.stop)
        self._run(
            "initdb",
            "-D",
            str(data),
            "-U",
            SUPERUSER,
            "--auth=scram-sha-256",
            f"--pwfile={pwfile}",
            "--encoding=UTF8",
            "--locale=C",
            "--no-sync",
        )
        self.port = free_port()
        options = " ".join(
            [f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.dir}"]
            + [f"-c {name}={value}" for name, value in self.settings.items()]
        )
        self._run("pg_ctl", "-D", str(data), "-l", str(self.log_path), "-o", options, "-w", "-t", "30", "start")
        self._running = True
        self.run_sql(f'CREATE DATABASE "{self.database}"', database="postgres")
        return self

    def stop(self) -> None:
        """Stop the server (pg_ctl, immediate: a test cluster keeps nothing) and remove its directory."""
        if self._running and self.dir is not None:
            self._running = False
            try:
                self._run("pg_ctl", "-D", str(self.dir / "data"), "-m", "immediate", "-w", "-t", "30", "stop")
            except RuntimeError:
                pass  # already gone; its directory goes anyway
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    def _run(self, tool: str, *args: str) -> None:
        assert self._bindir is not None
        argv = [str(self._bindir / tool), *args]
        if os.geteuid() == 0:
            argv = ["runuser", "-u", "postgres", "--", *argv]
        result = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd="/")
        if result.returncode != 0:
            raise RuntimeError(
                f"{tool} failed ({result.returncode}): {result.stderr.strip() or result.stdout.strip()}\n"
                f"server log:\n{self.log_tail()}"
            )

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # -- SQL -----------------------------------------------------------------------------------

    def connect(self, database: str | None = None) -> psycopg.Connection[Any]:
        """A plain psycopg connection (autocommit) as the superuser."""
        return psycopg.connect(
            host="127.0.0.1",
            port=self.port,
            user=SUPERUSER,
            password=self.password,
            dbname=database or self.database,
            autocommit=True,
            connect_timeout=10,
        )

    def run_sql(self, text: str, params: Any = None, *, database: str | None = None) -> list[tuple[Any, ...]]:
        """Run ``text`` (several statements when there are no ``params``) in autocommit and return
        the rows of the last statement ([] when it returns none)."""
        with self.connect(database) as conn:
            cursor = conn.execute(text.encode() if params is None else text, params)
            while cursor.nextset():  # several statements: the last one's rows
                pass
            return cursor.fetchall() if cursor.description is not None else []

    def scalar(self, text: str, params: Any = None) -> Any:
        """The first column of the first row of ``text``."""
        rows = self.run_sql(text, params)
        return rows[0][0] if rows else None


def serve(schema: str = "", database: str = "reach_test") -> Iterator[PostgresServer]:
    """For a pytest fixture (``yield from serve(SCHEMA, "shop")``): a started server with ``schema``
    loaded, stopped afterwards. Missing binaries fail the test with what to install."""
    import pytest

    server = PostgresServer(database)
    try:
        server.start()
    except PostgresMissing as exc:
        pytest.fail(str(exc))
    try:
        if schema:
            server.run_sql(schema)
        yield server
    finally:
        server.stop()


# The sample system of the sql tests: an order book with a PL/pgSQL procedure and functions of each
# shape, and an item table without a unique constraint (so a duplicated effect shows as two rows).
SHOP_SCHEMA = r"""
CREATE SCHEMA shop;
CREATE TABLE shop.orders (
    id serial PRIMARY KEY,
    customer text NOT NULL,
    amount numeric(12, 2) NOT NULL,
    title text NOT NULL UNIQUE,
    placed_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE shop.items (id serial PRIMARY KEY, title text NOT NULL);
CREATE SEQUENCE shop.item_calls;   -- executions of add_item: a sequence is not rolled back
CREATE SEQUENCE shop.flaky_calls;

CREATE PROCEDURE shop.place_order(customer text, amount numeric, title text, INOUT order_id int)
LANGUAGE plpgsql AS $$
BEGIN
    IF amount <= 0 THEN
        RAISE EXCEPTION 'amount must be positive, got %', amount USING HINT = 'Send an amount greater than 0.';
    END IF;
    INSERT INTO shop.orders (customer, amount, title)
    VALUES (place_order.customer, place_order.amount, place_order.title)
    RETURNING id INTO order_id;
END $$;

CREATE FUNCTION shop.order_total(customer text) RETURNS numeric LANGUAGE sql STABLE
AS $$ SELECT coalesce(sum(o.amount), 0) FROM shop.orders o WHERE o.customer = $1 $$;

CREATE FUNCTION shop.orders_of(customer text)
RETURNS TABLE (order_id int, amount numeric, title text, placed_at timestamptz) LANGUAGE sql STABLE
AS $$ SELECT o.id, o.amount, o.title, o.placed_at FROM shop.orders o WHERE o.customer = $1 ORDER BY o.id $$;

CREATE FUNCTION shop.customer_summary(customer text, OUT orders bigint, OUT total numeric) LANGUAGE sql STABLE
AS $$ SELECT count(*), coalesce(sum(o.amount), 0) FROM shop.orders o WHERE o.customer = $1 $$;

CREATE FUNCTION shop.order_by_title(title text) RETURNS shop.orders LANGUAGE plpgsql STABLE AS $$
DECLARE found shop.orders;
BEGIN
    SELECT * INTO STRICT found FROM shop.orders o WHERE o.title = order_by_title.title;  -- none: P0002
    RETURN found;
END $$;

CREATE FUNCTION shop.sleep(seconds float8) RETURNS int LANGUAGE plpgsql AS $$
BEGIN PERFORM pg_sleep(seconds); RETURN 1; END $$;

CREATE PROCEDURE shop.add_item(title text, INOUT item_id int) LANGUAGE plpgsql AS $$
BEGIN
    PERFORM nextval('shop.item_calls');
    INSERT INTO shop.items (title) VALUES (add_item.title) RETURNING id INTO item_id;
END $$;

-- a write in flight for 0.3 s before it inserts (kill -9 tests, statement timeouts)
CREATE PROCEDURE shop.add_item_slowly(title text, INOUT item_id int) LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_sleep(0.3);
    CALL shop.add_item(title, item_id);
END $$;

-- a serialization failure on every other call, the first included (rolled back, safe to retry)
CREATE PROCEDURE shop.add_item_flaky(title text, INOUT item_id int) LANGUAGE plpgsql AS $$
BEGIN
    IF nextval('shop.flaky_calls') % 2 = 1 THEN
        RAISE EXCEPTION 'could not serialize access due to concurrent update' USING ERRCODE = 'serialization_failure';
    END IF;
    CALL shop.add_item(title, item_id);
END $$;

-- declared as a read by a (wrong) catalog: it writes
CREATE FUNCTION shop.count_and_log(title text) RETURNS bigint LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO shop.items (title) VALUES (count_and_log.title);
    RETURN (SELECT count(*) FROM shop.items);
END $$;
"""
