"""Bounded decoding of what the broker delivers: the first thing a hostile message meets.

py-amqp decodes a message's properties inside the connection's frame loop, before any of our
code runs, with a recursive table reader that trusts the sender: a header table nested 1,000
deep raises RecursionError, a timestamp of 2**63-1 raises OSError, a short string of invalid
UTF-8 raises UnicodeDecodeError — each out of Celery's consumer loop, which then dies or
reconnects forever while the message stays at the head of the queue. kombu then decompresses
the body if a ``compression`` header asks for it (a bzip2 bomb), and py-amqp decodes it with the
``content_encoding`` the sender chose.

``frame_handler`` replaces py-amqp's own (``amqp.Connection(frame_handler=...)``, passed through
kombu's transport options) with one that differs only in how a message is read:

- the properties are checked with an iterative scan (depth, entry count, value ranges, UTF-8)
  before py-amqp's decoder runs; a message that fails is still delivered, with the properties
  that could be read safely, no headers, and ``UNREADABLE`` set to the reason;
- ``compression`` and ``content_encoding`` are taken out of the properties, so the body reaches
  the handler as the bytes that were sent (kept under ``SENT_ENCODING`` for the record);
- a body larger than ``body_cap`` is not kept: the message arrives with an empty body and
  ``OVERSIZE`` = (size, SHA-256 hex) so the router can answer and dead-letter it by its metadata.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Callable
from struct import error as StructError
from struct import unpack_from
from typing import Any

from amqp import spec
from amqp.basic_message import Message as AmqpMessage
from amqp.exceptions import UnexpectedFrame
from amqp.serialization import decode_properties_basic

# property keys our decoder adds (never AMQP property names, so they cannot be sent)
UNREADABLE = "x-reach-unreadable-properties"
OVERSIZE = "x-reach-oversize-body"
SENT_ENCODING = "x-reach-content-encoding"

MAX_HEADER_DEPTH = 8  # agents send flat headers; Celery's own are 3 deep at most
MAX_HEADER_ENTRIES = 1024  # keys and array items over the whole table
# datetime.fromtimestamp's range on every platform (years 1970..9999)
MAX_TIMESTAMP = 253402300799

_FIXED = {"s": 2, "b": 1, "B": 1, "U": 2, "u": 2, "I": 4, "i": 4, "L": 8, "l": 8, "f": 4, "d": 8, "D": 5, "t": 1}
_LONG = ("S", "x")  # 4-byte length, then that many bytes
_SHORT_STRINGS = (
    (0x8000, "content_type"),
    (0x4000, "content_encoding"),
    (0x2000, None),
    (0x1000, "delivery_mode"),
    (0x0800, "priority"),
    (0x0400, "correlation_id"),
    (0x0200, "reply_to"),
    (0x0100, "expiration"),
    (0x0080, "message_id"),
    (0x0040, "timestamp"),
    (0x0020, "type"),
    (0x0010, "user_id"),
    (0x0008, "app_id"),
    (0x0004, "cluster_id"),
)


class Unreadable(ValueError):
    """Why a property list is not decoded as it stands."""


def check_table(buf: bytes | memoryview, offset: int, end: int) -> None:
    """Walk a field table's bytes without recursion; raise ``Unreadable`` past a bound.

    ``offset`` points at the table's 4-byte length; ``end`` bounds the whole property list.
    """
    (length,) = unpack_from(">I", buf, offset)
    offset += 4
    if offset + length > end:
        raise Unreadable("the header table is longer than its frame")
    # each frame: (kind, position, limit); kind "F" reads key + value, "A" reads values
    stack: list[tuple[str, int]] = [("F", offset + length)]
    entries = 0
    while stack:
        kind, limit = stack[-1]
        if offset >= limit:
            if offset > limit:
                raise Unreadable("a header value runs past its table")
            stack.pop()
            continue
        entries += 1
        if entries > MAX_HEADER_ENTRIES:
            raise Unreadable(f"the headers hold more than {MAX_HEADER_ENTRIES} entries")
        if kind == "F":
            keylen = buf[offset]
            key = bytes(buf[offset + 1 : offset + 1 + keylen])
            try:
                key.decode("utf-8")
            except UnicodeDecodeError:
                raise Unreadable("a header name is not UTF-8") from None
            offset += 1 + keylen
        if offset >= limit:
            raise Unreadable("a header has a name but no value")
        ftype = chr(buf[offset])
        offset += 1
        if ftype in _FIXED:
            offset += _FIXED[ftype]
        elif ftype in _LONG:
            (size,) = unpack_from(">I", buf, offset)
            offset += 4 + size
        elif ftype == "T":
            (stamp,) = unpack_from(">Q", buf, offset)
            if stamp > MAX_TIMESTAMP:
                raise Unreadable(f"a timestamp header holds {stamp}, past the year 9999")
            offset += 8
        elif ftype == "V":
            pass
        elif ftype in ("F", "A"):
            if len(stack) >= MAX_HEADER_DEPTH:
                raise Unreadable(f"the headers nest deeper than {MAX_HEADER_DEPTH} levels")
            (size,) = unpack_from(">I", buf, offset)
            offset += 4
            if offset + size > limit:
                raise Unreadable("a nested header value runs past its table")
            stack.append((ftype, offset + size))
        else:
            raise Unreadable(f"a header has the unknown field type {ftype!r}")
        if offset > limit:
            raise Unreadable("a header value runs past its table")


def salvage_properties(buf: bytes | memoryview, offset: int, reason: str) -> dict[str, Any]:
    """The properties that can be read safely from a list that failed the check: every short
    string that is UTF-8, the fixed-size ones, no headers. Stops at the first thing it cannot read."""
    props: dict[str, Any] = {UNREADABLE: reason}
    try:
        (flags,) = unpack_from(">H", buf, offset)
        offset += 2
        for bit, name in _SHORT_STRINGS:
            if not flags & bit:
                continue
            if name is None:  # the header table: skipped by its length
                (length,) = unpack_from(">I", buf, offset)
                offset += 4 + length
            elif name in ("delivery_mode", "priority"):
                props[name] = buf[offset]
                offset += 1
            elif name == "timestamp":
                (props[name],) = unpack_from(">Q", buf, offset)
                offset += 8
            else:
                size = buf[offset]
                raw = bytes(buf[offset + 1 : offset + 1 + size])
                offset += 1 + size
                try:
                    props[name] = raw.decode("utf-8")
                except UnicodeDecodeError:
                    pass
    except (IndexError, StructError):
        pass
    return props


def read_properties(buf: bytes | memoryview, offset: int) -> dict[str, Any]:
    """Basic-class properties, checked first; never raises."""
    end = len(buf)
    try:
        (flags,) = unpack_from(">H", buf, offset)
        if flags & 0x2000:
            position = offset + 2
            for bit in (0x8000, 0x4000):  # content_type, content_encoding come before the table
                if flags & bit:
                    position += 1 + buf[position]
            check_table(buf, position, end)
        props, _ = decode_properties_basic(buf, offset)
    except Unreadable as exc:
        return salvage_properties(buf, offset, str(exc))
    except (IndexError, StructError, UnicodeDecodeError, ValueError, OverflowError, OSError, RecursionError) as exc:
        return salvage_properties(buf, offset, f"{type(exc).__name__}: {exc}"[:300])
    headers = props.get("application_headers")
    if isinstance(headers, dict) and "compression" in headers:
        headers = dict(headers)
        headers.pop("compression")  # kombu would decompress the body with it: a bomb
        props["application_headers"] = headers
    return props


class BoundedMessage(AmqpMessage):
    """py-amqp's message with checked properties and a capped body (see the module docstring)."""

    body_cap: int = 1 << 62

    def _load_properties(self, class_id: int, buf: Any, offset: int) -> int:
        props = read_properties(buf, offset) if class_id == spec.Basic.CLASS_ID else {}
        encoding = props.pop("content_encoding", None)
        if encoding is not None:
            props[SENT_ENCODING] = encoding
        self.properties = props
        return offset

    def inbound_header(self, buf: Any, offset: int = 0) -> int:
        offset = super().inbound_header(buf, offset)
        if self.body_size > self.body_cap:
            self._digest: Any = hashlib.sha256()
        return offset

    def inbound_body(self, buf: Any) -> None:
        if self.body_size <= self.body_cap:
            super().inbound_body(buf)
            return
        self._digest.update(buf)
        self.body_received += len(buf)
        if self.body_received >= self.body_size:
            self.properties[OVERSIZE] = (self.body_received, self._digest.hexdigest())
            self.body = b""
            self.ready = True


def make_frame_handler(body_cap: int) -> Callable[..., Callable[[tuple[int, int, Any]], bool]]:
    """A ``frame_handler`` for ``amqp.Connection`` whose messages are ``BoundedMessage``s with
    bodies of at most ``body_cap`` bytes kept."""

    message_class = type("CappedMessage", (BoundedMessage,), {"body_cap": body_cap})

    def frame_handler(
        connection: Any,
        callback: Callable[..., Any],
        unpack_from: Any = unpack_from,
        content_methods: frozenset[Any] = frozenset([spec.Basic.Return, spec.Basic.Deliver, spec.Basic.GetOk]),
    ) -> Callable[..., bool]:
        # py-amqp's method_framing.frame_handler, with the message class swapped
        expected_types: defaultdict[int, int] = defaultdict(lambda: 1)
        partial_messages: dict[int, BoundedMessage] = {}

        def on_frame(frame: tuple[int, int, Any]) -> bool:
            frame_type, channel, buf = frame
            connection.bytes_recv += 1
            if frame_type not in (expected_types[channel], 8):
                raise UnexpectedFrame(f"Received frame {frame_type} while expecting type: {expected_types[channel]}")
            if frame_type == 1:
                method_sig = unpack_from(">HH", buf, 0)
                if method_sig in content_methods:
                    partial_messages[channel] = message_class(frame_method=method_sig, frame_args=buf)
                    expected_types[channel] = 2
                    return False
                callback(channel, method_sig, buf, None)
            elif frame_type == 2:
                msg = partial_messages[channel]
                msg.inbound_header(buf)
                if not msg.ready:
                    expected_types[channel] = 3
                    return False
                expected_types[channel] = 1
                partial_messages.pop(channel, None)
                callback(channel, msg.frame_method, msg.frame_args, msg)
            elif frame_type == 3:
                msg = partial_messages[channel]
                msg.inbound_body(buf)
                if not msg.ready:
                    return False
                expected_types[channel] = 1
                partial_messages.pop(channel, None)
                callback(channel, msg.frame_method, msg.frame_args, msg)
            elif frame_type == 8:
                return False
            return True

        return on_frame

    return frame_handler
