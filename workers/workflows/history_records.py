"""A workflow run in its owner's history: its final receipt, remembered like an action's (its steps
are remembered by their pools, each with the run's id).

The record's ``action`` is the workflow's name and its ``connector`` null; its ``params`` the run's
input projected to the workflow's declared ``input`` (``entity`` fields index it, ``sensitive`` ones
are redacted); ``data`` is not kept (a workflow declares no typed output). It is kept for
REACH_HISTORY_TTL, and written right after the final receipt went out: a failure costs the record,
never the receipt.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from connectors import history
from connectors.spec import ActionSpec
from connectors.workflows.spec import WorkflowSpec
from workers.state.history import HistoryStore
from workers.workflows.model import Run

log = logging.getLogger("reach.workflows")


class RunHistory:
    """Writes a run's record once its final receipt is out."""

    def __init__(self, store: HistoryStore, ttl_seconds: int) -> None:
        self.store = store
        self.ttl_seconds = ttl_seconds
        self._contracts: dict[str, tuple[ActionSpec, str]] = {}  # spec digest -> (contract, version)

    def remember(self, run: Run) -> None:
        final = run.final
        if final is None:
            return
        try:
            contract, version = self._contract(run)
            error: dict[str, Any] = final.get("error") or {}
            execution: dict[str, Any] = final.get("execution") or {}
            rec = history.record(
                agent=run.owner,
                intent_id=run.run_id,
                connector="",
                action=contract,
                status=str(final.get("status")),
                code=error.get("code"),
                at=str(execution.get("finished_at")),
                at_ms=int(time.time() * 1000),
                trace_id=run.trace_id,
                params=run.input,
                data=None,
                retain_seconds=self.ttl_seconds,
                version=version,
                run_id=run.run_id,
            )
            self.store.write([rec])
        except Exception as exc:  # the receipt is out: only the record is lost, and said so
            log.error("could not keep the history record of run %s: %s: %s", run.run_id, type(exc).__name__, exc)

    def _contract(self, run: Run) -> tuple[ActionSpec, str]:
        found = self._contracts.get(run.spec_digest)
        if found is None:
            spec = WorkflowSpec.model_validate(run.spec)
            contract = ActionSpec(action=spec.name, input=dict(spec.input))
            found = self._contracts[run.spec_digest] = (contract, history.action_version(contract))
            while len(self._contracts) > 256:  # catalogs change rarely; a bound all the same
                self._contracts.pop(next(iter(self._contracts)))
        return found
