"""Writes that must survive a failover wait until a replica has them (Redis ``WAIT``).

Redis replicates asynchronously: a master answers a write before any replica has it, and a
replica promoted after the master died (Sentinel, Redis Cluster) lacks whatever had not reached
it. For the idempotency ledger that is a duplicated side effect: a lost claim lets the job's
redelivery call the system again. So the ledger's writes are followed, on the same connection
and in the same round trip, by ``WAIT <replicas> <timeout>``, which returns once that many
replicas acknowledged everything the connection wrote (REACH_REDIS_WAIT_REPLICAS, default 1;
REACH_REDIS_WAIT_TIMEOUT_MS bounds it).

A master with fewer replicas attached than asked for is asked for those it has (none for a single
server without replicas: no WAIT at all, no cost): each node's count is read with INFO every few
seconds, and again at once after a WAIT came back short. A WAIT that times out is logged, and the
intent goes on: the write was made, only its copy is late (the alternative, refusing work while a
replica lags, would turn a slow replica into an outage).

In a cluster each node that took such writes gets its own WAIT (``ClusterPipeline`` sends each
node's commands on one connection, in order). Measured cost and loss: BENCHMARKS.md.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import redis

log = logging.getLogger("reach.redis")

REFRESH_SECONDS = 5.0  # how long a node's count of attached replicas is trusted
WARN_EVERY_SECONDS = 10.0


@dataclass(frozen=True)
class Waits:
    """The WAITs queued at the end of one pipeline: how many replicas each asked for, per node."""

    asked: tuple[tuple[str, int], ...] = ()

    def __len__(self) -> int:
        return len(self.asked)


class ReplicaWait:
    """``REACH_REDIS_WAIT_REPLICAS`` for one client: queue the WAITs after a pipeline's writes,
    then check their answers."""

    def __init__(self, client: Any, replicas: int, timeout_ms: int, *, cluster: bool = False) -> None:
        if replicas < 0 or timeout_ms < 1:
            raise ValueError("replicas must be >= 0 and the timeout >= 1 ms (WAIT 0 would wait for ever)")
        self.replicas = replicas
        self.timeout_ms = timeout_ms
        self._client = client
        self._cluster = cluster
        self._lock = threading.Lock()
        self._attached: dict[str, tuple[int, float]] = {}  # node -> (replicas attached, read at)
        self._warned = 0.0

    def append(self, pipe: Any, keys: Iterable[str]) -> Waits:
        """Queue, after everything already on ``pipe``, the WAIT of each node holding one of
        ``keys`` (of the one server when not a cluster); the pipeline's last ``len(waits)``
        results are theirs (``check``)."""
        if self.replicas == 0:
            return Waits()
        asked = []
        if self._cluster:
            nodes = {node.name: node for node in (self._client.get_node_from_key(key) for key in keys)}
            for name, node in nodes.items():
                wanted = min(self.replicas, self._count(name, node))
                if wanted:
                    pipe.execute_command("WAIT", wanted, self.timeout_ms, target_nodes=node)
                    asked.append((name, wanted))
        else:
            wanted = min(self.replicas, self._count("", None))
            if wanted:
                pipe.execute_command("WAIT", wanted, self.timeout_ms)
                asked.append(("", wanted))
        return Waits(tuple(asked))

    def check(self, waits: Waits, results: list[Any]) -> list[Any]:
        """Read the WAITs' answers off the end of ``results`` (a short one is logged and makes the
        node's replicas counted again); returns the results without them."""
        if not waits:
            return results
        answers = results[-len(waits) :]
        for (name, wanted), acked in zip(waits.asked, answers, strict=True):
            if isinstance(acked, int) and acked >= wanted:
                continue
            with self._lock:
                self._attached.pop(name, None)
                now = time.monotonic()
                warn, self._warned = now - self._warned > WARN_EVERY_SECONDS, now
            if warn:
                log.warning(
                    "Redis %s: %s of %d replica(s) acknowledged the ledger's writes within %d ms; going on "
                    "(a failover now could lose them)",
                    name or "master",
                    acked,
                    wanted,
                    self.timeout_ms,
                )
        return results[: -len(waits)]

    def _count(self, name: str, node: Any) -> int:
        """Replicas attached to the master ``name`` (INFO replication), read at most every few seconds."""
        with self._lock:
            known = self._attached.get(name)
        if known is not None and time.monotonic() - known[1] < REFRESH_SECONDS:
            return known[0]
        source = self._client if node is None else self._client.get_redis_connection(node)
        info = source.info("replication")
        count = int(info.get("connected_slaves", 0)) if info.get("role") == "master" else 0
        with self._lock:
            self._attached[name] = (count, time.monotonic())
        return count


NO_WAIT = ReplicaWait(None, 0, 1)


def execute_durably(client: redis.Redis, wait: ReplicaWait, keys: Iterable[str], commands: Any) -> list[Any]:
    """Run ``commands`` (adds commands to a pipeline) in one round trip, followed by the WAITs for
    the nodes of ``keys``; their results, as ``pipeline.execute()`` gives them."""
    pipe = client.pipeline(transaction=False)
    commands(pipe)
    waits = wait.append(pipe, keys)
    return wait.check(waits, pipe.execute())
