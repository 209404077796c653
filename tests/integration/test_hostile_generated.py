"""The generated hostile-input run: Hypothesis against a live fleet (issue 30).

Each example (a :class:`~tests.integration.hostile_strategies.Scenario`) sends, as hand-built AMQP
frames to the router of the fleet of tests/integration/test_hostile.py (its fixtures, on a real
RabbitMQ, Redis and PostgreSQL):

- a few intents with hostile bodies, properties and headers: NUL and odd code points (lone
  surrogates, U+FFFF, RTL marks), very long strings, hostile ids, action names and reply_to, nesting,
  broken JSON; params for a regex-heavy action (``hostile_sys.register``: every field a pattern
  that backtracks catastrophically on Python's ``re``, ``\\p{L}`` classes, ECMA ``\\u`` escapes,
  anchors) and for a SQL action on PostgreSQL;
- maybe an intent that waits for approval, its id sent again with other params, actions, agents
  or unparsable bodies before a person approves or denies it;
- maybe slow clients (half-open sockets from other addresses) held against the /metrics and probes
  port of the router or a pool while the rest runs.

Then it checks from outside (receipts on a tap bound with ``#``, the downstreams, /proc, queues):
every intent whose sender and id are knowable gets exactly one receipt, structured (a known code
whose status and ``retryable`` follow the contract's table), to the sender's own routing key; no
downstream call is made twice, none for a refused intent, exactly one for a success; a regex field is
refused with ``pattern`` exactly when RE2 refuses the value; a NUL for the SQL system is
VALIDATION_FAILED and never opens its breaker; the approved intent ends in exactly one receipt (the
approved work, run once) and nothing answers it before the decision; the scraped /metrics and
/healthz answer while the slow clients hold; the processes keep their PIDs, the router answers
another agent within 10 s, its RSS stays bounded, and the queues drain.

A property that fails is raised with the problems, and Hypothesis shrinks the scenario and prints the
smallest one it found ("Falsifying example: ... scenario=Scenario(...)", one line a message, long
strings as ``'a1 '*9000+'!'``). The CI variant is bounded (:data:`CI`: few examples, derandomized,
no example database); the soak variant (``-m soak``) explores far more.
"""

from __future__ import annotations

import socket
import struct
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import kombu.exceptions
import pytest
import re2
import redis
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from producers.client import ReachClient, ReachError
from producers.wire import ErrorCode
from tests.fleet import BROKER_URL, Fleet, queue_depth
from tests.integration import test_hostile as hostile
from tests.integration.counting_system import CountingSystem
from tests.integration.hostile_gen import (
    BROKER_ERRORS,
    REGEX_FIELDS,
    PeakRss,
    RawSender,
    ReceiptTap,
    TapReceipt,
    rss_bytes,
)
from tests.integration.hostile_strategies import (
    ACTIONS,
    MAX_INTENT_BYTES,
    ApprovalCase,
    Msg,
    Scenario,
    SlowClients,
    brief,
    has_surrogate,
    regex_scenarios,
    scenarios,
)
from tests.integration.postgres import PostgresServer
from tests.integration.test_hostile import (
    AGENT,
    APPROVER,
    CONNECTOR,
    CREATE,
    GEN_AGENT,
    INTENTS,
    REFUND,
    REGISTER,
    ROUTER_RSS_LIMIT,
    SIDE_AGENT,
    SQL_CONNECTOR,
    assert_intents_empty,
    dlq_depth,
    pids,
    probe,
    ready,
)
from workers.ops import approval_decisions as approvals
from workers.state import keys

# test_hostile.py's fixtures, so this module runs against a fleet of the same catalog (its own, per module)
fleet, system, pg, tap, redis_client = hostile.fleet, hostile.system, hostile.pg, hostile.tap, hostile.redis_client

CI = settings(
    max_examples=12,
    deadline=None,
    derandomize=True,  # the same examples on every run: CI is reproducible
    database=None,
    suppress_health_check=list(HealthCheck),  # a live fleet is slow, and its fixtures are per module
    report_multiple_bugs=False,
    print_blob=False,
)
SOAK = settings(CI, max_examples=400, derandomize=False, print_blob=True)

# what the test's own clients raise when the broker closes their connections (other tests on the
# machine restart RabbitMQ or close every connection)
CONNECTIONS_CLOSED = (*BROKER_ERRORS, ReachError, kombu.exceptions.OperationalError)
TARGETS = ["router", CONNECTOR, SQL_CONNECTOR]  # processes whose /metrics and probes slow clients hold
RECEIPT_WAIT = 20.0  # seconds for every knowable intent's receipt
NOT_THE_AGENTS_FAULT = {"DOWNSTREAM_ERROR", "CONNECTOR_UNAVAILABLE", "INTERNAL", "OUTCOME_UNKNOWN"}
REFUSED_BY_ROUTER = {"VALIDATION_FAILED", "RATE_LIMITED"}  # past the invalid allowance, RATE_LIMITED replaces it
_QUIET = re2.Options()
_QUIET.log_errors = False  # a DFA out of memory falls back to the NFA: still right, and not worth a line
PATTERNS = {f.name: re2.compile(f.re2_pattern, _QUIET) for f in REGEX_FIELDS}


@dataclass
class Sent:
    msg: Msg
    intent_id: str  # the message_id, and the body's intent_id when the message is knowable
    title: str  # the unique title (plus the message's suffix) when the action takes one
    doc: dict[str, Any]
    body: bytes
    accepted: bool  # False: the broker refused the frame itself (nothing reached the fleet)

    @property
    def exact(self) -> bool:
        return self.accepted and self.msg.exact

    @property
    def clean(self) -> bool:
        """Whether nothing but the params decides the answer (so the params' own checks can be judged)."""
        return (
            self.exact
            and self.msg.body_form in ("utf8", "ascii")
            and not self.msg.fields
            and not has_surrogate(self.doc)
            and len(self.body) <= MAX_INTENT_BYTES - 1024
        )


@dataclass
class Parked:
    case: ApprovalCase
    intent_id: str
    title: str
    others: list[str] = field(default_factory=list)  # titles the resends carried (must never run)
    other_agent_title: str | None = None  # another agent's intent with the same id (must run once)
    queued: list[tuple[ReachClient, bytes]] = field(default_factory=list)  # the resends, until sent
    outcome: str = ""  # approve | deny: the decision that took effect


@dataclass
class Tally:
    examples: int = 0
    messages: int = 0
    approvals: int = 0
    resends: int = 0
    slow_sockets: int = 0
    judged: Counter[str] = field(default_factory=Counter)  # receipts judged against an oracle, by which
    codes: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0

    def summary(self) -> str:
        top = ", ".join(f"{code} {n}" for code, n in self.codes.most_common(8))
        return (
            f"hypothesis hostile run: {self.examples} examples in {self.seconds:.0f} s, {self.messages} messages "
            f"({top}), {self.approvals} approval decisions after {self.resends} resends, "
            f"{self.slow_sockets} slow sockets held; judged: {dict(self.judged)}"
        )


def structured(receipt: TapReceipt) -> str | None:
    """What is wrong with a receipt's shape, or None: a success, or a known code whose status and
    ``retryable`` follow the contract's table."""
    doc = receipt.doc
    if not doc:
        return f"not a JSON object: {receipt.body[:200]!r}"
    if doc.get("status") == "succeeded":
        return None if not doc.get("error") else f"succeeded with an error: {doc.get('error')}"
    error = receipt.error
    try:
        code = ErrorCode(error.get("code"))
    except ValueError:
        return f"unknown error code {error.get('code')!r}"
    if doc.get("status") != code.status or error.get("retryable") is not code.retryable:
        return f"{code}: status {doc.get('status')!r}, retryable {error.get('retryable')!r} (the contract's table says otherwise)"
    if not isinstance(error.get("message"), str):
        return f"{code} without a message"
    return None


def own_key(routing_key: str, agent: str) -> bool:
    return routing_key == agent or routing_key.startswith(agent + ".")


class Live:
    """The fleet as the generated run sees it, and what one example sends and checks."""

    def __init__(
        self, fleet: Fleet, tap: ReceiptTap, system: CountingSystem, pg: PostgresServer, store: redis.Redis
    ) -> None:
        self.fleet, self.tap, self.system, self.pg, self.store = fleet, tap, system, pg, store
        self.sender = RawSender(BROKER_URL)
        self.side = ReachClient(SIDE_AGENT, BROKER_URL, drop_duplicates=False, connect_timeout=30)
        self.other = ReachClient(AGENT, BROKER_URL, drop_duplicates=False, connect_timeout=30)
        self.tally = Tally()
        self.previous: list[str] = []  # the last example's ids: a late second receipt shows up here
        self.dirty = False
        self.failed = False

    def reconnect(self, timeout: float = 120.0) -> None:
        """New connections for the test's own clients, once the broker takes them again."""
        self.close()
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.tap = ReceiptTap(BROKER_URL)
                break
            except CONNECTIONS_CLOSED:
                if time.monotonic() > deadline:
                    raise
                time.sleep(1)
        self.sender = RawSender(BROKER_URL)
        self.side = ReachClient(SIDE_AGENT, BROKER_URL, drop_duplicates=False, connect_timeout=30)
        self.other = ReachClient(AGENT, BROKER_URL, drop_duplicates=False, connect_timeout=30)

    def close(self) -> None:
        for closing in (self.tap.close, self.sender.close, self.side.close, self.other.close):
            try:
                closing()
            except Exception:  # the summary must still print
                pass

    # -- one example ------------------------------------------------------------------------------

    def check(self, scenario: Scenario) -> None:
        started = time.monotonic()
        if self.dirty:  # the last example broke something: revive before judging this one
            ready(self.fleet, "the next generated example")
            self.dirty = False
        try:
            problems = self.run(scenario)
        except CONNECTIONS_CLOSED as exc:  # another test on this broker closed every connection: once more
            note(f"the test's own broker connections were closed ({type(exc).__name__}: {exc}); the example ran again")
            self.reconnect()
            ready(self.fleet, "the generated example, again")
            problems = self.run(scenario)
        self.tally.examples += 1
        self.tally.seconds += time.monotonic() - started
        if problems:
            self.dirty = True
            if not self.failed:  # before Hypothesis shrinks it (each step costs a live example)
                self.failed = True
                print(f"first failing example, unshrunk:\n{scenario!r}\n  " + "\n  ".join(problems))
            note("problems:\n  " + "\n  ".join(problems))
            raise AssertionError(
                "the fleet broke a property:\n  " + "\n  ".join(problems) + f"\nscenario: {scenario!r}"
            )

    def run(self, scenario: Scenario) -> list[str]:
        problems: list[str] = []
        nonce = uuid.uuid4().hex[:8]
        before = pids(self.fleet)
        router_pid = before["router"]
        dlq0 = dlq_depth()
        seen0 = len(self.tap.seen)
        logs0 = {name: self.log_size(name) for name in before}
        held = self.hold(scenario.slow) if scenario.slow is not None else []
        try:
            with PeakRss(router_pid) as rss:
                parked = self.park(nonce, scenario.approval, problems) if scenario.approval else None
                sent = [self.send(nonce, i, msg) for i, msg in enumerate(scenario.messages)]
                if scenario.slow is not None:
                    problems += self.served_meanwhile(scenario.slow)
                knowable = [s.intent_id for s in sent if s.exact]
                if not self.wait(lambda: all(self.receipts(i) for i in knowable), RECEIPT_WAIT):
                    missing = [s for s in sent if s.exact and not self.receipts(s.intent_id)]
                    problems += [f"no receipt within {RECEIPT_WAIT:g} s for message {self.which(s)}" for s in missing]
                if parked is not None:
                    problems += self.decide(parked)
                self.tap.drain(0.5)  # a second receipt would come now
        finally:
            for sock in held:
                sock.close()

        for s in sent:
            problems += self.judge(s)
        if parked is not None and parked.outcome:
            problems += self.judge_approval(parked)
        problems += self.judge_strays(seen0, sent)
        problems += self.judge_fleet(before, rss.peak, dlq0, len(sent) + (parked is not None) * 20)
        problems += self.judge_logs(logs0)
        self.previous = [s.intent_id for s in sent] + ([parked.intent_id] if parked else [])
        return problems

    # -- sending ----------------------------------------------------------------------------------

    def send(self, nonce: str, index: int, msg: Msg) -> Sent:
        intent_id = f"hy-{nonce}-{index}"
        title = f"hy-{nonce}-{index}"
        doc = msg.doc(intent_id, title, GEN_AGENT, f"k-{nonce}-{index}")
        body = msg.body(doc)
        accepted = self.sender.send(msg.frame(intent_id, GEN_AGENT), body, intent_id)
        self.tally.messages += 1
        return Sent(msg, intent_id, title + (msg.title or ""), doc, body, accepted)

    def park(self, nonce: str, case: ApprovalCase, problems: list[str]) -> Parked | None:
        import json

        intent_id, title = f"hg-{nonce}", f"gated-{nonce}"
        parked = Parked(case, intent_id, title)

        def body(action: str, params: dict[str, Any], **extra: Any) -> bytes:
            doc = {"intent_id": intent_id, "agent_id": SIDE_AGENT, "action": action, "params": params, **extra}
            return json.dumps(doc, ensure_ascii=False).encode("utf-8", "surrogatepass")

        amount = case.amount
        self.side.publish_raw(body(REFUND, {"title": title, "amount": amount}), message_id=intent_id)
        if not self.wait(lambda: self.notices(intent_id), 15):
            problems.append(f"no approval_pending notice within 15 s for the gated intent {intent_id}")
            return None
        for kind in case.resends:
            other = f"{title}-{kind}"
            if kind == "other_agent":
                parked.other_agent_title = other
                agent_body = json.dumps(
                    {"intent_id": intent_id, "agent_id": AGENT, "action": CREATE, "params": {"title": other}}
                ).encode()
                parked.queued.append((self.other, agent_body))
                continue
            parked.others.append(other)
            resend = {
                "same_again": lambda: body(REFUND, {"title": title, "amount": amount}),
                "mistyped_action": lambda: body("hostile_sys.refunds", {"title": other, "amount": amount}),
                "refused_params": lambda: body(REFUND, {"title": other, "amount": "lots"}),
                "no_approval_needed": lambda: body(REFUND, {"title": other, "amount": 1}),
                "nul_key": lambda: body(REFUND, {"title": other, "amount": amount, "x\x00": 1}),
                "odd_title": lambda: body(REFUND, {"title": other + "\u202e\x00\uffff", "amount": amount}),
                "other_action": lambda: body(CREATE, {"title": other}),
                "regex_action": lambda: body(REGISTER, {"title": other, "code": "a1 " * 12 + "!"}),
                "unparsable": lambda: f'{{"intent_id":"{intent_id}","agent_id":"{SIDE_AGENT}","action":'.encode(),
                "lone_surrogate": lambda: json.dumps(
                    {"intent_id": intent_id, "agent_id": SIDE_AGENT, "action": REFUND, "params": {"title": "\ud800"}}
                ).encode(),
                "too_big": lambda: body(REFUND, {"title": other + "p" * MAX_INTENT_BYTES, "amount": amount}),
                "other_reply_to": lambda: body(
                    REFUND, {"title": other, "amount": amount}, reply_to=f"{SIDE_AGENT}.elsewhere"
                ),
            }[kind]()
            parked.queued.append((self.side, resend))
        if case.timing == "before":
            self.resend(parked)
        return parked

    def resend(self, parked: Parked) -> None:
        for client, body in parked.queued:
            client.publish_raw(body, message_id=parked.intent_id)
            self.tally.resends += 1
        parked.queued.clear()

    def decide(self, parked: Parked) -> list[str]:
        """Wait for the resends' answers, then check nothing answered the gated intent, and decide it."""
        problems: list[str] = []
        before = parked.case.timing == "before"
        resent = sum(kind != "other_agent" for kind in parked.case.resends) if before else 0
        self.wait(lambda: len(self.notices(parked.intent_id)) > resent, 10)
        if parked.other_agent_title is not None and before:
            self.wait(lambda: self.receipts(parked.intent_id, AGENT), 10)
        early = self.receipts(parked.intent_id)
        if early:
            problems.append(
                f"the gated intent {parked.intent_id} was answered before any decision: "
                + "; ".join(
                    f"{r.doc.get('status')} {r.error.get('code')} {r.error.get('message', '')[:120]!r}" for r in early
                )
            )
        pending = [p for p in approvals.list_pending(self.store, 10_000) if p.intent_id == parked.intent_id]
        if len(pending) != 1:
            return problems + [f"{len(pending)} pending approvals for the gated intent {parked.intent_id}, not 1"]
        approval_id = pending[0].approval_id
        kinds = {"approve": ["approve"], "deny": ["deny"], "approve_twice": ["approve", "approve"]}
        kinds["approve_and_deny"] = ["approve", "deny"]
        moves = kinds[parked.case.decision]
        with ThreadPoolExecutor(len(moves)) as pool:  # two people deciding at once
            decided = list(
                pool.map(
                    lambda move: (
                        move,
                        (approvals.approve if move == "approve" else approvals.deny)(
                            self.store, BROKER_URL, approval_id, APPROVER
                        ),
                    ),
                    moves,
                )
            )
        self.resend(parked)  # timing "racing": while the decision is carried out
        won = [move for move, decision in decided if decision.ok]
        if len(won) != 1:
            return problems + [f"{len(won)} of {len(moves)} decisions at once took effect: {decided}"]
        parked.outcome = won[0]
        self.tally.approvals += 1
        if not self.wait(lambda: len(self.receipts(parked.intent_id)) > len(early), RECEIPT_WAIT):
            problems.append(f"no receipt within {RECEIPT_WAIT:g} s after the gated intent was {parked.outcome}d")
        if parked.other_agent_title is not None:
            self.wait(lambda: self.receipts(parked.intent_id, AGENT), 10)
        return problems

    def hold(self, slow: SlowClients) -> list[socket.socket]:
        port = self.fleet.metrics_port(slow.target)
        held: list[socket.socket] = []
        for n, count in enumerate(slow.per_address):
            for _ in range(count):
                try:
                    sock = socket.create_connection(
                        ("127.0.0.1", port), timeout=5, source_address=(f"127.0.0.{n + 2}", 0)
                    )
                    if slow.opening:
                        sock.sendall(slow.opening)
                except OSError:  # refused or cut off at once (the per-client bound): that is allowed
                    continue
                held.append(sock)
        self.tally.slow_sockets += len(held)
        return held

    # -- waiting ----------------------------------------------------------------------------------

    def wait(self, done: Any, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not done():
            if time.monotonic() > deadline:
                return False
            self.tap.drain(0.1)
        return True

    def receipts(self, intent_id: str, agent: str | None = None) -> list[TapReceipt]:
        """The intent's receipts (not its approval_pending notices) from ``agent`` (default: all but
        the other agent, whose intent may share an id with the gated one)."""
        return [
            r
            for r in self.tap.for_intent(intent_id)
            if r.doc.get("type") != "approval_pending"
            and (r.doc.get("agent_id") == agent if agent else r.doc.get("agent_id") != AGENT)
        ]

    def notices(self, intent_id: str) -> list[TapReceipt]:
        return [r for r in self.tap.for_intent(intent_id) if r.doc.get("type") == "approval_pending"]

    # -- judging ----------------------------------------------------------------------------------

    def which(self, s: Sent) -> str:
        return f"{s.intent_id} {s.msg!r}"

    def judge(self, s: Sent) -> list[str]:
        got = self.receipts(s.intent_id)
        problems: list[str] = []
        if len(got) > 1 or (s.exact and len(got) != 1):
            answers = [(r.doc.get("status"), r.error.get("code"), r.routing_key[:40]) for r in got]
            problems.append(
                f"{len(got)} receipts ({answers}), not {'exactly' if s.exact else 'at most'} one, for {self.which(s)}"
            )
        for r in got:
            wrong = structured(r)
            if wrong:
                problems.append(f"an unstructured receipt ({wrong}) for {self.which(s)}")
            if not own_key(r.routing_key, GEN_AGENT):
                problems.append(
                    f"the receipt went to {r.routing_key[:60]!r}, not the sender's own key, for {self.which(s)}"
                )
            self.tally.codes[r.error.get("code") or "succeeded"] += 1
        receipt = got[0] if len(got) == 1 else None
        status = receipt.doc.get("status") if receipt else None
        code = receipt.error.get("code") if receipt else None
        action = s.msg.action
        if action in (CREATE, REGISTER) and s.msg.title is not None and s.doc.get("action") == action:
            calls = len(self.system.requests("POST", title=s.title))
            if calls > 1 or (status == "succeeded" and calls != 1) or (status == "rejected" and calls):
                problems.append(f"the downstream was called {calls} times for a {status} intent: {self.which(s)}")
        if action == ACTIONS["sql"] and s.clean:
            self.tally.judged["sql"] += 1
            problems += self.judge_sql(s, code)
        if action == REGISTER and s.clean and receipt is not None:
            self.tally.judged["patterns"] += 1
            problems += self.judge_patterns(s, receipt)
        return problems

    def judge_sql(self, s: Sent, code: str | None) -> list[str]:
        if "\x00" in s.title:
            return (
                []
                if code == "VALIDATION_FAILED"
                else [f"a NUL for PostgreSQL was answered {code}, not VALIDATION_FAILED: {self.which(s)}"]
            )
        if code in NOT_THE_AGENTS_FAULT:
            return [f"the agent's value was answered {code} (counted against the system): {self.which(s)}"]
        rows = self.pg.scalar("SELECT count(*) FROM shop.items WHERE title = %s", (s.title,))
        if rows > 1 or (code is None and rows != 1):
            return [f"PostgreSQL holds {rows} rows for a {code or 'succeeded'} intent: {self.which(s)}"]
        return []

    def judge_patterns(self, s: Sent, receipt: TapReceipt) -> list[str]:
        """The regex fields are refused (``pattern``) exactly when RE2 refuses the value."""
        params = s.doc["params"]
        failing = {
            name
            for name, value in params.items()
            if name in PATTERNS and isinstance(value, str) and PATTERNS[name].search(value) is None
        }
        typed = {name for name, value in params.items() if name != "title" and not isinstance(value, str)}
        code = receipt.error.get("code")
        if not failing and not typed:
            if receipt.doc.get("status") != "succeeded":
                return [
                    f"every regex field matches (RE2), yet the answer is {code}: {receipt.error.get('message', '')[:200]!r} for {self.which(s)}"
                ]
            return []
        if code not in REFUSED_BY_ROUTER:
            return [
                f"regex fields {sorted(failing)} do not match (RE2), yet the answer is {code or 'succeeded'} for {self.which(s)}"
            ]
        if code == "VALIDATION_FAILED":
            flagged = {
                str(d.get("field", "")).rsplit(".", 1)[-1]
                for d in receipt.error.get("details") or []
                if d.get("code") == "pattern"
            }
            if flagged != failing:
                return [f"pattern refusals for {sorted(flagged)}, RE2 refuses {sorted(failing)}: {self.which(s)}"]
        return []

    def judge_approval(self, parked: Parked) -> list[str]:
        problems: list[str] = []
        got = self.receipts(parked.intent_id)
        want = "succeeded" if parked.outcome == "approve" else "rejected"
        answers = [(r.doc.get("status"), r.error.get("code")) for r in got]
        # racing resends may come after the receipt, when the id is answered like any other (the
        # hold lasts until the receipt is sent): then the first receipt must be the decided work's
        racing = parked.case.timing == "racing"
        if not got or got[0].doc.get("status") != want or (len(got) != 1 and not racing):
            problems.append(
                f"the gated intent {parked.intent_id} ({parked.case!r}) ended in receipts {answers}, not one {want}"
            )
        calls = self.system.requests("POST", title=parked.title)
        expected = 1 if parked.outcome == "approve" else 0
        if len(calls) != expected or any(c["body"].get("amount") != parked.case.amount for c in calls):
            problems.append(f"the approved work ran {len(calls)} times (expected {expected}) for {parked.case!r}")
        for other in parked.others if not racing else []:
            if self.system.requests(title=other) or self.system.requests(title=other + "\u202e\x00\uffff"):
                problems.append(f"a resend of the gated id ran ({other}) for {parked.case!r}")
        if parked.other_agent_title is not None:
            theirs = self.receipts(parked.intent_id, AGENT)
            ran = len(self.system.requests("POST", title=parked.other_agent_title))
            if len(theirs) != 1 or theirs[0].doc.get("status") != "succeeded" or ran != 1:
                answers = [(r.doc.get("status"), r.error.get("code"), r.error.get("message", "")[:100]) for r in theirs]
                problems.append(
                    f"another agent's intent with the gated id got {answers} and ran {ran} times, not one success"
                )
            leaked = [r for r in self.notices(parked.intent_id) if own_key(r.routing_key, AGENT)]
            if leaked:
                problems.append(f"another agent got the gated intent's approval notice: {leaked[0].body[:200]!r}")
        return problems

    def judge_strays(self, seen0: int, sent: list[Sent]) -> list[str]:
        """Receipts to the generator's agent that no knowable message explains: at most one for each
        message with a hostile id; and no second receipt for the last example's ids."""
        known = {s.intent_id for s in sent if s.exact}
        unknowable = sum(s.accepted for s in sent) - len(known)
        strays = [
            r
            for r in self.tap.seen[seen0:]
            if r.doc.get("agent_id") == GEN_AGENT
            and r.intent_id not in known
            and r.doc.get("type") != "approval_pending"
        ]
        problems = []
        late = [r for r in strays if r.intent_id in self.previous]
        if late:
            problems.append(f"a second (late) receipt for the previous example's {sorted({r.intent_id for r in late})}")
        if len(strays) - len(late) > unknowable:
            ids = [brief(r.intent_id or "") for r in strays[:5]]
            problems.append(f"{len(strays)} receipts nobody sent a knowable intent for, {unknowable} allowed: {ids}")
        for r in strays:
            wrong = structured(r)
            if wrong:
                problems.append(f"an unstructured receipt ({wrong}) for {brief(r.intent_id or '')}")
        return problems

    def judge_fleet(self, before: dict[str, int], peak_rss: int, dlq0: int, allowed_letters: int) -> list[str]:
        problems: list[str] = []
        now = pids(self.fleet)
        for name, pid in before.items():
            proc = self.fleet.procs.get(name)
            if proc is None or proc.poll() is not None or now.get(name) != pid:
                problems.append(f"{name} (pid {pid}) died: {self.fleet.log(name)[-800:]}")
        if problems:
            return problems
        started = time.monotonic()
        answered = probe(timeout=10)
        if answered is None or answered.status != "succeeded":
            problems.append(f"another agent's intent was not served within 10 s: {answered}")
        elif time.monotonic() - started > 10:
            problems.append(f"another agent's intent took {time.monotonic() - started:.1f} s")
        rss = max(peak_rss, rss_bytes(before["router"]))
        if rss >= ROUTER_RSS_LIMIT:
            problems.append(f"router RSS reached {rss / 1e6:.0f} MB")
        queues = [INTENTS, f"reach.connector.{CONNECTOR}", f"reach.connector.{SQL_CONNECTOR}"]
        if not self.wait(lambda: all(queue_depth(q)[0] == 0 for q in queues), 10):
            problems.append(f"queues not drained: {[(q, queue_depth(q)[0]) for q in queues]}")
        grown = dlq_depth() - dlq0
        if grown > allowed_letters:
            problems.append(f"reach.dlq grew by {grown} for {allowed_letters} messages")
        for connector in (CONNECTOR, SQL_CONNECTOR):
            state = self.store.hget(keys.breaker(connector), "state")
            if state not in (None, b"closed"):
                problems.append(f"the breaker of {connector} is {state!r}")
        return problems

    def log_size(self, name: str) -> int:
        path = self.fleet.log_dir / f"{name}.log"
        return path.stat().st_size if path.exists() else 0

    def judge_logs(self, sizes: dict[str, int]) -> list[str]:
        """No process printed a traceback: nothing an outsider sends is a bug, and a traceback per
        message or connection lets them fill the log."""
        problems = []
        for name, size in sizes.items():
            with (self.fleet.log_dir / f"{name}.log").open("rb") as log:
                log.seek(size)
                grown = log.read()
            at = grown.find(b"Traceback (most recent call last)")
            if at >= 0:
                problems.append(f"{name} logged a traceback: {grown[at : at + 1500].decode('utf-8', 'replace')}")
        return problems

    def served_meanwhile(self, slow: SlowClients) -> list[str]:
        """The held process's /metrics and /healthz still answer another client within 5 s."""
        port = self.fleet.metrics_port(slow.target)
        problems = []
        for path in ("/metrics", "/healthz"):
            started = time.monotonic()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
                    status = response.status
            except (urllib.error.URLError, OSError) as exc:
                status = getattr(exc, "code", None) or f"{type(exc).__name__}: {exc}"
            if status != 200:
                problems.append(
                    f"{slow.target}'s {path} answered {status} after {time.monotonic() - started:.1f} s "
                    f"while {slow!r} held"
                )
        return problems


@pytest.fixture(scope="module")
def live(
    fleet: Fleet, tap: ReceiptTap, system: CountingSystem, pg: PostgresServer, redis_client: redis.Redis
) -> Iterator[Live]:
    ready(fleet, "the generated run")
    state = Live(fleet, tap, system, pg, redis_client)
    yield state
    state.close()
    print("\n" + state.tally.summary())


def finish(live: Live) -> None:
    """After the last example: nothing left unacked in reach.intents (a loop holds its message for
    good; the last example's own messages may still be in the router's hands for a moment on a
    busy machine)."""
    assert_intents_empty(timeout=30.0)


@pytest.fixture
def bounded_shrinking(monkeypatch: pytest.MonkeyPatch) -> None:
    """A failing example is shrunk for at most 90 s, not Hypothesis's 5 minutes: each shrinking
    step here is an example against the live fleet (the unshrunk one is printed first anyway)."""
    from hypothesis.internal.conjecture import engine

    if hasattr(engine, "MAX_SHRINKING_SECONDS"):
        monkeypatch.setattr(engine, "MAX_SHRINKING_SECONDS", 90)


@CI
@given(scenario=scenarios(TARGETS))
def test_generated_hostile_input_keeps_every_fleet_property(
    bounded_shrinking: None, live: Live, scenario: Scenario
) -> None:
    live.check(scenario)


@settings(CI, max_examples=8)
@given(scenario=regex_scenarios(TARGETS))
def test_generated_regex_heavy_params_are_judged_by_re2_alone(
    bounded_shrinking: None, live: Live, scenario: Scenario
) -> None:
    live.check(scenario)


def test_after_the_generated_run_nothing_is_left_in_reach_intents(live: Live) -> None:
    finish(live)


@pytest.fixture
def soak_only(request: pytest.FixtureRequest) -> None:
    markexpr = request.config.getoption("markexpr") or ""
    if "soak" not in markexpr or "not soak" in markexpr:
        pytest.skip("the soak variant runs only when asked for: -m soak")


@pytest.mark.soak
@SOAK
@given(scenario=st.one_of(scenarios(TARGETS, max_messages=10), regex_scenarios(TARGETS, max_messages=12)))
def test_soak_generated_hostile_input_keeps_every_fleet_property(
    soak_only: None, live: Live, scenario: Scenario
) -> None:
    live.check(scenario)


def rst_close(sock: socket.socket) -> None:
    """Close with a TCP reset (SO_LINGER 0), as a client that gives up or crashes does."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


@pytest.mark.parametrize("process", ["router", CONNECTOR])
def test_clients_that_give_up_leave_no_traceback_in_the_processs_log(fleet: Fleet, process: str) -> None:
    """The slow clients of the generated run showed it: every probes/metrics client that went away
    before its answer (reset, broken pipe) or timed out printed a ~1.7 KB traceback to the
    process's log, so anyone who can reach REACH_METRICS_PORT could fill the log at their own
    connection rate (the per-client bound limits connections at once, not their rate)."""
    port = fleet.metrics_port(process)
    log_path = fleet.log_dir / f"{process}.log"
    size_before = log_path.stat().st_size
    for i in range(40):
        sock = socket.create_connection(("127.0.0.1", port), timeout=5, source_address=("127.0.0.5", 0))
        # half a header (the server's read is reset), or a whole request (its write is)
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n" + (b"\r\n" if i % 2 else b""))
        rst_close(sock)
    time.sleep(1.5)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as response:
        assert response.status == 200
    with log_path.open("rb") as log:
        log.seek(size_before)
        grown = log.read()
    tracebacks = grown.count(b"Traceback (most recent call last)")
    assert tracebacks == 0 and b"Exception occurred during processing" not in grown, (
        f"{process}'s log grew {len(grown)} bytes with {tracebacks} tracebacks for 40 clients that gave up: "
        f"{grown[-600:].decode('utf-8', 'replace')}"
    )
    assert len(grown) < 8 * 1024, f"{process}'s log grew {len(grown)} bytes for 40 clients that gave up"
