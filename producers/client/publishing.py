"""Publishing intents: each one waits for the broker's confirm, is published again after a nack
(with pauses) or on the next node after a lost connection, and fails loudly when unroutable."""

from __future__ import annotations

import logging
import time
import uuid
from datetime import datetime
from typing import Any

from amqp.exceptions import MessageNacked

from producers.client.bodies import intent_body
from producers.client.errors import ReachError
from producers.client.session import INTENTS_EXCHANGE, BrokerSession
from producers.wire import INTENT_ROUTING_KEY, NACK_PAUSES_SECONDS

log = logging.getLogger(__name__)


class Publishing(BrokerSession):
    """The publishing part of :class:`ReachClient`."""

    _returned: list[str]  # what the broker returned unroutable during the current publish

    def _start_publishing(self) -> None:
        self._returned = []

    def publish(
        self,
        action: str,
        params: dict[str, Any] | None = None,
        *,
        intent_id: str | None = None,
        idempotency_key: str | None = None,
        deadline: datetime | str | None = None,
        context: dict[str, Any] | None = None,
        traceparent: str | None = None,
    ) -> str:
        """Publish a native intent and return as soon as the broker has confirmed it.

        Args:
            action: ``create_ticket``, ``connector.create_ticket`` or ``connector__create_ticket``.
            params: The action's inputs (JSON-serialisable, finite numbers).
            intent_id: Default: a new uuid4 hex.
            idempotency_key: Default (on the router): the intent_id.
            deadline: Time after which the action must not start; an aware datetime or
                RFC 3339 text.
            context: ``{"description", "domain"}`` to choose between connectors.
            traceparent: W3C trace context.

        Returns:
            The intent_id; pass it to :meth:`wait`.

        Raises:
            ValueError: The intent is malformed (it would be rejected anyway).
            ReachError: The broker did not accept the intent; it was not delivered.
        """
        intent_id = intent_id if intent_id is not None else uuid.uuid4().hex
        body = intent_body(
            self.agent_id,
            action,
            params,
            intent_id=intent_id,
            idempotency_key=idempotency_key,
            reply_to=self.reply_to,
            deadline=deadline,
            context=context,
            traceparent=traceparent,
        )
        self._publish(body, headers={"agent_id": self.agent_id}, message_id=intent_id)
        return intent_id

    def publish_raw(self, body: bytes, *, headers: dict[str, Any] | None = None, message_id: str | None = None) -> None:
        """Publish a body as it is, e.g. a foreign tool call or a deliberately broken intent.

        Args:
            body: The message body, sent with ``content_type: application/json``.
            headers: AMQP headers; default ``{"agent_id": <this client's agent_id>}``, which is
                how the router learns who sent a foreign-format intent. Pass ``{}`` for none.
            message_id: AMQP ``message_id`` (the router's default intent_id).

        Raises:
            ReachError: The broker did not accept the message.
        """
        self._publish(
            bytes(body),
            headers={"agent_id": self.agent_id} if headers is None else dict(headers),
            message_id=message_id,
        )

    def _publish(self, body: bytes, *, headers: dict[str, Any], message_id: str | None) -> None:
        if self._closed:
            raise ReachError("the client is closed")
        if self._publish_broken:
            raise ReachError(
                "an earlier publish of this client was never confirmed, so confirms can no "
                "longer be matched to messages; create a new ReachClient to publish"
            )
        label = f"intent {message_id}" if message_id else "the message"
        properties: dict[str, Any] = {}
        if message_id is not None:
            properties["message_id"] = message_id
        if self.user_id is not None:
            properties["user_id"] = self.user_id
        nack_pauses = iter(NACK_PAUSES_SECONDS)
        reconnected = False  # once per publish, on another node
        while True:
            self._returned.clear()
            try:
                # confirm mode makes this wait for the broker's ack; a basic.return for an
                # unroutable message always comes before that ack, so _returned is current after it
                self._producer.publish(
                    body,
                    content_type="application/json",
                    content_encoding="utf-8",
                    delivery_mode=2,
                    headers=headers,
                    mandatory=True,
                    timeout=self._timeout,
                    confirm_timeout=self._timeout,
                    **properties,
                )
                break
            except MessageNacked as exc:
                # reach.intents has no length bound: a nack is the broker's passing trouble
                pause = next(nack_pauses, None)
                if pause is None:
                    raise ReachError(
                        f"the broker refused {label} (nack) on {len(NACK_PAUSES_SECONDS) + 1} tries; it was not queued"
                    ) from exc
                log.info("the broker nacked %s; publishing it again in %g s", label, pause)
                time.sleep(pause)
            except TimeoutError as exc:
                if not reconnected and len(self._urls) > 1:
                    reconnected = True
                    self._reconnect(exc)  # another node may confirm it
                    continue
                self._publish_broken = True
                raise ReachError(
                    f"the broker did not confirm {label} within {self._timeout:g} s; it may or may "
                    "not be queued: resend it from a new client with the same intent_id or "
                    "idempotency_key (receipts still arrive at this one)"
                ) from exc
            except tuple(self._conn.connection_errors) as exc:
                if not reconnected:
                    reconnected = True
                    self._reconnect(exc)  # unconfirmed: published again on the new connection
                    continue
                raise ReachError(f"publishing {label} failed: {exc}") from exc
            except self._broker_errors() as exc:
                raise ReachError(f"publishing {label} failed: {exc}") from exc
        if self._returned:
            raise ReachError(
                f"{label} was not routed ({self._returned[0]}): no queue is bound to "
                f"exchange {INTENTS_EXCHANGE.name!r} with key {INTENT_ROUTING_KEY!r}; "
                "is the fleet set up (reach setup, reach router)?"
            )

    def _on_return(self, exc: Exception, exchange: str, routing_key: str, message: Any) -> None:
        self._returned.append(str(exc))
