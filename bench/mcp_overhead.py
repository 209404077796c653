#!/usr/bin/env python
"""What the MCP facade adds to a call: ``tools/call`` through ``reach mcp`` against ``ReachClient.call``,
side by side in one run, on the same fleet, action and params.

    .venv/bin/python bench/mcp_overhead.py            # 5 repetitions x 6 s per variant at 50 calls/s
    .venv/bin/python bench/mcp_overhead.py --quick    # 1 x 4 s

A fleet (router + bench_fast pool, the benchmark catalog of ``catalogs.py``) in a vhost and a
redis-server of its own, the counting downstream, and the facade twice: ``reach mcp --http`` (logged in
as a facade user with the impersonator tag, made for the run and deleted after it; a static bearer
token) and ``reach mcp --stdio`` (a child of this process, publishing with the vhost's own login).

Three variants, paced at ``--rate`` calls/s, one call at a time, each in blocks of ``--seconds`` and
interleaved (direct, http, stdio, direct, ...) so the machine's changing load hits them alike:

- **direct**: ``ReachClient.call`` in this process (publish, wait for the receipt);
- **http**: the official MCP client SDK's ``call_tool`` over Streamable HTTP to the facade;
- **stdio**: the same over stdio.

Latency is the caller's: from before the call to its result, measured where the call runs (the MCP
calls inside their event loop, so the thread that drives it here costs nothing). "added" is a
variant's p50/p99 minus direct's in the same repetition; the medians over repetitions are printed
and written to ``bench/results/mcp_overhead.json``. ``facade ms`` is the facade's own time per
call from its ``reach_mcp_tool_call_seconds`` histogram (request in to result out, receipt wait
included); the rest of "added" is the MCP client SDK and its transport. "caller CPU" and "facade CPU"
are CPU ms per call of this process and of the facade's process (/proc utime+stime): unlike
latency, they hardly change with the machine's load, so they say what a call costs on a quiet
machine too. Every call must succeed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import ExitStack, asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

import catalogs  # noqa: E402
from common import (  # noqa: E402
    PYTHON,
    REPO,
    RESULTS,
    Procs,
    Vhost,
    calibrate,
    cpu_seconds,
    ensure_services,
    fmt,
    free_port,
    loadavg,
    log,
    median,
    percentile,
    start_downstream,
    start_private_redis,
    table,
    tmpdir,
)
from reachfleet import ReachFleet  # noqa: E402

TOOL = f"{catalogs.FAST}__create_ticket"
FAST_QUEUE = "reach.connector." + catalogs.FAST
VARIANTS = ("direct", "http", "stdio")


def facade_seconds(port: int) -> tuple[float, float]:
    """(sum, count) of the facade's reach_mcp_tool_call_seconds."""
    import httpx

    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10, trust_env=False).text
    found = dict(re.findall(r"^reach_mcp_tool_call_seconds_(sum|count) ([0-9.e+-]+)$", text, re.M))
    return float(found.get("sum", 0)), float(found.get("count", 0))


@asynccontextmanager
async def mcp_session(transport: str, url: str, token: str, env: dict[str, str], errlog: Any) -> AsyncIterator[Any]:
    from mcp.client.session import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    if transport == "http":
        http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
        async with http, streamable_http_client(url, http_client=http) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                await session.list_tools()
                yield session
        return
    server = StdioServerParameters(
        command=PYTHON, args=["-m", "workers.ops.cli", "mcp", "--stdio", "--agent", catalogs.AGENT], env=env, cwd=REPO
    )
    async with stdio_client(server, errlog=errlog) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            await session.list_tools()
            yield session


def stdio_server_pid() -> int:
    """The ``reach mcp --stdio`` child this process started (the MCP client SDK spawned it)."""
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and b"--stdio" in Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0"):
                if int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1]) == os.getpid():
                    return int(entry)
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
    raise RuntimeError("the reach mcp --stdio child is not running")


def paced(rate: float, seconds: float, call: Callable[[int], float]) -> list[float]:
    """Call ``call(i)`` at ``rate`` per second for ``seconds``, one at a time; its latencies in ms."""
    latencies = []
    start = time.perf_counter()
    for i in range(int(rate * seconds)):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        latencies.append(call(i))
    return latencies


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=50.0, help="calls per second (default 50)")
    parser.add_argument("--seconds", type=float, default=6.0, help="seconds per block (default 6)")
    parser.add_argument("--reps", type=int, default=5, help="repetitions of the three blocks (default 5)")
    parser.add_argument("--quick", action="store_true", help="1 repetition of 4 s blocks")
    args = parser.parse_args()
    if args.quick:
        args.reps, args.seconds = 1, 4.0

    from anyio.from_thread import start_blocking_portal

    from producers.client import ReachClient
    from workers.mcp.broker_user import create_facade_user, delete_facade_user
    from workers.mcp.tokens import digest

    work = tmpdir("reach-mcp-bench-")
    procs = Procs(work)
    shared, _ = ensure_services()
    vhost = Vhost(shared, f"reach-mcp-bench-{os.getpid()}").create()
    facade_user = f"bench_mcp_{os.getpid()}"
    made_user = False
    ok = True
    calib_start, load_start = calibrate(), loadavg()
    try:
        redis_url, _ = start_private_redis(procs)
        downstream, _ = start_downstream(procs)
        catalog_dir = catalogs.write(work / "catalog", catalogs.main_catalog(downstream))
        fleet = ReachFleet(procs, catalog_dir, vhost.url, redis_url)
        fleet.start_router()
        fleet.start_pool(catalogs.FAST)
        fleet.wait_consuming("reach.intents")
        fleet.wait_consuming(FAST_QUEUE)

        password = secrets.token_urlsafe(24)
        create_facade_user(facade_user, password, vhost.name)
        made_user = True
        parts = urlsplit(vhost.url)
        facade_url = urlunsplit(
            parts._replace(netloc=f"{facade_user}:{password}@{parts.hostname}:{parts.port or 5672}")
        )
        token = secrets.token_urlsafe(24)
        (work / "tokens.yaml").write_text(f"{catalogs.AGENT}: {digest(token)}\n")
        port = free_port()
        url = f"http://127.0.0.1:{port}/mcp"
        fleet.start(
            "mcp",
            ["mcp", "--http", "--port", str(port)],
            {"REACH_BROKER_URL": facade_url, "REACH_MCP_URL": url, "REACH_MCP_TOKENS_FILE": str(work / "tokens.yaml")},
        )
        metrics_port = fleet.metrics_ports["mcp"]
        deadline = time.time() + 60
        while True:
            try:
                facade_seconds(metrics_port)
                break
            except Exception:
                if time.time() > deadline:
                    raise RuntimeError(f"reach mcp did not start: {fleet.proc('mcp').log_text()[-2000:]}") from None
                procs.check_alive()
                time.sleep(0.2)

        stdio_env = dict(fleet.env, REACH_BROKER_URL=vhost.url)
        figures: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
        failures: list[str] = []
        with start_blocking_portal() as portal, ExitStack() as stack, open(work / "mcp-stdio.log", "a") as errlog:
            sessions = {
                t: stack.enter_context(portal.wrap_async_context_manager(mcp_session(t, url, token, stdio_env, errlog)))
                for t in ("http", "stdio")
            }
            client = stack.enter_context(ReachClient(catalogs.AGENT, vhost.url))
            http_pid = fleet.proc("mcp").pid
            stdio_pid = stdio_server_pid()

            def params(variant: str, rep: int, i: int) -> dict[str, Any]:
                return dict(catalogs.PARAMS, title=f"mcp-bench-{variant}-{rep}-{i}")

            def direct(rep: int) -> Callable[[int], float]:
                def call(i: int) -> float:
                    t0 = time.perf_counter()
                    receipt = client.call("create_ticket", params("direct", rep, i), timeout=30)
                    took = (time.perf_counter() - t0) * 1000
                    if receipt.status != "succeeded":
                        failures.append(f"direct: {receipt.status} {receipt.error}")
                    return took

                return call

            def through(variant: str, rep: int) -> Callable[[int], float]:
                session = sessions[variant]

                async def timed(i: int) -> tuple[float, Any]:
                    t0 = time.perf_counter()
                    result = await session.call_tool(TOOL, params(variant, rep, i))
                    return (time.perf_counter() - t0) * 1000, result

                def call(i: int) -> float:
                    took, result = portal.call(timed, i)
                    if result.is_error:
                        failures.append(f"{variant}: {result.content}")
                    return took

                return call

            for rep in range(args.reps):
                for variant in VARIANTS:
                    call = direct(rep) if variant == "direct" else through(variant, rep)
                    call(-1)  # warm: a first call may connect
                    server = {"http": http_pid, "stdio": stdio_pid}.get(variant)
                    before = facade_seconds(metrics_port)
                    cpu_before = (
                        cpu_seconds(os.getpid(), tree=False),
                        cpu_seconds(server, tree=False) if server else 0,
                    )
                    latencies = paced(args.rate, args.seconds, call)
                    cpu_after = (cpu_seconds(os.getpid(), tree=False), cpu_seconds(server, tree=False) if server else 0)
                    after = facade_seconds(metrics_port)
                    facade_ms = None
                    if variant == "http" and after[1] > before[1]:
                        facade_ms = (after[0] - before[0]) / (after[1] - before[1]) * 1000
                    figures[variant].append(
                        {
                            "calls": len(latencies),
                            "p50": percentile(latencies, 50),
                            "p99": percentile(latencies, 99),
                            "max": round(max(latencies), 3),
                            "facade_ms": facade_ms,
                            # CPU per call: the caller (this process), and the facade process
                            "caller_cpu_ms": round((cpu_after[0] - cpu_before[0]) / len(latencies) * 1000, 3),
                            "facade_cpu_ms": (
                                round((cpu_after[1] - cpu_before[1]) / len(latencies) * 1000, 3) if server else None
                            ),
                        }
                    )
                    log(f"rep {rep + 1}/{args.reps} {variant}: {figures[variant][-1]}")
        if failures:
            ok = False
            log(f"{len(failures)} call(s) did not succeed, e.g. {failures[:3]}")

        rows, summary = [], {}
        for variant in VARIANTS:
            reps = figures[variant]
            added50 = [r["p50"] - d["p50"] for r, d in zip(reps, figures["direct"])]
            added99 = [r["p99"] - d["p99"] for r, d in zip(reps, figures["direct"])]
            summary[variant] = {
                "p50": median([r["p50"] for r in reps]),
                "p99": median([r["p99"] for r in reps]),
                "added_p50": median(added50) if variant != "direct" else None,
                "added_p99": median(added99) if variant != "direct" else None,
                "facade_ms": median([r["facade_ms"] for r in reps]),
                "caller_cpu_ms": median([r["caller_cpu_ms"] for r in reps]),
                "facade_cpu_ms": median([r["facade_cpu_ms"] for r in reps]),
                "reps": reps,
            }
            s = summary[variant]
            rows.append(
                [
                    variant,
                    sum(r["calls"] for r in reps),
                    fmt(s["p50"], 2),
                    fmt(s["p99"], 2),
                    fmt(s["added_p50"], 2),
                    fmt(s["added_p99"], 2),
                    fmt(s["facade_ms"], 2),
                    fmt(s["caller_cpu_ms"], 2),
                    fmt(s["facade_cpu_ms"], 2),
                ]
            )
        print(
            f"\ntools/call through reach mcp vs ReachClient.call, {args.rate:g} calls/s, "
            f"{args.reps} x {args.seconds:g} s per variant (medians of repetitions, ms):\n"
        )
        header = ["variant", "calls", "p50", "p99", "added p50", "added p99", "facade ms", "caller CPU", "facade CPU"]
        print(table(header, rows))
        added = summary["http"]["added_p50"]
        target_met = added is not None and added <= 3.0
        print(f"\ntarget: http added p50 <= 3 ms: {fmt(added, 2)} ms -> {'met' if target_met else 'NOT met'}")
        calib_end, load_end = calibrate(), loadavg()
        print(f"calibration {calib_start} -> {calib_end} ms; load average {load_start} -> {load_end}")
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "mcp_overhead.json").write_text(
            json.dumps(
                {
                    "meta": {
                        "rate": args.rate,
                        "seconds": args.seconds,
                        "reps": args.reps,
                        "calibration_ms": [calib_start, calib_end],
                        "loadavg": [load_start, load_end],
                        "failures": len(failures),
                    },
                    "variants": summary,
                },
                indent=2,
            )
        )
    finally:
        procs.stop_all()
        if made_user:
            try:
                delete_facade_user(facade_user)
            except Exception as exc:
                log(f"could not delete the facade user {facade_user}: {exc}")
        vhost.delete()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
