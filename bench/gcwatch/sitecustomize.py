"""Garbage-collection accounting for the benchmark's processes (bench/recovery.py --gcwatch).

Loaded through PYTHONPATH=bench/gcwatch only when BENCH_GCWATCH names a file: every collection's
generation and duration is counted (gc.callbacks), and a daemon thread appends the running totals
to that file as one JSON line every 0.2 s, with the number of objects the collector tracks in the
oldest generation (frozen objects excluded) and of frozen ones every 2 s. Not used by the fleet itself."""

from __future__ import annotations

import gc
import json
import os
import threading
import time

_PATH = os.environ.get("BENCH_GCWATCH")

if _PATH:
    _counts = [0, 0, 0]
    _seconds = [0.0, 0.0, 0.0]
    _max = [0.0, 0.0, 0.0]
    _started: list[float] = [0.0]

    def _on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            _started[0] = time.perf_counter()
            return
        gen = info.get("generation", 0)
        took = time.perf_counter() - _started[0]
        _counts[gen] += 1
        _seconds[gen] += took
        _max[gen] = max(_max[gen], took)

    gc.callbacks.append(_on_gc)

    def _writer() -> None:
        n = 0
        old = frozen = None
        with open(f"{_PATH}.{os.getpid()}", "a", buffering=1) as out:
            while True:
                if n % 10 == 0:
                    # both walk a list of objects: rarely (get_freeze_count walks every frozen one)
                    old = len(gc.get_objects(2))
                    frozen = gc.get_freeze_count()
                out.write(
                    json.dumps(
                        {
                            "t": round(time.time(), 3),
                            "counts": _counts,
                            "seconds": [round(s, 6) for s in _seconds],
                            "max_ms": [round(m * 1000, 3) for m in _max],
                            "gen2_objects": old,
                            "frozen": frozen,
                            "thresholds": gc.get_threshold(),
                        }
                    )
                    + "\n"
                )
                n += 1
                time.sleep(0.2)

    threading.Thread(target=_writer, name="bench-gcwatch", daemon=True).start()
