"""The combiner behind the Redis batcher and the receipt publisher: who runs a batch, and that no
item is lost, run twice or left waiting."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

from workers.state.combining import Combiner


class Item:
    def __init__(self, n: int) -> None:
        self.n = n
        self.done = threading.Event()
        self.ran_on: int | None = None


class Recorder:
    def __init__(self, pause: float = 0.0, fail_first: bool = False) -> None:
        self.pause = pause
        self.fail_first = fail_first
        self.batches: list[list[int]] = []
        self.lock = threading.Lock()

    def __call__(self, batch: list[Item]) -> None:
        with self.lock:
            self.batches.append([item.n for item in batch])
            first = len(self.batches) == 1
        time.sleep(self.pause)
        for item in batch:
            item.ran_on = threading.get_ident()
            item.done.set()
        if self.fail_first and first:
            raise RuntimeError("boom")

    def seen(self) -> list[int]:
        with self.lock:
            return sorted(n for batch in self.batches for n in batch)


def test_a_lone_caller_runs_its_own_batch_on_its_own_thread() -> None:
    recorder = Recorder()
    combiner: Combiner[Item] = Combiner(recorder, max_batch=10, name="t")
    for n in range(5):
        item = Item(n)
        assert combiner.run(item, item.done, timeout=5)
        assert item.ran_on == threading.get_ident()  # no hand-over to another thread
    assert recorder.batches == [[0], [1], [2], [3], [4]]
    combiner.close()


def test_concurrent_callers_share_batches_and_each_item_runs_once() -> None:
    recorder = Recorder(pause=0.005)
    combiner: Combiner[Item] = Combiner(recorder, max_batch=7, name="t")
    items = [Item(n) for n in range(400)]

    def call(item: Item) -> bool:
        return combiner.run(item, item.done, timeout=10)

    with ThreadPoolExecutor(max_workers=20) as pool:
        assert all(pool.map(call, items))
    assert recorder.seen() == list(range(400))
    assert max(len(batch) for batch in recorder.batches) > 1  # items queued during a batch were combined
    assert all(len(batch) <= 7 for batch in recorder.batches)
    combiner.close()


def test_posted_items_run_even_when_posted_during_someone_elses_batch() -> None:
    recorder = Recorder(pause=0.2)
    combiner: Combiner[Item] = Combiner(recorder, max_batch=10, name="t")
    first = Item(0)
    caller = threading.Thread(target=combiner.run, args=(first, first.done, 5))
    caller.start()
    time.sleep(0.05)  # the caller is inside its batch
    posted = [Item(n) for n in range(1, 4)]
    for item in posted:
        combiner.post(item)
    caller.join()
    for item in posted:  # passed on to the background thread: nobody else ever calls again
        assert item.done.wait(2), f"item {item.n} was left in the queue"
    assert recorder.seen() == [0, 1, 2, 3]
    combiner.close()


def test_a_failing_batch_does_not_stop_the_next_ones() -> None:
    recorder = Recorder(fail_first=True)
    combiner: Combiner[Item] = Combiner(recorder, max_batch=10, name="t")
    for n in range(3):
        item = Item(n)
        assert combiner.run(item, item.done, timeout=5)
    assert recorder.seen() == [0, 1, 2]
    combiner.close()


def test_after_close_calls_and_posts_still_run_on_their_caller() -> None:
    recorder = Recorder()
    combiner: Combiner[Item] = Combiner(recorder, max_batch=10, name="t")
    combiner.close()
    item, posted = Item(1), Item(2)
    assert combiner.run(item, item.done, timeout=1)
    combiner.post(posted)
    assert posted.done.is_set() and posted.ran_on == threading.get_ident()
