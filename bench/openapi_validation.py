"""How long `reach import openapi` spends validating a large document: the chosen operations and what
they reach by $ref (the default) against the whole document (`--validate-all`).

    .venv/bin/python bench/openapi_validation.py [--include issues] [--reps 5] [--whole-reps 1]

Reads GitHub's REST API from the tests' npm cache (tests/openapi_docs.py fetches it with `npm pack`).
Prints the median seconds of each and the size of the part checked. A figure, not a test: the machine's
load moves it; docs/openapi.md quotes one run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from connectors.openapi import ImportOptions, document_problems, plan, read_document  # noqa: E402
from connectors.openapi.document import subtree  # noqa: E402
from tests import openapi_docs as docs  # noqa: E402


def timed(fn: object, reps: int) -> float:
    runs = []
    for _ in range(reps):
        started = time.perf_counter()
        fn()  # type: ignore[operator]
        runs.append(time.perf_counter() - started)
    return statistics.median(runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--include", action="append", default=None, help="a tag or /glob (default: issues)")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--whole-reps", type=int, default=1)
    args = parser.parse_args()
    doc = read_document(docs.read(docs.GITHUB))
    chosen = plan(doc, ImportOptions("github", include=tuple(args.include or ["issues"]), max_operations=10_000))
    part = subtree(doc, chosen)
    schemas = len(part.get("components", {}).get("schemas", {}))
    print(f"GitHub REST API: {len(chosen)} chosen operations; the part checked holds {schemas} schemas")
    limited = timed(lambda: document_problems(doc, only=chosen), args.reps)
    print(f"chosen operations and what they reach: median {limited:.2f} s over {args.reps}")
    whole = timed(lambda: document_problems(doc), args.whole_reps)
    print(f"whole document (--validate-all):       median {whole:.2f} s over {args.whole_reps}")


if __name__ == "__main__":
    main()
