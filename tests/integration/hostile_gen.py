"""Hostile AMQP messages for the fleet: hand-built property frames, bodies that attack the parser,
and the plain AMQP tools the hostile-input tests watch the fleet with.

py-amqp and pika refuse to *encode* most of what is here (a header table nested 1,000 deep, a
timestamp past year 9999, a short string that is not UTF-8), but RabbitMQ stores and delivers it,
and the router's AMQP client must then *decode* it. ``RawFrameMessage`` sends property bytes
exactly as given: property flags and property list of the AMQP 0-9-1 ``basic`` class, where a
field table is a 4-byte length and entries ``shortstr key, type octet, value``.

Generators are deterministic for a seed (``random.Random(seed)``), so a failing message can be
regenerated from its label and index. Nothing here imports the fleet's own code: the tests look
at the fleet only from outside (AMQP, Redis, /proc, /metrics).
"""

from __future__ import annotations

import bz2
import functools
import gzip
import hashlib
import json
import random
import socket
import struct
import subprocess
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit

import amqp
import amqp.exceptions

# ---------------------------------------------------------------------------------------- encoding

# every field-value type letter py-amqp's table decoder (amqp.serialization._read_item) knows
TYPE_LETTERS = "SsxbBUuIiLlfdDFAtTV"
# RabbitMQ 3.10 itself refuses (closes the connection on) tables holding 'U' or a NaN/Inf float, and
# delivery_mode 0 or 255: only a few messages (BROKER_REFUSED_SHARE) may carry those, so most reach the router
BROKER_REFUSED = "U"
BROKER_REFUSED_SHARE = 0.05
INVALID_UTF8 = (b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xc0\xaf", b"\xe2\x82")


def shortstr(value: bytes | str) -> bytes:
    """AMQP short string: one length octet, then at most 255 bytes (cut to fit, never refused)."""
    raw = value.encode("utf-8", "surrogatepass") if isinstance(value, str) else bytes(value)
    raw = raw[:255]
    return bytes([len(raw)]) + raw


def longstr(value: bytes | str) -> bytes:
    raw = value.encode("utf-8", "surrogatepass") if isinstance(value, str) else bytes(value)
    return struct.pack(">I", len(raw)) + raw


def table(entries: list[tuple[bytes | str, bytes]]) -> bytes:
    """A field table from ``(key, encoded field value with its type octet)`` pairs."""
    content = b"".join(shortstr(key) + value for key, value in entries)
    return struct.pack(">I", len(content)) + content


def array(values: list[bytes]) -> bytes:
    content = b"".join(values)
    return struct.pack(">I", len(content)) + content


def fv(letter: str, value: Any = None) -> bytes:
    """One encoded field value (type octet + value) as py-amqp's decoder reads that letter.

    ``F`` and ``A`` take their already encoded content (``table(...)`` / ``array(...)``).
    """
    t = letter.encode()
    if letter in "Sx":
        return t + longstr(value)
    if letter in "sU":
        return t + struct.pack(">h", value)
    if letter == "u":
        return t + struct.pack(">H", value)
    if letter == "b":
        return t + struct.pack(">b", value)
    if letter == "B":
        return t + struct.pack(">B", value)
    if letter == "I":
        return t + struct.pack(">i", value)
    if letter == "i":
        return t + struct.pack(">I", value)
    if letter in "Ll":
        return t + struct.pack(">q", value)
    if letter == "f":
        return t + (value if isinstance(value, bytes) else struct.pack(">f", value))
    if letter == "d":
        return t + (value if isinstance(value, bytes) else struct.pack(">d", value))
    if letter == "D":
        scale, unscaled = value
        return t + struct.pack(">Bi", scale, unscaled)
    if letter in "FA":
        return t + value
    if letter == "t":
        return t + struct.pack(">B", value)
    if letter == "T":
        return t + struct.pack(">Q", value)
    if letter == "V":
        return t
    raise ValueError(f"no AMQP field type {letter!r}")


def nested_table(depth: int, key: bytes = b"h", leaf: bytes | None = None) -> bytes:
    """A header table nested ``depth`` tables deep (about 7 bytes a level), built without recursion."""
    inner = b"" if leaf is None else shortstr(b"leaf") + leaf
    for _ in range(depth - 1):
        inner = shortstr(key) + b"F" + struct.pack(">I", len(inner)) + inner
    return struct.pack(">I", len(inner)) + inner


def nested_array(depth: int) -> bytes:
    inner = fv("t", 1)
    for _ in range(depth - 1):
        inner = b"A" + struct.pack(">I", len(inner)) + inner
    return struct.pack(">I", len(inner)) + inner


# the basic class's properties in flag order (bit 15 first), with their AMQP domain
BASIC_PROPERTIES: tuple[tuple[str, str], ...] = (
    ("content_type", "shortstr"),
    ("content_encoding", "shortstr"),
    ("headers", "table"),
    ("delivery_mode", "octet"),
    ("priority", "octet"),
    ("correlation_id", "shortstr"),
    ("reply_to", "shortstr"),
    ("expiration", "shortstr"),
    ("message_id", "shortstr"),
    ("timestamp", "longlong"),
    ("type", "shortstr"),
    ("user_id", "shortstr"),
    ("app_id", "shortstr"),
    ("cluster_id", "shortstr"),
)
_NAMES = {name for name, _ in BASIC_PROPERTIES}


def properties(**props: Any) -> bytes:
    """Property flags + property list, values written as given.

    Short strings are ``bytes`` (sent as they are, even if not UTF-8) or ``str``; ``headers`` is an
    encoded table (``table(...)``, ``nested_table(...)``) or a dict of already encoded field values.
    """
    unknown = set(props) - _NAMES
    if unknown:
        raise TypeError(f"not basic properties: {sorted(unknown)}")
    flags, parts = 0, []
    for bit, (name, domain) in zip(range(15, 1, -1), BASIC_PROPERTIES):
        value = props.get(name)
        if value is None:
            continue
        flags |= 1 << bit
        if domain == "shortstr":
            parts.append(shortstr(value))
        elif domain == "octet":
            parts.append(struct.pack(">B", value))
        elif domain == "longlong":
            parts.append(struct.pack(">Q", value))
        else:
            parts.append(table(list(value.items())) if isinstance(value, dict) else bytes(value))
    return struct.pack(">H", flags) + b"".join(parts)


class RawFrameMessage(amqp.Message):
    """A py-amqp message whose content-header properties are the given bytes, unchecked."""

    def __init__(self, body: bytes, raw_properties: bytes) -> None:
        super().__init__(body)
        self.raw_properties = raw_properties

    def _serialize_properties(self) -> bytes:
        return self.raw_properties


# ------------------------------------------------------------------------------------ AMQP tools


def connection_params(broker_url: str) -> dict[str, Any]:
    parts = urlsplit(broker_url)
    return {
        "host": f"{parts.hostname or '127.0.0.1'}:{parts.port or 5672}",
        "userid": unquote(parts.username or "guest"),
        "password": unquote(parts.password or "guest"),
        "virtual_host": unquote(parts.path[1:]) or "/",
        "connect_timeout": 10,
    }


def vhost(broker_url: str) -> str:
    return unquote(urlsplit(broker_url).path[1:]) or "/"


BROKER_ERRORS: tuple[type[BaseException], ...] = (amqp.exceptions.AMQPError, OSError, struct.error, ValueError)


class RawSender:
    """Publishes hand-built frames to ``reach.intents`` with publisher confirms.

    The broker may refuse a frame it cannot parse itself (it closes the connection): ``send``
    then reconnects and returns False, so a generator run can count what the broker let through.
    """

    def __init__(self, broker_url: str, exchange: str = "reach.intents", routing_key: str = "intent") -> None:
        self.params = connection_params(broker_url)
        self.exchange, self.routing_key = exchange, routing_key
        self.refused: list[str] = []
        self.conn: amqp.Connection | None = None
        self._connect()

    def _connect(self) -> None:
        self.conn = amqp.Connection(**self.params)
        self.conn.connect()
        self.channel = self.conn.channel()
        self.channel.confirm_select()

    def send(self, raw_properties: bytes, body: bytes, label: str = "") -> bool:
        try:
            self.channel.basic_publish_confirm(
                RawFrameMessage(body, raw_properties), self.exchange, self.routing_key, confirm_timeout=30
            )
            return True
        except BROKER_ERRORS as exc:
            self.refused.append(f"{label}: {type(exc).__name__}: {exc}"[:300])
            self.close()
            self._connect()
            return False

    def close(self) -> None:
        if self.conn is not None:
            try:
                self.conn.close()
            except BROKER_ERRORS:
                try:
                    self.conn.collect()
                except Exception:  # the socket is gone already: nothing left to release
                    pass
            self.conn = None

    def __enter__(self) -> RawSender:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


@dataclass
class TapReceipt:
    routing_key: str
    properties: dict[str, Any]
    body: bytes
    at: float

    @functools.cached_property
    def doc(self) -> dict[str, Any]:
        try:
            value = json.loads(self.body)
        except ValueError:
            return {}
        return value if isinstance(value, dict) else {}

    @property
    def intent_id(self) -> str | None:
        return self.properties.get("correlation_id") or self.doc.get("intent_id")

    @property
    def error(self) -> dict[str, Any]:
        return self.doc.get("error") or {}


class ReceiptTap:
    """Every receipt published on ``reach.receipts`` (bound with ``#``), raw: routing key, bytes."""

    def __init__(self, broker_url: str, binding: str = "#") -> None:
        self.conn = amqp.Connection(**connection_params(broker_url))
        self.conn.connect()
        self.channel = self.conn.channel()
        self.channel.auto_decode = False
        queue = self.channel.queue_declare("", exclusive=True, auto_delete=True).queue
        self.channel.queue_bind(queue, "reach.receipts", binding)
        self.channel.basic_consume(queue, callback=self._on_message, no_ack=True)
        self.seen: list[TapReceipt] = []

    def _on_message(self, message: amqp.Message) -> None:
        body = message.body if isinstance(message.body, bytes) else str(message.body).encode()
        self.seen.append(
            TapReceipt(message.delivery_info.get("routing_key", ""), dict(message.properties), body, time.time())
        )

    def drain(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            try:
                self.conn.drain_events(timeout=min(left, 0.5))
            except TimeoutError:
                pass

    def for_intent(self, intent_id: str) -> list[TapReceipt]:
        return [r for r in self.seen if r.intent_id == intent_id]

    def wait_for(self, intent_id: str, timeout: float) -> list[TapReceipt]:
        deadline = time.monotonic() + timeout
        while not self.for_intent(intent_id) and time.monotonic() < deadline:
            self.drain(min(0.2, max(0.0, deadline - time.monotonic())))
        return self.for_intent(intent_id)

    def close(self) -> None:
        try:
            self.conn.close()
        except BROKER_ERRORS:
            pass


@dataclass
class DeadLetter:
    body: bytes
    properties: dict[str, Any]

    @property
    def headers(self) -> dict[str, Any]:
        return dict(self.properties.get("application_headers") or {})

    def header_text(self, name: str) -> str:
        value = self.headers.get(name)
        if isinstance(value, bytes):
            return value.decode("utf-8", "replace")
        return "" if value is None else str(value)

    def all_bytes(self) -> bytes:
        """Body, every property and every header, as bytes (for 'is this secret anywhere?')."""
        return (
            self.body
            + repr(self.properties).encode("utf-8", "backslashreplace")
            + b"".join(
                v if isinstance(v, bytes) else str(v).encode("utf-8", "surrogatepass") for v in _walk(self.properties)
            )
        )


def _walk(value: Any) -> Iterator[Any]:
    if isinstance(value, dict):
        for k, v in value.items():
            yield k
            yield from _walk(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _walk(v)
    else:
        yield value


def peek_queue(broker_url: str, queue: str, limit: int = 200) -> list[DeadLetter]:
    """The messages at the head of ``queue``, left in it (fetched unacked, then the channel closes)."""
    conn = amqp.Connection(**connection_params(broker_url))
    conn.connect()
    try:
        channel = conn.channel()
        channel.auto_decode = False
        out = []
        for _ in range(limit):
            try:
                message = channel.basic_get(queue, no_ack=False)
            except Exception as exc:  # what an operator's `reach dlq list` would choke on too
                raise AssertionError(
                    f"{queue} holds a message AMQP clients cannot decode: {type(exc).__name__}: {str(exc)[:200]}"
                ) from exc
            if message is None:
                break
            body = message.body if isinstance(message.body, bytes) else str(message.body).encode()
            out.append(DeadLetter(body, dict(message.properties)))
        return out
    finally:
        try:
            conn.close()
        except BROKER_ERRORS:
            pass


def rabbit_queues(vhost_name: str) -> dict[str, dict[str, Any]]:
    """``rabbitmqctl list_queues`` for a vhost: per queue name, ready/unacked/bytes and arguments."""
    out = subprocess.run(
        [
            "rabbitmqctl",
            "list_queues",
            "-q",
            "-p",
            vhost_name,
            "name",
            "messages_ready",
            "messages_unacknowledged",
            "message_bytes",
            "arguments",
            "--formatter",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return {row["name"]: row for row in json.loads(out.stdout or "[]")}


# ------------------------------------------------------------------------------------ /proc, /metrics


def rss_bytes(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def cpu_seconds(pid: int) -> float:
    """User + system CPU of the process (all its threads) so far."""
    import os

    stat = open(f"/proc/{pid}/stat").read()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def metric_sum(port: int, sample: str) -> float:
    """Sum of every series of ``sample`` served on http://127.0.0.1:port/metrics."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return sum(s.value for family in text_string_to_metric_families(text) for s in family.samples if s.name == sample)


class PeakRss:
    """The largest resident set size of a process while the ``with`` block runs (sampled every 20 ms)."""

    def __init__(self, pid: int) -> None:
        import threading

        self.pid, self.peak = pid, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"rss-{pid}")

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.peak = max(self.peak, rss_bytes(self.pid))
            except OSError:  # the process is gone; the test says so itself
                return
            self._stop.wait(0.02)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(5)


def wait_until(check: Callable[[], Any], timeout: float, every: float = 0.1) -> Any:
    """The first truthy value of ``check()`` within ``timeout`` seconds, else its last value."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(every)


# ---------------------------------------------------------------------------------------- bodies


def intent(agent: str | None, action: str, params: Any, **fields: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {"action": action, "params": params, **fields}
    if agent is not None:
        doc["agent_id"] = agent
    return doc


def dumps(doc: Any) -> bytes:
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode()


def nested_json(depth: int, leaf: str = "1", key: str = "a") -> str:
    """``{"a":{"a":...leaf...}}`` ``depth`` objects deep, as text (json.dumps would recurse)."""
    return f'{{"{key}":' * depth + leaf + "}" * depth


def unknown_params(count: int, value: str = "0") -> str:
    """A params object of ``count`` distinct short keys nobody declared, as JSON text."""
    alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
    keys = []
    for i in range(count):
        k, n = "", i
        while True:
            k, n = alphabet[n % len(alphabet)] + k, n // len(alphabet)
            if n == 0:
                break
        keys.append(f'"z{k}":{value}')
    return "{" + ",".join(keys) + "}"


def bz2_bomb(size: int = 256 << 20) -> bytes:
    """``size`` zero bytes bzip2-compressed (256 MiB -> about 200 bytes)."""
    return _bomb("bz2", size)


@functools.lru_cache(maxsize=8)
def _bomb(kind: str, size: int) -> bytes:
    chunk = bytes(1 << 20)
    if kind == "bz2":
        c: Any = bz2.BZ2Compressor(9)
    elif kind == "zlib":
        c = zlib.compressobj(9)
    else:
        c = zlib.compressobj(9, zlib.DEFLATED, 31)  # gzip container
    out = [c.compress(chunk[: min(len(chunk), size - done)]) for done in range(0, size, len(chunk))]
    out.append(c.flush())
    return b"".join(out)


# ----------------------------------------------------------------------------------- generators


@dataclass
class Hostile:
    label: str
    props: bytes
    body: bytes
    tags: set[str] = field(default_factory=set)


@dataclass(frozen=True)
class Limits:
    """How far the generator goes; the default fits a ~1 minute run, ``soak()`` goes further."""

    max_depth: int = 2000
    max_body: int = 2 << 20  # beyond the fleet's 256 KiB limit, but cheap to send
    max_unknown: int = 30_000  # unknown params in one body (fits in 256 KiB)
    bomb_size: int = 16 << 20  # decompressed size of compression bombs
    max_header_bytes: int = 60_000  # the content header frame must fit the broker's frame_max

    @classmethod
    def soak(cls) -> Limits:
        return cls(max_body=20 << 20, bomb_size=256 << 20)


class Generator:
    """Deterministic hostile messages (``random.Random(seed)``) from one agent identity.

    ``agent`` is the agent named in bodies and ``agent_id`` headers, ``action`` a real action with
    a free-form ``object`` param ``extra`` and a sensitive one, so bodies reach the checks behind parsing.
    """

    def __init__(self, seed: int, agent: str, action: str, limits: Limits = Limits()) -> None:
        self.rng = random.Random(seed)
        self.agent, self.action, self.limits = agent, action, limits
        self.count = 0
        self.refusable = False  # whether the message being built may hold what the broker refuses

    # -- field values --------------------------------------------------------------------------

    def key(self) -> bytes:
        r = self.rng.random()
        if r < 0.15:
            return self.rng.choice(INVALID_UTF8) + b"k"
        if r < 0.2:
            return b""
        if r < 0.25:
            return b"k" * 255
        if r < 0.3:
            return b"agent_id"
        return f"k{self.rng.randrange(1000)}".encode()

    def text(self, limit: int = 4096) -> bytes:
        r = self.rng.random()
        if r < 0.25:
            return self.rng.choice(INVALID_UTF8) * self.rng.randint(1, 8)
        if r < 0.35:
            return "\ud800".encode("utf-8", "surrogatepass")
        if r < 0.45:
            return b"\x00\r\n\x1b[2J"
        if r < 0.5:
            return b"x" * self.rng.randint(0, limit)
        return self.rng.choice([b"", b"application/json", "é".encode() * 50, b"compression"])

    def value(self, letter: str, depth_left: int) -> bytes:
        rng = self.rng
        if letter == "S":
            return fv("S", self.text())
        if letter == "x":
            return fv("x", rng.randbytes(rng.choice([0, 1, 64, 4096])))
        if letter in "sU":
            return fv(letter, rng.choice([-(1 << 15), -1, 0, (1 << 15) - 1]))
        if letter == "u":
            return fv("u", rng.choice([0, (1 << 16) - 1]))
        if letter == "b":
            return fv("b", rng.choice([-128, 0, 127]))
        if letter == "B":
            return fv("B", rng.choice([0, 255]))
        if letter == "I":
            return fv("I", rng.choice([-(1 << 31), 0, (1 << 31) - 1]))
        if letter == "i":
            return fv("i", rng.choice([0, (1 << 32) - 1]))
        if letter in "Ll":
            return fv(letter, rng.choice([-(1 << 63), -1, 0, (1 << 63) - 1]))
        if letter == "f":  # NaN/Inf rarely: RabbitMQ refuses them (the whole message never reaches the router)
            special = [b"\x7f\xc0\x00\x00", b"\x7f\x80\x00\x00", b"\xff\x80\x00\x00"]
            return fv(
                "f", rng.choice(special) if self.refusable and rng.random() < 0.3 else rng.choice([3.4e38, 0.0, 1e-45])
            )
        if letter == "d":
            special = [b"\x7f\xf8\x00\x00\x00\x00\x00\x01", b"\x7f\xf0" + bytes(6), b"\xff\xf0" + bytes(6)]
            return fv(
                "d",
                rng.choice(special) if self.refusable and rng.random() < 0.3 else rng.choice([1.7e308, 5e-324, -0.0]),
            )
        if letter == "D":
            return fv("D", (rng.choice([0, 2, 127, 255]), rng.choice([-(1 << 31), 0, (1 << 31) - 1])))
        if letter == "t":
            return fv("t", rng.choice([0, 1, 2, 255]))
        if letter == "T":
            return fv("T", rng.choice([0, 253402300800, (1 << 63) - 1, (1 << 64) - 1, 1 << 40]))
        if letter == "V":
            return fv("V")
        if letter == "F":
            return fv("F", self.table(depth_left - 1))
        if letter == "A":
            items = [self.value(self.letter(nested=False), 0) for _ in range(rng.randint(0, 6))]
            return fv("A", array(items))
        raise ValueError(letter)

    def letter(self, nested: bool = True) -> str:
        """A random type letter; the ones the broker refuses only rarely."""
        if self.refusable and self.rng.random() < 0.1:
            return BROKER_REFUSED
        letters = TYPE_LETTERS.replace(BROKER_REFUSED, "")
        return self.rng.choice(letters if nested else letters.replace("F", "").replace("A", ""))

    def table(self, depth_left: int = 2) -> bytes:
        entries = [
            (self.key(), self.value(self.letter(depth_left > 0), depth_left)) for _ in range(self.rng.randint(0, 8))
        ]
        return table(entries)

    def headers(self) -> tuple[bytes, set[str]]:
        """A headers table: deep, wide, every type letter, extreme values, bad keys; and its tags."""
        rng = self.rng
        shape = rng.choice(["deep", "deep_array", "wide", "letters", "letters", "agent"])
        agent_entry = (b"agent_id", fv("S", self.agent))
        if shape == "deep":
            depth = rng.randint(1, self.limits.max_depth)
            return nested_table(depth, leaf=self.value(rng.choice("TtSV"), 0)), {f"headers_deep_{depth}"}
        if shape == "deep_array":
            depth = rng.randint(1, self.limits.max_depth)
            return table([agent_entry, (b"deep", fv("A", nested_array(depth)))]), {f"headers_array_deep_{depth}"}
        if shape == "wide":
            n = rng.randint(100, 2000)
            entries = [(f"w{i}".encode(), self.value(self.letter(nested=False), 0)) for i in range(n)]
            encoded = table([agent_entry, *entries])
            while len(encoded) > self.limits.max_header_bytes:
                entries = entries[: len(entries) // 2]
                encoded = table([agent_entry, *entries])
            return encoded, {f"headers_wide_{len(entries)}"}
        if shape == "agent":
            bad = rng.choice(
                [
                    fv("S", rng.choice(INVALID_UTF8)),
                    fv("x", self.agent.encode()),
                    fv("T", (1 << 63) - 1),
                    fv("F", nested_table(50)),
                    fv("S", "A" * 5000),
                    fv("V"),
                ]
            )
            return table([(b"agent_id", bad), (b"traceparent", fv("S", self.text()))]), {"headers_bad_agent"}
        # every letter once (the broker-refused one only sometimes), in a random order
        letters = [c for c in TYPE_LETTERS if c != BROKER_REFUSED or self.refusable]
        rng.shuffle(letters)
        entries = [agent_entry] + [(self.key(), self.value(letter, 2)) for letter in letters]
        return table(entries), {"headers_all_letters"}

    # -- properties ------------------------------------------------------------------------------

    def props(self, body_kind: str) -> tuple[bytes, set[str]]:
        rng = self.rng
        props: dict[str, Any] = {}
        tags: set[str] = set()
        if rng.random() < 0.8:
            props["headers"], tags = self.headers()
        for name in (
            "content_type",
            "content_encoding",
            "correlation_id",
            "reply_to",
            "message_id",
            "type",
            "app_id",
            "cluster_id",
        ):
            if rng.random() < 0.15:
                props[name] = self.text(255)
                tags.add(f"bad_{name}")
        if "content_type" not in props:
            props["content_type"] = rng.choice(
                [b"application/json"] * 6
                + [b"application/x-python-serialize", b"application/x-yaml", b"application/data", b"text/plain"]
            )
        if rng.random() < 0.1:
            props["content_encoding"] = rng.choice([b"utf-16", b"binary", b"rot13", b"zlib", b"\xff"])
            tags.add("odd_content_encoding")
        if rng.random() < 0.2:
            props["timestamp"] = rng.choice([0, (1 << 63) - 1, (1 << 64) - 1])
            tags.add("extreme_timestamp")
        if rng.random() < 0.1:
            props["priority"] = 255
        if rng.random() < 0.05:
            props["user_id"] = b"guest"  # the only user_id the broker lets the test login send
        if rng.random() < 0.05:
            props["expiration"] = rng.choice([b"60000", b"0"])
        props["delivery_mode"] = (
            rng.choice([0, 255]) if self.refusable and rng.random() < 0.3 else rng.choice([1, 2, 2])
        )
        if "message_id" not in props:
            props["message_id"] = f"hostile-{self.count}"
        if body_kind == "compressed":
            headers = props.get("headers")
            extra = (
                b"compression",
                fv(
                    "S",
                    rng.choice(
                        [
                            "application/x-bzip2",
                            "application/x-gzip",
                            "application/zlib",
                            "application/x-brotli",
                            "bogus",
                        ]
                    ),
                ),
            )
            if headers is None or len(headers) > self.limits.max_header_bytes:
                props["headers"] = table([extra])
            else:  # append the entry to the encoded table
                content = headers[4:] + shortstr(extra[0]) + extra[1]
                props["headers"] = struct.pack(">I", len(content)) + content
            tags.add("compression_header")
        return properties(**props), tags

    # -- bodies ----------------------------------------------------------------------------------

    BODY_KINDS = (
        "valid",
        "deep",
        "deep_array",
        "big",
        "unknown",
        "utf16",
        "utf16_bom",
        "utf8_bom",
        "invalid_utf8",
        "nan",
        "duplicate",
        "lone_surrogate",
        "huge_int",
        "empty",
        "scalar",
        "compressed",
        "foreign",
        "reply_to",
        "long_strings",
        "control_chars",
        "regex",
        "odd_code_points",
    )

    def body(self, kind: str) -> bytes:
        rng, agent, action = self.rng, self.agent, self.action
        base = {"title": f"hostile-gen-{self.count}"}
        if kind == "valid":
            return dumps(intent(agent, action, base))
        if kind == "deep":
            depth = rng.randint(1, self.limits.max_depth)
            return (
                f'{{"agent_id":"{agent}","action":"{action}","params":{{"title":"d","extra":{nested_json(depth)}}}}}'
            ).encode()
        if kind == "deep_array":
            depth = rng.choice([100, 1000, 100_000])
            return f'{{"agent_id":"{agent}","action":"{action}","params":{{"extra":{{"a":{"[" * depth}1{"]" * depth}}}}}}}'.encode()
        if kind == "big":
            size = rng.choice([255 * 1024, 256 * 1024, 256 * 1024 + 1, rng.randint(300_000, self.limits.max_body)])
            head = f'{{"agent_id":"{agent}","action":"{action}","params":{{"title":"'.encode()
            return head + b"x" * max(0, size - len(head) - 4) + b'"}}'
        if kind == "unknown":
            n = rng.choice([51, 1000, rng.randint(1, self.limits.max_unknown)])
            return f'{{"agent_id":"{agent}","action":"{action}","params":{unknown_params(n)}}}'.encode()
        if kind == "utf16":
            return json.dumps(intent(agent, action, base)).encode("utf-16-le")
        if kind == "utf16_bom":
            return json.dumps(intent(agent, action, base)).encode("utf-16")
        if kind == "utf8_bom":
            return b"\xef\xbb\xbf" + dumps(intent(agent, action, base))
        if kind == "invalid_utf8":
            return dumps(intent(agent, action, base)).replace(b"hostile", rng.choice(INVALID_UTF8) + b"hostile")
        if kind == "nan":
            literal = rng.choice(["NaN", "Infinity", "-Infinity", "1e999", "-1e999"])
            return f'{{"agent_id":"{agent}","action":"{action}","params":{{"title":"n","extra":{{"v":{literal}}}}}}}'.encode()
        if kind == "duplicate":
            return (
                f'{{"agent_id":"{agent}","action":"{action}","action":"reach.list_tools",'
                f'"params":{{"title":"a","title":"b"}}}}'
            ).encode()
        if kind == "lone_surrogate":
            return f'{{"agent_id":"{agent}","action":"{action}","params":{{"title":"\\ud800\\udfff\\udc00"}}}}'.encode()
        if kind == "huge_int":
            digits = rng.choice([4301, 100_000, 200_000])
            return f'{{"agent_id":"{agent}","action":"{action}","params":{{"title":"i","extra":{{"n":{"9" * digits}}}}}}}'.encode()
        if kind == "empty":
            return rng.choice([b"", b" ", b"null", b"[]", b"{}", b'""', b"\x00" * 64])
        if kind == "scalar":
            return rng.choice([b"1", b"true", b'"create_item"', b"[" * 10, b"{" * 10])
        if kind == "compressed":
            which = rng.choice(["bz2", "gzip", "zlib"])
            return _bomb(which, self.limits.bomb_size)
        if kind == "foreign":
            bad_args = rng.choice(['{"title": "t",', "not json", nested_json(5000), '{"title": NaN}'])
            return rng.choice(
                [
                    dumps(
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": action.replace(".", "__"), "arguments": bad_args},
                        }
                    ),
                    dumps(
                        {
                            "type": "tool_use",
                            "id": "tu_1",
                            "name": action.replace(".", "__"),
                            "input": json.loads(nested_json(20)),
                        }
                    ),
                    dumps(
                        {
                            "jsonrpc": "2.0",
                            "id": 1,
                            "method": "tools/call",
                            "params": {"name": action.replace(".", "__"), "arguments": "[]"},
                        }
                    ),
                    dumps({"name": action, "args": [1, 2], "id": None}),
                ]
            )
        if kind == "reply_to":
            reply = rng.choice(
                [
                    f"{agent}." + "r" * 300,
                    "é" * 200,
                    f"{agent}." + "é" * 150,
                    f"{agent}.*.#",
                    f"{agent}.\u0000",
                    "amq.gen-x",
                ]
            )
            return dumps(intent(agent, action, base, reply_to=reply))
        if kind == "long_strings":
            return dumps(
                intent(
                    agent,
                    action,
                    base,
                    intent_id="i" * rng.choice([128, 129, 5000]),
                    idempotency_key="k" * rng.choice([255, 256, 100_000]),
                    traceparent="00-" + "f" * 5000,
                    deadline="9" * 1000,
                    context={"description": "d" * 100_000, "domain": "x" * 1000},
                )
            )
        if kind == "regex":  # almost matches the action's backtracking pattern (RE2 runs it in linear time)
            n = rng.choice([28, 32, 64, 1000, 100_000])
            tail = rng.choice(["!", "\u0000", " !", "\n"])
            return dumps(intent(agent, action, {**base, "code": "a1 " * (n // 3) + "a" * (n % 3) + tail}))
        if kind == "odd_code_points":
            odd = rng.choice(["\u0000", "\ufffe", "\uffff", "\U0010ffff", "\u202e", "e\u0301" * 1000, "\u2028"])
            return dumps(intent(agent, action, {"title": f"t{odd}", "code": odd, "extra": {odd: odd}}))
        if kind == "control_chars":
            return dumps(intent(agent + "\u0000\r\n", action, {"title": "t\r\nX-Injected: 1", "extra": {"\u0000": 1}}))
        raise ValueError(kind)

    def message(self) -> Hostile:
        self.refusable = self.rng.random() < BROKER_REFUSED_SHARE
        kind = self.rng.choice(self.BODY_KINDS)
        props, tags = self.props(kind)
        body = self.body(kind)
        label = f"#{self.count} body={kind} props={','.join(sorted(tags)) or 'plain'} ({len(body)} B)"
        self.count += 1
        return Hostile(label, props, body, {*tags, f"body_{kind}"})

    def batch(self, n: int) -> list[Hostile]:
        return [self.message() for _ in range(n)]


# -- beside the hostile frames: approval resends, odd values for a SQL system, half-open clients ----


@dataclass
class ApprovalResends:
    """An intent that waits for a person, and messages that reuse its id before anyone decides."""

    intent_id: str
    title: str  # the approved work's title: what the downstream must be called with, once
    original: bytes
    resends: list[bytes]
    kinds: list[str]


@dataclass
class OddValue:
    """An intent for a SQL action whose string param holds a NUL (``nul``) or another odd code point."""

    intent_id: str
    body: bytes
    nul: bool
    label: str


ODD_CODE_POINTS = (
    "\ufffe",
    "\uffff",
    "\U0010ffff",
    "\u202e",  # right-to-left override
    "\u2028",
    "e\u0301" * 500,  # a long run of combining marks
    "\x7f\x1b[2J",
    "\ufeff",
)


class SideGenerator:
    """Deterministic (``random.Random(seed)``) intents that must each get exactly one receipt:
    approval resends and odd values for a SQL system. Bodies only; the tests send and judge them."""

    def __init__(self, seed: int, agent: str, run: str) -> None:
        self.rng = random.Random(seed)
        self.agent, self.run = agent, run
        self.count = 0

    def _id(self, label: str) -> str:
        self.count += 1
        return f"{label}-{self.run}-{self.count}-{self.rng.randrange(1 << 30):08x}"

    def approval_resends(self, action: str, threshold: float) -> ApprovalResends:
        """``action`` (an approval when ``amount`` > ``threshold``) parked, then its id sent again
        with a mistyped action, params the schema refuses, params that need no approval, extra
        params, and the same message again: 2 to 5 of those, in a random order."""
        rng = self.rng
        intent_id = self._id("gated")
        title = f"gated-{intent_id}"
        amount = rng.choice([threshold + 0.01, threshold * 2, 1e6])
        connector, _, name = action.partition(".")
        typo = rng.choice([f"{connector}.{name[::-1]}", f"{connector}.{name}s", f"{connector}x.{name}", name.upper()])
        variants = {
            "mistyped_action": intent(self.agent, typo, {"title": title, "amount": amount}, intent_id=intent_id),
            "refused_params": intent(self.agent, action, {"title": title, "amount": "lots"}, intent_id=intent_id),
            "no_approval_needed": intent(
                self.agent, action, {"title": f"{title}-small", "amount": 1}, intent_id=intent_id
            ),
            "extra_params": intent(
                self.agent, action, {"title": title, "amount": amount, "x\u0000": 1}, intent_id=intent_id
            ),
            "same_again": intent(self.agent, action, {"title": title, "amount": amount}, intent_id=intent_id),
        }
        kinds = rng.sample(sorted(variants), rng.randint(2, len(variants)))
        return ApprovalResends(
            intent_id,
            title,
            dumps(intent(self.agent, action, {"title": title, "amount": amount}, intent_id=intent_id)),
            [dumps(variants[k]) for k in kinds],
            kinds,
        )

    def odd_values(self, action: str, param: str, n: int) -> list[OddValue]:
        """``n`` intents for ``action``, ``param`` holding a NUL (the first always) or an odd code point."""
        out = []
        for i in range(n):
            nul = i == 0 or self.rng.random() < 0.4
            odd = self.rng.choice(["\u0000", "a\u0000b", "\u0000" * 100]) if nul else self.rng.choice(ODD_CODE_POINTS)
            intent_id = self._id("odd")
            label = f"{'nul' if nul else 'odd'} {odd[:8]!r}"
            out.append(
                OddValue(
                    intent_id,
                    dumps(intent(self.agent, action, {param: f"{intent_id}{odd}"}, intent_id=intent_id)),
                    nul,
                    label,
                )
            )
        return out


def half_open(port: int, count: int, source: str = "127.0.0.2") -> list[socket.socket]:
    """``count`` connections to ``port`` from ``source`` (all of 127.0.0.0/8 is this machine), each
    sending half a request header and no more: held until the server cuts them off or :func:`close_all`."""
    opened = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(source, 0))
        try:
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        except OSError:  # already refused by the server (its per-client limit)
            pass
        opened.append(sock)
    return opened


def close_all(socks: list[socket.socket]) -> None:
    for sock in socks:
        sock.close()


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def gzip_of(data: bytes) -> bytes:
    return gzip.compress(data)


# -- a regex-heavy catalog: patterns as vendors write them ------------------------------------------


@dataclass(frozen=True)
class RegexField:
    """A string field whose ``pattern`` backtracks catastrophically on Python's ``re`` (or uses a
    spelling RE2 lacks). ``oracle`` is the same pattern in RE2's own spelling, which the contract says
    decides (docs/contract.md: patterns run on RE2); ``unit`` repeated, plus a tail, makes near misses."""

    name: str
    pattern: str
    unit: str
    oracle: str = ""

    @property
    def re2_pattern(self) -> str:
        return self.oracle or self.pattern


REGEX_FIELDS: tuple[RegexField, ...] = (
    RegexField("code", r"^([a-zA-Z0-9]+\s?)*$", "a1 "),  # issue 30's: 32 characters cost 130 s on re
    RegexField("email", r"^([a-zA-Z0-9_\.\-])+\@(([a-zA-Z0-9\-])+\.)+([a-zA-Z0-9]{2,4})+$", "a."),
    RegexField("name", r"^\p{L}+(?:[ '\-]\p{L}+)*$", "é "),
    RegexField("slug", r"^(a+)+$", "a"),
    RegexField("alt", r"^(a|aa)+$", "a"),
    RegexField("words", r"^(\w+\s?)*$", "ab "),
    RegexField("phone", r"^\+?(\d+[-. ]?)*\d$", "1-"),
    RegexField("latin", r"^\u00c0[\u0041-\u005A]{1,3}\Z", "A", r"^\x{00c0}[\x{0041}-\x{005A}]{1,3}\z"),
    RegexField("upto", r"^x{,3}$", "x", r"^x{0,3}$"),
    RegexField("printable", r"^\P{Cc}*$", "é"),
    RegexField("handle", r"^[\p{Lu}\p{Ll}\p{Nd}_-]{1,64}$", "Ab"),
)


def regex_fields_yaml(indent: int = 8) -> str:
    """The ``input:`` lines of an action with every :data:`REGEX_FIELDS` field (JSON strings are
    YAML double-quoted scalars, so the backslashes arrive as written)."""
    pad = " " * indent
    return "".join(f"{pad}{f.name}: {{ type: string, pattern: {json.dumps(f.pattern)} }}\n" for f in REGEX_FIELDS)
