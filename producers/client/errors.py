"""What the client raises::

ReachError            the broker refused or lost something, or a receipt reports a failure
                      (then ``.receipt`` holds it)
ReceiptTimeout        no receipt arrived in time (a TimeoutError; the intent may still run)
 └─ ApprovalPending   ... because the intent waits for a person (``.notice`` says until when)
"""

from __future__ import annotations

from producers.wire import ApprovalNotice, Receipt


class ReachError(Exception):
    """The broker refused or lost something, or a receipt reports that an intent did not succeed.

    Attributes:
        receipt: The receipt, when the error is about one; otherwise None.
    """

    def __init__(self, message: str, receipt: Receipt | None = None) -> None:
        super().__init__(message)
        self.receipt = receipt

    @classmethod
    def from_receipt(cls, receipt: Receipt) -> ReachError:
        """Build the error for a receipt whose status is not ``succeeded``."""
        error = receipt.error
        if error is None:
            text = f"intent {receipt.intent_id} {receipt.status}"
        else:
            text = f"intent {receipt.intent_id} {receipt.status}: {error.code}: {error.message}"
            if error.suggestion:
                text += f" ({error.suggestion})"
        return cls(text, receipt)


class ReceiptTimeout(TimeoutError):
    """No receipt arrived in time; the intent may still be queued or running."""


class ApprovalPending(ReceiptTimeout):
    """No receipt arrived in time because the intent waits for a person (an ``approval_pending``
    notice came for it). Do not send it again under a new id: that would ask for a second
    approval. Call :meth:`ReachClient.wait` with its ``intent_id`` again (its receipt comes once
    it is decided, or by ``expires_at``), or tell your user it waits.

    Attributes:
        notice: The notice (``intent_id``, ``approval_id``, ``expires_at``, ``summary``).
    """

    def __init__(self, message: str, notice: ApprovalNotice) -> None:
        super().__init__(message)
        self.notice = notice
