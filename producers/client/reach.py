"""ReachClient: the publishing and receiving parts on one broker connection, and the calls built
on them (an intent and its receipt in one call; the tools this agent may call)."""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType
from typing import Any

from producers.client.errors import ReachError
from producers.client.publishing import Publishing
from producers.client.receiving import Receiving
from producers.tools import EXPORT_FORMATS, ToolSpec, export
from producers.wire import AGENT_ID_PATTERN, LIST_TOOLS_ACTION, NAME_RULE, ApprovalNotice, Receipt


class ReachClient(Publishing, Receiving):
    """Publishes intents on ``reach.intents`` and collects receipts from ``reach.receipts``.

    The receipt queue is exclusive to this client and bound before the first publish, so no
    receipt for an intent published through this client is missed; it is deleted by the broker
    when the client closes. Receipts that arrive while waiting for another one are buffered and
    returned by later :meth:`wait` or :meth:`receipts` calls.

    Not thread-safe: one connection and channel carry publishes and deliveries, so use one
    client per thread (or guard it with a lock).

    With ``user_id`` (or ``authenticated=True``) every message carries the AMQP ``user_id``
    property; RabbitMQ refuses it unless it equals the connection's login, so the router can
    trust it as the agent's identity (and with ``REACH_REQUIRE_USER_ID=1`` requires it).

    On a cluster, give every node's URL, split by ``;``. When the connection is lost (its node
    stopped), the client connects to the next node that answers, declares a new receipt queue
    and goes on: a publish that was not confirmed is published again there (the fleet runs an
    intent id once, so a copy that did get through changes nothing). Receipts sent while the
    client had no queue (between the loss and the new binding, usually well under a second) are
    lost; ``reconnects`` counts the losses. Resending such an intent with a new intent_id and the
    same ``idempotency_key`` returns its stored outcome (``deduplicated``) without running it again.

    Example::

        with ReachClient("ticket_qa_bot") as reach:
            receipt = reach.call("query_ticket", {"tid": "TK-0001"})

        url = "amqp://ticket_qa_bot:<password>@broker:5672//"
        with ReachClient("ticket_qa_bot", url, authenticated=True) as reach:
            ...
    """

    def __init__(
        self,
        agent_id: str,
        broker_url: str | None = None,
        *,
        reply_to: str | None = None,
        connect_timeout: float = 10.0,
        user_id: str | None = None,
        authenticated: bool = False,
        drop_duplicates: bool = True,
        on_notice: Callable[[ApprovalNotice], None] | None = None,
    ) -> None:
        """Connect, check the exchanges exist and bind this client's receipt queue.

        Args:
            agent_id: The calling agent app (``^[a-z][a-z0-9_]{0,62}$``).
            broker_url: AMQP URL, or a cluster's nodes' URLs split by ``;``; default
                ``$REACH_BROKER_URL``, else ``amqp://guest:guest@localhost:5672//``.
            reply_to: Routing key for this client's receipts (default: ``agent_id``). Give
                each concurrent client of one agent its own, or they share receipts.
            connect_timeout: Seconds to wait for the broker to accept the connection, and for
                it to confirm each publish.
            user_id: Set the AMQP ``user_id`` property to this on every publish. It must be
                the broker login (the broker refuses anything else) and equal ``agent_id``
                (the router refuses anything else).
            authenticated: Shorthand for ``user_id`` = the broker URL's login.
            drop_duplicates: Drop a receipt that repeats one this client already took in (of
                the last ``SEEN_RECEIPTS``): same agent, intent, status, code, trace and finish
                time. The fleet sends one, except when a pool dies right after the broker
                confirmed a receipt and before it recorded that, or loses its broker node while
                the confirm is under way: the same stored receipt is published again. A different receipt for the same intent id (a
                dead letter replayed, an id reused a day later) is kept. Dropped ones are counted
                in ``duplicate_receipts``. False shows every receipt as it arrives (tests of the
                fleet itself).
            on_notice: Called (on the thread that waits) with each :class:`ApprovalNotice`: an
                intent of this client waits for a person. A notice is not a receipt: ``wait``
                goes on waiting for the receipt, which comes once the intent was approved and
                ran, was denied (APPROVAL_DENIED) or expired (APPROVAL_EXPIRED). The newest
                notices are also kept: see :meth:`notice`.

        Raises:
            ValueError: ``agent_id`` or ``reply_to`` is malformed, or ``user_id`` is not
                ``agent_id``.
            ReachError: The broker cannot be reached, the fleet's exchanges do not exist, or
                the broker refused the receipt queue or its binding.
        """
        if not isinstance(agent_id, str) or not AGENT_ID_PATTERN.match(agent_id):
            raise ValueError(f"agent_id must be {NAME_RULE}")
        if reply_to is not None and (not 1 <= len(reply_to) <= 255 or any(c in reply_to for c in "*#")):
            raise ValueError("reply_to must be 1-255 characters without the wildcards * or #")
        if user_id is not None and authenticated:
            raise ValueError("give user_id or authenticated=True, not both")
        self.agent_id = agent_id
        self.reply_to = reply_to
        self._timeout = connect_timeout
        self._closed = False
        self._start_receiving(drop_duplicates, on_notice)
        self._start_publishing()
        self._connect(broker_url, user_id, authenticated)

    def call(self, action: str, params: dict[str, Any] | None = None, *, timeout: float = 30.0, **kw: Any) -> Receipt:
        """Publish an intent and wait for its receipt.

        Args:
            action: As for :meth:`publish`.
            params: As for :meth:`publish`.
            timeout: Seconds to wait for the receipt.
            **kw: The keyword arguments of :meth:`publish`.

        Returns:
            The receipt, whatever its status.

        Raises:
            ApprovalPending: No receipt in time, and the intent waits for a person: wait again
                with ``wait(exc.notice.intent_id, timeout=...)`` rather than resend it.
            ReceiptTimeout: No receipt in time.
            ReachError: The broker did not accept the intent.
        """
        return self.wait(self.publish(action, params, **kw), timeout=timeout)

    def tools(self, fmt: str = "openai", timeout: float = 10.0) -> list[dict[str, Any]]:
        """Ask the router which actions this agent may call, as tool schemas.

        Args:
            fmt: ``"openai"``, ``"anthropic"``, ``"mcp"`` or ``"json"``.
            timeout: Seconds to wait for the router's answer.

        Returns:
            The tools, rendered by :func:`producers.tools.export`.

        Raises:
            ValueError: ``fmt`` is unknown.
            ReachError: The receipt is not ``succeeded`` or does not hold a tool list.
            ReceiptTimeout: No answer in time (is the router running?).
        """
        if fmt not in EXPORT_FORMATS:
            raise ValueError(f"unknown tool format {fmt!r}: expected one of {', '.join(EXPORT_FORMATS)}")
        receipt = self.call(LIST_TOOLS_ACTION, {}, timeout=timeout)
        if receipt.status != "succeeded":
            raise ReachError.from_receipt(receipt)
        data = receipt.data
        if not isinstance(data, dict) or not isinstance(data.get("tools"), list):
            raise ReachError(f"intent {receipt.intent_id}: the tool list receipt has no 'tools' list", receipt)
        try:
            specs = [ToolSpec.from_dict(d) for d in data["tools"]]
        except ValueError as exc:
            raise ReachError(f"intent {receipt.intent_id}: malformed tool list: {exc}", receipt) from exc
        return export(specs, fmt)

    def __enter__(self) -> ReachClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
