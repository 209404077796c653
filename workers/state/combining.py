"""Batches of work done by whichever thread gets there first ("flat combining").

The Redis batcher and the pools' receipt publisher both turn many threads' small requests into one
round trip. Handing a lone request to a dedicated thread and the answer back costs two thread
switches (futex calls, the GIL changing hands, waking an idle CPU), more than the work itself when
the fleet is quiet.

So a caller that finds no batch running runs the batch itself — its own item and whatever was
queued before it — on its own thread: no hand-over. A caller that finds a batch running queues its
item and waits; when that batch ends, whatever queued meanwhile is passed to the background thread,
which batches it. Low load pays no hand-overs; high load still shares round trips.

Only the thread holding ``busy`` touches what ``run_batch`` uses (a pipeline, a channel), so
that need not be thread-safe.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

log = logging.getLogger("reach.combining")

T = TypeVar("T")


class Combiner(Generic[T]):
    def __init__(self, run_batch: Callable[[list[T]], None], *, max_batch: int, name: str) -> None:
        """``run_batch`` must settle every item it is given (its caller may be waiting on it) and
        should not raise; ``max_batch`` bounds one batch."""
        self._run_batch = run_batch
        self._max_batch = max_batch
        self._queue: queue.SimpleQueue[T] = queue.SimpleQueue()
        self._busy = threading.Lock()  # held by the thread running a batch
        self._wake = threading.Event()
        self._closed = False
        self._thread = threading.Thread(target=self._background, name=name, daemon=True)
        self._thread.start()

    def run(self, item: T, done: threading.Event, timeout: float) -> bool:
        """Queue ``item`` and return once ``done`` is set (by ``run_batch``): on this thread if no
        batch is running, else by whoever runs the next one. False if ``timeout`` passed first."""
        return self.run_all([item], [done], timeout)

    def run_all(self, items: list[T], dones: list[threading.Event], timeout: float) -> bool:
        """``run`` for several items at once, in one batch when they fit: they queue together,
        and batches take the queue in order, so once the last is done every earlier one is too.
        False if ``timeout`` passed before all were done."""
        for item in items:
            self._queue.put(item)
        self._combine(dones[-1])
        give_up = time.monotonic() + timeout
        return all(done.is_set() or done.wait(max(0.0, give_up - time.monotonic())) for done in dones)

    def post(self, item: T) -> None:
        """Queue ``item`` without waiting for it: if no batch is running, this thread runs one now
        (waking another thread would cost more than the round trip), else it goes in the next."""
        self._queue.put(item)
        self._combine(None)

    def close(self, timeout: float = 10.0) -> None:
        """Run what is queued, then stop the background thread; later calls run on their caller."""
        self._closed = True
        self._wake.set()
        self._thread.join(timeout)

    def _combine(self, done: threading.Event | None) -> None:
        """If no batch is running, run batches on this thread — until ``done`` is set, or one when
        there is nothing to wait for — then pass on what queued meanwhile. Otherwise the running
        batch's thread passes our item on when it ends (``_pass_on``)."""
        if not self._acquire():
            return
        try:
            while done is None or not done.is_set():
                if not self._one_batch() or done is None:
                    break  # (a batch always finds our item while it is not done) — never spin
        finally:
            self._busy.release()
        self._pass_on()

    def _acquire(self) -> bool:
        """Take ``busy`` if free; once closed (no background thread to pass work to), wait for it."""
        return self._busy.acquire(blocking=False) or (self._closed and self._busy.acquire())

    def _one_batch(self) -> bool:
        """Run one batch of what is queued (the caller holds ``busy``). False if nothing was."""
        batch: list[T] = []
        while len(batch) < self._max_batch:
            try:
                batch.append(self._queue.get_nowait())
            except queue.Empty:
                break
        if not batch:
            return False
        try:
            self._run_batch(batch)
        except Exception:  # run_batch settles its items itself; this thread must go on
            log.exception("a batch failed")
        return True

    def _pass_on(self) -> None:
        """After releasing ``busy``: what queued while we ran goes to the background thread. (A
        caller that queued before we released either took ``busy`` itself or is seen here.) Once
        closed, the background thread may be gone: this thread runs it instead."""
        if self._queue.empty():
            return
        if not self._closed:
            self._wake.set()
            return
        with self._busy:
            while self._one_batch():
                pass

    def _background(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            while not self._queue.empty():
                with self._busy:
                    self._one_batch()
            if self._closed:
                return
