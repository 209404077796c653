"""Receiving: this client's receipts, buffered until asked for, a repeat of one dropped, and the
approval notices for its intents kept apart (a notice is never taken for the receipt)."""

from __future__ import annotations

import logging
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from typing import Any

from kombu.message import Message

from producers.client.bodies import read_reply
from producers.client.errors import ApprovalPending, ReachError, ReceiptTimeout
from producers.client.session import BrokerSession
from producers.wire import ApprovalNotice, Receipt

log = logging.getLogger(__name__)

SEEN_RECEIPTS = 100_000  # receipts a client remembers, to drop a repeat of one
KEPT_NOTICES = 10_000  # approval notices a client keeps (the newest), for ``notice()``


class Receiving(BrokerSession):
    """The receiving part of :class:`ReachClient`."""

    on_notice: Callable[[ApprovalNotice], None] | None
    duplicate_receipts: int  # repeated receipts dropped (see drop_duplicates)
    _buffer: deque[Receipt]
    # fingerprints of the receipts already taken in, newest last: a repeat of one of them is
    # dropped (see _on_message)
    _seen: OrderedDict[tuple[Any, ...], None]
    _drop_duplicates: bool
    _notices: OrderedDict[str, ApprovalNotice]

    def _start_receiving(self, drop_duplicates: bool, on_notice: Callable[[ApprovalNotice], None] | None) -> None:
        self._buffer = deque()
        self._seen = OrderedDict()
        self._drop_duplicates = drop_duplicates
        self.duplicate_receipts = 0
        self.on_notice = on_notice
        self._notices = OrderedDict()

    def wait(self, intent_id: str, timeout: float = 30.0) -> Receipt:
        """Return the receipt for ``intent_id``, buffering any others that arrive meanwhile.

        Args:
            intent_id: As returned by :meth:`publish`.
            timeout: Seconds to wait.

        Returns:
            The receipt.

        Raises:
            ApprovalPending: None arrived in time, and an approval notice came for the intent:
                it waits for a person (until ``exc.notice.expires_at`` at most); call ``wait``
                again later rather than resend it.
            ReceiptTimeout: None arrived in time.
            ReachError: The connection to the broker was lost.
        """
        deadline = time.monotonic() + timeout
        while True:
            receipt = self._take(intent_id)
            if receipt is not None:
                return receipt
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                notice = self._notices.get(intent_id)
                if notice is not None:
                    raise ApprovalPending(
                        f"no receipt for intent {intent_id} within {timeout:g} s: it waits for approval "
                        f"{notice.approval_id} until {notice.expires_at}",
                        notice,
                    )
                raise ReceiptTimeout(f"no receipt for intent {intent_id} within {timeout:g} s")
            self._drain(remaining)

    def receipts(self, timeout: float | None = None) -> Iterator[Receipt]:
        """Yield receipts as they arrive, buffered ones first.

        Args:
            timeout: Stop after this many seconds without a receipt; None waits forever.

        Yields:
            Receipts in arrival order.

        Raises:
            ReachError: The connection to the broker was lost.
        """
        while True:
            deadline = None if timeout is None else time.monotonic() + timeout
            while not self._buffer:
                if deadline is None:
                    self._drain(None)
                    continue
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return
                self._drain(remaining)
            yield self._buffer.popleft()

    def notice(self, intent_id: str) -> ApprovalNotice | None:
        """The approval notice that came for ``intent_id``, if one did (the intent waits for a
        person: its receipt comes later)."""
        return self._notices.get(intent_id)

    def _on_message(self, message: Message) -> None:
        try:
            reply = read_reply(message.body, message.content_type, message.properties.get("type"))
        except ValueError as exc:
            log.warning("ignoring a message on %s: %s", self.queue_name, exc)
            return
        if isinstance(reply, ApprovalNotice):
            self._on_notice(reply)
            return
        receipt = reply
        if self._drop_duplicates:
            # the fleet publishes a stored receipt again when a pool died after the broker
            # confirmed it and before recording that it had: the very same receipt
            error = receipt.error
            fingerprint = (
                receipt.agent_id,
                receipt.intent_id,
                receipt.status,
                error.code if error else None,
                receipt.execution.trace_id,
                receipt.execution.finished_at,
            )
            if fingerprint in self._seen:
                self.duplicate_receipts += 1
                log.info("dropping a repeated receipt for intent %s", receipt.intent_id)
                return
            self._seen[fingerprint] = None
            if len(self._seen) > SEEN_RECEIPTS:
                self._seen.popitem(last=False)
        self._buffer.append(receipt)

    def _on_notice(self, notice: ApprovalNotice) -> None:
        """An approval notice: kept and handed to ``on_notice``, never taken for the receipt."""
        self._notices[notice.intent_id] = notice
        if len(self._notices) > KEPT_NOTICES:
            self._notices.popitem(last=False)
        if self.on_notice is not None:
            self.on_notice(notice)

    def _take(self, intent_id: str) -> Receipt | None:
        for i, receipt in enumerate(self._buffer):
            if receipt.intent_id == intent_id:
                del self._buffer[i]
                return receipt
        return None

    def _drain(self, timeout: float | None) -> None:
        if self._closed:
            raise ReachError("the client is closed")
        try:
            self._conn.drain_events(timeout=timeout)
        except TimeoutError:
            return
        except tuple(self._conn.connection_errors) as exc:
            self._reconnect(exc)  # ReachError if no node answers
        except self._broker_errors() as exc:
            raise ReachError(f"lost the broker connection; receipts may be missed: {exc}") from exc
