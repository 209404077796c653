"""Example requests per action (issue 35), measured: the routing set's catalog with and without
the `examples:` of routing_set/examples.yaml, each split routed by the three tiers at the shipped
defaults and at settings calibrated on dev for that catalog. Judged on test and fresh only: dev
pairs each English request with its Chinese translation, so it flatters anything tuned on it.

    .venv/bin/python bench/routing_examples.py [--models use-m3,use-m3+e5-small] [--output FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from bench import routing_tiers  # noqa: E402
from bench.semantic import SET, calibrate, load, requests  # noqa: E402
from connectors.catalog import Catalog  # noqa: E402
from connectors.routing import ActionIndex, load_embedder, rank  # noqa: E402
from connectors.spec import RoutingSpec, RoutingWeights  # noqa: E402

EXAMPLES = SET / "examples.yaml"


def with_examples(directory: Path) -> Path:
    """A copy of the set's catalog whose actions carry the examples of examples.yaml."""
    wanted: dict[str, list[str]] = yaml.safe_load(EXAMPLES.read_text())
    docs = list(yaml.safe_load_all((SET / "catalog" / "connectors.yaml").read_text()))
    used = set()
    for doc in docs:
        connector = (doc or {}).get("connector")
        if not connector:
            continue
        for action in connector["actions"]:
            key = f"{connector['name']}.{action['action']}"
            if key in wanted:
                action["examples"] = wanted[key]
                used.add(key)
    assert used == set(wanted), f"examples for actions the catalog lacks: {set(wanted) - used}"
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "catalog.yaml").write_text(yaml.safe_dump_all(docs, allow_unicode=True, sort_keys=False))
    return directory


def candidates(catalog: Catalog, model: str, rows: list[dict[str, Any]]) -> list[routing_tiers.Cands]:
    index = ActionIndex(catalog, load_embedder(model))
    index.prepare()
    parts = RoutingWeights(semantic=1.0, lexical=1.0, domain=0, agent_domain=0)
    out = []
    for r in rows:
        ranking = rank(index, catalog.by_action[r["action"]], r["text"], parts)
        out.append([(s.ref.connector.name, s.semantic or 0.0, s.lexical or 0.0) for s in ranking.ranked])
    return out


def measure(models: list[str]) -> dict[str, Any]:
    rows = requests()
    splits = {s: [i for i, r in enumerate(rows) if r["split"] == s] for s in ("dev", "test", "fresh")}
    work = Path(tempfile.mkdtemp(prefix="reach-examples-"))
    catalogs = {"without": load(SET / "catalog"), "with": load(with_examples(work / "with"))}
    shipped = RoutingSpec()
    out: dict[str, Any] = {"examples": sum(len(v) for v in yaml.safe_load(EXAMPLES.read_text()).values())}
    for model in models:
        entry: dict[str, Any] = {}
        for label, catalog in catalogs.items():
            started = time.monotonic()
            cands = candidates(catalog, model, rows)
            dev = splits["dev"]
            chosen = calibrate([rows[i] for i in dev], [cands[i] for i in dev])
            chosen["confirm_margin"] = routing_tiers.calibrate_confirm(
                [rows[i] for i in dev], [cands[i] for i in dev], chosen["lexical"], chosen["margin"]
            )
            settings = {
                "shipped": (shipped.weights.lexical, shipped.margin, shipped.confirm_margin),
                "dev_calibrated": (chosen["lexical"], chosen["margin"], chosen["confirm_margin"]),
            }
            entry[label] = {"calibrated": chosen, "seconds": round(time.monotonic() - started, 1)}
            for name, (w_lex, margin, confirm) in settings.items():
                entry[label][name] = {
                    split: routing_tiers.tally(
                        [rows[i] for i in splits[split]], [cands[i] for i in splits[split]], w_lex, margin, confirm
                    )
                    for split in ("test", "fresh")
                }
            print(f"examples {model} {label}: {json.dumps(entry[label]['shipped'])[:400]}", flush=True)
        out[model] = entry
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="use-m3,use-m3+e5-small")
    parser.add_argument("--output", type=Path, default=HERE / "results" / "routing_examples.json")
    args = parser.parse_args()
    meta = {"started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "load_average": os.getloadavg()}
    results = {"meta": meta, **measure(args.models.split(","))}
    results["meta"]["load_average_end"] = os.getloadavg()
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(results, indent=2, ensure_ascii=False))
    print(f"results in {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
