"""A real RabbitMQ cluster on this machine (three nodes by default), for tests that stop nodes.

Each node has a name of its own (``reach1-<token>@localhost``, ...), free AMQP and distribution
ports on 127.0.0.1, its data and logs under one temporary directory, and no plugins (no
management listener). The nodes share an Erlang cookie through ``HOME``: RabbitMQ 3.10 and its CLI
read ``$HOME/.erlang.cookie`` (``RABBITMQ_ERLANG_COOKIE`` is deprecated). The scripts are run from
``/usr/lib/rabbitmq/bin``: the ``/usr/sbin`` wrappers switch to the ``rabbitmq`` user and drop
this environment. Nodes 2.. join node 1 with ``stop_app; join_cluster; start_app``.

Nothing here touches another broker on the machine (the shared one on 5672 that the rest of the
suite uses): every ``rabbitmqctl`` call names one of these nodes (``-n``), and only these nodes'
processes are stopped — ``rabbitmqctl stop`` first, then their own process group. The Erlang port
mapper (epmd) they register with is the machine's and stays.

A cluster that cannot be started raises :class:`ClusterError`; tests turn it into a failure. A
watchdog process stops the nodes if the test process dies without closing the cluster (killed by a
timeout, say): the nodes run in sessions of their own and would outlive it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

from tests.waiting import wait_for
from workers.ops.local_fleet import free_ports

SCRIPTS = Path("/usr/lib/rabbitmq/bin")
# run by the watchdog: once the test process (argv[1]) is gone, SIGTERM then SIGKILL every process
# group listed in argv[2] (one per line, appended as nodes start), and remove the cluster's directory
WATCHDOG = """
import os, shutil, signal, sys, time
parent, groups, root = int(sys.argv[1]), sys.argv[2], sys.argv[3]
while True:
    try:
        os.kill(parent, 0)
    except ProcessLookupError:
        break
    if not os.path.exists(groups):
        sys.exit(0)
    time.sleep(1)
pgids = [int(line) for line in open(groups).read().split()]
for sig in (signal.SIGTERM, signal.SIGKILL):
    for pgid in pgids:
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            pass
    time.sleep(10)
shutil.rmtree(root, ignore_errors=True)
"""
_PLAIN = re.compile(r"^[A-Za-z0-9._/-]{1,200}$")
START_SECONDS = 90.0
STOP_SECONDS = 60.0


class ClusterError(RuntimeError):
    """The cluster (or one of its nodes) could not be started, joined or stopped."""


def _tool(name: str) -> str:
    """The RabbitMQ script itself, not a wrapper that changes user (and so HOME and the cookie)."""
    if (SCRIPTS / name).is_file():
        return str(SCRIPTS / name)
    found = shutil.which(name)
    if found is None:
        raise ClusterError(f"{name} is not installed (apt-get install rabbitmq-server)")
    return found


@dataclass
class Node:
    """One node of the cluster."""

    name: str  # Erlang node name, e.g. reach1-1a2b3c@localhost
    port: int  # AMQP
    dist_port: int  # Erlang distribution (clustering, CLI)
    base: Path  # data and logs
    process: subprocess.Popen[bytes] | None = None
    log: Path = field(init=False)

    def __post_init__(self) -> None:
        self.log = self.base / "console.log"

    def url(self, vhost: str = "/", user: str = "guest", password: str = "guest") -> str:
        return f"amqp://{user}:{password}@127.0.0.1:{self.port}/{quote(vhost, safe='')}"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def short(self) -> str:
        return self.name.split("-")[0]


class RabbitCluster:
    """``size`` RabbitMQ nodes clustered on this machine; use as a context manager (``start``,
    then ``close`` stops every node it started and removes their data)."""

    def __init__(self, size: int = 3) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="reach-rabbit-cluster-"))
        self.home = self.root / "home"
        self.home.mkdir()
        cookie = self.home / ".erlang.cookie"
        cookie.write_text(uuid.uuid4().hex.upper())
        cookie.chmod(0o400)
        (self.root / "enabled_plugins").write_text("[].\n")
        token = uuid.uuid4().hex[:6]
        ports = free_ports(2 * size)  # distinct: an AMQP port equal to a dist port fails the boot
        self.nodes = [
            Node(f"reach{i}-{token}@localhost", ports[2 * i - 2], ports[2 * i - 1], self.root / f"reach{i}")
            for i in range(1, size + 1)
        ]
        self._ctl = _tool("rabbitmqctl")
        self._server = _tool("rabbitmq-server")
        self._spawned: list[subprocess.Popen[bytes]] = []  # every node process started, to stop them all
        self._groups = self.root / "process-groups"  # the same, for the watchdog
        self._groups.touch()
        self._watchdog = subprocess.Popen(
            [sys.executable, "-c", WATCHDOG, str(os.getpid()), str(self._groups), str(self.root)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

    def __enter__(self) -> RabbitCluster:
        return self if any(node.running for node in self.nodes) else self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the whole cluster -------------------------------------------------------------------

    def start(self) -> RabbitCluster:
        """Start every node (at once), then join nodes 2.. to node 1. Raises ClusterError."""
        try:
            for node in self.nodes:
                self._spawn(node)
            for node in self.nodes:
                self._await(node)
            first = self.nodes[0]
            for node in self.nodes[1:]:
                self.ctl(node, "stop_app")
                self.ctl(node, "join_cluster", first.name)
                self.ctl(node, "start_app")
            running = self.running_nodes(first)
            if sorted(running) != sorted(n.name for n in self.nodes):
                raise ClusterError(f"cluster formed with {running}, expected every node of {self.nodes}")
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        """Stop every node this cluster started: ``rabbitmqctl stop`` by name, then the process
        group of any node process still there (SIGTERM, then SIGKILL)."""
        for node in self.nodes:
            subprocess.run(
                [self._ctl, "-n", node.name, "-q", "stop"], env=self.env(node), capture_output=True, timeout=60
            )
        for process in self._spawned:
            for sig in (signal.SIGTERM, signal.SIGKILL):
                if process.poll() is not None:
                    break
                try:
                    os.killpg(process.pid, sig)
                    process.wait(timeout=20)
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    pass
        shutil.rmtree(self.root, ignore_errors=True)  # (the watchdog sees its list gone and exits)
        try:
            self._watchdog.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._watchdog.kill()

    def urls(self, vhost: str = "/", order: list[Node] | None = None) -> str:
        """Every node's URL, split by ``;`` (REACH_BROKER_URL for a cluster), in ``order``."""
        return ";".join(node.url(vhost) for node in (order or self.nodes))

    def node(self, name: str) -> Node:
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(name)

    def any_running(self) -> Node:
        for node in self.nodes:
            if node.running:
                return node
        raise ClusterError("no node of the cluster is running")

    # -- nodes ---------------------------------------------------------------------------------

    def env(self, node: Node) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RABBITMQ_")}
        env.update(
            HOME=str(self.home),
            RABBITMQ_NODENAME=node.name,
            RABBITMQ_NODE_IP_ADDRESS="127.0.0.1",
            RABBITMQ_NODE_PORT=str(node.port),
            RABBITMQ_DIST_PORT=str(node.dist_port),
            RABBITMQ_MNESIA_BASE=str(node.base / "mnesia"),
            RABBITMQ_LOG_BASE=str(node.base / "log"),
            RABBITMQ_PID_FILE=str(node.base / "pid"),
            RABBITMQ_ENABLED_PLUGINS_FILE=str(self.root / "enabled_plugins"),
            # none of the machine's own configuration (it may name the shared node or its ports)
            RABBITMQ_CONF_ENV_FILE=str(self.root / "no-rabbitmq-env.conf"),
            RABBITMQ_CONFIG_FILE=str(self.root / "no-rabbitmq"),
            RABBITMQ_ADVANCED_CONFIG_FILE=str(self.root / "no-advanced.config"),
        )
        return env

    def _spawn(self, node: Node) -> None:
        node.base.mkdir(exist_ok=True)
        with open(node.log, "ab") as log:
            node.process = subprocess.Popen(
                [self._server],
                env=self.env(node),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # its own process group: stopped with everything it started
            )
        self._spawned.append(node.process)
        with open(self._groups, "a") as groups:
            groups.write(f"{node.process.pid}\n")

    def _await(self, node: Node, timeout: float = START_SECONDS) -> None:
        """Until the node has booted (the CLI cannot reach it until it registered with epmd)."""
        deadline = time.monotonic() + timeout
        while True:
            if not node.running:
                raise ClusterError(f"node {node.name} exited while starting:\n{self.tail(node)}")
            done = subprocess.run(
                [self._ctl, "-n", node.name, "-q", "await_startup", "--timeout", "30"],
                env=self.env(node),
                capture_output=True,
                timeout=40,
            )
            if done.returncode == 0:
                return
            if time.monotonic() > deadline:
                raise ClusterError(f"node {node.name} did not start within {timeout:g} s:\n{self.tail(node)}")
            time.sleep(0.5)

    def start_node(self, node: Node) -> None:
        """Start a stopped node again; it rejoins the cluster it belonged to."""
        if node.running:
            return
        self._spawn(node)
        self._await(node)

    def stop(self, node: Node, timeout: float = STOP_SECONDS) -> None:
        """Stop a node gracefully, as an operator would (its connections are closed, its quorum
        queue replicas leave); if it does not exit in time, its process group is killed."""
        if not node.running:
            return
        subprocess.run(
            [self._ctl, "-n", node.name, "-q", "stop"], env=self.env(node), capture_output=True, timeout=timeout + 10
        )
        process = node.process
        assert process is not None
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)

    def ctl(self, node: Node, *args: str, timeout: float = 120.0) -> str:
        """``rabbitmqctl -n NODE ARGS``; its output. Raises ClusterError if it fails."""
        done = subprocess.run(
            [self._ctl, "-n", node.name, "-q", *args],
            env=self.env(node),
            capture_output=True,
            timeout=timeout,
            text=True,
        )
        if done.returncode != 0:
            raise ClusterError(f"rabbitmqctl -n {node.name} {' '.join(args)}: {done.stderr.strip() or done.stdout}")
        return done.stdout

    def tail(self, node: Node, lines: int = 30) -> str:
        """The end of the node's console output and of its log, and its exit status if it exited."""
        parts = []
        if node.process is not None and node.process.poll() is not None:
            parts.append(f"exit status {node.process.returncode}")
        for path in [node.log, *sorted((node.base / "log").glob("*.log"))]:
            if path.exists():
                text = path.read_text(errors="replace").splitlines()[-lines:]
                parts.append(f"--- {path.name}\n" + "\n".join(text))
        return "\n".join(parts)

    # -- what the cluster says -----------------------------------------------------------------

    def running_nodes(self, via: Node | None = None) -> list[str]:
        status = json.loads(self.ctl(via or self.any_running(), "cluster_status", "--formatter", "json"))
        return [str(name) for name in status.get("running_nodes", [])]

    def add_vhost(self, vhost: str) -> None:
        node = self.any_running()
        self.ctl(node, "add_vhost", vhost)
        self.ctl(node, "set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")

    def leader(self, queue: str, vhost: str = "/") -> Node:
        """The node leading a quorum queue now (asked of a running node)."""
        rows = json.loads(
            self.ctl(self.any_running(), "list_queues", "-p", vhost, "name", "leader", "--formatter", "json")
        )
        for row in rows:
            if row.get("name") == queue and row.get("leader"):
                return self.node(str(row["leader"]))
        raise ClusterError(f"{queue} in {vhost} has no leader now: {rows}")

    def move_leader(self, queue: str, to: Node, vhost: str = "/") -> None:
        """Make ``to`` lead a quorum queue, with the function RabbitMQ's maintenance mode
        (``rabbitmq-upgrade drain``) moves leaders with; waits until it does."""
        if not _PLAIN.match(queue) or not _PLAIN.match(vhost):
            raise ValueError("queue and vhost names here are plain ([A-Za-z0-9._-])")
        if self.leader(queue, vhost) is to:
            return
        self.ctl(
            self.any_running(),
            "eval",
            f'{{ok, Q}} = rabbit_amqqueue:lookup(rabbit_misc:r(<<"{vhost}">>, queue, <<"{queue}">>)), '
            f"rabbit_quorum_queue:transfer_leadership(Q, '{to.name}').",
        )
        wait_for(lambda: self.leader(queue, vhost) is to, 60, f"{to.name} to lead {queue}")

    def wait_leader_elsewhere(self, queue: str, gone: Node, vhost: str = "/", timeout: float = 60.0) -> Node:
        """The node that leads ``queue`` once it is no longer ``gone``."""
        found: list[Node] = []

        def moved() -> bool:
            try:
                node = self.leader(queue, vhost)
            except ClusterError:
                return False
            found[:] = [node]
            return node is not gone

        wait_for(moved, timeout, f"a new leader of {queue}")
        return found[0]
