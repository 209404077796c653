"""Redis set-ups on this machine, for the tests and benchmarks: a Redis Cluster, a
Sentinel-watched master with a replica, and one server that persists what it is sent (AOF), each
``redis-server`` processes on free loopback ports, started and stopped by PID
(``workers.ops.local_fleet.ProcessGroup``).

    with LocalCluster(masters=3, replicas=1) as cluster:     # cluster.url: redis+cluster://...
        ...
    with LocalSentinel() as sentinel:                         # sentinel.url: redis+sentinel://.../reach/0
        sentinel.kill_master()                                # kill -9
        sentinel.wait_failover()                              # the replica is the master now
    with LocalRedis() as server:                              # server.url: redis://127.0.0.1:PORT/0
        server.kill()                                         # kill -9
        server.start()                                        # again, from its append-only file

One sentinel, not three: these set-ups test the fleet's side of a failover (finding the new
master, retrying, waiting for replicas), not Sentinel's own agreement, which a quorum of one
reaches at once (three sentinels on one machine would only add processes and election time).
A missing ``redis-server`` is an error here, never a skip.

``replica_delay`` (seconds) puts a link in front of the master that holds everything the master
sends to the replica that long: a replica in another zone, so a failover can lose the writes
of that last stretch (what ``REACH_REDIS_WAIT_REPLICAS`` is about). Use it with
``sentinel=False`` (``master_url`` then names the master): a sentinel finds the replica
replicating from an address that is not the master's and points it at the master itself within
seconds ("+fix-slave-config"), which takes the link, and its delay, away.
"""

from __future__ import annotations

import collections
import select
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import redis

from workers.ops.local_fleet import ProcessGroup, free_port, free_ports

SENTINEL_SERVICE = "reach"


def redis_server() -> str:
    """The redis-server binary; its absence fails the test (the suite installs it)."""
    found = shutil.which("redis-server")
    if found is None:
        raise RuntimeError("redis-server is not installed (apt-get install redis-server); these tests need it")
    return found


def _wait(condition: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if condition():  # type: ignore[operator]
                return
        except (redis.RedisError, OSError):
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} within {timeout:g} s")
        time.sleep(0.05)


class _Servers:
    """redis-server processes in a temp dir of their own (configs, logs, cluster state)."""

    def __init__(self, prefix: str) -> None:
        self.binary = redis_server()
        self.dir = Path(tempfile.mkdtemp(prefix=prefix))
        self.group = ProcessGroup(self.dir)

    def start(self, name: str, port: int, *args: str, persist: bool = False) -> None:
        """``persist``: keep an append-only file in the dir, fsynced before each write is answered."""
        aof = ["--appendonly", "yes", "--appendfsync", "always"] if persist else ["--appendonly", "no"]
        common = ["--port", str(port), "--bind", "127.0.0.1", "--dir", str(self.dir), "--save", "", *aof]
        self.group.start(name, [self.binary, *args, *common, "--logfile", ""])
        _wait(lambda: redis.Redis(port=port, socket_connect_timeout=0.5).ping(), 10, f"{name} did not answer")

    def stop(self) -> None:
        self.group.stop_all(grace=5)
        shutil.rmtree(self.dir, ignore_errors=True)


class LocalRedis:
    """One server with persistence on (AOF, ``appendfsync always``, no RDB snapshots): what it
    answered is on disk, so after ``kill()`` (kill -9) ``start()`` brings it back on the same port
    from the same directory with every acknowledged write."""

    def __init__(self) -> None:
        self.port = free_port()
        self._servers = _Servers("reach-redis-aof-")

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> LocalRedis:
        try:
            self._servers.start("redis", self.port, persist=True)
        except BaseException:
            self.stop()
            raise
        return self

    def kill(self) -> int:
        """kill -9 (a crash: no SHUTDOWN, no last save); returns its pid."""
        return self._servers.group.kill("redis")

    def stop(self) -> None:
        self._servers.stop()

    def __enter__(self) -> LocalRedis:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class LocalCluster:
    """``masters`` masters with ``replicas`` replicas each, made into a cluster by ``redis-cli --cluster create``."""

    def __init__(self, masters: int = 3, replicas: int = 0) -> None:
        self.masters, self.replicas = masters, replicas
        self.ports: list[int] = []
        self._servers = _Servers("reach-redis-cluster-")

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{port}" for port in self.ports[: self.masters])

    def client(self) -> redis.RedisCluster:
        return redis.RedisCluster(host="127.0.0.1", port=self.ports[0])

    def start(self) -> LocalCluster:
        try:
            for i in range(self.masters * (1 + self.replicas)):
                port, bus = free_ports(2)  # distinct: a bus port equal to the port fails the start
                self.ports.append(port)
                self._servers.start(
                    f"node{i}",
                    port,
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    f"nodes-{port}.conf",
                    "--cluster-port",  # the bus port: port + 10000 may be past 65535 or taken
                    str(bus),
                    "--cluster-node-timeout",
                    "2000",
                )
            subprocess.run(
                ["redis-cli", "--cluster", "create", *(f"127.0.0.1:{p}" for p in self.ports)]
                + ["--cluster-replicas", str(self.replicas), "--cluster-yes"],
                check=True,
                capture_output=True,
                timeout=60,
            )
            _wait(self._ready, 30, "the cluster did not become ready")
        except BaseException:
            self.stop()
            raise
        return self

    def _ready(self) -> bool:
        for port in self.ports:
            node = redis.Redis(port=port, socket_timeout=1)
            if node.cluster("INFO").get("cluster_state") != "ok":
                return False
            info = node.info("replication")
            if info["role"] == "slave" and info.get("master_link_status") != "up":
                return False
        return True

    def stop(self) -> None:
        self._servers.stop()

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class LocalSentinel:
    """A master, one replica and one sentinel watching them as service ``reach``."""

    def __init__(self, replica_delay: float = 0.0, down_after_ms: int = 1000, sentinel: bool = True) -> None:
        self.master_port, self.replica_port, self.sentinel_port = free_ports(3)
        self.replica_delay = replica_delay
        self.down_after_ms = down_after_ms
        self.with_sentinel = sentinel
        self._servers = _Servers("reach-redis-sentinel-")
        self._link: DelayLink | None = None

    @property
    def url(self) -> str:
        return f"redis+sentinel://127.0.0.1:{self.sentinel_port}/{SENTINEL_SERVICE}/0"

    @property
    def master_url(self) -> str:
        return f"redis://127.0.0.1:{self.master_port}/0"

    def start(self) -> LocalSentinel:
        try:
            self._servers.start("master", self.master_port)
            upstream = self.master_port
            if self.replica_delay:
                self._link = DelayLink(self.master_port, self.replica_delay).start()
                upstream = self._link.port
            self._servers.start("replica", self.replica_port, "--replicaof", "127.0.0.1", str(upstream))
            _wait(self._replica_linked, 20, "the replica did not sync")
            if not self.with_sentinel:
                return self
            conf = self._servers.dir / "sentinel.conf"
            conf.write_text(
                f"port {self.sentinel_port}\nbind 127.0.0.1\ndir {self._servers.dir}\n"
                f"sentinel monitor {SENTINEL_SERVICE} 127.0.0.1 {self.master_port} 1\n"
                f"sentinel down-after-milliseconds {SENTINEL_SERVICE} {self.down_after_ms}\n"
                f"sentinel failover-timeout {SENTINEL_SERVICE} 10000\n"
                f"sentinel parallel-syncs {SENTINEL_SERVICE} 1\n"
            )
            self._servers.group.start("sentinel", [self._servers.binary, str(conf), "--sentinel"])
            _wait(self._sentinel_sees_replica, 20, "the sentinel did not find the replica")
        except BaseException:
            self.stop()
            raise
        return self

    def _replica_linked(self) -> bool:
        info = redis.Redis(port=self.replica_port, socket_timeout=1).info("replication")
        return bool(info.get("master_link_status") == "up")

    def _sentinel_sees_replica(self) -> bool:
        sentinel = redis.Redis(port=self.sentinel_port, socket_timeout=1)
        replicas = sentinel.sentinel_slaves(SENTINEL_SERVICE)
        return any(r.get("port") == self.replica_port and "s_down" not in r.get("flags", "") for r in replicas)

    def master(self) -> tuple[str, int]:
        host, port = redis.Redis(port=self.sentinel_port, socket_timeout=1).sentinel_get_master_addr_by_name(
            SENTINEL_SERVICE
        )
        return (host.decode() if isinstance(host, bytes) else host), int(port)

    def kill_master(self) -> int:
        """kill -9 the master (as a crashed host would go): nothing it has not sent is kept."""
        return self._servers.group.kill("master")

    def wait_failover(self, timeout: float = 30.0) -> float:
        """Wait until the sentinel names the replica as the master; the seconds it took."""
        started = time.monotonic()
        _wait(lambda: self.master()[1] == self.replica_port, timeout, "the sentinel did not fail over")
        _wait(
            lambda: redis.Redis(port=self.replica_port, socket_timeout=1).info("replication")["role"] == "master",
            timeout,
            "the replica was not promoted",
        )
        return time.monotonic() - started

    def stop(self) -> None:
        if self._link is not None:
            self._link.stop()
        self._servers.stop()

    def __enter__(self) -> LocalSentinel:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


class DelayLink:
    """A TCP link to ``upstream_port`` that delivers what the upstream sends ``delay`` seconds late
    (in order); what the client sends goes through at once. One connection at a time is enough
    for a replica."""

    def __init__(self, upstream_port: int, delay: float) -> None:
        self.upstream_port, self.delay = upstream_port, delay
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._stop = threading.Event()

    def start(self) -> DelayLink:
        threading.Thread(target=self._accept, daemon=True, name="delay-link").start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._listener.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True, name="delay-link-conn").start()

    def _serve(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port), timeout=5)
        except OSError:
            client.close()
            return
        pending: collections.deque[tuple[float, bytes]] = collections.deque()
        try:
            while not self._stop.is_set():
                wait = max(0.0, pending[0][0] - time.monotonic()) if pending else 0.05
                readable, _, _ = select.select([client, upstream], [], [], min(wait, 0.05))
                if client in readable:
                    data = client.recv(65536)
                    if not data:
                        return
                    upstream.sendall(data)
                if upstream in readable:
                    data = upstream.recv(65536)
                    if not data:
                        return
                    pending.append((time.monotonic() + self.delay, data))
                while pending and pending[0][0] <= time.monotonic():
                    client.sendall(pending.popleft()[1])
        except OSError:
            pass
        finally:
            client.close()
            upstream.close()


# -- the fleet on a topology: the checks the cluster and Sentinel tests share ----------------------

WRITE_CONNECTOR, FLAKY_CONNECTOR = "topo_items", "topo_flaky"


def fleet_catalog(items_url: str, flaky_url: str, agents: list[str], limited: str) -> str:
    """Two connectors (a plain non-idempotent write, and one whose breaker opens after three 5xx)
    and the agents bound to both; ``limited`` may send 3 intents a minute."""
    connector = """
connector:
  name: {name}
  endpoint: {url}
  pool: {{ concurrency: 8 }}
  retry: {{ max_attempts: 1 }}
  breaker: {{ fail_max: 3, reset_timeout: 60s }}
  actions:
    - action: create_item
      description: Create an item (a side effect that must happen at most once)
      path: POST /items
      input:
        title: {{ type: string, required: true }}
      permission: write
      timeout: 5s
      idempotent: false
---"""
    catalog = connector.format(name=WRITE_CONNECTOR, url=items_url) + connector.format(
        name=FLAKY_CONNECTOR, url=flaky_url
    )
    for name in [*agents, limited]:
        rate = "\n      rate_limit: 3/min" if name == limited else ""
        catalog += f"""
agent_app:
  name: {name}
  connector_bindings:
    - connector: {WRITE_CONNECTOR}
      allowed_actions: ["*"]{rate}
    - connector: {FLAKY_CONNECTOR}
      allowed_actions: ["*"]
---"""
    return catalog.removesuffix("---")


def gather(client: Any, expected: set[str], timeout: float = 60, grace: float = 1.5) -> list[Any]:
    """Receipts until every expected one arrived (or ``timeout``), then ``grace`` s more, so a
    second receipt for anything shows up too."""
    got: list[Any] = []
    deadline = time.monotonic() + timeout
    while not expected <= {r.intent_id for r in got} and time.monotonic() < deadline:
        got.extend(client.receipts(timeout=0.5))
    got.extend(client.receipts(timeout=grace))
    return got
