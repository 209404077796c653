"""A process's Redis round trips and audit writes, in batches.

Every Redis round trip and every write to stdout costs a router or pool thread far more CPU than
the work itself (system calls, redis-py's per-call work, the GIL changing hands between threads).
So threads' commands are combined (``workers.state.combining``): the thread that finds no batch
running writes all audit lines queued so far with one ``write`` and sends all commands in one
pipeline, its own included; under load many intents share one round trip, and a lone call pays no
hand-over to another thread.

``call`` waits until its commands' batch came back and returns their results: a caller that
stores something before acting (the idempotency claim, the receipt before it is published, the
"sent" mark before the ack) keeps exactly the order it had with its own round trips. A call
``durable`` for some keys also waits until a replica has its writes: one WAIT per node at the end
of the batch covers every such call in it (``workers.state.replicas``).

On a Redis Cluster the batch is a ``ClusterPipeline``: each node gets its share of the commands
on one connection, all nodes at once, so a batch is still one round trip (per node, in parallel).
No batch is a transaction (MULTI/EXEC would have to stay within one slot). ``submit``
and ``lines`` never wait for another thread's batch (the router's trace entries: best effort, the
log lines are the record); when no batch is running they run one on the calling thread.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import redis

from workers.state.client import replica_wait
from workers.state.combining import Combiner
from workers.state.replicas import NO_WAIT

log = logging.getLogger("reach.batcher")

Commands = Callable[[Any], None]  # adds commands to a redis-py pipeline
MAX_BATCH = 500
WAIT_SECONDS = 30.0


@dataclass(frozen=True)
class Write:
    """One caller's share of a batch: its commands, its audit lines, and the keys whose node
    must pass the writes on to its replicas before the caller goes on (see ``Batcher.call``)."""

    commands: Commands
    lines: list[str] | None = None
    durable: Sequence[str] = ()


_stdout_lock = threading.Lock()


def write_stdout(lines: list[str]) -> None:
    """Write audit lines to stdout as bare JSON, one per line, whatever the log format.

    One direct write per batch: through ``logging`` (caller lookup, a handler lock per line) they
    would cost more CPU than everything else the audit does."""
    text = "\n".join(lines) + "\n"
    with _stdout_lock:
        sys.stdout.write(text)
        sys.stdout.flush()


class _Item:
    __slots__ = ("commands", "lines", "done", "durable", "results", "error")

    def __init__(
        self,
        commands: Commands | None,
        lines: list[str] | None,
        done: threading.Event | None,
        durable: Sequence[str] = (),
    ) -> None:
        self.commands = commands
        self.lines = lines
        self.done = done
        self.durable = durable
        self.results: list[Any] = []
        self.error: Exception | None = None


class Batcher:
    def __init__(
        self,
        client: redis.Redis | None,
        write_lines: Callable[[list[str]], None] = write_stdout,
        name: str = "reach-batcher",
    ) -> None:
        self._client = client
        self._wait = NO_WAIT if client is None else replica_wait(client)
        self._write_lines = write_lines
        self._combiner: Combiner[_Item] = Combiner(self._write, max_batch=MAX_BATCH, name=name)

    def lines(self, lines: list[str]) -> None:
        """Audit lines for stdout (an ``Audit`` write function)."""
        self._combiner.post(_Item(None, lines, None))

    def submit(self, commands: Commands | None, lines: list[str] | None = None) -> None:
        """Queue Redis commands (and audit lines) without waiting for another thread's batch (if none
        is running, this thread runs one): best effort, errors are logged."""
        self._combiner.post(_Item(commands, lines, None))

    def call(self, commands: Commands, lines: list[str] | None = None, durable: Sequence[str] = ()) -> list[Any]:
        """Run the commands (and write the lines) in the next batch and return their results, as
        ``pipeline.execute()`` would; raises ``redis.RedisError`` as it would too. ``durable``: keys
        whose node must have passed the batch's writes on to its replicas before this returns."""
        [outcome] = self.call_each([Write(commands, lines, durable)])
        if isinstance(outcome, redis.RedisError):
            raise outcome
        return outcome

    def call_each(self, writes: Sequence[Write]) -> list[list[Any] | redis.RedisError]:
        """Several callers' writes in the next batch (each as ``call`` would run it), for a thread
        that acts for them all (the receipt publisher): each one's results, or the error that
        failed it — one failing write does not fail the others."""
        if not writes:
            return []
        items = [_Item(w.commands, w.lines, threading.Event(), w.durable) for w in writes]
        self._combiner.run_all(items, [item.done for item in items], WAIT_SECONDS)  # type: ignore[misc]
        late = redis.TimeoutError(f"the Redis batcher did not answer within {WAIT_SECONDS:.0f} s")
        return [
            late if not item.done.is_set() else item.results if item.error is None else _redis_error(item.error)  # type: ignore[union-attr]
            for item in items
        ]

    def close(self, timeout: float = 10.0) -> None:
        """Write what is queued, then stop the background thread (later calls run on their caller)."""
        self._combiner.close(timeout)

    def _write(self, batch: list[_Item]) -> None:
        try:
            lines = [line for item in batch if item.lines for line in item.lines]
            if lines:
                try:
                    self._write_lines(lines)
                except Exception:
                    log.exception("could not write %d audit line(s)", len(lines))
            with_commands = [item for item in batch if item.commands is not None]
            if with_commands and self._client is not None:
                pipe = self._client.pipeline(transaction=False)
                spans = []
                for item in with_commands:
                    start = len(pipe)
                    item.commands(pipe)  # type: ignore[misc]
                    spans.append((item, start, len(pipe)))
                try:
                    waits = self._wait.append(pipe, [key for item in with_commands for key in item.durable])
                    results = self._wait.check(waits, pipe.execute(raise_on_error=False))
                except redis.RedisError as exc:
                    for item in with_commands:
                        item.error = exc
                    if any(item.done is None for item in with_commands):
                        log.error("Redis batch of %d item(s) failed: %s", len(with_commands), exc)
                else:
                    for item, start, end in spans:
                        item.results = results[start:end]
                        item.error = next((r for r in item.results if isinstance(r, Exception)), None)
                        if item.error is not None and item.done is None:
                            log.error("Redis refused a batched write: %s", item.error)
        except Exception as exc:  # never let the thread die: callers would hang
            log.exception("the Redis batcher failed on a batch")
            for item in batch:
                item.error = exc if isinstance(exc, redis.RedisError) else redis.RedisError(f"batcher failed: {exc}")
        finally:
            for item in batch:
                if item.done is not None:
                    item.done.set()


def _redis_error(error: Exception) -> redis.RedisError:
    return error if isinstance(error, redis.RedisError) else redis.RedisError(str(error))
