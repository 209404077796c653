"""The one way the fleet opens Redis, and reads its replies as text.

``REACH_REDIS_URL`` names one of three set-ups (``rediss`` instead of ``redis`` for TLS)::

    redis://[user:password@]host:6379/0                        one server (also unix:///path?db=0)
    redis+cluster://[user:password@]h1:7000,h2:7001,...        a Redis Cluster: some of its nodes
    redis+sentinel://[user:password@]s1:26379,s2:26379/name/0  the master Sentinel knows as ``name``
                                                               (database 0), found through these sentinels

The user and password are the data nodes'; a sentinel with a password of its own takes
``?sentinel_password=...``. A cluster has only database 0.

The client of a cluster is a ``redis.RedisCluster``: it routes each command (and each pipeline's
commands, node by node) by its keys' slot. It offers every command the fleet uses, so the fleet's
modules are typed against ``redis.Redis`` and ``connect_redis`` says so; what differs (a
transaction or a script must stay within one slot: workers/state/keys.py arranges it; SCAN runs
per node: ``scan_keys``) is handled here and in the keys module.

A Sentinel client asks the sentinels for the master on every new connection; during a failover
commands fail (no client here retries a command by itself: the router and the pools put the
intent back on its queue and try again), and then reach the new master. The failover can lose the last writes the old master had not passed on:
``workers.state.replicas`` makes the ledger's writes wait for a replica (REACH_REDIS_WAIT_REPLICAS).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast
from urllib.parse import parse_qs, unquote, urlsplit

import redis
from redis.cluster import ClusterNode
from redis.sentinel import Sentinel

from workers.settings import Settings
from workers.state.replicas import NO_WAIT, ReplicaWait

Kind = Literal["single", "cluster", "sentinel"]
SCHEMES: dict[str, tuple[Kind, bool]] = {
    "redis": ("single", False),
    "rediss": ("single", True),
    "unix": ("single", False),
    "redis+cluster": ("cluster", False),
    "rediss+cluster": ("cluster", True),
    "redis+sentinel": ("sentinel", False),
    "rediss+sentinel": ("sentinel", True),
}
DEFAULT_PORT = {"single": 6379, "cluster": 6379, "sentinel": 26379}


@dataclass(frozen=True)
class RedisTarget:
    """What a ``REACH_REDIS_URL`` names."""

    kind: Kind
    url: str
    nodes: tuple[tuple[str, int], ...] = ()
    service: str = ""
    db: int = 0
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    sentinel_password: str | None = field(default=None, repr=False)
    ssl: bool = False


def parse_redis_url(url: str) -> RedisTarget:
    """Read a ``REACH_REDIS_URL``.

    Raises:
        ValueError: the URL names no set-up this module can open; the message says why.
    """
    scheme = url.partition("://")[0].lower()
    if scheme not in SCHEMES or "://" not in url:
        raise ValueError(f"must start with one of {', '.join(s + '://' for s in SCHEMES)}")
    kind, ssl = SCHEMES[scheme]
    if kind == "single":
        return RedisTarget("single", url, ssl=ssl)
    rest = url.split("://", 1)[1]
    netloc, _, path_query = rest.partition("/")
    path, _, query = path_query.partition("?")
    if "?" in netloc:  # no path: redis+cluster://h1:1,h2:2?x=y
        netloc, _, query = netloc.partition("?")
    userinfo, _, hosts = netloc.rpartition("@")
    username, _, password = userinfo.partition(":")
    nodes = tuple(_host_port(host, DEFAULT_PORT[kind]) for host in hosts.split(",") if host)
    if not nodes:
        raise ValueError(f"names no {'node' if kind == 'cluster' else 'sentinel'} (host:port, comma-separated)")
    params = parse_qs(query)
    segments = [unquote(s) for s in path.split("/") if s]
    if kind == "cluster":
        if segments not in ([], ["0"]):
            raise ValueError("a Redis Cluster has only database 0")
        service, db = "", 0
    else:
        if not segments or len(segments) > 2:
            raise ValueError("must name the master's service after the sentinels: redis+sentinel://host:26379/NAME/0")
        service = segments[0]
        try:
            db = int(segments[1]) if len(segments) == 2 else 0
        except ValueError:
            raise ValueError(f"database {segments[1]!r} is not a number") from None
    return RedisTarget(
        kind,
        url,
        nodes,
        service,
        db,
        unquote(username) or None,
        unquote(password) or None,
        params["sentinel_password"][0] if "sentinel_password" in params else None,
        ssl,
    )


def _host_port(text: str, default: int) -> tuple[str, int]:
    parts = urlsplit("//" + text)
    try:
        port = parts.port or default
    except ValueError:
        raise ValueError(f"{text!r} is not host:port") from None
    if not parts.hostname:
        raise ValueError(f"{text!r} is not host:port")
    return parts.hostname, port


def open_redis(target: RedisTarget) -> redis.Redis:
    """A client for ``target`` (no replica waiting: see ``connect_redis``). Five-second timeouts,
    so a Redis that does not answer is an error the caller reports rather than a hang; idle
    connections are checked before reuse."""
    if target.kind == "single":
        return redis.Redis.from_url(target.url, socket_timeout=5, socket_connect_timeout=5, health_check_interval=30)
    if target.kind == "cluster":
        cluster: redis.RedisCluster = redis.RedisCluster(
            startup_nodes=[ClusterNode(host, port) for host, port in target.nodes],
            username=target.username,
            password=target.password,
            ssl=target.ssl,
            socket_timeout=5,
            socket_connect_timeout=5,
            health_check_interval=30,
        )
        return cast(redis.Redis, cluster)  # the same commands, routed by slot (module docstring)
    sentinel = Sentinel(
        list(target.nodes),
        sentinel_kwargs={
            "password": target.sentinel_password,
            "ssl": target.ssl,
            "socket_timeout": 5,
            "socket_connect_timeout": 5,
        },
        socket_timeout=5,
        socket_connect_timeout=5,
        health_check_interval=30,
    )
    return sentinel.master_for(
        target.service, db=target.db, username=target.username, password=target.password, ssl=target.ssl
    )


# the replica waiting of each client connect_redis made (a client made elsewhere waits for none)
_WAITS: weakref.WeakKeyDictionary[redis.Redis, ReplicaWait] = weakref.WeakKeyDictionary()


def connect_redis(settings: Settings) -> redis.Redis:
    """A client for ``REACH_REDIS_URL``; its durable writes wait for REACH_REDIS_WAIT_REPLICAS
    replicas (``replica_wait``)."""
    target = parse_redis_url(settings.redis_url)
    client = open_redis(target)
    _WAITS[client] = ReplicaWait(
        client, settings.redis_wait_replicas, settings.redis_wait_timeout_ms, cluster=target.kind == "cluster"
    )
    return client


def replica_wait(client: redis.Redis) -> ReplicaWait:
    """How ``client``'s durable writes wait for replicas: as configured when ``connect_redis`` made
    it, not at all for any other client (tests, tools)."""
    return _WAITS.get(client, NO_WAIT)


def is_cluster(client: redis.Redis) -> bool:
    return isinstance(client, redis.RedisCluster)


def scan_keys(client: redis.Redis, pattern: str, count: int = 1000, max_scanned: int = 1_000_000) -> Iterator[bytes]:
    """The keys matching ``pattern``, node by node on a cluster; stops once about ``max_scanned``
    keys were looked at (each SCAN call looks at ``count``), matching or not."""
    scanned = 0
    nodes = cast(redis.RedisCluster, client).get_primaries() if is_cluster(client) else [None]
    for node in nodes:
        cursor = 0
        while True:
            if node is None:
                cursor, batch = client.scan(cursor=cursor, match=pattern, count=count)
            else:  # a cluster answers {node: cursor}
                cursors, batch = cast(Any, client).scan(cursor=cursor, match=pattern, count=count, target_nodes=node)
                cursor = cursors[node.name]
            scanned += count
            yield from batch
            if cursor == 0 or scanned >= max_scanned:
                break
        if scanned >= max_scanned:
            return


def eval_into(pipe: Any, script: str, keys: Sequence[str], *args: Any) -> None:
    """Queue a Lua script on a pipeline as EVAL: a Script object would cost redis-py a SCRIPT
    EXISTS round trip per pipeline, and redis-py's cluster pipeline has no ``eval()`` (its
    ``execute_command`` routes EVAL by the keys' slot). Redis caches the script by its hash."""
    pipe.execute_command("EVAL", script, len(keys), *keys, *args)


def text(value: object) -> str:
    """A reply (bytes, str, number, or None for a missing field) as a string; None is ``""``."""
    if value is None:
        return ""
    return value.decode() if isinstance(value, bytes) else str(value)
