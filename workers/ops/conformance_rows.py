"""The conformance kit's rows about calls (workers/ops/conformance.py runs them in this order,
then the two rows over everything seen: no secret shown, every code documented)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from connectors.adapters.base import Adapter, Outcome
from connectors.adapters.kit import Downstream, Fixture, Reply
from connectors.adapters.plugin import Manifest
from connectors.spec import ConnectorSpec
from producers.wire import ErrorCode

KIT_DEPTH = 32  # the max_depth the kit gives adapters (REACH_MAX_DEPTH's default)
KIT_MAX_DATA_BYTES = 2 << 20  # the most ``data`` one answer may pass on
TIMEOUT = 1.0  # the call's deadline in the timing rows
HANG = 6.0  # how long the fake system holds a request it does not answer
DEADLINE_SLACK = 3.0  # how late past its deadline a call may return (2 shared cores are slow)
THREADS, CALLS = 8, 6  # the concurrency row: threads at once, calls each
_TIMED_OUT = (ErrorCode.DOWNSTREAM_TIMEOUT, ErrorCode.OUTCOME_UNKNOWN, ErrorCode.DEADLINE_EXCEEDED)

Status = Literal["PASS", "FAIL", "SKIP"]
Built = tuple[ConnectorSpec, Adapter]


@dataclass(frozen=True)
class Row:
    guarantee: str
    status: Status
    detail: str


class AdapterRaised(Exception):
    """The adapter raised instead of answering with an Outcome."""


class Kit(Protocol):
    """What the rows use of the suite (workers/ops/conformance.py's Suite)."""

    manifest: Manifest
    fixture: Fixture
    downstream: Downstream
    last_attempts: list[Outcome]

    def adapter(self, reachable: bool = True, idempotency: bool = False) -> Built: ...
    def call(self, built: Built, name: str, q: str, key: str | None = None, timeout: float = 5.0) -> Outcome: ...
    def retried(self, built: Built, name: str, key: str | None) -> tuple[Outcome, int]: ...


def _said(outcome: Outcome) -> str:
    return f"{outcome.code or 'ok'} (sent={outcome.sent})"


def write_timeout(kit: Kit) -> tuple[Status, str]:
    built = kit.adapter()
    kit.downstream.play(then=Reply("hang", seconds=HANG))
    outcome, attempts = kit.retried(built, kit.fixture.write_action, None)
    sent = kit.downstream.count
    if kit.manifest.guarantees.timeout_may_land:
        good = outcome.code is ErrorCode.OUTCOME_UNKNOWN and sent == 1 and attempts == 1
        return ("PASS" if good else "FAIL"), f"{_said(outcome)}, {attempts} attempt(s), system received {sent}"
    # claimed: the system undoes a timed-out call, so it is reported unsent and may be retried
    good = outcome.code in _TIMED_OUT and not outcome.sent
    return ("PASS" if good else "FAIL"), f"{_said(outcome)} (claims a timeout never lands), {attempts} attempt(s)"


def same_key(kit: Kit) -> tuple[Status, str]:
    if not kit.manifest.guarantees.idempotency_key:
        return "SKIP", "not claimed (guarantees.idempotency_key is false)"
    built = kit.adapter(idempotency=True)
    kit.downstream.play(Reply("fail", message="busy"), Reply("fail", message="busy"))
    outcome, attempts = kit.retried(built, kit.fixture.write_action, "kit-key-7f3a")
    keys = kit.downstream.keys()
    good = outcome.ok and len(keys) >= 2 and all(k == "kit-key-7f3a" for k in keys)
    return ("PASS" if good else "FAIL"), f"{_said(outcome)} after {attempts} attempt(s); keys received: {keys}"


def never_twice(kit: Kit) -> tuple[Status, str]:
    built = kit.adapter()
    kit.downstream.play(then=Reply("fail", message="the system is down"))
    outcome, attempts = kit.retried(built, kit.fixture.write_action, None)
    sent = kit.downstream.count
    # a resend is allowed only after an attempt the adapter reported unsent (a rolled-back transaction)
    unsent = sum(1 for o in kit.last_attempts[:-1] if not o.sent)
    good = not outcome.ok and 1 <= sent <= 1 + unsent
    said = f"{_said(outcome)}, {attempts} attempt(s) ({unsent} before the last reported unsent), system received {sent}"
    return ("PASS" if good else "FAIL"), said


def refused_connection(kit: Kit) -> tuple[Status, str]:
    built = kit.adapter(reachable=False)
    kit.downstream.play()
    once = kit.call(built, kit.fixture.write_action, "kit-0-0", None, TIMEOUT)
    outcome, attempts = kit.retried(built, kit.fixture.write_action, None)
    good = (
        not once.ok
        and not once.sent
        and once.code is not None
        and once.code.retryable
        and once.code is not ErrorCode.OUTCOME_UNKNOWN
        and attempts > 1
    )
    return ("PASS" if good else "FAIL"), f"{_said(once)}; the pool's retry loop made {attempts} attempt(s)"


def oversized_answer(kit: Kit) -> tuple[Status, str]:
    built = kit.adapter()
    kit.downstream.play(then=Reply("huge", size=16 << 20))
    outcome = kit.call(built, kit.fixture.read_action, "kit-0-0")
    size = data_bytes(outcome.data)
    good = 0 <= size <= KIT_MAX_DATA_BYTES and kit.downstream.count == 1  # the answer was really sent
    return ("PASS" if good else "FAIL"), f"a 16 MiB answer: {_said(outcome)}, data of {size} bytes passed on"


def nested_answer(kit: Kit) -> tuple[Status, str]:
    built = kit.adapter()
    kit.downstream.play(then=Reply("deep", depth=100_000))
    outcome = kit.call(built, kit.fixture.read_action, "kit-0-0")
    levels = depth(outcome.data)
    good = levels <= KIT_DEPTH + 1 and kit.downstream.count == 1
    return ("PASS" if good else "FAIL"), f"100000 levels: {_said(outcome)}, data nested {levels} deep (max {KIT_DEPTH})"


def deadline(kit: Kit) -> tuple[Status, str]:
    built = kit.adapter()
    kit.downstream.play(then=Reply("hang", seconds=HANG))
    started = time.monotonic()
    outcome = kit.call(built, kit.fixture.read_action, "kit-0-0", None, TIMEOUT)
    took = time.monotonic() - started
    good = not outcome.ok and outcome.code in _TIMED_OUT and took < TIMEOUT + DEADLINE_SLACK
    return (
        "PASS" if good else "FAIL"
    ), f"deadline {TIMEOUT} s, system silent for {HANG} s: {_said(outcome)} after {took:.1f} s"


def concurrency(kit: Kit) -> tuple[Status, str]:
    built = kit.adapter()
    kit.downstream.play(echo=True)

    def one(thread: int) -> list[str]:
        wrong = []
        for n in range(CALLS):
            marker = f"kit-{thread}-{n}"
            outcome = kit.call(built, kit.fixture.read_action, marker)
            seen = _seen(outcome.data)
            if not outcome.ok or seen != marker:
                wrong.append(f"{marker} got {_said(outcome)} {seen!r}")
        return wrong

    with ThreadPoolExecutor(THREADS) as threads:
        wrong = [w for ws in threads.map(one, range(THREADS)) for w in ws]
    total = THREADS * CALLS
    good = not wrong and kit.downstream.count == total
    detail = f"{total} reads on {THREADS} threads, system received {kit.downstream.count}"
    return ("PASS" if good else "FAIL"), detail + (
        f"; first wrong: {wrong[0]}" if wrong else ", each got its own answer"
    )


def _seen(data: Any) -> Any:
    """The marker the fake system echoed: ``data.seen``, or ``data.result.seen`` for a type that
    wraps a record (sql's ``{"result": {...}}``)."""
    if isinstance(data, dict) and isinstance(data.get("result"), dict):
        data = data["result"]
    return data.get("seen") if isinstance(data, dict) else None


def probe(kit: Kit) -> tuple[Status, str]:
    kit.downstream.play()
    _, up = kit.adapter()
    _, down = kit.adapter(reachable=False)
    try:
        said_up, said_down = up.probe(2.0), down.probe(2.0)
    except Exception as exc:
        return "FAIL", f"the probe raised {type(exc).__name__}"
    good = said_up.healthy and not said_down.healthy
    return ("PASS" if good else "FAIL"), f"up: {said_up.healthy}, refused: {said_down.healthy}"


def tempting_error(kit: Kit) -> tuple[Status, str]:
    """A system whose error text holds the credential: the adapter must not pass it on (the
    secrets row judges; this row checks the failure is a failure)."""
    built = kit.adapter()
    kit.downstream.play(Reply("fail", message=f"token {kit.fixture.secret} is not allowed here"))
    outcome = kit.call(built, kit.fixture.read_action, "kit-0-0")
    good = not outcome.ok and outcome.code is not None and kit.downstream.count == 1
    return ("PASS" if good else "FAIL"), f"{_said(outcome)}, system received {kit.downstream.count}"


STEPS: list[tuple[str, Callable[[Any], tuple[Status, str]]]] = [
    ("a write that times out is OUTCOME_UNKNOWN and not retried", write_timeout),
    ("a retried idempotent call carries the same idempotency key", same_key),
    ("a non-idempotent write is never sent twice", never_twice),
    ("connection refused before sending is retryable, not unknown", refused_connection),
    ("an oversized answer is bounded", oversized_answer),
    ("a deeply nested answer is bounded", nested_answer),
    ("the deadline cancels the call", deadline),
    ("safe under the pool's concurrency", concurrency),
    ("the health probe tells up from down and never raises", probe),
    ("a system's error is a failure with a code", tempting_error),
]


def depth(value: Any) -> int:
    """How deeply ``value`` nests (without recursion: it is whatever an adapter passed on)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        deepest = max(deepest, level)
        if isinstance(item, dict):
            stack.extend((v, level + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, level + 1) for v in item)
    return deepest


def data_bytes(value: Any) -> int:
    try:
        return len(json.dumps(value, default=str))
    except (ValueError, RecursionError):
        return -1
