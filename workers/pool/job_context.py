"""What one delivery of one job carries through the pool, once it is checked (right connector,
known action): the job, its action, its idempotency record and this delivery's own claim."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from connectors.catalog import ActionRef
from producers.wire import Receipt
from workers.transport.job import Job
from workers.transport.receipts import job_receipt


@dataclass(frozen=True)
class JobContext:
    """One delivery of one job on this pool, checked (right connector, known action)."""

    job: Job
    ref: ActionRef
    key: str  # the idempotency record
    attempt: str  # this delivery's own claim: see Ledger.abandon
    safe: bool  # repeating the call is harmless (ConnectorSpec.safe_to_repeat)
    params_hash: str
    queue_ms: float

    @property
    def intent_id(self) -> str:
        return self.job.intent_id

    @property
    def agent_id(self) -> str:
        return self.job.agent_id

    @property
    def deadline(self) -> float | None:
        return self.job.deadline

    def receipt(self, **outcome: Any) -> Receipt:
        return job_receipt(self.job, self.queue_ms, **outcome)

    def check_first(self) -> str:
        """The suggestion of an OUTCOME_UNKNOWN answer: what to check before sending it again."""
        return (
            self.ref.connector.check_first_suggestion(self.ref.action.action)
            + " Resending with the same idempotency_key returns this same answer."
        )
