"""Test harness: a real fleet (``reach router`` + ``reach worker`` processes) on the real broker."""

from __future__ import annotations

import atexit
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from kombu import Connection

from producers.client import ReachClient, ReachError
from workers.ops.local_fleet import FleetProcesses, Proc, ProcessGroup, free_port  # noqa: F401  (free_port: tests import it from here)
from workers.transport.topology import INTENTS_QUEUE, connector_queue

REPO = Path(__file__).resolve().parent.parent
SHARED_BROKER_URL = os.environ.get("REACH_BROKER_URL", "amqp://guest:guest@127.0.0.1:5672//")
SHARED_REDIS_URL = os.environ.get("REACH_REDIS_URL", "redis://127.0.0.1:6379/0")


def _isolated() -> tuple[str, str]:
    """A vhost and a Redis database of this test run's own, so two runs on one machine (a developer
    and CI, or parallel sessions) never consume each other's intents or share breaker state.

    Needs rabbitmqctl next to the broker (as `bash .ci/test` sets up); REACH_TEST_ISOLATE=0, or a
    remote broker, uses the given URLs as they are.
    """
    from urllib.parse import quote, urlunsplit

    parts = urlsplit(SHARED_BROKER_URL)
    local = parts.hostname in ("localhost", "127.0.0.1", "::1")
    if os.environ.get("REACH_TEST_ISOLATE", "1") == "0" or not local or shutil.which("rabbitmqctl") is None:
        return SHARED_BROKER_URL, SHARED_REDIS_URL
    vhost = f"reach-test-{os.getpid()}"
    user = parts.username or "guest"
    try:
        subprocess.run(["rabbitmqctl", "add_vhost", vhost], check=True, capture_output=True, timeout=60)
        subprocess.run(
            ["rabbitmqctl", "set_permissions", "-p", vhost, user, ".*", ".*", ".*"],
            check=True,
            capture_output=True,
            timeout=60,
        )
    except (subprocess.SubprocessError, OSError):
        return SHARED_BROKER_URL, SHARED_REDIS_URL  # not ours to manage: share (and run alone)
    atexit.register(lambda: subprocess.run(["rabbitmqctl", "delete_vhost", vhost], capture_output=True, timeout=60))
    broker = urlunsplit(parts._replace(path="/" + quote(vhost, safe="")))
    redis_parts = urlsplit(SHARED_REDIS_URL)
    # parallel workers of one run (pytest-xdist: gw0, gw1, ...) get databases of their own
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    first = (int(worker[2:]) if worker[2:].isdigit() else os.getpid()) % TEST_DATABASES
    database = claim_database(lambda db: urlunsplit(redis_parts._replace(path=f"/{db}")), first)
    return broker, urlunsplit(redis_parts._replace(path=f"/{database}"))


# Redis databases 1..15 (0 is left alone: it is where real data usually lives)
TEST_DATABASES = 15
# set by the suite in every database it takes; a database with keys and without it is someone's data
TEST_MARKER = "reach-test:owner"
TEST_MARKER_TTL = 7 * 24 * 3600  # a run that was killed leaves a database the next run may take


class NoTestDatabase(RuntimeError):
    """Every Redis database the suite may use holds keys it did not write, or another live run's."""


def claim_database(url_of: Callable[[int], str], first: int, me: str | None = None) -> int:
    """The first of databases 1..15 (from ``first``) that is empty or the suite's own, marked as
    this run's and emptied of what an earlier run left (ledger records, open breakers under the
    same fixed names must not answer this run's intents).

    Never empties a database with keys the suite did not write: such a database has no marker
    (``TEST_MARKER``), and is passed over. One marked by a run still alive is passed over too.
    ``me``: this run's name in the marker (default ``host:pid``).

    Raises:
        NoTestDatabase: No database qualifies (says which hold other data).
    """
    import redis

    me = me or f"{socket.gethostname()}:{os.getpid()}"
    passed: list[str] = []
    for step in range(TEST_DATABASES):
        database = 1 + (first + step) % TEST_DATABASES
        client = redis.Redis.from_url(url_of(database))
        try:
            owner = client.get(TEST_MARKER)
            if owner is None:
                # an empty database becomes ours; NX: two runs starting at once cannot both take it
                if client.dbsize() > 0 or not client.set(TEST_MARKER, me, nx=True, ex=TEST_MARKER_TTL):
                    passed.append(f"{database} (holds keys the suite did not write)")
                    continue
            elif owner.decode() != me and _alive(owner.decode()):
                passed.append(f"{database} (in use by test run {owner.decode()})")
                continue
            else:
                # the suite's own leftovers: taken over (the marker first, so a dead run's is replaced)
                client.set(TEST_MARKER, me, ex=TEST_MARKER_TTL)
            _empty_but_marker(client)
            return database
        finally:
            client.close()
    raise NoTestDatabase(
        "no Redis database the test suite may empty: "
        + "; ".join(passed)
        + f". The suite empties only databases that are empty or hold its marker key {TEST_MARKER!r}; "
        "free a database 1..15, or point REACH_REDIS_URL at a Redis server kept for tests"
    )


def _alive(owner: str) -> bool:
    """Whether the run that wrote this marker (``host:pid``) still runs; another host's: assumed so."""
    host, _, pid = owner.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return True
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _empty_but_marker(client: Any) -> None:
    """Delete every key but the marker (FLUSHDB would drop it and leave a moment without one)."""
    batch: list[bytes] = []
    for key in client.scan_iter(count=1000):
        if key != TEST_MARKER.encode():
            batch.append(key)
        if len(batch) >= 1000:
            client.delete(*batch)
            batch.clear()
    if batch:
        client.delete(*batch)


_URLS: tuple[str, str] | None = None


def isolated_urls() -> tuple[str, str]:
    """This test process's broker and Redis URLs (made on first use, not at import: a benchmark
    that imports the harness brings its own)."""
    global _URLS
    if _URLS is None:
        _URLS = _isolated()
    return _URLS


def __getattr__(name: str) -> str:
    # ``from tests.fleet import BROKER_URL, REDIS_URL``: this run's isolated URLs
    if name == "BROKER_URL":
        return isolated_urls()[0]
    if name == "REDIS_URL":
        return isolated_urls()[1]
    raise AttributeError(name)


def reachable(url: str, default_port: int) -> bool:
    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or default_port), timeout=2):
            return True
    except OSError:
        return False


def queue_depth(name: str, broker_url: str | None = None) -> tuple[int, int]:
    """(messages ready, consumers) of a queue."""
    with Connection(broker_url or isolated_urls()[0]) as conn:
        channel = conn.channel()
        try:
            result = channel.queue_declare(name, passive=True)
            return int(result.message_count), int(result.consumer_count)
        finally:
            channel.close()


def purge(*names: str, broker_url: str | None = None) -> None:
    with Connection(broker_url or isolated_urls()[0]) as conn:
        channel = conn.channel()
        for name in names:
            try:
                channel.queue_purge(name)
            except Exception:  # not declared yet: nothing to purge
                channel = conn.channel()
        channel.close()


class Fleet:
    """The router and one pool per named connector against a catalog text, on this test run's
    vhost and Redis database (or the URLs given), and a process per pool group (``groups``: the
    group's name -> its connectors, each started as ``reach worker A B --group NAME``). The
    processes are those of ``workers.ops.local_fleet``, which ``reach demo`` and the benchmarks use too."""

    def __init__(
        self,
        catalog_yaml: str,
        pools: list[str],
        *,
        groups: dict[str, list[str]] | None = None,
        env: dict[str, str] | None = None,
        log_dir: Path | None = None,
        broker_url: str | None = None,
        redis_url: str | None = None,
    ) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="reach-test-catalog-"))
        (self.dir / "catalog.yaml").write_text(catalog_yaml)
        self.pools = pools
        self.groups = groups or {}
        self.log_dir = log_dir or self.dir
        default_broker, default_redis = (None, None) if broker_url and redis_url else isolated_urls()
        self.broker_url = broker_url or str(default_broker)
        self.redis_url = redis_url or str(default_redis)
        self.processes = FleetProcesses(
            ProcessGroup(self.log_dir), self.dir, self.broker_url, self.redis_url, env=env or {}
        )
        self.env = self.processes.env
        self.procs = self.processes.group.items  # name -> Proc (pid, poll())

    def start(self, timeout: float = 60.0) -> Fleet:
        """Start the router and the pools and wait until they answer. If any of them does not come
        up, what did start is stopped before the error goes on: a router left running would keep
        answering this run's vhost with its catalog, and fail the test files that come after."""
        try:
            return self._start(timeout)
        except BaseException:
            self.stop()
            raise

    def _start(self, timeout: float) -> Fleet:
        grouped = [c for connectors in self.groups.values() for c in connectors]
        purge(INTENTS_QUEUE.name, *(connector_queue(p).name for p in self.pools + grouped), broker_url=self.broker_url)
        self.start_process("router", ["router"])
        for pool in self.pools:
            self.start_process(pool, ["worker", pool])
        for group, connectors in self.groups.items():
            self.start_group(group, connectors)
        deadline = time.time() + timeout
        for pool in self.pools + grouped:
            self.processes.wait_consuming(connector_queue(pool).name, max(1.0, deadline - time.time()))
        # the router is ready when it answers
        # the probe sends as the broker login with user_id set, so it is answered in every identity mode
        login = urlsplit(self.broker_url).username or "guest"
        while True:  # on a fresh vhost the exchanges exist once the router (or a pool) has declared them
            self.check_alive()
            try:
                probe = ReachClient(login, self.broker_url, authenticated=True)
                break
            except ReachError:
                if time.time() > deadline:
                    raise RuntimeError(f"the fleet's exchanges were never declared; see {self.log_dir}") from None
                time.sleep(0.2)
        with probe:
            while True:
                self.check_alive()
                try:
                    probe.call("reach.list_tools", {}, timeout=2)
                    break
                except TimeoutError:
                    if time.time() > deadline:
                        raise RuntimeError(f"router did not answer; see {self.log_dir}") from None
        return self

    def start_process(self, name: str, args: list[str], extra_env: dict[str, str] | None = None) -> Proc:
        return self.processes.start(name, args, extra_env)

    def start_group(self, name: str, connectors: list[str], extra_env: dict[str, str] | None = None) -> Proc:
        """Start a pool group: one process (named ``name``) for ``connectors``; no waiting."""
        return self.start_process(name, ["worker", *connectors, "--group", name], extra_env)

    def metrics_port(self, name: str) -> int:
        """The REACH_METRICS_PORT the running process ``name`` serves /metrics, /healthz and /readyz on."""
        return self.processes.metrics_ports[name]

    def check_alive(self) -> None:
        self.processes.group.check_alive()

    def log(self, name: str) -> str:
        path = self.log_dir / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def log_lines(self, name: str) -> list[str]:
        """The complete lines of a process's log (a line still being written is left for the next read)."""
        text = self.log(name)
        return text[: text.rfind("\n") + 1].splitlines()

    def stages(self, agent_id: str, intent_id: str) -> list[str]:
        """The audit stages recorded so far for an agent's intent, in order (what ``reach trace`` shows)."""
        import redis

        from workers.observability.audit import read_trace

        client = redis.Redis.from_url(self.redis_url)
        try:
            return [event["stage"] for event in read_trace(client, agent_id, intent_id)]
        finally:
            client.close()

    def stop_process(self, name: str) -> None:
        self.processes.group.stop(name)

    def kill_process(self, name: str) -> int:
        """kill -9 the process group of ``name``, reap it, and return its pid (a crash, not a stop)."""
        return self.processes.group.kill(name)

    def wait_consuming(self, queue: str, timeout: float = 60.0, consumers: int = 1) -> None:
        """Wait until ``queue`` has at least ``consumers`` consumers (a process started or reconnected)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                if self.processes.queue_state(queue)[1] >= consumers:
                    return
            except Exception:  # broker not back yet
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{queue} has no consumer after {timeout:g} s; see {self.log_dir}")
            time.sleep(0.1)

    def stop(self) -> None:
        """Stop every process at once (SIGTERM to each group, SIGKILL after 20 s)."""
        self.processes.group.stop_all()

    def __enter__(self) -> Fleet:
        try:
            return self.start()
        except BaseException:
            self.stop()  # what started before the failure must not outlive the test
            raise

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def agent(agent_id: str, broker_url: str | None = None) -> ReachClient:
    return ReachClient(agent_id, broker_url or isolated_urls()[0], drop_duplicates=False)  # tests see the wire as it is
