"""Waiting on another delivery of the same request, before this one acts on its ledger claim.

A claim held by a live worker is waited for (bounded); one held by a dead worker is taken over
when repeating the call is safe or the call never reached the system; a record completed by this
very intent's first delivery is given time to have its receipt marked sent.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from producers.wire import Receipt
from workers.pool.job_context import JobContext
from workers.state.ledger import Begin, Claim, Ledger
from workers.transport.receipts import ReceiptSink

SENT_POLL_SECONDS = 0.1
HOLDER_POLL_SECONDS = 0.25


def settle_claim(
    ledger: Ledger, ctx: JobContext, begin: Begin, wait_for_holder: float, sleep: Callable[[float], None]
) -> Claim:
    """The claim this delivery acts on, after waiting for a live holder and taking over a
    dead one's record where repeating the call is safe."""
    claim = Claim(begin.state, begin.receipt_json, begin.holder_intent)  # type: ignore[arg-type]
    was_sending = begin.was_sending
    if claim.state == "in_progress" and claim.holder_intent == ctx.intent_id:
        # this very intent is held: by a live worker still running it (a broker redelivery after
        # a connection loss), or by one that just died and whose heartbeat has not expired yet.
        # Wait until it finishes or is seen dead, instead of dropping the only delivery left.
        give_up = time.monotonic() + wait_for_holder
        while claim.state == "in_progress" and time.monotonic() < give_up:
            sleep(HOLDER_POLL_SECONDS)
            claim = _claim(ledger, ctx)
        was_sending = ledger.was_sending(ctx.key) if claim.state == "orphaned" else was_sending
    if claim.state == "orphaned" and (ctx.safe or not was_sending):
        # the dead worker's call is safe to repeat, or it never reached the system
        if ledger.take_over(ctx.key, ctx.intent_id, ctx.attempt):
            return Claim("claimed")
        claim = _claim(ledger, ctx)
    if claim.state == "in_progress" and claim.holder_intent != ctx.intent_id:
        wait = wait_for_holder
        if ctx.deadline is not None:
            wait = max(0.0, min(wait, ctx.deadline - time.time()))
        settled = ledger.wait_completed(ctx.key, wait)
        if settled is not None and settled.state == "completed":
            return settled
        if settled is not None:  # released by its holder: ours to try
            return _claim(ledger, ctx)
    return claim


def sent_by_first_delivery(
    sink: ReceiptSink, ctx: JobContext, stored_json: str, wait_for_sent: float, sleep: Callable[[float], None]
) -> bool:
    """The record was completed by this very intent: its job came twice (the router got the
    intent again after a broker connection loss), and the first delivery may still be publishing
    the receipt. Wait (bounded) for it to be marked sent, so that the intent gets that one
    receipt and not a second, deduplicated one. A replayed dead letter of an executed intent
    waits this long before its deduplicated receipt."""
    stored = Receipt.model_validate_json(stored_json)
    if stored.intent_id != ctx.intent_id or stored.agent_id != ctx.agent_id:
        return False
    for _ in range(max(1, int(wait_for_sent / SENT_POLL_SECONDS))):
        if sink.already_sent(ctx.agent_id, ctx.intent_id):
            return True
        sleep(SENT_POLL_SECONDS)
    return sink.already_sent(ctx.agent_id, ctx.intent_id)


def _claim(ledger: Ledger, ctx: JobContext) -> Claim:
    return ledger.claim(ctx.key, ctx.params_hash, ctx.intent_id, ctx.attempt)
