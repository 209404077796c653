"""Connector type agent: another agent answers a connector's actions, through a real fleet.

The answering agents run producers.serve.AgentServer (or, for the raw wire, a plain AMQP consumer)
on the fleet's broker. Covered: success and error answers, a silent agent (unknown for a write, a
retried timeout for a read), an agent that is not running, malformed answers, the idempotency ledger
and the breaker in front of an agent, the hop limit that stops agents calling each other in a loop,
and the broker permissions of an agent's own user."""

from __future__ import annotations

import json
import secrets
import threading
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import amqp
import pytest
from amqp.exceptions import AccessRefused

from connectors.adapters.agent import MAX_AGENT_HOPS
from producers.serve import (
    AGENT_REPLIES_EXCHANGE_NAME,
    AGENTS_EXCHANGE_NAME,
    AgentError,
    AgentServeError,
    AgentServer,
    Request,
)
from producers.wire import Receipt
from tests.fleet import BROKER_URL, Fleet, agent, queue_depth
from tests.integration.legacy_responder import LegacyResponder, Reply
from tests.waiting import wait_for
from workers.ops.agents import create_agent_user, delete_agent_user, vhost_of

RUN = uuid.uuid4().hex[:8]
ALPHA, BETA = f"ag_{RUN}_alpha", f"ag_{RUN}_beta"
VHOST = vhost_of(BROKER_URL)
HELPER_QUEUE = "reach.agent.helper_bot"

CATALOG = f"""
connector:
  name: helper_desk
  type: agent
  agent: helper_bot
  retry: {{max_attempts: 2, initial_backoff: 50ms, max_backoff: 100ms}}
  breaker: {{fail_max: 50, reset_timeout: 30s}}
  actions:
    - action: lookup
      timeout: 3s
      input:
        order_id: {{type: string, required: true}}
      output:
        state: {{type: string}}
    - action: make_note
      permission: write
      idempotent: false
      timeout: 1s
      input:
        text: {{type: string, required: true}}
    - action: slow_lookup
      timeout: 1s
      input:
        order_id: {{type: string, required: true}}
---
connector:
  name: fragile_desk
  type: agent
  agent: fragile_bot
  retry: {{max_attempts: 1}}
  breaker: {{fail_max: 2, reset_timeout: 30s}}
  actions:
    - {{action: check, timeout: 3s, input: {{order_id: {{type: string, required: true}}}}}}
---
connector:
  name: ping_a
  type: agent
  agent: loop_a
  retry: {{max_attempts: 1}}
  actions:
    - {{action: relay, permission: write, timeout: 30s, input: {{n: {{type: integer, required: true}}}}}}
---
connector:
  name: ping_b
  type: agent
  agent: loop_b
  retry: {{max_attempts: 1}}
  actions:
    - {{action: relay, permission: write, timeout: 30s, input: {{n: {{type: integer, required: true}}}}}}
---
connector:
  name: alpha_desk
  type: agent
  agent: {ALPHA}
  actions:
    - {{action: hello, input: {{name: {{type: string}}}}}}
---
agent_app:
  name: desk_bot
  connector_bindings:
    - {{connector: helper_desk, allowed_actions: ["*"]}}
    - {{connector: alpha_desk, allowed_actions: ["*"]}}
    - {{connector: fragile_desk, allowed_actions: ["*"]}}
---
agent_app:
  name: loop_a
  connector_bindings:
    - {{connector: ping_b, allowed_actions: [relay]}}
---
agent_app:
  name: loop_b
  connector_bindings:
    - {{connector: ping_a, allowed_actions: [relay]}}
"""


@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    with Fleet(CATALOG, ["helper_desk", "fragile_desk", "ping_a", "ping_b", "alpha_desk"]) as running:
        yield running


def serving(agent_id: str, handlers: dict[str, Callable[[dict[str, Any], Request], Any]], **kw: Any) -> AgentServer:
    return AgentServer(agent_id, BROKER_URL, handlers, **kw)


def error_code(receipt: Receipt) -> str | None:
    return receipt.error.code.value if receipt.error else None


# -- answering ------------------------------------------------------------------------------------


def test_an_agent_answers_as_a_connector_and_sees_who_asked(fleet: Fleet) -> None:
    seen: list[tuple[dict[str, Any], Request]] = []

    def lookup(params: dict[str, Any], request: Request) -> dict[str, Any]:
        seen.append((params, request))
        return {"state": "shipped", "order_id": params["order_id"]}

    with serving("helper_bot", {"lookup": lookup}), agent("desk_bot") as desk:
        receipt = desk.call("lookup", {"order_id": "O-7"}, timeout=20, idempotency_key="look-7")
    assert receipt.status == "succeeded", receipt
    assert receipt.data == {"state": "shipped", "order_id": "O-7"} and receipt.connector == "helper_desk"
    [(params, request)] = seen
    assert params == {"order_id": "O-7"}
    assert (request.caller, request.intent_id, request.idempotency_key) == ("desk_bot", receipt.intent_id, "look-7")
    assert request.hops == 1 and request.connector == "helper_desk" and request.action == "lookup"
    assert request.seconds_left is not None and 0 < request.seconds_left <= 3


def test_an_agent_error_reaches_the_caller_as_the_receipts_error(fleet: Fleet) -> None:
    calls: list[str] = []

    def lookup(params: dict[str, Any], request: Request) -> Any:
        calls.append(params["order_id"])
        raise AgentError("DOWNSTREAM_NOT_FOUND", f"no order {params['order_id']}", "List the orders first.")

    with serving("helper_bot", {"lookup": lookup}), agent("desk_bot") as desk:
        receipt = desk.call("lookup", {"order_id": "O-404"}, timeout=20)
    assert receipt.status == "failed" and receipt.error is not None
    assert (receipt.error.code, receipt.error.message, receipt.error.suggestion) == (
        "DOWNSTREAM_NOT_FOUND",
        "no order O-404",
        "List the orders first.",
    )
    assert receipt.execution.attempts == 1 and calls == ["O-404"]  # not retried: the agent answered


def test_a_failing_handler_or_an_unserved_action_is_a_downstream_error(fleet: Fleet) -> None:
    def lookup(params: dict[str, Any], request: Request) -> Any:
        raise RuntimeError("database password is hunter2")  # never shown to the caller

    with serving("helper_bot", {"lookup": lookup}), agent("desk_bot") as desk:
        crashed = desk.call("lookup", {"order_id": "O-1"}, timeout=20)
        unserved = desk.call("make_note", {"text": "hi"}, timeout=20)
    assert error_code(crashed) == "DOWNSTREAM_ERROR" and crashed.execution.attempts == 2  # a read: retried
    assert crashed.error is not None and "hunter2" not in crashed.error.message
    assert error_code(unserved) == "DOWNSTREAM_ERROR" and unserved.error is not None
    assert "does not handle make_note" in unserved.error.message


def test_a_silent_agent_leaves_a_write_unknown_and_a_read_timed_out_after_retries(fleet: Fleet) -> None:
    release = threading.Event()
    calls: list[str] = []

    def hang(params: dict[str, Any], request: Request) -> Any:
        calls.append(request.action)
        release.wait(30)
        return {}

    try:
        with serving("helper_bot", {"make_note": hang, "slow_lookup": hang}), agent("desk_bot") as desk:
            write = desk.call("make_note", {"text": "call back"}, timeout=20)
            read = desk.call("slow_lookup", {"order_id": "O-1"}, timeout=20)
            release.set()  # the late answers go to reply queues that no longer wait for them
    finally:
        release.set()
    assert write.status == "unknown" and error_code(write) == "OUTCOME_UNKNOWN" and write.execution.attempts == 1
    assert read.status == "failed" and error_code(read) == "DOWNSTREAM_TIMEOUT" and read.execution.attempts == 2
    assert calls == ["make_note", "slow_lookup", "slow_lookup"]


def test_an_agent_that_is_not_running_is_unreachable_at_once(fleet: Fleet) -> None:
    wait_for(lambda: queue_depth(HELPER_QUEUE)[1] == 0, 10, "a helper_bot consumer is still there")
    with agent("desk_bot") as desk:
        receipt = desk.call("make_note", {"text": "anyone?"}, timeout=20)
    # retried (it was never sent) and quick: nothing waits for a timeout in a queue nobody reads
    assert error_code(receipt) == "DOWNSTREAM_UNREACHABLE" and receipt.execution.attempts == 2
    assert receipt.error is not None and "not consuming" in receipt.error.message
    assert queue_depth(HELPER_QUEUE)[0] == 0  # no request was left behind for it


def test_serving_an_agent_no_connector_names_says_what_is_missing(fleet: Fleet) -> None:
    with pytest.raises(AgentServeError, match="reach.agent.nobody_asked"):
        serving("nobody_asked", {}).start(timeout=10)


# -- the pool's ledger and breaker in front of the agent ---------------------------------------------------


def test_the_same_idempotency_key_reaches_the_agent_once_and_answers_the_first_outcome(fleet: Fleet) -> None:
    notes: list[tuple[str, str | None]] = []

    def make_note(params: dict[str, Any], request: Request) -> dict[str, Any]:
        notes.append((params["text"], request.idempotency_key))
        return {"note_id": f"N-{len(notes)}"}

    key = f"note-{uuid.uuid4().hex}"
    with serving("helper_bot", {"make_note": make_note}), agent("desk_bot") as desk:
        first = desk.call("make_note", {"text": "call back"}, timeout=20, idempotency_key=key)
        second = desk.call("make_note", {"text": "call back"}, timeout=20, idempotency_key=key)
    assert first.status == second.status == "succeeded", (first, second)
    assert first.data == second.data == {"note_id": "N-1"}
    assert second.execution.deduplicated and not first.execution.deduplicated
    assert second.intent_id != first.intent_id
    assert notes == [("call back", key)]  # a write that is not idempotent: answered from the ledger


def test_an_agent_failing_fail_max_times_opens_the_breaker_and_the_next_intent_never_reaches_it(
    fleet: Fleet,
) -> None:
    calls: list[str] = []

    def check(params: dict[str, Any], request: Request) -> Any:
        calls.append(params["order_id"])
        raise AgentError("DOWNSTREAM_ERROR", "the order backend is down")

    with serving("fragile_bot", {"check": check}), agent("desk_bot") as desk:
        failed = [desk.call("fragile_desk.check", {"order_id": f"O-{n}"}, timeout=20) for n in range(2)]
        refused = desk.call("fragile_desk.check", {"order_id": "O-2"}, timeout=20)
    assert [error_code(r) for r in failed] == ["DOWNSTREAM_ERROR", "DOWNSTREAM_ERROR"], failed
    assert all(r.error is not None and r.error.message == "the order backend is down" for r in failed)
    assert refused.status == "rejected" and error_code(refused) == "CONNECTOR_UNAVAILABLE", refused
    assert refused.error is not None and refused.error.retryable and refused.error.retry_after_ms
    # refused by the router (its words, no attempt), not dispatched to the pool to be refused there
    assert "circuit breaker of fragile_desk is open" in refused.error.message and refused.execution.attempts == 0
    assert calls == ["O-0", "O-1"]  # fail_max 2 and no retries: two requests, no third


# -- the raw wire, as an agent in another language speaks it ------------------------------------------


@pytest.mark.parametrize(
    "reply, code",
    [
        (Reply.json({"status": "succeeded", "data": {"state": "open"}}), None),
        (Reply.json({"status": "succeeded"}), "DOWNSTREAM_CONTRACT_VIOLATION"),  # no data is {}: no declared state
        (
            Reply.json({"status": "failed", "error": {"code": "DOWNSTREAM_CONFLICT", "message": "taken"}}),
            "DOWNSTREAM_CONFLICT",
        ),
        (Reply.json({"status": "ok", "data": {}}), "DOWNSTREAM_CONTRACT_VIOLATION"),
        (Reply.json({"status": "succeeded", "date": {}}), "DOWNSTREAM_CONTRACT_VIOLATION"),  # a typo is not data
        (Reply.json({"status": "failed"}), "DOWNSTREAM_CONTRACT_VIOLATION"),
        (
            Reply.json({"status": "failed", "error": {"code": "OUTCOME_UNKNOWN", "message": "?"}}),
            "DOWNSTREAM_CONTRACT_VIOLATION",
        ),
        (Reply.json({"status": "succeeded", "data": {"state": 3}}), "DOWNSTREAM_CONTRACT_VIOLATION"),  # output
        (Reply(b"not json"), "DOWNSTREAM_CONTRACT_VIOLATION"),
    ],
)
def test_answers_on_the_raw_wire(fleet: Fleet, reply: Reply, code: str | None) -> None:
    raw = LegacyResponder(BROKER_URL, [HELPER_QUEUE], reply_exchange=AGENT_REPLIES_EXCHANGE_NAME)
    raw.behaviours[HELPER_QUEUE] = lambda params, n: reply
    raw.start()
    try:
        with agent("desk_bot") as desk:
            receipt = desk.call("lookup", {"order_id": "O-1"}, timeout=20)
    finally:
        raw.stop()
    assert error_code(receipt) == code, receipt
    [seen] = raw.seen()
    request = seen.params
    assert request["v"] == 1 and request["agent_id"] == "desk_bot" and request["params"] == {"order_id": "O-1"}
    assert request["hops"] == 1 and request["intent_id"] == receipt.intent_id and request["deadline"].endswith("Z")
    props = seen.properties
    assert props["reply_to"].startswith("helper_bot.") and props["message_id"] == receipt.intent_id
    assert props["delivery_mode"] == 2 and props["content_type"] == "application/json"
    if code is None:
        assert receipt.data == {"state": "open"}


# -- the loop guard --------------------------------------------------------------------------------------


def test_agents_calling_each_other_in_a_loop_are_refused_after_the_hop_limit(fleet: Fleet) -> None:
    handled: list[tuple[str, int]] = []

    def relay_to(me: str, other: str) -> Callable[[dict[str, Any], Request], Any]:
        def relay(params: dict[str, Any], request: Request) -> dict[str, Any]:
            handled.append((me, request.hops))
            inner = request.call(f"{other}.relay", {"n": params["n"] + 1})  # context.hops passed on
            return {"hops": request.hops, "status": inner.status, "code": error_code(inner), "inner": inner.data}

        return relay

    # each agent holds every request of the chain that reached it until the chain unwinds
    with (
        serving("loop_a", {"relay": relay_to("loop_a", "ping_b")}, concurrency=MAX_AGENT_HOPS),
        serving("loop_b", {"relay": relay_to("loop_b", "ping_a")}, concurrency=MAX_AGENT_HOPS),
        agent("loop_a") as starter,
    ):
        receipt = starter.call("ping_b.relay", {"n": 0}, timeout=60)
    assert receipt.status == "succeeded", receipt
    assert sorted(h for _, h in handled) == list(range(1, MAX_AGENT_HOPS + 1))  # one request per hop, no more
    assert [who for who, _ in sorted(handled, key=lambda x: x[1])] == ["loop_b", "loop_a"] * (MAX_AGENT_HOPS // 2)
    level, chain = receipt.data, []
    while level is not None:
        chain.append((level["hops"], level["status"], level["code"]))
        level = level["inner"]
    assert chain[-1] == (MAX_AGENT_HOPS, "failed", "DOWNSTREAM_VALIDATION_FAILED")  # the refused call
    assert [h for h, _, _ in chain] == list(range(1, MAX_AGENT_HOPS + 1))


def test_an_intent_cannot_claim_more_hops_than_the_wire_allows(fleet: Fleet) -> None:
    with agent("loop_a") as starter:
        starter.publish_raw(
            json.dumps(
                {
                    "intent_id": "too-deep",
                    "agent_id": "loop_a",
                    "action": "ping_b.relay",
                    "params": {"n": 0},
                    "context": {"hops": 65},
                }
            ).encode(),
            message_id="too-deep",
        )
        refused = starter.wait("too-deep", timeout=20)
        at_limit = starter.call("ping_b.relay", {"n": 0}, timeout=20, context={"hops": MAX_AGENT_HOPS})
    assert error_code(refused) == "INVALID_INTENT"
    assert error_code(at_limit) == "DOWNSTREAM_VALIDATION_FAILED" and at_limit.execution.attempts == 1
    assert at_limit.error is not None and at_limit.error.details[0]["field"] == "context.hops"


# -- the agent's broker user -----------------------------------------------------------------------------


def url_for(user: str, password: str) -> str:
    parts = urlsplit(BROKER_URL)
    netloc = f"{quote(user, safe='')}:{quote(password, safe='')}@{parts.hostname}:{parts.port or 5672}"
    return urlunsplit((parts.scheme, netloc, "/" + quote(VHOST, safe=""), "", ""))


@pytest.fixture(scope="module")
def passwords(fleet: Fleet) -> Iterator[dict[str, str]]:
    created = {name: secrets.token_urlsafe(24) for name in (ALPHA, BETA)}
    # side by side: each rabbitmqctl call starts an Erlang VM, seconds apiece
    with ThreadPoolExecutor(2) as pool:
        try:
            list(pool.map(lambda name: create_agent_user(name, created[name], VHOST), created))
            yield created
        finally:
            for name, done in zip(created, pool.map(lambda name: _delete(name), created)):
                if done is not None:
                    print(f"could not delete agent user {name}: {done}")


def _delete(name: str) -> Exception | None:
    try:
        delete_agent_user(name, VHOST)
    except Exception as exc:  # cleanup must not hide the test's own failure
        return exc
    return None


def refused(user: str, password: str, attempt: Callable[[amqp.Channel], Any]) -> bool:
    """Whether the broker refuses ``attempt`` (403) on a fresh connection as ``user``."""
    conn = amqp.Connection(
        f"{urlsplit(BROKER_URL).hostname}:{urlsplit(BROKER_URL).port or 5672}",
        userid=user,
        password=password,
        virtual_host=VHOST,
        connect_timeout=10,
    )
    conn.connect()
    try:
        channel = conn.channel()
        channel.confirm_select()
        try:
            attempt(channel)
        except AccessRefused:
            return True
        return False
    finally:
        try:
            conn.close()
        except Exception:
            pass


def test_an_agent_user_answers_its_own_requests_and_no_other_agents(fleet: Fleet, passwords: dict[str, str]) -> None:
    alpha_url = url_for(ALPHA, passwords[ALPHA])
    # alpha's own least-privilege login is enough: consume its queue, answer through the replies exchange
    with AgentServer(ALPHA, alpha_url, {"hello": lambda params, request: {"as": request.caller}}, concurrency=1):
        with agent("desk_bot") as desk:
            receipt = desk.call("alpha_desk.hello", {}, timeout=20)
    assert receipt.status == "succeeded" and receipt.data == {"as": "desk_bot"}, receipt

    beta = passwords[BETA]
    alpha_queue = f"reach.agent.{ALPHA}"
    publish = amqp.Message(b"{}", content_type="application/json", correlation_id="x")
    assert refused(BETA, beta, lambda ch: ch.basic_consume(alpha_queue, callback=print))
    assert refused(BETA, beta, lambda ch: ch.basic_get(alpha_queue))
    assert refused(
        BETA, beta, lambda ch: ch.basic_publish_confirm(publish, exchange=AGENTS_EXCHANGE_NAME, routing_key=ALPHA)
    )
    # answers only under its own name: calls to alpha cannot be answered by beta
    assert refused(
        BETA,
        beta,
        lambda ch: ch.basic_publish_confirm(publish, exchange=AGENT_REPLIES_EXCHANGE_NAME, routing_key=f"{ALPHA}.x"),
    )
    assert not refused(
        BETA,
        beta,
        lambda ch: ch.basic_publish_confirm(publish, exchange=AGENT_REPLIES_EXCHANGE_NAME, routing_key=f"{BETA}.x"),
    )
    # and never the default exchange (direct reply-to would need it, and it reaches every queue by name)
    assert refused(BETA, beta, lambda ch: ch.basic_publish_confirm(publish, exchange="", routing_key=alpha_queue))
