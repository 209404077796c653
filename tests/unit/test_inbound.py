"""The consumer boundary: AMQP properties and bodies from hostile senders are read within bounds."""

from __future__ import annotations

import hashlib
import struct
from datetime import datetime

import amqp
from amqp.serialization import decode_properties_basic
from hypothesis import given, settings
from hypothesis import strategies as st

from workers.transport.inbound import (
    OVERSIZE,
    SENT_ENCODING,
    UNREADABLE,
    BoundedMessage,
    make_frame_handler,
    read_properties,
)


def shortstr(raw: bytes) -> bytes:
    return bytes([len(raw)]) + raw


def table(entries: bytes) -> bytes:
    return struct.pack(">I", len(entries)) + entries


def nested(depth: int) -> bytes:
    inner = table(b"")
    for _ in range(depth):
        inner = table(shortstr(b"a") + b"F" + inner)
    return inner


def properties(flags: int, *parts: bytes) -> bytes:
    return struct.pack(">H", flags) + b"".join(parts)


def test_headers_nested_a_thousand_deep_are_refused_without_recursion() -> None:
    props = read_properties(properties(0x2000, nested(1000)), 0)
    assert "nest deeper than 8" in props[UNREADABLE]
    assert "application_headers" not in props


def test_a_timestamp_past_year_9999_is_refused() -> None:
    raw = properties(0x2000, table(shortstr(b"t") + b"T" + struct.pack(">Q", 2**63 - 1)))
    assert "past the year 9999" in read_properties(raw, 0)[UNREADABLE]


def test_invalid_utf8_short_string_drops_that_property_and_keeps_the_others() -> None:
    raw = properties(0x0080 | 0x0010, shortstr(b"\xff\xfe"), shortstr(b"desk_bot"))
    props = read_properties(raw, 0)
    assert UNREADABLE in props
    assert "message_id" not in props
    assert props["user_id"] == "desk_bot"


def test_unknown_field_type_and_truncated_tables_are_refused() -> None:
    assert "unknown field type" in read_properties(properties(0x2000, table(shortstr(b"k") + b"Z")), 0)[UNREADABLE]
    truncated = properties(0x2000, struct.pack(">I", 100) + shortstr(b"k") + b"V")
    assert UNREADABLE in read_properties(truncated, 0)


def test_compression_header_is_dropped_so_no_body_is_decompressed() -> None:
    raw = properties(
        0x2000,
        table(
            shortstr(b"compression")
            + b"S"
            + struct.pack(">I", 19)
            + b"application/x-bzip2"
            + shortstr(b"agent_id")
            + b"S"
            + struct.pack(">I", 4)
            + b"desk"
        ),
    )
    props = read_properties(raw, 0)
    assert UNREADABLE not in props
    assert props["application_headers"] == {"agent_id": "desk"}


def test_ordinary_properties_decode_exactly_as_py_amqp_does() -> None:
    message = amqp.Message(
        b"{}",
        content_type="application/json",
        content_encoding="utf-8",
        message_id="m-1",
        user_id="desk",
        reply_to="desk.x",
        correlation_id="c",
        delivery_mode=2,
        priority=3,
        timestamp=1_700_000_000,
        application_headers={
            "task": "reach.execute",
            "id": "x",
            "timelimit": [None, None],
            "n": 5,
            "f": 1.5,
            "ok": True,
            "when": datetime(2026, 1, 2, 3, 4, 5),
            "nested": {"a": {"b": [1, "c"]}},
        },
    )
    raw = message._serialize_properties()
    assert read_properties(raw, 0) == decode_properties_basic(raw, 0)[0]


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=300))
def test_no_byte_string_makes_property_reading_raise(raw: bytes) -> None:
    read_properties(struct.pack(">H", 0x2000) + raw, 0)
    read_properties(raw, 0)


def test_content_encoding_is_kept_aside_so_the_body_stays_the_bytes_sent() -> None:
    message = BoundedMessage()
    header = struct.pack(">HxxQ", 60, 2) + properties(
        0x8000 | 0x4000, shortstr(b"application/json"), shortstr(b"utf-16")
    )
    message.inbound_header(header)
    assert "content_encoding" not in message.properties
    assert message.properties[SENT_ENCODING] == "utf-16"


def test_an_oversize_body_is_hashed_and_never_kept() -> None:
    capped = type("Capped", (BoundedMessage,), {"body_cap": 1000})
    message = capped()
    chunks = [b"x" * 700] * 5
    message.inbound_header(struct.pack(">HxxQ", 60, 3500) + properties(0))
    for chunk in chunks:
        message.inbound_body(chunk)
    assert message.ready
    assert message.body == b""
    assert message.properties[OVERSIZE] == (3500, hashlib.sha256(b"".join(chunks)).hexdigest())


def test_frame_handler_delivers_bounded_messages_and_keeps_small_bodies() -> None:
    delivered: list[tuple[object, ...]] = []

    class Conn:
        bytes_recv = 0

    on_frame = make_frame_handler(body_cap=10)(Conn(), lambda *args: delivered.append(args))
    deliver = struct.pack(">HH", 60, 60)  # basic.deliver
    for body in (b"small", b"far too large a body"):
        on_frame((1, 1, deliver))
        on_frame((2, 1, struct.pack(">HxxQ", 60, len(body)) + properties(0x2000, nested(50))))
        on_frame((3, 1, body))
    first, second = delivered[0][3], delivered[1][3]
    assert first.body == b"small" and UNREADABLE in first.properties
    assert second.body == b"" and second.properties[OVERSIZE][0] == len(b"far too large a body")
