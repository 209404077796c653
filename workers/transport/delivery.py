"""What the roles get from the broker and give back: a ``Delivery`` (the parts of an AMQP message
they read, already bounded by ``inbound``) in, a ``Settle`` out. Nothing above transport handles
a kombu message.

``TRANSIENT_ERRORS`` are the failures after which the same message may well be handled on its
next delivery (the broker or Redis went away, or is failing over); ``Refused`` is the broker refusing one message
(a nack): a full queue, where only reach.dlq has a bound, or a queue failing to take it, as a
quorum queue does while its leader moves (``workers.transport.dispatch`` publishes a job again).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import amqp.exceptions
import kombu.exceptions
import redis
from kombu.message import Message

from workers.transport.inbound import OVERSIZE, UNREADABLE

TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    redis.ConnectionError,
    redis.TimeoutError,
    # a Redis failover under way: a cluster without a master for some slots, a slot being moved,
    # a client still talking to the master that was just made a replica
    redis.exceptions.ClusterDownError,
    redis.exceptions.TryAgainError,
    redis.exceptions.ReadOnlyError,
    amqp.exceptions.RecoverableConnectionError,
    kombu.exceptions.OperationalError,
)
Refused = amqp.exceptions.MessageNacked
Settle = Literal["ack", "requeue"]


@dataclass(frozen=True)
class Delivery:
    """The parts of an AMQP delivery the roles look at."""

    body: bytes
    headers: dict[str, Any] = field(default_factory=dict)
    user_id: str | None = None
    message_id: str | None = None
    content_type: str | None = None
    received_at: float = 0.0
    redelivered: bool = False
    unreadable: str | None = None  # why the AMQP properties could not be read
    oversize: tuple[int, str] | None = None  # a body too large to keep: (bytes, SHA-256 hex)

    @property
    def size(self) -> int:
        return self.oversize[0] if self.oversize else len(self.body)


def delivery_of(message: Message) -> Delivery:
    properties = message.properties
    body = message.body
    return Delivery(
        body=bytes(body) if isinstance(body, (bytes, bytearray, memoryview)) else str(body).encode("utf-8", "replace"),
        headers=dict(message.headers or {}),
        user_id=text_or_none(properties.get("user_id")),
        message_id=text_or_none(properties.get("message_id")),
        content_type=text_or_none(message.content_type),
        received_at=time.time(),
        redelivered=bool((message.delivery_info or {}).get("redelivered")),
        unreadable=properties.get(UNREADABLE),
        oversize=properties.get(OVERSIZE),
    )


def handler_for(handle: Callable[[Delivery], Settle]) -> Callable[[Message], Callable[[], None]]:
    """A consumer handler (``workers.transport.consuming``) that hands ``handle`` a Delivery and
    settles the message as it says."""

    def on_message(message: Message) -> Callable[[], None]:
        return message.ack if handle(delivery_of(message)) == "ack" else message.requeue

    return on_message


def text_or_none(value: Any) -> str | None:
    """``value`` if it is a str (a header or property from outside may be anything)."""
    return value if isinstance(value, str) else None
