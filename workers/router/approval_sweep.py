"""Intents that wait for a person, when nobody acts: every router's sweep expires the approvals
nobody decided in time and carries out decisions whose process died before finishing them."""

from __future__ import annotations

import logging
import threading
import time

from workers.observability import metrics
from workers.router.approval_settling import Settler
from workers.state.approval_store import IN_PROGRESS, ApprovalStore

log = logging.getLogger("reach.approvals")

SWEEP_SECONDS = 1.0
SWEEP_BATCH = 100
EXPIRING_EVERY = 10.0  # seconds between two counts of the approvals close to expiry (a metric)
EXPIRING_SCAN = 10_000  # approvals looked at per count


class Sweeper:
    """Every ``interval`` seconds: expire the approvals nobody decided in time (APPROVAL_EXPIRED)
    and carry out decisions left unfinished. Each router runs one; the store's claims make sure
    one entry is acted on by one sweeper at a time."""

    def __init__(self, store: ApprovalStore, settler: Settler, interval: float = SWEEP_SECONDS) -> None:
        self.store = store
        self.settler = settler
        self.interval = interval
        self._counted_at = 0.0  # when the approvals close to expiry were last counted (monotonic)
        self._expiring_shown: set[str] = set()  # connectors the gauge has a value for
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="reach-approval-sweep", daemon=True)

    def start(self) -> Sweeper:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.sweep()
            except Exception as exc:  # Redis or the broker away: the entries stay due for the next round
                log.warning(
                    "approval sweep failed (%s: %s); trying again in %g s", type(exc).__name__, exc, self.interval
                )

    def count_expiring(self) -> None:
        """Set ``reach_approvals_expiring_soon`` per connector (zero where none is left), at most
        every ``EXPIRING_EVERY`` seconds: an alert on it reaches people before an approval expires unseen."""
        now = time.monotonic()
        if now - self._counted_at < EXPIRING_EVERY:
            return
        self._counted_at = now
        counts = self.store.expiring(int(metrics.APPROVALS_EXPIRING_WITHIN_SECONDS * 1000), EXPIRING_SCAN)
        for connector in self._expiring_shown - set(counts):
            metrics.APPROVALS_EXPIRING.labels(connector=connector).set(0)
        for connector, n in counts.items():
            metrics.APPROVALS_EXPIRING.labels(connector=connector).set(n)
        self._expiring_shown |= set(counts)

    def sweep(self) -> int:
        """One round; returns how many entries it settled."""
        self.count_expiring()
        settled = 0
        for approval_id in self.store.due(SWEEP_BATCH):
            claim = self.store.claim_due(approval_id)
            if claim not in IN_PROGRESS:
                continue
            record = self.store.get(approval_id)
            if record is None or record.state != claim:  # finished meanwhile by the one who decided
                continue
            try:
                self.settler.settle(record, claim)
                settled += 1
            except Exception as exc:
                log.warning("could not settle approval %s (%s): %s; retried after its grace", approval_id, claim, exc)
        return settled
