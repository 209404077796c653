"""CPU per HTTP call of three httpx transports, in one run, against bench/downstream.py:

    default   httpx.HTTPTransport (httpcore and h11): the baseline
    own       ThreadTransport, the transport on http.client this project wrote until issue 31;
              loaded from git at --own-ref when the working tree no longer has it
    urllib3   PooledTransport (connectors/adapters/transport.py): urllib3's pools, with
              the strict answer reading of connectors/adapters/strict_http.py

Two layers, each in this one thread, kept alive, against a downstream in a process of its own
(its CPU is not counted; the calls here measure the client side only, with thread_time):

    transport   a request built by an httpx.Client, sent on the transport itself (as the HTTP
                adapter sends), its body read and closed: a JSON POST and a GET, alternating
    adapter     HttpAdapter.call for the same two actions: validation, request building, the
                call, the answer's checks and mapping: what the pool spends on one intent's call

and, with --fleet, a third:

    pool        bench/hotpath.py's pool phase (the pool's whole work per intent: Redis, the call,
                the receipt) in a process of its own per repetition, its HttpAdapter on each
                transport in turn: CPU per intent, the figure that bounds the fleet's throughput

Repetitions are interleaved (the variants' order shuffled in each), and medians reported with the
ratio to the baseline. The fleet figure: the pool process is what bounds the fleet's throughput
(BENCHMARKS.md, "Throughput and CPU per intent"), so a call costing d µs more than the own
transport costs about d / (pool CPU per intent) of the throughput; --pool-ms is that CPU.

    .venv/bin/python bench/transports.py [--calls 2000] [--reps 7] [--pool-ms 1.4] [--fleet] [--json PATH]

--fleet needs RabbitMQ and Redis as bench/hotpath.py does (database 15, flushed after each run).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

import httpx  # noqa: E402
import urllib3  # noqa: E402
from common import calibrate, loadavg  # noqa: E402

from connectors.adapters.base import CallContext  # noqa: E402
from connectors.adapters.http import HttpAdapter  # noqa: E402
from connectors.adapters.transport import PooledTransport  # noqa: E402
from connectors.spec import ConnectorSpec  # noqa: E402

OWN_REF = "4bfc252"  # the last commit whose connectors/adapters/transport.py holds ThreadTransport


def own_transport_class(ref: str) -> type[httpx.BaseTransport]:
    """ThreadTransport from the working tree if it is there, else from git at ``ref``."""
    try:
        from connectors.adapters import transport  # type: ignore[attr-defined]

        return transport.ThreadTransport  # type: ignore[no-any-return]
    except (ImportError, AttributeError):
        pass
    source = subprocess.run(
        ["git", "show", f"{ref}:connectors/adapters/transport.py"], cwd=ROOT, capture_output=True, check=True, text=True
    ).stdout
    module = types.ModuleType("own_transport")
    module.__dict__["__name__"] = "own_transport"
    sys.modules["own_transport"] = module
    exec(compile(source, f"{ref}:connectors/adapters/transport.py", "exec"), module.__dict__)  # noqa: S102
    return module.ThreadTransport  # type: ignore[no-any-return]


def start_downstream() -> tuple[subprocess.Popen[bytes], str]:
    proc = subprocess.Popen([sys.executable, str(HERE / "downstream.py"), "0"], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    line = proc.stdout.readline().decode()
    if not line.startswith("READY"):
        proc.kill()
        raise RuntimeError(f"downstream did not start: {line!r}")
    return proc, f"http://127.0.0.1:{int(line.split()[1])}"


def transport_calls(transport: httpx.BaseTransport, base: str) -> Callable[[int], None]:
    """n calls, alternating a JSON POST and a GET, each sent on the transport, read and closed."""
    client = httpx.Client(trust_env=False, timeout=httpx.Timeout(15.0, connect=5.0))
    post_url, get_url = f"{base}/tickets", f"{base}/items/IT-1"

    def run(n: int) -> None:
        for i in range(n):
            if i % 2:
                request = client.build_request("GET", get_url)
            else:
                request = client.build_request("POST", post_url, json={"title": f"t{i}", "priority": "high"})
            response = transport.handle_request(request)
            try:
                response.read()
            finally:
                response.close()
            if response.status_code >= 300:
                raise RuntimeError(f"HTTP {response.status_code}")

    return run


def adapter_calls(transport: httpx.BaseTransport, base: str) -> Callable[[int], None]:
    spec = ConnectorSpec.model_validate(
        {
            "name": "bench",
            "endpoint": base,
            "actions": [
                {"action": "create_ticket", "path": "POST /tickets", "permission": "write", "input": {"title": {}}},
                {"action": "get_item", "path": "GET /items/{item_id}", "permission": "read", "input": {"item_id": {}}},
            ],
        }
    )
    adapter = HttpAdapter(spec, environ={}, transport=transport)
    create, read = spec.actions
    ctx = CallContext("bench-intent")

    def run(n: int) -> None:
        for i in range(n):
            outcome = (
                adapter.call(read, {"item_id": "IT-1"}, ctx) if i % 2 else adapter.call(create, {"title": f"t{i}"}, ctx)
            )
            if not outcome.ok:
                raise RuntimeError(f"call failed: {outcome}")

    return run


def patch_adapter(name: str, own_ref: str) -> None:
    """Make every HttpAdapter built from now on send on a transport of kind ``name`` (hotpath.py
    runs one pool thread, so one transport per adapter is one per thread)."""
    factory = {
        "default": httpx.HTTPTransport,
        "own": own_transport_class(own_ref),
        "urllib3": PooledTransport,
    }[name]
    original = HttpAdapter.__init__

    def init(self: HttpAdapter, connector: ConnectorSpec, **kwargs: Any) -> None:
        kwargs.setdefault("transport", factory())
        original(self, connector, **kwargs)

    HttpAdapter.__init__ = init  # type: ignore[method-assign]


def pool_cpu(name: str, own_ref: str, n: int) -> float:
    """µs of the pool's CPU per intent in one bench/hotpath.py run on transport ``name``."""
    code = (
        f"import runpy, sys; sys.path[:0] = [{str(ROOT)!r}, {str(HERE)!r}]; import transports;"
        f" transports.patch_adapter({name!r}, {own_ref!r}); sys.argv = ['hotpath.py', '--n', '{n}'];"
        f" runpy.run_path({str(HERE / 'hotpath.py')!r}, run_name='__main__')"
    )
    for attempt in range(3):
        # a session of its own, output to a file: a run that dies (another tenant restarting RabbitMQ)
        # leaves no downstream behind holding a pipe open, and is tried again
        with tempfile.TemporaryFile("w+") as out:
            proc = subprocess.Popen(
                [sys.executable, "-c", code], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
            proc.wait()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            out.seek(0)
            text = out.read()
        line = next((line for line in text.splitlines() if line.startswith("pool:")), None)
        if proc.returncode == 0 and line is not None:
            return float(line.split()[1]) * 1000
        print(f"hotpath.py on {name} failed (attempt {attempt + 1}):\n{text[-800:]}", file=sys.stderr)
    raise RuntimeError(f"hotpath.py on {name} failed three times")


def measure(run: Callable[[int], None], n: int) -> float:
    """µs of this thread's CPU per call over n calls."""
    t0 = time.thread_time()
    run(n)
    return (time.thread_time() - t0) / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=2000, help="calls per variant per repetition")
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--pool-ms", type=float, default=1.4, help="the pool's CPU per intent, ms (BENCHMARKS.md)")
    parser.add_argument("--own-ref", default=OWN_REF, help="git ref to load ThreadTransport from if it is gone")
    parser.add_argument("--fleet", action="store_true", help="also the pool's CPU per intent (bench/hotpath.py)")
    parser.add_argument("--intents", type=int, default=2000, help="intents per hotpath.py run (--fleet)")
    parser.add_argument("--json", type=Path, help="write the figures here too")
    args = parser.parse_args()

    own = own_transport_class(args.own_ref)
    factories: dict[str, Callable[[], httpx.BaseTransport]] = {
        "default": lambda: httpx.HTTPTransport(),
        "own": lambda: own(),
        "urllib3": lambda: PooledTransport(),
    }
    meta = {
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "commit": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "versions": f"httpx {httpx.__version__}, urllib3 {urllib3.__version__}",
        "calls": args.calls,
        "reps": args.reps,
        "load_start": loadavg(),
        "calibration_ms_start": calibrate(),
    }
    print(json.dumps(meta), file=sys.stderr)
    proc, base = start_downstream()
    results: dict[str, dict[str, list[float]]] = {"transport": {}, "adapter": {}, "pool": {}}
    try:
        runners: dict[tuple[str, str], Callable[[int], None]] = {}
        for name, make in factories.items():
            runners["transport", name] = transport_calls(make(), base)
            runners["adapter", name] = adapter_calls(make(), base)
        for run in runners.values():
            run(200)  # warm: connections open, code paths taken
        for rep in range(args.reps):
            order = list(runners)
            random.shuffle(order)
            for key in order:
                results[key[0]].setdefault(key[1], []).append(measure(runners[key], args.calls))
            if args.fleet:
                for name in random.sample(list(factories), len(factories)):
                    results["pool"].setdefault(name, []).append(pool_cpu(name, args.own_ref, args.intents))
            print(f"rep {rep + 1}/{args.reps} done, load {loadavg()}", file=sys.stderr)
    finally:
        proc.terminate()
        proc.wait(10)
    meta["load_end"] = loadavg()
    meta["calibration_ms_end"] = calibrate()

    summary: dict[str, Any] = {"meta": meta}
    lines = [
        f"{meta['when']}, commit {meta['commit']}, {meta['machine']}, {meta['versions']}",
        f"{args.reps} interleaved repetitions of {args.calls} calls; load {meta['load_start']} -> {meta['load_end']},"
        f" calibration {meta['calibration_ms_start']} -> {meta['calibration_ms_end']} ms",
        "",
        "| layer | transport | µs CPU per call, median (min–max) | / default | − own, µs | fleet throughput vs own |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for layer, by_name in results.items():
        if not by_name:
            continue
        medians = {name: statistics.median(values) for name, values in by_name.items()}
        summary[layer] = {"medians_us": medians, "samples_us": by_name}
        for name, values in by_name.items():
            delta = medians[name] - medians["own"]
            # the pool bounds throughput: its rate is 1 / its CPU per intent, which grows by delta
            pool_us = medians["own"] if layer == "pool" else args.pool_ms * 1000
            effect = pool_us / (pool_us + delta) - 1
            lines.append(
                f"| {layer} | {name} | {medians[name]:.1f} ({min(values):.1f}–{max(values):.1f}) |"
                f" {medians[name] / medians['default']:.2f} | {delta:+.1f} | {effect:+.1%} |"
            )
    lines.append("")
    lines.append(
        f"fleet throughput vs own: the pool's CPU per intent taken as {args.pool_ms} ms (--pool-ms) for the"
        " transport and adapter rows, as measured (own) for the pool rows"
    )
    print("\n".join(lines))
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
