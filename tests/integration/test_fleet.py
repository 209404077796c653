"""The fleet end to end: real router and pool processes, real RabbitMQ and Redis, real HTTP systems."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from kombu import Connection, Consumer, Queue

from examples.ticket_system import TicketSystem
from producers.client import ReachClient
from tests.fleet import BROKER_URL, REDIS_URL, Fleet, agent
from tests.waiting import wait_for
from workers.state import keys
from workers.transport.topology import DLQ, INTENTS_EXCHANGE, RECEIPTS_EXCHANGE, DeadLetterBounds, dead_letter_queue

CATALOG = """
connector:
  name: fast_tickets
  endpoint: {fast}
  domain: support
  actions:
    - action: create_ticket
      description: Create a new ticket
      path: POST /tickets
      input:
        title: {{ type: string, required: true, description: Ticket title, at most 100 chars }}
        description: {{ type: string, required: true }}
        priority: {{ type: enum, values: [low, medium, high], default: medium }}
      permission: write
      idempotent: false
    - action: query_ticket
      description: Get a ticket by its id
      path: GET /tickets/{{tid}}
      input:
        tid: {{ type: string, required: true }}
      permission: read
---
connector:
  name: slow_tickets
  endpoint: {slow}
  pool: {{ concurrency: 2 }}
  actions:
    - action: create_ticket
      path: POST /tickets
      input:
        title: {{ type: string, required: true }}
        description: {{ type: string, required: true }}
      permission: write
      timeout: 10s
---
agent_app:
  name: tester
  connector_bindings:
    - connector: fast_tickets
      allowed_actions: [create_ticket, query_ticket]
    - connector: slow_tickets
      allowed_actions: ["*"]
---
agent_app:
  name: reader
  connector_bindings:
    - connector: fast_tickets
      allowed_actions: [query_ticket]
---
agent_app:
  name: guest
  connector_bindings:
    - connector: fast_tickets
      allowed_actions: [query_ticket]
"""

CONTRACT_FIELDS = {"intent_id", "agent_id", "action", "connector", "status", "success", "data", "error", "execution"}
EXECUTION_FIELDS = {
    "trace_id",
    "attempts",
    "latency_ms",
    "queue_ms",
    "downstream_ms",
    "received_at",
    "finished_at",
    "deduplicated",
}
NEW_TICKET = {"title": "Printer", "description": "on fire", "priority": "high"}
CREATE = "fast_tickets.create_ticket"  # bare create_ticket is ambiguous for tester (two connectors)


@pytest.fixture(scope="module")
def systems() -> Iterator[tuple[TicketSystem, TicketSystem]]:
    fast, slow = TicketSystem().start(), TicketSystem().start()
    yield fast, slow
    fast.stop()
    slow.stop()


@pytest.fixture(scope="module")
def fleet(systems: tuple[TicketSystem, TicketSystem]) -> Iterator[Fleet]:
    fast, slow = systems
    with Fleet(CATALOG.format(fast=fast.url, slow=slow.url), ["fast_tickets", "slow_tickets"]) as running:
        yield running


@pytest.fixture
def fast(systems: tuple[TicketSystem, TicketSystem], fleet: Fleet) -> TicketSystem:
    systems[0].state.reset()
    return systems[0]


@pytest.fixture
def slow(systems: tuple[TicketSystem, TicketSystem], fleet: Fleet) -> TicketSystem:
    systems[1].state.reset()
    return systems[1]


@pytest.fixture
def tester() -> Iterator[ReachClient]:
    with agent("tester") as client:
        yield client


def raw_receipts(routing_key: str) -> tuple[Connection, Queue]:
    conn = Connection(BROKER_URL)
    queue = Queue(
        f"test-raw-{uuid.uuid4().hex[:8]}", RECEIPTS_EXCHANGE, routing_key=routing_key, exclusive=True, auto_delete=True
    )
    queue(conn.default_channel).declare()
    return conn, queue


def collect(conn: Connection, queue: Queue, count: int, timeout: float = 20) -> list[Any]:
    got: list[Any] = []
    with Consumer(conn, [queue], on_message=got.append, accept=["json"]):
        end = time.time() + timeout
        while len(got) < count and time.time() < end:
            try:
                conn.drain_events(timeout=0.5)
            except TimeoutError:
                pass
    for message in got:
        message.ack()
    return got


def publish_raw(body: bytes, **properties: Any) -> None:
    with Connection(BROKER_URL, transport_options={"confirm_publish": True}) as conn:
        conn.Producer().publish(
            body,
            exchange=INTENTS_EXCHANGE,
            routing_key="intent",
            content_type="application/json",
            content_encoding="binary",
            delivery_mode=2,
            **properties,
        )


def test_valid_intent_executes_once_and_receipt_has_every_contract_field(
    fast: TicketSystem, tester: ReachClient
) -> None:
    receipt = tester.call(CREATE, NEW_TICKET, timeout=20)
    assert receipt.status == "succeeded" and receipt.success
    assert receipt.data["ticket_id"] == "TK-0001" and receipt.data["priority"] == "high"
    assert receipt.connector == "fast_tickets" and receipt.action == "create_ticket" and receipt.agent_id == "tester"
    assert len(fast.requests("POST")) == 1
    doc = json.loads(receipt.model_dump_json())
    assert CONTRACT_FIELDS <= set(doc) and EXECUTION_FIELDS <= set(doc["execution"])
    assert doc["execution"]["attempts"] == 1 and doc["execution"]["downstream_ms"] > 0
    assert len(doc["execution"]["trace_id"]) == 32


def test_receipt_is_persistent_json_correlated_and_routed_to_reply_to(fast: TicketSystem) -> None:
    reply_to = f"tester.custom{uuid.uuid4().hex[:8]}"
    conn, queue = raw_receipts(reply_to)
    try:
        with ReachClient("tester", BROKER_URL, reply_to=reply_to, drop_duplicates=False) as client:
            intent_id = client.publish("query_ticket", {"tid": "TK-4242"})
            messages = collect(conn, queue, 1)
    finally:
        conn.release()
    assert len(messages) == 1
    message = messages[0]
    assert message.properties["correlation_id"] == intent_id
    assert message.properties["delivery_mode"] == 2
    assert message.content_type == "application/json"
    assert message.delivery_info["routing_key"] == reply_to
    body = json.loads(message.body)
    assert body["intent_id"] == intent_id and body["error"]["code"] == "DOWNSTREAM_NOT_FOUND"
    assert "retry_after_ms" not in body["error"]  # only present when set


def test_receipt_is_stored_in_redis_by_agent_and_intent_id(fast: TicketSystem, tester: ReachClient) -> None:
    receipt = tester.call("query_ticket", {"tid": "TK-0404"}, timeout=20)
    stored = redis.Redis.from_url(REDIS_URL).get(keys.receipt(receipt.agent_id, receipt.intent_id))
    assert stored is not None and json.loads(stored)["intent_id"] == receipt.intent_id
    assert redis.Redis.from_url(REDIS_URL).ttl(keys.receipt(receipt.agent_id, receipt.intent_id)) > 3600


@pytest.mark.parametrize(
    "params, code, field",
    [
        ({"title": "x", "description": "d", "priority": "urgent"}, "enum", "priority"),
        ({"description": "d"}, "required", "title"),
        ({"title": "x", "description": "d", "assignee": "bob"}, "unknown", "assignee"),
        ({"title": 5, "description": "d"}, "type", "title"),
    ],
)
def test_invalid_params_are_rejected_before_the_downstream(
    fast: TicketSystem, tester: ReachClient, params: dict[str, Any], code: str, field: str
) -> None:
    receipt = tester.call("fast_tickets.create_ticket", params, timeout=20)
    assert receipt.status == "rejected" and receipt.error is not None
    assert receipt.error.code == "VALIDATION_FAILED" and receipt.error.retryable is False
    assert any(d["field"] == field and d["code"] == code for d in receipt.error.details), receipt.error.details
    assert field in receipt.error.suggestion
    assert fast.requests() == []


def test_unbound_action_is_permission_denied_and_never_reaches_the_downstream(fast: TicketSystem) -> None:
    with agent("reader") as reader:
        receipt = reader.call("create_ticket", NEW_TICKET, timeout=20)
    assert receipt.error is not None and receipt.error.code == "PERMISSION_DENIED"
    assert "fast_tickets.query_ticket" in receipt.error.suggestion
    assert fast.requests() == []


def test_unknown_agent_and_unknown_action_are_rejected(fast: TicketSystem, tester: ReachClient) -> None:
    with agent("nobody") as nobody:
        assert nobody.call("query_ticket", {"tid": "TK-1"}, timeout=20).error.code == "PERMISSION_DENIED"
    receipt = tester.call("query_tiket", {"tid": "TK-1"}, timeout=20)
    assert receipt.error.code == "UNKNOWN_ACTION" and "query_ticket" in receipt.error.suggestion
    assert fast.requests() == []


def test_action_offered_by_two_connectors_is_ambiguous_unless_qualified_or_in_a_domain(
    fast: TicketSystem, slow: TicketSystem, tester: ReachClient
) -> None:
    ambiguous = tester.call("create_ticket", {"title": "t", "description": "d"}, timeout=20)
    assert ambiguous.error is not None and ambiguous.error.code == "AMBIGUOUS_ACTION"
    assert "fast_tickets.create_ticket" in ambiguous.error.suggestion
    assert "slow_tickets.create_ticket" in ambiguous.error.suggestion
    by_domain = tester.call(
        "create_ticket", {"title": "t", "description": "d"}, context={"domain": "support"}, timeout=20
    )
    assert by_domain.success and by_domain.connector == "fast_tickets"
    qualified = tester.call("slow_tickets__create_ticket", {"title": "t", "description": "d"}, timeout=20)
    assert qualified.success and qualified.connector == "slow_tickets"
    # reader is bound to fast_tickets only: its bindings decide
    with agent("reader") as reader:
        assert reader.call("query_ticket", {"tid": "TK-1"}, timeout=20).connector == "fast_tickets"


@pytest.mark.parametrize(
    "tid",
    ["../x", "..", "%2F", "a/b", "x?admin=1", "x#frag", "a\r\nX-Injected: 1", "@evil.example", "http://127.0.0.1:1/"],
)
def test_path_parameter_never_changes_the_requested_path(fast: TicketSystem, tester: ReachClient, tid: str) -> None:
    receipt = tester.call("query_ticket", {"tid": tid}, timeout=20)
    assert receipt.error is not None and receipt.error.code == "DOWNSTREAM_NOT_FOUND"
    (request,) = fast.requests("GET")
    path = request["path"]
    assert path.startswith("/tickets/") and path.count("/") == 2 and "?" not in path and "#" not in path
    assert "x-injected" not in request["headers"]
    from urllib.parse import unquote

    assert unquote(path[len("/tickets/") :]) == tid


def test_fifty_intents_get_exactly_fifty_receipts(fast: TicketSystem, tester: ReachClient) -> None:
    ids = [tester.publish(CREATE, {"title": f"t{i}", "description": "d"}) for i in range(50)]
    receipts = []
    for receipt in tester.receipts(timeout=10):
        receipts.append(receipt)
        if len(receipts) >= 50:
            break
    # any extra receipt would show up within a short grace period
    receipts.extend(tester.receipts(timeout=1.5))
    assert sorted(r.intent_id for r in receipts) == sorted(ids)
    assert all(r.success for r in receipts)
    assert len(fast.requests("POST")) == 50


def test_slow_connector_backlog_does_not_delay_another_connector(
    fast: TicketSystem, slow: TicketSystem, tester: ReachClient
) -> None:
    baseline = []
    for _ in range(3):
        started = time.perf_counter()
        assert (
            tester.call("fast_tickets.query_ticket", {"tid": "TK-1"}, timeout=20).error.code == "DOWNSTREAM_NOT_FOUND"
        )
        baseline.append(time.perf_counter() - started)
    slow.state.delay = 3.0
    backlog = [tester.publish("slow_tickets.create_ticket", {"title": f"s{i}", "description": "d"}) for i in range(30)]
    # the slow pool is busy (both its threads wait on the slow system) and its queue is long
    wait_for(lambda: len(slow.requests("POST")) >= 2, 10, "the slow pool never took its backlog")
    during = []
    for _ in range(3):
        started = time.perf_counter()
        receipt = tester.call("fast_tickets.query_ticket", {"tid": "TK-1"}, timeout=20)
        during.append(time.perf_counter() - started)
        assert receipt.error.code == "DOWNSTREAM_NOT_FOUND"
    slow_done = [r for r in tester.receipts(timeout=0.2) if r.intent_id in backlog]
    assert len(slow_done) < 30, "the backlog was expected to still be in progress"
    # generous bound: the fast connector answers in its own time, not after 30 x 3 s of backlog
    assert max(during) < max(1.5, 10 * max(baseline)), (baseline, during)
    slow.state.delay = 0.0  # let the backlog drain quickly


JUNK: list[tuple[str, bytes]] = [
    ("invalid utf-8", b'{"action": "\xff\xfe"}'),
    ("not json", b"{not json"),
    ("a list", b"[1, 2, 3]"),
    ("a number", b"42"),
    ("null", b"null"),
    ("deep nesting", b"[" * 100_000 + b"]" * 100_000),
    ("oversized", b'{"action": "query_ticket", "params": {"tid": "' + b"x" * 300_000 + b'"}}'),
    ("wrong types", b'{"action": 5, "params": []}'),
    ("NaN", b'{"action": "query_ticket", "params": {"tid": NaN}}'),
    ("duplicate keys", b'{"action": "query_ticket", "action": "create_ticket"}'),
    (
        "celery task message",
        json.dumps(
            [[{"intent_id": "x", "connector": "fast_tickets", "action": "create_ticket", "params": NEW_TICKET}], {}, {}]
        ).encode(),
    ),
]


def test_junk_gets_invalid_intent_receipts_and_dead_letters_and_the_router_keeps_going(
    fast: TicketSystem, tester: ReachClient
) -> None:
    conn = Connection(BROKER_URL)
    dlq = dead_letter_queue(DeadLetterBounds())  # declared as the fleet declares it
    dlq(conn.default_channel).declare()
    conn.default_channel.queue_purge(DLQ.name)
    ids = {}
    for name, body in JUNK:
        message_id = f"junk-{uuid.uuid4().hex[:10]}"
        ids[message_id] = name
        headers = {"agent_id": "tester"}
        if name == "celery task message":
            # what a Celery client would send: it must be read as data, never run as a task
            headers.update(task="reach.execute", id=message_id, lang="py", argsrepr="", kwargsrepr="")
        publish_raw(body, headers=headers, message_id=message_id)
    got = {}
    for message_id in ids:
        receipt = tester.wait(message_id, timeout=20)
        got[ids[message_id]] = receipt.error.code if receipt.error else receipt.status
    assert got == {name: "INVALID_INTENT" for name in ids.values()}
    dead = collect(conn, dlq, len(ids), timeout=10)
    conn.release()
    assert {m.properties["message_id"] for m in dead} == set(ids)
    assert all(m.headers.get("x-reach-reason") for m in dead)
    assert fast.requests() == []
    # the router is still there and still right
    assert tester.call(CREATE, NEW_TICKET, timeout=20).success


def test_message_without_identity_goes_to_the_dead_letter_queue_only(fast: TicketSystem) -> None:
    with Connection(BROKER_URL) as conn:
        dlq = dead_letter_queue(DeadLetterBounds())  # declared as the fleet declares it
        dlq(conn.default_channel).declare()
        message_id = f"anon-{uuid.uuid4().hex[:10]}"
        publish_raw(b"garbage", message_id=message_id)
        dead = [m for m in collect(conn, dlq, 1, timeout=10) if m.properties["message_id"] == message_id]
    assert len(dead) == 1 and "JSON" in dead[0].headers["x-reach-reason"]


@pytest.mark.parametrize(
    "fmt, body",
    [
        (
            "openai",
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "fast_tickets__query_ticket", "arguments": json.dumps({"tid": "TK-7"})},
            },
        ),
        (
            "anthropic",
            {"type": "tool_use", "id": "toolu_1", "name": "fast_tickets__query_ticket", "input": {"tid": "TK-7"}},
        ),
        (
            "mcp",
            {
                "jsonrpc": "2.0",
                "id": 7,
                "method": "tools/call",
                "params": {"name": "fast_tickets__query_ticket", "arguments": {"tid": "TK-7"}},
            },
        ),
        (
            "langchain",
            {"name": "fast_tickets__query_ticket", "args": {"tid": "TK-7"}, "id": "lc_1", "type": "tool_call"},
        ),
    ],
)
def test_foreign_tool_call_formats_are_accepted(
    fast: TicketSystem, tester: ReachClient, fmt: str, body: dict[str, Any]
) -> None:
    message_id = f"{fmt}-{uuid.uuid4().hex[:10]}"
    unique = uuid.uuid4().hex[:8]
    doc = json.loads(
        json.dumps(body)
        .replace('"call_1"', f'"call_{unique}"')
        .replace('"toolu_1"', f'"toolu_{unique}"')
        .replace('"lc_1"', f'"lc_{unique}"')
    )
    publish_raw(json.dumps(doc).encode(), headers={"agent_id": "tester"}, message_id=message_id)
    # a globally unique foreign id becomes the intent id; MCP's per-session counter does not
    expected = {
        "openai": f"call_{unique}",
        "anthropic": f"toolu_{unique}",
        "mcp": message_id,
        "langchain": f"lc_{unique}",
    }[fmt]
    receipt = tester.wait(expected, timeout=20)
    assert receipt.error is not None and receipt.error.code == "DOWNSTREAM_NOT_FOUND"
    assert [r["path"] for r in fast.requests("GET")] == ["/tickets/TK-7"]


def test_authenticated_user_id_is_the_identity_and_a_claimed_one_is_refused(fast: TicketSystem) -> None:
    with agent("guest") as guest, agent("tester") as tester:
        # RabbitMQ checks user_id against the connection's login (guest here)
        good = f"uid-{uuid.uuid4().hex[:8]}"
        publish_raw(
            json.dumps({"action": "query_ticket", "params": {"tid": "TK-1"}}).encode(), message_id=good, user_id="guest"
        )
        assert guest.wait(good, timeout=20).error.code == "DOWNSTREAM_NOT_FOUND"
        forged = f"forged-{uuid.uuid4().hex[:8]}"
        publish_raw(
            json.dumps({"action": "create_ticket", "agent_id": "tester", "params": NEW_TICKET}).encode(),
            message_id=forged,
            user_id="guest",
        )
        receipt = guest.wait(forged, timeout=20)
        assert receipt.error.code == "PERMISSION_DENIED" and receipt.agent_id == "guest"
        assert all(r.intent_id != forged for r in tester.receipts(timeout=1.0))
    assert fast.requests("POST") == []


def test_deadline_in_the_past_is_rejected(fast: TicketSystem, tester: ReachClient) -> None:
    receipt = tester.call(CREATE, NEW_TICKET, deadline="2020-01-01T00:00:00Z", timeout=20)
    assert receipt.error.code == "DEADLINE_EXCEEDED" and receipt.status == "rejected"
    assert fast.requests() == []


def test_agent_gets_its_own_tools(fleet: Fleet) -> None:
    with agent("reader") as reader:
        tools = reader.tools("anthropic")
    assert [t["name"] for t in tools] == ["fast_tickets__query_ticket"]
    assert tools[0]["input_schema"]["required"] == ["tid"]


def test_a_pool_dead_letters_what_is_not_a_job_and_runs_no_task_by_name(
    fast: TicketSystem, tester: ReachClient
) -> None:
    """Only the router publishes to a connector queue; anything else found there is kept in
    reach.dlq with the reason, and a Celery task name in the headers runs nothing."""
    queue_name = "reach.connector.fast_tickets"
    job = {
        "intent_id": "x",
        "agent_id": "tester",
        "connector": "fast_tickets",
        "action": "create_ticket",
        "params": NEW_TICKET,
    }
    messages = {
        f"nojob-{n}-{uuid.uuid4().hex[:8]}": message
        for n, message in enumerate(
            [
                (json.dumps([[], {}, {}]).encode(), "celery.backend_cleanup"),
                (b"\xff not json", "reach.execute"),
                (json.dumps([["not a job"], {}, {}]).encode(), "reach.execute"),
                (json.dumps([[job], {}, {}]).encode(), "reach.other_task"),
            ]
        )
    }
    with Connection(BROKER_URL, transport_options={"confirm_publish": True}) as conn:
        dlq = dead_letter_queue(DeadLetterBounds())  # declared as the fleet declares it
        dlq(conn.default_channel).declare()
        conn.default_channel.queue_purge(DLQ.name)
        for message_id, (body, task) in messages.items():
            conn.Producer().publish(
                body,
                exchange="",
                routing_key=queue_name,
                content_type="application/json",
                content_encoding="binary",
                delivery_mode=2,
                message_id=message_id,
                headers={"task": task, "id": message_id, "lang": "py"},
            )
        dead = [m for m in collect(conn, dlq, len(messages), timeout=10) if m.properties["message_id"] in messages]
    assert {m.properties["message_id"] for m in dead} == set(messages)
    assert all(m.headers["x-reach-queue"] == queue_name and queue_name in m.headers["x-reach-reason"] for m in dead)
    assert not any("x-reach-connector" in m.headers for m in dead)  # `reach dlq replay` must not treat them as jobs
    assert fast.requests() == []  # not even the well-formed job under another task name ran
    assert tester.call(CREATE, NEW_TICKET, timeout=20).success  # the pool is still there
