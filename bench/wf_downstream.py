"""The workflow benchmark's downstream: the tests' counting system (tests/integration/counting_system.py)
in a process of its own, with two things bench/workflows.py needs besides: every *call* counted by
title (before the system's own Idempotency-Key dedup, so a step sent twice shows as two calls), and a
gate that holds answers (calls wait at the gate until released, at most HOLD_MAX_SECONDS).

    python bench/wf_downstream.py      # prints "READY <port>", then answers one JSON line per command on stdin:

    hold                 calls arriving from now on wait at the gate
    release              open the gate (held calls answer at once)
    counts TAG           calls and executions of titles starting with TAG: {"calls", "titles", "repeated",
                         "by_step": {suffix after the last '-' of the title's first word: calls}, "held"}
"""

from __future__ import annotations

import json
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.integration.counting_system import CountingSystem  # noqa: E402

HOLD_MAX_SECONDS = 120.0  # a forgotten gate opens by itself: nothing waits past the benchmark's bounds


class Gate:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: Counter[str] = Counter()
        self.open = threading.Event()
        self.open.set()
        self.held = 0

    def on_request(self, record: dict[str, Any]) -> None:
        title = record.get("title")
        with self.lock:
            if isinstance(title, str):
                self.calls[title] += 1
            waiting = not self.open.is_set()
            if waiting:
                self.held += 1
        if waiting:
            self.open.wait(HOLD_MAX_SECONDS)
            with self.lock:
                self.held -= 1

    def counts(self, system: CountingSystem, tag: str) -> dict[str, Any]:
        with self.lock:
            mine = {t: n for t, n in self.calls.items() if t.startswith(tag)}
            held = self.held
        executed = system.executions()
        by_step: Counter[str] = Counter()
        for title, n in mine.items():
            by_step[title.split(" ", 1)[0].rsplit("-", 1)[-1]] += n
        return {
            "calls": sum(mine.values()),
            "titles": len(mine),
            "repeated": sum(1 for n in mine.values() if n > 1),
            "executed_twice": sum(1 for t in mine if executed.get(t, 0) > 1),
            "by_step": dict(sorted(by_step.items())),
            "held": held,
        }


def main() -> None:
    system = CountingSystem(0)
    system.state.keep_requests = False
    gate = Gate()
    system.state.on_request = gate.on_request
    threading.Thread(target=system.serve_forever, daemon=True, name="wf-downstream").start()
    print(f"READY {system.port}", flush=True)
    for line in sys.stdin:
        cmd, _, arg = line.strip().partition(" ")
        if cmd == "hold":
            gate.open.clear()
            out: dict[str, Any] = {"ok": True}
        elif cmd == "release":
            gate.open.set()
            out = {"ok": True}
        elif cmd == "counts":
            out = gate.counts(system, arg)
        else:
            out = {"error": f"unknown command {cmd!r}"}
        print(json.dumps(out), flush=True)
    gate.open.set()
    system.shutdown()


if __name__ == "__main__":
    main()
