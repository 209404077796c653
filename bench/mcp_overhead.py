#!/usr/bin/env python
"""What the MCP facade adds to a call: ``tools/call`` through ``reach mcp`` against ``ReachClient.call``,
side by side in one run, on the same fleet, action and params.

    .venv/bin/python bench/mcp_overhead.py            # 5 repetitions x 6 s per variant at 50 calls/s
    .venv/bin/python bench/mcp_overhead.py --quick    # 1 x 4 s
    .venv/bin/python bench/mcp_overhead.py --before /tmp/before   # also a facade from another checkout

A fleet (router + bench_fast pool, the benchmark catalog of ``catalogs.py``) in a vhost and a
redis-server of its own, the counting downstream, and the facade twice: ``reach mcp --http`` (logged in
as a facade user with the impersonator tag, made for the run and deleted after it; a static bearer
token) and ``reach mcp --stdio`` (a child of this process, publishing with the vhost's own login).

The variants, paced at ``--rate`` calls/s, one call at a time, each in blocks of ``--seconds`` and
interleaved (direct, http, http-lean, stdio, direct, ...) so the machine's changing load hits them alike:

- **direct**: ``ReachClient.call`` in this process (publish, wait for the receipt);
- **http**: the official MCP client SDK's ``call_tool`` over Streamable HTTP to the facade (what an
  MCP host built on that client sees: the facade's cost plus the SDK client's own);
- **http-lean**: the same facade, called by a lean MCP client: one JSON-RPC POST per call on one
  kept-alive connection with the standard library's http.client (synchronous, in this thread, as
  direct's ReachClient), the headers Streamable HTTP asks for, the JSON answer parsed. Its "added"
  is what the facade adds over HTTP (the target's figure); http's minus http-lean's is what the SDK
  client costs its caller;
- **stdio**: the SDK's client over stdio (the target's figure over stdio);
- **http-before**, **stdio-before** (with ``--before DIR``): the SDK client against a second
  ``reach mcp --http`` and ``--stdio`` started from the checkout DIR (e.g. ``git worktree add DIR
  HEAD``), for before and after in one run.

Latency is the caller's: from before the call to its result, measured where the call runs (the SDK
calls inside their event loop, so the thread that drives it here costs nothing). "added" is a
variant's p50/p99 minus direct's in the same repetition; the medians over repetitions are printed
and written to ``bench/results/mcp_overhead.json``. ``facade ms`` is the facade's own time per
call from its ``reach_mcp_tool_call_seconds`` histogram (the tools/call handler: intent in to
result out, receipt wait included); the rest of "added" is HTTP, the transport on both sides and
the client. "caller CPU" and "facade CPU" are CPU ms per call of this process and of the facade's
process (/proc utime+stime; the SDK variants' caller CPU includes the hand-over from this thread to
their event loop and back, a few tenths of a ms): they change less with the machine's load than
latency does. Every call must succeed.
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
VARIANTS = ("direct", "http", "http-lean", "stdio")
LEAN_VERSION = "2025-11-25"  # the protocol version the lean client speaks (the SDK client's too)


class LeanClient:
    """A minimal MCP client over Streamable HTTP: initialize once, then one POST per tools/call on
    one kept-alive connection (the standard library's http.client: an HTTP library's own CPU per
    request would be counted as the facade's). Synchronous, in the benchmark's own thread, as the
    direct variant's ReachClient is."""

    def __init__(self, url: str, token: str) -> None:
        import http.client

        parts = urlsplit(url)
        self.path = parts.path or "/"
        self.http = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 80, timeout=60)
        self.headers = {
            "Authorization": f"Bearer {token}",
            "Accept": "application/json, text/event-stream",
            "Content-Type": "application/json",
            "MCP-Protocol-Version": LEAN_VERSION,
        }
        self.ids = 0
        info = {"name": "lean-bench", "version": "1"}
        self.request("initialize", {"protocolVersion": LEAN_VERSION, "capabilities": {}, "clientInfo": info})
        self.post(json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}).encode())

    def post(self, body: bytes) -> tuple[int, bytes]:
        import http.client

        for attempt in (1, 2):
            try:
                self.http.request("POST", self.path, body=body, headers=self.headers)
                answer = self.http.getresponse()
                return answer.status, answer.read()
            except (BrokenPipeError, ConnectionResetError, http.client.RemoteDisconnected):
                # the server closed the idle connection (uvicorn's keep-alive timeout): a new one
                self.http.close()
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        self.ids += 1
        status, raw = self.post(
            json.dumps({"jsonrpc": "2.0", "id": self.ids, "method": method, "params": params}).encode()
        )
        if status != 200:
            raise RuntimeError(f"{method}: HTTP {status}: {raw[:300]!r}")
        doc: dict[str, Any] = json.loads(raw)
        if "error" in doc:
            raise RuntimeError(f"{method}: {doc['error']}")
        return doc["result"]

    def close(self) -> None:
        self.http.close()


def facade_seconds(port: int) -> tuple[float, float]:
    """(sum, count) of the facade's reach_mcp_tool_call_seconds."""
    import httpx

    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10, trust_env=False).text
    found = dict(re.findall(r"^reach_mcp_tool_call_seconds_(sum|count) ([0-9.e+-]+)$", text, re.M))
    return float(found.get("sum", 0)), float(found.get("count", 0))


@asynccontextmanager
async def mcp_session(
    transport: str, url: str, token: str, env: dict[str, str], errlog: Any, cwd: Path = REPO
) -> AsyncIterator[Any]:
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
        command=PYTHON, args=["-m", "workers.cli", "mcp", "--stdio", "--agent", catalogs.AGENT], env=env, cwd=cwd
    )
    async with stdio_client(server, errlog=errlog) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            await session.list_tools()
            yield session


def stdio_server_pid(cwd: Path = REPO) -> int:
    """The ``reach mcp --stdio`` child this process started in ``cwd`` (the MCP client SDK spawned it)."""
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and b"--stdio" in Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0"):
                if int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1]) == os.getpid():
                    if Path(f"/proc/{entry}/cwd").resolve() == cwd.resolve():
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
    parser.add_argument("--before", type=Path, help="a checkout to start a second HTTP facade from (http-before)")
    parser.add_argument(
        "--variants", help=f"comma-separated subset of {','.join(VARIANTS)} (direct is always run: the baseline)"
    )
    args = parser.parse_args()
    if args.quick:
        args.reps, args.seconds = 1, 4.0
    variants = VARIANTS + (("http-before", "stdio-before") if args.before else ())
    if args.variants:
        chosen = {"direct", *args.variants.split(",")}
        unknown = chosen - set(variants)
        if unknown:
            parser.error(f"unknown variants: {', '.join(sorted(unknown))}")
        variants = tuple(v for v in variants if v in chosen)

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
        before_url = before_metrics = None
        if args.before:
            before_port, before_metrics = free_port(), free_port()
            before_url = f"http://127.0.0.1:{before_port}/mcp"
            env = dict(
                fleet.env,
                REACH_BROKER_URL=facade_url,
                REACH_MCP_URL=before_url,
                REACH_MCP_TOKENS_FILE=str(work / "tokens.yaml"),
                REACH_METRICS_PORT=str(before_metrics),
            )
            argv = [PYTHON, "-m", "workers.cli", "mcp", "--http", "--port", str(before_port)]
            procs.start("mcp-before", argv, env, cwd=args.before.resolve())
        metrics_port = fleet.metrics_ports["mcp"]
        deadline = time.time() + 60
        for port_ in (metrics_port, before_metrics):
            while port_ is not None:
                try:
                    facade_seconds(port_)
                    break
                except Exception:
                    if time.time() > deadline:
                        raise RuntimeError(f"reach mcp did not start: {fleet.proc('mcp').log_text()[-2000:]}") from None
                    procs.check_alive()
                    time.sleep(0.2)

        stdio_env = dict(fleet.env, REACH_BROKER_URL=vhost.url)
        figures: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
        failures: list[str] = []
        with start_blocking_portal() as portal, ExitStack() as stack, open(work / "mcp-stdio.log", "a") as errlog:
            sessions = {
                t: stack.enter_context(portal.wrap_async_context_manager(mcp_session(t, url, token, stdio_env, errlog)))
                for t in ("http", "stdio")
            }
            if before_url is not None:
                sessions["http-before"] = stack.enter_context(
                    portal.wrap_async_context_manager(mcp_session("http", before_url, token, stdio_env, errlog))
                )
                sessions["stdio-before"] = stack.enter_context(
                    portal.wrap_async_context_manager(mcp_session("stdio", url, token, stdio_env, errlog, args.before))
                )
            lean = LeanClient(url, token)
            stack.callback(lean.close)
            client = stack.enter_context(ReachClient(catalogs.AGENT, vhost.url))
            server_pids = {
                "http": fleet.proc("mcp").pid,
                "http-lean": fleet.proc("mcp").pid,
                "stdio": stdio_server_pid(),
            }
            histograms = {"http": metrics_port, "http-lean": metrics_port}
            if args.before:
                server_pids["http-before"] = procs.items["mcp-before"].pid
                server_pids["stdio-before"] = stdio_server_pid(args.before)
                histograms["http-before"] = before_metrics

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

            def lean_call(rep: int) -> Callable[[int], float]:
                def call(i: int) -> float:
                    t0 = time.perf_counter()
                    result = lean.request("tools/call", {"name": TOOL, "arguments": params("http-lean", rep, i)})
                    took = (time.perf_counter() - t0) * 1000
                    if result.get("isError"):
                        failures.append(f"http-lean: {result.get('content')}")
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
                for variant in variants:
                    if variant in ("direct", "http-lean"):
                        call = direct(rep) if variant == "direct" else lean_call(rep)
                    else:
                        call = through(variant, rep)
                    call(-1)  # warm: a first call may connect
                    server = server_pids.get(variant)
                    histogram = histograms.get(variant)
                    before = facade_seconds(histogram) if histogram else (0.0, 0.0)
                    cpu_before = (
                        cpu_seconds(os.getpid(), tree=False),
                        cpu_seconds(server, tree=False) if server else 0,
                    )
                    latencies = paced(args.rate, args.seconds, call)
                    cpu_after = (cpu_seconds(os.getpid(), tree=False), cpu_seconds(server, tree=False) if server else 0)
                    after = facade_seconds(histogram) if histogram else (0.0, 0.0)
                    facade_ms = None
                    if after[1] > before[1]:
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
        for variant in variants:
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
        # the target is what the facade adds: reached by a lean HTTP client, and by the SDK over stdio
        for variant in ("http-lean", "stdio"):
            if variant not in summary:
                continue
            added = summary[variant]["added_p50"]
            met = added is not None and added <= 3.0
            print(f"target: {variant} added p50 <= 3 ms: {fmt(added, 2)} ms -> {'met' if met else 'NOT met'}")
        if "http" in summary:
            print(f"through the SDK's HTTP client (its own cost included): {fmt(summary['http']['added_p50'], 2)} ms")
        if "http" in figures and "http-lean" in figures:
            sdk_cost = [h["p50"] - lean_["p50"] for h, lean_ in zip(figures["http"], figures["http-lean"])]
            print(f"the SDK client's own cost (http p50 - http-lean p50, median): {fmt(median(sdk_cost), 2)} ms")
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
                        "before": str(args.before) if args.before else None,
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
