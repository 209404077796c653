"""What a plugin's conformance fixture works with: the fake system's script, set by the kit.

``reach plugins check TYPE`` (workers/ops/conformance.py) runs one suite against any adapter. It
cannot speak every protocol, so each plugin declares a fixture (``Manifest.conformance``): a
server of its own protocol that asks a :class:`Downstream` what to do with every request it
receives, and the connector document that points the adapter at that server. The kit sets the
script per row (answer, hang, fail, refuse), and reads back what the system received (how many
requests, with which idempotency key), which is how it proves, whatever the protocol, that a write
was not sent twice.

A fixture (see :class:`Fixture`) offers two actions, each taking one string param ``q``: a read
(``read_action``) and a non-idempotent write (``write_action``); its server passes the request's
text (where ``q`` can be found) to :meth:`Downstream.handle` and answers as the :class:`Reply` says.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

MARKER = re.compile(r"kit-[0-9]+-[0-9]+")  # what the concurrency row puts in ``q``


@dataclass(frozen=True)
class Received:
    """One request as the fake system saw it."""

    key: str | None  # the idempotency key it carried (None: none)
    text: str  # the request's text (body, query, message), where the kit looks for ``q``'s value


@dataclass(frozen=True)
class Reply:
    """What the fake system does with a request, which its fixture renders in its protocol.

    - ``answer``: succeed with ``data`` (JSON-like);
    - ``huge``: succeed with an answer of about ``size`` bytes (one long text value);
    - ``deep``: succeed with an answer nested ``depth`` levels (objects in objects, elements in
      elements), which a recursive decoder would choke on;
    - ``hang``: answer nothing for ``seconds`` (then close);
    - ``fail``: a server-side failure of the protocol (HTTP 503, a SOAP server fault, a GraphQL
      error, ...) whose text is ``message``.
    """

    kind: Literal["answer", "huge", "deep", "hang", "fail"]
    data: Any = None
    size: int = 0
    depth: int = 0
    seconds: float = 0.0
    message: str = ""


def json_answer(reply: Reply) -> bytes:
    """A successful Reply as JSON bytes (for protocols that answer JSON), built without recursion."""
    if reply.kind == "huge":
        return b'{"blob": "' + b"x" * reply.size + b'"}'
    if reply.kind == "deep":
        return b'{"a":' * reply.depth + b"1" + b"}" * reply.depth
    return json.dumps(reply.data).encode()


class Downstream:
    """The fake system's behaviour and what it received; thread-safe (servers are threaded)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._script: list[Reply] = []
        self._default: Reply = Reply("answer", data={"ok": True})
        self._echo = False
        self._received: list[Received] = []
        self._mirror: Callable[[list[Reply], Reply, bool], None] | None = None
        self._seen: Callable[[], list[Received]] | None = None

    def attach(self, mirror: Callable[[list[Reply], Reply, bool], None], seen: Callable[[], list[Received]]) -> None:
        """For a system that keeps the script itself (a database's routine cannot call back into
        the kit): ``mirror(replies, then, echo)`` gets every play, ``seen()`` says what arrived."""
        self._mirror, self._seen = mirror, seen

    @property
    def received(self) -> list[Received]:
        if self._seen is not None:
            return self._seen()
        with self._lock:
            return list(self._received)

    def play(self, *replies: Reply, then: Reply | None = None, echo: bool = False) -> None:
        """Answer the next requests with ``replies`` in turn, then with ``then`` (default: success);
        ``echo``: a success answers ``{"seen": <the kit marker found in the request>}``."""
        with self._lock:
            self._script = list(replies)
            self._default = then or Reply("answer", data={"ok": True})
            self._echo = echo
            self._received = []
        if self._mirror is not None:
            self._mirror(list(replies), self._default, echo)

    def handle(self, received: Received) -> Reply:
        """Note the request and say what to do with it (the fixture's server calls this)."""
        with self._lock:
            self._received.append(received)
            reply = self._script.pop(0) if self._script else self._default
            if self._echo and reply.kind == "answer":
                found = MARKER.search(received.text)
                reply = Reply("answer", data={"seen": found.group(0) if found else None})
            return reply

    @property
    def count(self) -> int:
        return len(self.received)

    def keys(self) -> list[str | None]:
        return [r.key for r in self.received]


@dataclass
class Fixture:
    """A plugin's way to point its adapter at the kit's fake system.

    ``connector(reachable, idempotency)`` returns the connector document (the mapping under
    ``connector:`` in YAML) with the two actions; ``reachable`` False aims it where nothing listens
    (connection refused); ``idempotency`` True asks the system to deduplicate by the intent's
    idempotency key (the http type's ``idempotency_header``), making the write safe to repeat.
    ``secret`` is a credential the connector uses (read from ``environ``): it must never show.
    """

    connector: Callable[[bool, bool], dict[str, Any]]
    close: Callable[[], None]
    secret: str
    environ: Mapping[str, str] = field(default_factory=dict)
    read_action: str = "kit_read"
    write_action: str = "kit_write"


@dataclass(frozen=True)
class KitContext:
    """What the kit's caller offers a fixture: the fleet's broker, for systems reached through one."""

    broker_url: str | None = None
    database_url: str | None = None  # a PostgreSQL database the sql fixture may add a schema to


class FixtureFactory(Protocol):
    """``Manifest.conformance`` names one of these: it starts the fake system's server (raising
    when it cannot, e.g. without a broker it needs)."""

    def __call__(self, downstream: Downstream, context: KitContext) -> Fixture: ...


__all__ = ["MARKER", "Downstream", "Fixture", "FixtureFactory", "KitContext", "Received", "Reply", "json_answer"]
