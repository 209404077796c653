#!/usr/bin/env python
"""Render a results file of bench/run.py as Markdown (the figures section of BENCHMARKS.md).

.venv/bin/python bench/report.py [bench/results/latest.json] > figures.md
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import median  # noqa: E402

PROCS = ("agent", "router", "pool", "rabbitmq", "redis", "downstream")
VARIANTS = ("direct", "bare", "fleet")


def _isolation_rows(name: str, iso: dict[str, Any]) -> list[list[Any]]:
    """Two rows (without / with the slow backlog) of the isolation table for one pipeline."""
    return [
        [
            f"{name}, without the backlog",
            f(iso["fast_p50_without_ms"], 2),
            f(iso["fast_p99_without_ms"], 2),
            " / ".join(f(x["latency_ms"]["p99"], 1) for x in iso["without"]),
            "",
        ],
        [
            f"{name}, with the backlog",
            f(iso["fast_p50_with_ms"], 2),
            f(iso["fast_p99_with_ms"], 2),
            " / ".join(f(x["latency_ms"]["p99"], 1) for x in iso["with"]),
            f(iso.get("ratio"), 2),
        ],
    ]


def f(value: Any, digits: int = 1) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def md_table(header: list[str], rows: list[list[Any]]) -> str:
    out = [
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---" if i == 0 else "---:" for i in range(len(header))) + "|",
    ]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


def render(r: dict[str, Any]) -> str:
    meta = r["meta"]
    m = meta["machine"]
    v = meta.get("versions", {})
    code = meta.get("code") or {}
    cfg = meta["config"]
    out = [
        f"Run: `{meta['command']}` ({meta['mode']}), {meta['started']}, {meta.get('duration_s')} s; "
        f"code at commit `{code.get('commit')}`"
        + (
            f" with uncommitted fleet changes ({', '.join(code['uncommitted_fleet_changes'])})"
            if code.get("uncommitted_fleet_changes")
            else ""
        )
        + ".",
        "",
        f"Machine: {m['nproc']} cores ({m['cpu_model']}), {m['ram_gb']} GB RAM, Linux {m['kernel']}. "
        f"Load average {meta.get('load_start')} at start and {meta.get('load_end')} at end; calibration "
        f"(fixed pure-Python work) {meta.get('calibration_ms_start')} ms at start, {meta.get('calibration_ms_end')} ms "
        "at end.",
        "",
        "Versions: " + ", ".join(f"{k} {val}" for k, val in v.items()) + ".",
    ]
    t = r.get("targets") or {}
    if t:
        out += [
            "",
            "### Targets",
            "",
            md_table(
                ["target (issue 7)", "measured", "met"],
                [[k, d["text"], "yes" if d["met"] else "**no**"] for k, d in t.items()],
            ),
        ]
    tp = r.get("throughput")
    if tp:
        out += ["", f"### Throughput and CPU per intent (burst of {cfg['burst_n']}, median of {cfg['reps']})", ""]
        rows = []
        for variant in VARIANTS:
            b = tp[variant]
            cpu = b["cpu_ms_per_intent"]
            vals = [cpu.get(p + "_net", cpu.get(p)) for p in PROCS]
            total = sum(x for x in vals if x is not None)
            rows.append(
                [
                    variant,
                    f(b["steady_rate"], 0),
                    " / ".join(f(x.get("steady_rate"), 0) for x in b["reps"]),
                    *[f(x, 2) if x is not None else "–" for x in vals],
                    f(total, 2),
                ]
            )
        out.append(
            md_table(
                [
                    "variant",
                    "intents/s",
                    "repetitions",
                    "agent",
                    "router",
                    "pool",
                    "RabbitMQ¹",
                    "Redis",
                    "downstream",
                    "total CPU ms/intent",
                ],
                rows,
            )
        )
        out.append("")
        out.append(
            "CPU columns: ms of CPU per intent during the burst (utime+stime from /proc). ¹ RabbitMQ net of its "
            "idle rate measured just before each burst (other tenants share the broker)."
        )
        calls = tp["fleet"].get("redis_calls_per_intent")
        if calls:
            out.append("")
            trips = calls.get("(round trips)")
            out.append(
                (
                    f"Fleet, Redis round trips per intent: about **{trips}** (socket reads Redis processed). "
                    if trips
                    else ""
                )
                + "Redis commands per intent (INFO commandstats; Lua-internal calls counted too): "
                + ", ".join(
                    f"{k} {val}" for k, val in calls.items() if k not in ("info", "hello", "ping", "(round trips)")
                )
                + "."
            )
    lat = r.get("latency")
    if lat:
        out += ["", f"### Latency, agent publish → receipt at the agent (ms, median of {cfg['reps']} repetitions)", ""]
        header = ["variant"]
        for rate in lat:
            header += [f"{rate}/s p50", f"{rate}/s p99", f"{rate}/s max"]
        rows = []
        for variant in VARIANTS:
            row = [variant]
            for rate in lat:
                b = lat[rate][variant]
                row += [f(b["p50_ms"], 2), f(b["p99_ms"], 2), f(b["max_ms"], 1)]
            rows.append(row)
        out.append(md_table(header, rows))
        ratios = r.get("ratios") or {}
        out.append("")
        out.append(
            f"c/b throughput **{f(ratios.get('throughput_c_over_b'), 3)}**; added latency of the fleet over the "
            f"direct call at 100/s: p50 **+{f(ratios.get('added_p50_ms_100'), 2)} ms**, p99 "
            f"**+{f(ratios.get('added_p99_ms_100'), 2)} ms** (over bare: p50 +{f(ratios.get('fleet_minus_bare_p50_ms_100'), 2)}"
            f" ms, p99 +{f(ratios.get('fleet_minus_bare_p99_ms_100'), 2)} ms)."
        )
        stages = [x.get("stages_ms") for x in lat.get("100", {}).get("fleet", {}).get("reps", []) if x.get("stages_ms")]
        if stages:
            names = {
                "to_router": "agent publish → router reads it",
                "in_fleet": "router reads → receipt built",
                "queue": "… of which waiting in the connector queue",
                "downstream": "… of which the HTTP call",
                "to_agent": "receipt built → agent has it",
            }
            out += [
                "",
                "Fleet at 100/s, where the time goes (from the receipts' `execution` fields, ms):",
                "",
                md_table(
                    ["stage", "p50", "p99"],
                    [
                        [
                            label,
                            f(median([s[k]["p50"] for s in stages if k in s]), 2),
                            f(median([s[k]["p99"] for s in stages if k in s]), 2),
                        ]
                        for k, label in names.items()
                        if any(k in s for s in stages)
                    ],
                ),
            ]
    iso = r.get("isolation")
    if iso and "fast_p99_without_ms" in iso:
        out += [
            "",
            f"### Isolation (fast connector at paced 100/s; bench_slow takes 2 s per call, backlog {iso['backlog']})",
            "",
            f"(p50 and p99 over all repetitions' intents pooled: {iso.get('samples')} without / with)",
            "",
            md_table(
                ["", "p50 ms", "p99 ms", "each repetition's p99", "p99 with / without"],
                [
                    row
                    for name, x in (("fleet", iso), ("bare (baseline)", iso.get("bare")))
                    if x
                    for row in _isolation_rows(name, x)
                ],
            ),
            "",
            f"Fleet p99 with / without: **{f(iso.get('ratio'), 2)}**"
            + (f" (bare pipeline in the same repetitions: {f(iso['bare'].get('ratio'), 2)})" if iso.get("bare") else "")
            + f"; fleet slow queue depth at the start and end of each 'with' phase: {iso.get('slow_depth')}.",
        ]
    sc = r.get("scale")
    if sc and sc.get("rows"):
        out += [
            "",
            f"### Scale (burst of {sc['n']} intents for one action, agent ids round-robin over all agents)",
            "",
            md_table(
                [
                    "actions",
                    "agents",
                    "router CPU ms/intent",
                    "pool CPU ms/intent",
                    "intents/s",
                    "router RSS MB",
                    "pool RSS MB",
                    "start-up s",
                    "catalog MB",
                ],
                [
                    [
                        x["actions"],
                        x["agents"],
                        f(x["router_cpu_ms"], 3),
                        f(x["pool_cpu_ms"], 3),
                        f(x["steady_rate"], 0),
                        x["rss_mb"]["router"],
                        x["rss_mb"]["pool"],
                        f(x["startup_s"], 1),
                        f(x.get("catalog_mb"), 1),
                    ]
                    for x in sc["rows"]
                ],
            ),
            "",
            f"Router CPU per intent, largest catalog / smallest: **{f(sc.get('flat_ratio'), 2)}** "
            f"(max / min over all rows {f(sc.get('max_over_min'), 2)}).",
        ]
    rf = r.get("redis_footprint")
    if rf:
        out += [
            "",
            "### What the fleet keeps in Redis",
            "",
            f"{rf['keys_per_intent']} keys and about {rf['bytes_per_intent']} bytes of Redis memory per intent "
            f"({rf['keys']} keys, {rf['used_memory_mb']} MB after {rf['intents']} intents; 24 h TTLs by default). "
            "Keys by prefix: " + ", ".join(f"`reach:{k}:` {v}" for k, v in rf["keys_by_prefix"].items()) + ".",
        ]
    mem = r.get("memory")
    if mem:
        out += [
            "",
            "### Resident memory after the main runs (MB)",
            "",
            md_table(list(mem), [[f(x, 1) for x in mem.values()]]),
        ]
    checks = r.get("checks") or {}
    out += ["", "### Checks", ""]
    if checks.get("problems"):
        out += [f"- problem: {p}" for p in checks["problems"]]
    else:
        out.append(
            "- every intent got exactly one receipt and all succeeded; queues empty at the end; the downstream "
            "answered exactly one call per succeeded receipt; no ERROR lines in the fleet's logs"
        )
    out += [f"- note: {n}" for n in checks.get("notes") or []]
    return "\n".join(out)


if __name__ == "__main__":
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent / "results" / "latest.json"
    print(render(json.loads(path.read_text())))
