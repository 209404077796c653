"""A large catalog's semantic-routing start-up, cold and warm (issue 35): how long a new router
replica takes to have every action's vector, from nothing (the model embeds every text), from the
shared cache in Redis, and from the saved-vector file `reach route warm` writes beside the catalog.

    .venv/bin/python bench/routing_start.py [--actions 10000] [--reps 3] [--model use-m3]
                                            [--pair-sample 200] [--output FILE]

Each measurement runs in a process of its own (``python -c``), as a new replica would: import,
load the catalog, load the model, build the index (BM25 and the vectors); the child reports the
catalog load and the index build apart and its CPU time, and the parent the whole process's wall
time. On a shared machine read the CPU seconds: the wall time is whatever the scheduler left. The catalog
is routing_set/filler.py's generated one (100 connectors of 100 actions) with a routing: document
naming the model. Cold runs once (it is the slow one); warm from Redis and from the file run
``--reps`` times, medians reported. ``--pair-sample``: the default pair (use-m3 + e5-small) is
timed cold on that many of the texts only and the rate scaled up (10,000 cold takes ~10 minutes
with e5 on one core); its starts from Redis and from the file are measured in full, on random
unit vectors under the real keys (reading does not depend on the values). Redis: tests/fleet.py's
isolated database for this process (emptied first). Only processes this script started run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from bench.common import calibrate as machine_speed  # noqa: E402
from bench.routing_set.filler import filler_catalog  # noqa: E402

CHILD = """
import json, resource, sys, time
t0 = time.monotonic()
from connectors.catalog import build
from connectors.loader import load_directory
from connectors.routing.saved import Layered, SavedVectors
from workers.router.semantic import SemanticRouting
from workers.state.embeddings import RedisVectorCache
import redis
imported = time.monotonic()
directory, source, redis_url, limit = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
catalog, problems = build(load_directory(directory))
assert not problems, problems[:3]
loaded = time.monotonic()
shared = RedisVectorCache(redis.Redis.from_url(redis_url)) if source in ("cold", "redis", "file") else None
cache = Layered(SavedVectors.load(__import__("pathlib").Path(directory) / "routing-vectors.npz"), shared) if source == "file" else shared
routing = SemanticRouting(catalog, cache, embed_all=limit == 0)
index = routing.index()
if limit:
    index.prepare(range(limit))
built = time.monotonic()
usage = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"import_s": imported - t0, "catalog_s": loaded - imported, "index_s": built - loaded,
                  "cpu_s": usage.ru_utime + usage.ru_stime,
                  "embedded": index.embedded, "from_cache": index.from_cache, "texts": index.size}))
"""


def catalog_dir(work: Path, model: str, actions: int) -> Path:
    directory = work / model.replace("+", "_")
    directory.mkdir(parents=True, exist_ok=True)
    text = filler_catalog()
    docs = text.split("\n---\n")
    # the filler is 100 connectors of 100 actions: keep as many connectors as the actions asked for
    connectors = [d for d in docs if d.lstrip().startswith("connector:")][: max(1, actions // 100)]
    (directory / "filler.yaml").write_text("\n---\n".join(connectors) + "\n")
    (directory / "routing.yaml").write_text(yaml.safe_dump({"routing": {"model": model}}))
    return directory


def child(directory: Path, source: str, redis_url: str, limit: int = 0) -> dict[str, Any]:
    started = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(directory), source, redis_url, str(limit)],
        capture_output=True,
        text=True,
        cwd=HERE.parent,
        timeout=3600,
        check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"child failed: {out.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    result["process_s"] = time.monotonic() - started
    return {k: round(v, 2) if isinstance(v, float) else v for k, v in result.items()}


def warm(directory: Path, redis_url: str) -> dict[str, Any]:
    env = {**os.environ, "REACH_CATALOG": str(directory), "REACH_REDIS_URL": redis_url}
    started = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "workers.cli", "route", "warm"],
        capture_output=True,
        text=True,
        cwd=HERE.parent,
        env=env,
        timeout=3600,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return {"seconds": round(time.monotonic() - started, 2), "output": out.stdout.strip()}


def placeholders(directory: Path, model: str, client: Any) -> int:
    """The pair's file and Redis entries with random unit vectors under the real texts' keys:
    what is timed is reading them, which does not depend on their values, and embedding 10,000
    texts with e5 first would take ten minutes or more here."""
    import numpy as np

    from connectors.catalog import build
    from connectors.loader import load_directory
    from connectors.routing.embedders import cache_models
    from connectors.routing.index import ActionIndex, text_key
    from connectors.routing.saved import save
    from workers.state.embeddings import RedisVectorCache

    catalog, _ = build(load_directory(directory))
    texts = set(ActionIndex(catalog, None).texts)
    rng = np.random.default_rng(20261206)
    vectors: dict[str, bytes] = {}
    for name, dim in cache_models(model):
        for text in texts:
            row = rng.standard_normal(dim).astype("<f4")
            vectors[text_key(name, text)] = (row / np.linalg.norm(row)).astype("<f4").tobytes()
    written = save(directory / "routing-vectors.npz", vectors, dict(cache_models(model)))
    RedisVectorCache(client).put_many(vectors)
    return written


def median(runs: list[dict[str, Any]], key: str) -> float:
    return round(statistics.median(r[key] for r in runs), 2)


def measure(model: str, actions: int, reps: int, redis_url: str, pair_sample: int) -> dict[str, Any]:
    import redis

    client = redis.Redis.from_url(redis_url)
    work = Path(tempfile.mkdtemp(prefix="reach-routing-start-"))
    directory = catalog_dir(work, model, actions)
    client.flushdb()
    out: dict[str, Any] = {"model": model, "actions": actions}
    if "+" in model and pair_sample:
        sample = child(directory, "none", redis_url, limit=pair_sample)  # not kept: the rest are placeholders
        out["cold_sample"] = sample
        out["cold_estimate_s"] = round(sample["index_s"] / pair_sample * actions, 1)
        print(f"{model} cold, {pair_sample} texts: {sample}", flush=True)
    else:
        out["cold"] = child(directory, "cold", redis_url)  # an empty Redis: it embeds all, and keeps them there
        print(f"{model} cold: {out['cold']}", flush=True)
    if "+" in model and pair_sample:
        out["placeholders"] = placeholders(directory, model, client)
    else:
        out["route_warm"] = warm(directory, redis_url)  # finds them in Redis and writes the file
        print(f"{model} reach route warm: {out['route_warm']}", flush=True)
    out["file_bytes"] = (directory / "routing-vectors.npz").stat().st_size
    from_redis = [child(directory, "redis", redis_url) for _ in range(reps)]
    out["warm_redis"] = {
        "runs": from_redis,
        "index_s": median(from_redis, "index_s"),
        "process_s": median(from_redis, "process_s"),
    }
    print(
        f"{model} from Redis: {out['warm_redis']['index_s']} s index, {out['warm_redis']['process_s']} s process",
        flush=True,
    )
    client.flushdb()  # a new replica on a fresh Redis: the file alone
    from_file = [child(directory, "file", redis_url) for _ in range(reps)]
    out["warm_file"] = {
        "runs": from_file,
        "index_s": median(from_file, "index_s"),
        "process_s": median(from_file, "process_s"),
    }
    print(
        f"{model} from the file: {out['warm_file']['index_s']} s index, {out['warm_file']['process_s']} s process",
        flush=True,
    )
    client.flushdb()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--actions", type=int, default=10_000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--models", default="use-m3,use-m3+e5-small")
    parser.add_argument("--pair-sample", type=int, default=200)
    parser.add_argument("--output", type=Path, default=HERE / "results" / "routing_start.json")
    args = parser.parse_args()
    from tests.fleet import isolated_urls

    _, redis_url = isolated_urls()
    meta = {
        "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "load_average": os.getloadavg(),
        "calibration_ms": machine_speed(),
    }
    results: dict[str, Any] = {"meta": meta}
    for model in args.models.split(","):
        results[model] = measure(model, args.actions, args.reps, redis_url, args.pair_sample)
    meta["load_average_end"] = os.getloadavg()
    meta["calibration_ms_end"] = machine_speed()
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(results, indent=2))
    print(f"results in {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
