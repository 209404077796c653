"""A pool's history records: each dispatched intent's receipt remembered for ``reach.history``.

The record is built from the job (its checked params, its run when it is a workflow's step) and
the receipt as sent (status, code, data), projected by the action's contract
(connectors/history.py). In Redis it is written by the same round trip that stores the receipt
(``commands``); another store gets it right after the receipt is published (``write_after``), and
a failure there costs the record only, never the receipt.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from connectors import history
from connectors.catalog import Catalog
from producers.wire import Receipt
from workers.state.history import HistoryStore, RedisHistory
from workers.transport.job import Job

log = logging.getLogger("reach.pool")


class HistoryWrites:
    """Records of one pool's receipts; ``store`` None: history is not kept by this process."""

    def __init__(self, catalog: Catalog, store: HistoryStore | None, default_ttl_seconds: int) -> None:
        self.catalog = catalog
        self.store = store
        self.default_ttl_seconds = default_ttl_seconds
        self._versions: dict[tuple[str, str], str] = {}

    def record(self, receipt: Receipt, job: Job) -> history.Record | None:
        """The record of ``receipt`` (None: the action keeps no history, or is not in the catalog).
        Never raises: whatever a record would have been, the receipt goes out."""
        if self.store is None:
            return None
        try:
            return self._record(receipt, job)
        except Exception:
            log.exception("could not build the history record of %s; the receipt goes out without one", job.intent_id)
            return None

    def _record(self, receipt: Receipt, job: Job) -> history.Record | None:
        ref = self.catalog.refs.get((job.connector, job.action))
        if ref is None:
            return None
        retain = history.retention(ref.action, self.default_ttl_seconds)
        if retain is None:
            return None
        version = self._versions.get((job.connector, job.action))
        if version is None:
            version = self._versions[(job.connector, job.action)] = history.action_version(ref.action)
        error = receipt.error
        return history.record(
            agent=job.agent_id,
            intent_id=job.intent_id,
            connector=job.connector,
            action=ref.action,
            status=receipt.status,
            code=error.code.value if error is not None else None,
            at=receipt.execution.finished_at,
            at_ms=int(time.time() * 1000),
            trace_id=job.trace_id,
            params=job.params,
            data=receipt.data,
            retain_seconds=retain,
            version=version,
            run_id=job.run_id,
        )

    def commands(self, rec: history.Record | None) -> Callable[[Any], None] | None:
        """The Redis commands that write ``rec`` on the receipt's own pipeline, if the store is Redis."""
        store = self.store
        if rec is None or not isinstance(store, RedisHistory):
            return None

        def write(pipe: Any) -> None:
            store.write_into(pipe, rec)

        return write

    def write_after(self, rec: history.Record | None) -> None:
        """Write ``rec`` to a store that is not Redis (after the receipt went out)."""
        if rec is None or self.store is None or isinstance(self.store, RedisHistory):
            return
        try:
            self.store.write([rec])
        except Exception as exc:  # the receipt is out: only the record is lost, and said so
            log.error("could not keep the history record of %s: %s", rec.intent_id, exc)
