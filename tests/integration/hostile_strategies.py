"""Hypothesis strategies for the generated hostile-input run against a live fleet
(tests/integration/test_hostile_generated.py).

A :class:`Scenario` is what one example sends: a few intents with hostile bodies, AMQP properties
and headers (:class:`Msg`), maybe an intent that waits for approval with resends of its id
(:class:`ApprovalCase`), maybe slow clients held against a process's /metrics and probes
(:class:`SlowClients`). Nothing here holds an intent id or a unique title: those are made when the
example is sent, because Hypothesis replays an example while it shrinks it and a replayed id would
be answered as a duplicate. Every value prints short (``'a1 '*9000+'!'``, not 27,000 characters), so
the shrunk example Hypothesis prints on a failure can be read.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st

from tests.integration.hostile_gen import (
    REGEX_FIELDS,
    fv,
    nested_json,
    nested_table,
    properties,
    table,
)

# code points that break naive handling somewhere: NUL, lone surrogates, non-characters, the last
# code point, bidi controls, line/paragraph separators, a BOM, C1 controls, combining marks, emoji
ODD_CODE_POINTS = (
    "\x00",
    "\ud800",
    "\udfff",
    "\ufffe",
    "\uffff",
    "\U0010ffff",
    "\u200f",  # right-to-left mark
    "\u202e",  # right-to-left override
    "\u2066",  # left-to-right isolate
    "\u2028",
    "\u2029",
    "\ufeff",
    "\x85",
    "\x7f\x1b[2J",
    "e\u0301\u0301",
    "\U0001f600",
    "\r\nX-Injected: 1",
)
LONG_LENGTHS = (128, 129, 255, 256, 1000, 4097, 65_536, 100_000)
MAX_INTENT_BYTES = 256 * 1024  # the contract's default intent size limit


def brief(value: Any, keep: int = 24) -> str:
    """``value`` as short Python-like text: long strings as ``'x'*N+'tail'``, deep dicts cut."""
    if isinstance(value, str):
        if len(value) <= max(keep, 60):
            return repr(value)
        head = value[:3]
        if head and len(value) > 50 and value.startswith(head * 5):
            n = 0
            while value.startswith(head, n * len(head)):
                n += 1
            rest = value[n * len(head) :]
            return f"{head!r}*{n}" + (f"+{brief(rest, keep)}" if rest else "")
        return f"{value[:keep]!r}…(+{len(value) - keep} chars)"
    if isinstance(value, bytes):
        return brief(value.decode("latin-1"), keep).replace("'", "b'", 1) if len(value) > keep else repr(value)
    if isinstance(value, dict):
        items = list(value.items())
        shown = ", ".join(f"{brief(k)}: {brief(v)}" for k, v in items[:6])
        return "{" + shown + (f", …{len(items) - 6} more" if len(items) > 6 else "") + "}"
    if isinstance(value, (list, tuple)):
        shown = ", ".join(brief(v) for v in value[:6])
        return "[" + shown + (f", …{len(value) - 6} more" if len(value) > 6 else "") + "]"
    return repr(value)


def has_surrogate(value: Any) -> bool:
    if isinstance(value, str):
        return any("\ud800" <= ch <= "\udfff" for ch in value)
    if isinstance(value, dict):
        return any(has_surrogate(k) or has_surrogate(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return any(has_surrogate(v) for v in value)
    return False


class ShortRepr:
    """Hypothesis prints a falsifying example with its own pretty printer, which spells out
    dataclass fields (megabytes for a long string): this makes it use the short ``__repr__``."""

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(repr(self))


# ------------------------------------------------------------------------------------ text values


def odd_code_point() -> st.SearchStrategy[str]:
    return st.sampled_from(ODD_CODE_POINTS)


def long_text() -> st.SearchStrategy[str]:
    return st.builds(
        lambda unit, n: unit * n,
        st.sampled_from(["a", "é", "\u202e", "\x00", "a1 ", "\U0010ffff"]),
        st.sampled_from(LONG_LENGTHS),
    )


def hostile_text(max_size: int = 12) -> st.SearchStrategy[str]:
    """Short text over every code point (surrogates included), odd code points, very long runs."""
    anything = st.text(max_size=max_size)  # lone surrogates come from odd_code_point(), less often
    mixed = st.lists(st.one_of(odd_code_point(), st.text(max_size=4)), min_size=1, max_size=4).map("".join)
    return st.one_of(anything, odd_code_point(), mixed, long_text())


def near_miss(unit: str) -> st.SearchStrategy[str]:
    """``unit`` repeated, then a tail: the shape that makes a backtracking engine try every split."""
    return st.builds(
        lambda n, tail: unit * n + tail,
        st.sampled_from([0, 1, 3, 9, 10, 11, 28, 32, 100, 1000, 20_000]),
        st.sampled_from(["", "!", "\x00", "\n", " ", "é", "\u202e", "\uffff", "A", "a", "1", "x", "\ud800", "_"]),
    )


# ----------------------------------------------------------------------------------- AMQP headers


@dataclass(frozen=True)
class Header(ShortRepr):
    """One extra header entry that AMQP clients can decode: a UTF-8 name, a typed value."""

    name: str
    letter: str
    value: Any

    def encoded(self) -> tuple[bytes, bytes]:
        if self.letter == "F":  # a table ``value`` levels deep (the contract allows 8)
            return self.name.encode(), fv("F", nested_table(int(self.value), leaf=fv("S", "leaf")))
        if self.letter == "S":
            return self.name.encode(), fv("S", self.value.encode("utf-8"))
        return self.name.encode(), fv(self.letter, self.value)

    def __repr__(self) -> str:
        return f"{brief(self.name)}:{self.letter}={brief(self.value)}"


def _valid_utf8(text: str) -> str:
    """Lone surrogates out (a header name or short string must be UTF-8: that one is unreadable)."""
    return "".join(ch for ch in text if not "\ud800" <= ch <= "\udfff")


def header_names() -> st.SearchStrategy[str]:
    reserved = {"agent_id", "traceparent", "compression", "x-reach-on-behalf-of", "x-reach-run-id"}
    return (
        st.one_of(
            hostile_text(10).map(_valid_utf8),
            st.sampled_from(
                ["x-reach-reason", "x-delivery-count", "x-death", "X-Agent-Id", "Agent_ID", "\x00agent_id"]
            ),
        )
        .map(lambda name: name.encode("utf-8")[:255].decode("utf-8", "ignore"))
        .filter(lambda name: name not in reserved)
    )


def headers() -> st.SearchStrategy[Header]:
    return st.one_of(
        # long values, but the whole header frame must fit the broker's frame_max (128 KiB)
        st.builds(Header, header_names(), st.just("S"), hostile_text(16).map(lambda t: _valid_utf8(t)[:4096])),
        st.builds(Header, header_names(), st.just("l"), st.sampled_from([-(1 << 63), -1, 0, (1 << 63) - 1])),
        st.builds(Header, header_names(), st.just("t"), st.sampled_from([0, 1, 255])),
        st.builds(Header, header_names(), st.just("T"), st.sampled_from([0, 253402300799])),
        st.builds(Header, header_names(), st.just("x"), st.binary(max_size=64)),
        st.builds(Header, header_names(), st.just("F"), st.integers(1, 6)),
        st.builds(Header, header_names(), st.just("V"), st.none()),
    )


# --------------------------------------------------------------------------------- one message


@dataclass(frozen=True)
class Msg(ShortRepr):
    """One generated intent, sent as a hand-built frame.

    ``envelope``: ``plain`` (JSON content type, ``agent_id`` header) or ``odd_headers`` (the same,
    plus decodable hostile headers and properties): both must get exactly one receipt.
    ``unreadable:…``, ``content_type:…`` and ``no_agent``: at most one.
    ``id_kind``: ``fresh`` (the body's ``intent_id`` = ``message_id``) or ``absent`` (``message_id``
    only): the receipt is findable; any other is a hostile id (at most one receipt).
    ``title``: the suffix after the unique title made at send time; None: no ``title`` param.
    """

    action: str
    params: dict[str, Any]
    title: str | None = None
    envelope: str = "plain"
    headers: tuple[Header, ...] = ()
    props: tuple[tuple[str, Any], ...] = ()
    id_kind: str = "fresh"
    body_form: str = "utf8"
    fields: tuple[tuple[str, Any], ...] = ()  # reply_to, idempotency_key, deadline, context, traceparent

    @property
    def exact(self) -> bool:
        """Whether this message must get exactly one receipt (its sender and id are knowable)."""
        return self.envelope in ("plain", "odd_headers") and self.id_kind in ("fresh", "absent")

    def __repr__(self) -> str:
        parts = [f"{self.action!r}" if len(self.action) < 60 else brief(self.action), brief(self.params)]
        if self.title is not None:
            parts.append(f"title=<unique>+{brief(self.title)}")
        for name in ("envelope", "id_kind", "body_form"):
            if getattr(self, name) != Msg.__dataclass_fields__[name].default:
                parts.append(f"{name}={getattr(self, name)!r}")
        if self.headers:
            parts.append(f"headers={list(self.headers)}")
        if self.props:
            parts.append(f"props={brief(dict(self.props))}")
        if self.fields:
            parts.append(f"fields={brief(dict(self.fields))}")
        return "Msg(" + ", ".join(parts) + ")"

    # -- built when sent --------------------------------------------------------------------------

    def doc(self, intent_id: str, title: str, agent: str, key: str) -> dict[str, Any]:
        params = dict(self.params)
        if self.title is not None:
            params["title"] = title + self.title
        doc: dict[str, Any] = {"agent_id": agent, "action": self.action, "params": params}
        ids = {"fresh": intent_id, "long": "i" * 129, "nul": f"{intent_id}\x00", "rtl": f"\u202e{intent_id}"}
        ids.update({"empty": "", "number": 42, "list": [intent_id]})
        if self.id_kind != "absent":
            doc["intent_id"] = ids[self.id_kind]
        for name, value in self.fields:
            if name == "reply_to":
                doc["reply_to"] = value.replace("<agent>", agent)
            elif name == "idempotency_key":
                doc["idempotency_key"] = key if value == "<fresh>" else value
            else:
                doc[name] = value
        return doc

    def body(self, doc: dict[str, Any]) -> bytes:
        form = self.body_form
        if form == "ascii":
            return json.dumps(doc, separators=(",", ":")).encode()
        utf8 = json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogatepass")
        broken: dict[str, Callable[[bytes], bytes]] = {
            "utf8": lambda b: b,
            "bom": lambda b: b"\xef\xbb\xbf" + b,
            "truncated": lambda b: b[: max(1, len(b) // 2)],
            "nan": lambda b: b.replace(b'"params":{', b'"params":{"extra":NaN,', 1),
            "duplicate_action": lambda b: b"{" + b'"action":"reach.list_tools",' + b[1:],
            "deep": lambda b: b.replace(b'"params":{', b'"params":{"extra":' + nested_json(40).encode() + b",", 1),
            "nul_byte": lambda b: b[:1] + b"\x00" + b[1:],
            "invalid_utf8": lambda b: b.replace(b'"params":{', b'"params":{"\xc3\x28":1,', 1),
            "utf16": lambda b: b.decode("utf-8", "surrogatepass").encode("utf-16", "surrogatepass"),
            "big": lambda b: b.replace(b'"params":{', b'"params":{"pad":"' + b"p" * MAX_INTENT_BYTES + b'",', 1),
        }
        return broken[form](utf8)

    def frame(self, intent_id: str, agent: str) -> bytes:
        entries = [(b"agent_id", fv("S", agent))] if self.envelope != "no_agent" else []
        entries += [h.encoded() for h in self.headers]
        props: dict[str, Any] = {"content_type": "application/json", "delivery_mode": 2, "message_id": intent_id}
        props.update(dict(self.props))
        why = self.envelope.partition(":")[2]
        if self.envelope.startswith("unreadable:"):
            if why == "nested":
                props["headers"] = nested_table(12, leaf=fv("S", "deep"))
                return properties(**props)
            if why == "invalid_utf8_name":
                entries.append((b"\xff\xfeh", fv("S", "x")))
            elif why == "timestamp":
                entries.append((b"sent_at", fv("T", (1 << 63) - 1)))
            elif why == "wide":
                entries += [(f"w{i}".encode(), fv("t", 1)) for i in range(1100)]
            elif why == "invalid_utf8_string":
                entries.append((b"note", fv("S", b"\xc3\x28\xff")))
        elif self.envelope.startswith("content_type:"):
            props["content_type"] = why
        props["headers"] = table(entries)
        return properties(**props)


ACTIONS = {
    "create": "hostile_sys.create_item",
    "read": "hostile_sys.get_item",
    "register": "hostile_sys.register",
    "sql": "hostile_sql.add_item",
}
HOSTILE_ACTION_NAMES = (
    "",
    "x" * 301,
    "hostile_sys.create_item\x00",
    "hostile_sys.create_\u0456tem",  # a Cyrillic і
    "\u202ehostile_sys.create_item",
    "hostile_sys.refunds",
    "HOSTILE_SYS.CREATE_ITEM",
    "hostile_sys__create_item",
    "reach.list_tools",
    "hostile_sys.*",
    "../hostile_sys.create_item",
    "hostile_sys.create_item.extra",
)


def nested_json_value() -> st.SearchStrategy[Any]:
    leaves = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), hostile_text(8))
    return st.recursive(
        leaves,
        lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(hostile_text(6), inner, max_size=3)),
        max_leaves=8,
    )


def create_params() -> st.SearchStrategy[dict[str, Any]]:
    code = next(f for f in REGEX_FIELDS if f.name == "code")
    return st.fixed_dictionaries(
        {},
        optional={
            "code": near_miss(code.unit),
            "extra": st.dictionaries(hostile_text(8), nested_json_value(), max_size=3),
            "tags": st.lists(st.one_of(hostile_text(8), st.integers()), max_size=4),
            "token": hostile_text(8),
        },
    )


def register_params() -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {}, optional={f.name: st.one_of(near_miss(f.unit), hostile_text(6)) for f in REGEX_FIELDS}
    )


def envelopes() -> st.SearchStrategy[tuple[str, tuple[Header, ...], tuple[tuple[str, Any], ...]]]:
    odd_props = st.dictionaries(
        st.sampled_from(["correlation_id", "type", "app_id", "cluster_id", "priority", "expiration", "timestamp"]),
        st.one_of(hostile_text(8).map(_valid_utf8), st.integers(0, 255)),
        max_size=3,
    ).map(_fix_props)
    plain: st.SearchStrategy[tuple[str, tuple[Header, ...], tuple[tuple[str, Any], ...]]] = st.just(("plain", (), ()))
    odd = st.tuples(st.just("odd_headers"), st.lists(headers(), max_size=4).map(tuple), odd_props)
    return st.one_of(
        plain,
        plain,
        odd,
        st.tuples(
            st.sampled_from(
                [
                    "unreadable:nested",
                    "unreadable:invalid_utf8_name",
                    "unreadable:timestamp",
                    "unreadable:wide",
                    "unreadable:invalid_utf8_string",
                    "content_type:text/plain",
                    "content_type:application/x-python-serialize",
                    "content_type:application/x-yaml",
                    "content_type:",
                    "no_agent",
                ]
            ),
            st.just(()),
            st.just(()),
        ),
    )


def _fix_props(raw: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    """Each property in its AMQP domain: octets for priority, in-range time, text for the rest."""
    out: list[tuple[str, Any]] = []
    for name, value in sorted(raw.items()):
        if name == "priority":
            out.append((name, value if isinstance(value, int) else 255))
        elif name == "timestamp":
            out.append((name, value if isinstance(value, int) else 253402300799))
        elif name == "expiration":
            out.append((name, "60000"))
        else:  # a short string: at most 255 bytes, cut on a code point (a cut one is not UTF-8)
            out.append((name, str(value).encode("utf-8")[:255].decode("utf-8", "ignore")))
    return tuple(out)


def intent_fields() -> st.SearchStrategy[tuple[tuple[str, Any], ...]]:
    return st.dictionaries(
        st.sampled_from(["reply_to", "idempotency_key", "deadline", "context", "traceparent"]),
        st.none(),
        max_size=3,
    ).flatmap(
        lambda chosen: st.fixed_dictionaries({name: FIELD_VALUES[name] for name in sorted(chosen)}).map(
            lambda d: tuple(d.items())
        )
    )


FIELD_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "reply_to": st.sampled_from(
        [
            "<agent>",
            "<agent>.r1",
            "<agent>." + "r" * 300,
            "é" * 200,
            "<agent>.*.#",
            "<agent>.\x00",
            "hb_someone_else",
            "amq.gen-x",
        ]
    ),
    "idempotency_key": st.one_of(st.just("<fresh>"), st.just("k" * 256), hostile_text(8)),
    "deadline": st.sampled_from(["9" * 1000, "2020-01-01T00:00:00Z", "not a date", "2999-01-01T00:00:00\x00Z"]),
    "context": st.fixed_dictionaries({"description": hostile_text(8), "domain": hostile_text(4)}),
    "traceparent": st.one_of(st.just("00-" + "f" * 5000), hostile_text(8)),
}


@st.composite
def messages(draw: st.DrawFn) -> Msg:
    kind = draw(st.sampled_from(["create", "register", "register", "read", "sql", "hostile_action"]))
    if kind == "create":
        action, params, title = ACTIONS[kind], draw(create_params()), draw(st.one_of(st.just(""), hostile_text(6)))
    elif kind == "register":
        action, params, title = ACTIONS[kind], draw(register_params()), draw(st.one_of(st.just(""), hostile_text(4)))
    elif kind == "read":
        action, params, title = ACTIONS[kind], {"item_id": draw(hostile_text(10))}, None
    elif kind == "sql":
        action, params, title = ACTIONS[kind], {}, draw(st.one_of(odd_code_point(), hostile_text(6)))
    else:
        action, params, title = draw(st.sampled_from(HOSTILE_ACTION_NAMES)), {}, draw(st.just(""))
    envelope, extra_headers, props = draw(envelopes())
    return Msg(
        action=action,
        params=params,
        title=title,
        envelope=envelope,
        headers=extra_headers,
        props=props,
        id_kind=draw(st.sampled_from(["fresh"] * 10 + ["absent"] * 3 + ["long", "nul", "rtl", "empty", "number"])),
        body_form=draw(
            st.sampled_from(
                ["utf8"] * 12
                + ["ascii"] * 6
                + ["bom", "truncated", "nan", "duplicate_action", "deep", "nul_byte", "invalid_utf8", "utf16", "big"]
            )
        ),
        fields=draw(st.one_of(st.just(()), st.just(()), intent_fields())),
    )


def register_messages() -> st.SearchStrategy[Msg]:
    """Well-formed intents for the regex-heavy action, so that only the patterns decide the answer:
    plain envelope, the intent's own id, UTF-8 or ASCII-escaped JSON, every field a near miss or
    hostile text (NUL and odd code points; lone surrogates, which are INVALID_INTENT, left out)."""
    no_surrogates = st.one_of(*(near_miss(f.unit) for f in REGEX_FIELDS[:4]), hostile_text(6)).map(_valid_utf8)
    params = st.fixed_dictionaries(
        {},
        optional={
            f.name: st.one_of(near_miss(f.unit).map(_valid_utf8), no_surrogates, st.just(f.unit * 2))
            for f in REGEX_FIELDS
        },
    )
    return st.builds(
        Msg,
        st.just(ACTIONS["register"]),
        params,
        st.one_of(st.just(""), odd_code_point().map(_valid_utf8)),
        body_form=st.sampled_from(["utf8", "ascii"]),
        id_kind=st.sampled_from(["fresh", "absent"]),
    )


# ------------------------------------------------------------------------ approval resends


RESEND_KINDS = (
    "same_again",
    "mistyped_action",
    "refused_params",
    "no_approval_needed",
    "nul_key",
    "odd_title",
    "other_action",
    "regex_action",
    "unparsable",
    "lone_surrogate",
    "too_big",
    "other_reply_to",
    "other_agent",  # another agent's own intent that happens to use the same id
)


@dataclass(frozen=True)
class ApprovalCase(ShortRepr):
    """An intent above the approval threshold, parked; its id sent again as ``resends`` (in that
    order) before a person decides it, or right after (racing the decision being carried out)."""

    amount: float
    resends: tuple[str, ...]
    decision: str  # approve | deny | approve_twice | approve_and_deny (two people at once)
    timing: str = "before"  # the resends: before the decision, or "racing" it (sent right after)

    def __repr__(self) -> str:
        return (
            f"ApprovalCase(amount={self.amount!r}, resends={list(self.resends)}, decision={self.decision!r}, "
            f"timing={self.timing!r})"
        )


def approval_cases() -> st.SearchStrategy[ApprovalCase]:
    return st.builds(
        ApprovalCase,
        st.sampled_from([500.01, 501, 1000, 1e6]),
        st.lists(st.sampled_from(RESEND_KINDS), min_size=1, max_size=4).map(tuple),
        st.sampled_from(["approve", "approve", "deny", "approve_twice", "approve_and_deny"]),
        st.sampled_from(["before", "before", "racing"]),
    )


# ----------------------------------------------------------------------------- slow clients


@dataclass(frozen=True)
class SlowClients(ShortRepr):
    """Sockets held against a process's /metrics and probes port while the example runs: from
    127.0.0.2, .3 and .4 (``per_address``), each sending ``opening`` and no more."""

    target: str  # router | a pool's connector name
    per_address: tuple[int, int, int]
    opening: bytes

    def __repr__(self) -> str:
        return f"SlowClients({self.target!r}, per_address={self.per_address}, opening={self.opening!r})"


def slow_clients(targets: list[str]) -> st.SearchStrategy[SlowClients]:
    return st.builds(
        SlowClients,
        st.sampled_from(targets),
        st.tuples(st.integers(0, 12), st.integers(0, 12), st.integers(0, 12)),
        st.sampled_from(
            [
                b"",
                b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ",
                b"GET /healthz HTTP/1.1\r\n",
                b"GET /readyz HTT",
                b"POST /metrics HTTP/1.1\r\nContent-Length: 100000\r\n\r\nab",
            ]
        ),
    )


# ------------------------------------------------------------------------------- one example


@dataclass(frozen=True)
class Scenario(ShortRepr):
    messages: tuple[Msg, ...]
    approval: ApprovalCase | None = None
    slow: SlowClients | None = None
    notes: tuple[str, ...] = field(default=(), compare=False)

    def __repr__(self) -> str:
        lines = [f"  {i}: {m!r}" for i, m in enumerate(self.messages)]
        if self.approval is not None:
            lines.append(f"  {self.approval!r}")
        if self.slow is not None:
            lines.append(f"  {self.slow!r}")
        return "Scenario(\n" + "\n".join(lines) + "\n)"


def regex_scenarios(targets: list[str], max_messages: int = 8) -> st.SearchStrategy[Scenario]:
    """Only regex-heavy intents (:func:`register_messages`), maybe with slow clients."""
    return st.builds(
        Scenario,
        st.lists(register_messages(), min_size=1, max_size=max_messages).map(tuple),
        st.none(),
        st.one_of(st.none(), slow_clients(targets)),
    )


def scenarios(targets: list[str], max_messages: int = 6) -> st.SearchStrategy[Scenario]:
    return st.builds(
        Scenario,
        st.lists(messages(), min_size=1, max_size=max_messages).map(tuple),
        st.one_of(st.none(), approval_cases()),
        st.one_of(st.none(), slow_clients(targets)),
    )
