"""What a phase left in Redis, key by key: every key's MEMORY USAGE and PTTL, grouped by family
(``reach:wf-run:{agent}:<id>`` -> ``reach:wf-run``), compared between two snapshots. Meant for a
Redis of the benchmark's own (bench/common.py's private redis-server): it reads every key."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis

PAGE = 1000


def family(key: str) -> str:
    """``reach:<kind>`` for the fleet's keys (the part before the tag or the agent), else the key's first two parts."""
    head = key.split("{", 1)[0].rstrip(":")
    parts = head.split(":")
    return ":".join(parts[:2])


@dataclass
class Snapshot:
    used_memory: int
    keys: dict[str, tuple[int, int]]  # key -> (bytes, pttl ms; -1 none)


def snapshot(client: redis.Redis) -> Snapshot:
    used = int(client.info("memory")["used_memory"])
    names = [k.decode() if isinstance(k, bytes) else k for k in client.scan_iter(count=PAGE)]
    keys: dict[str, tuple[int, int]] = {}
    for i in range(0, len(names), PAGE):
        page = names[i : i + PAGE]
        pipe = client.pipeline(transaction=False)
        for name in page:
            pipe.memory_usage(name, samples=0)
            pipe.pttl(name)
        got = pipe.execute()
        for j, name in enumerate(page):
            size, ttl = got[2 * j], got[2 * j + 1]
            if size is not None and ttl != -2:  # gone meanwhile
                keys[name] = (int(size), int(ttl))
    return Snapshot(used, keys)


def delta(before: Snapshot, after: Snapshot, per: int) -> dict[str, Any]:
    """Per ``per`` runs: used_memory added, and by family the keys added, their bytes (growth of keys
    already there included) and their time to live (new keys without one are counted)."""
    fams: dict[str, dict[str, Any]] = {}
    for key, (size, ttl) in after.keys.items():
        old = before.keys.get(key)
        grown = size - (old[0] if old else 0)
        if old is not None and grown == 0:
            continue
        f = fams.setdefault(family(key), {"new_keys": 0, "bytes": 0, "no_ttl": 0, "ttl_s": []})
        f["bytes"] += grown
        if old is None:
            f["new_keys"] += 1
            if ttl == -1:
                f["no_ttl"] += 1
            else:
                f["ttl_s"].append(ttl / 1000)
        elif ttl == -1:
            f["no_ttl"] += 1  # an older key that grew and never expires (an index)
    out: dict[str, Any] = {}
    for name, f in sorted(fams.items(), key=lambda kv: -kv[1]["bytes"]):
        ttls = f.pop("ttl_s")
        out[name] = {
            "keys_per_run": round(f["new_keys"] / per, 2),
            "bytes_per_run": round(f["bytes"] / per, 1),
            "no_ttl": f["no_ttl"],
            "ttl_h": [round(min(ttls) / 3600, 2), round(max(ttls) / 3600, 2)] if ttls else None,
        }
    return {
        "used_memory_per_run": round((after.used_memory - before.used_memory) / per, 1),
        "key_bytes_per_run": round(sum(f["bytes_per_run"] for f in out.values()), 1),
        "keys_per_run": round(sum(f["keys_per_run"] for f in out.values()), 2),
        "families": out,
    }
