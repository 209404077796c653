"""ReachClient against the real RabbitMQ: what it puts on the wire and how it collects receipts.

These tests need no fleet. The router may be running during the wider suite and also consumes
``reach.intents``, so each test uses its own agent id, taps the exchange with its own exclusive
queue (a direct exchange copies a message to every queue bound with the key) and filters by
intent_id. Receipts the tests publish themselves use intent ids that were never sent, so a
receipt from a running router can never be mistaken for one of them.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from kombu import Connection, Consumer, Exchange, Producer, Queue
from kombu.message import Message

from producers import ReachClient, ReachError, Receipt, ReceiptTimeout
from producers.wire import ErrorCode, ErrorInfo, Execution
from tests.fleet import BROKER_URL
from workers.transport.topology import declare_all

pytestmark = pytest.mark.integration

INTENTS = Exchange("reach.intents", type="direct", durable=True, auto_delete=False)
RECEIPTS = Exchange("reach.receipts", type="topic", durable=True, auto_delete=False)


@pytest.fixture(scope="module", autouse=True)
def fleet_topology() -> None:
    """ReachClient only checks that the fleet's exchanges exist (passive declares); on a fresh
    broker nothing else may have declared them yet."""
    with Connection(BROKER_URL) as conn:
        declare_all(conn, [])


@pytest.fixture
def broker_url() -> str:
    return os.environ.get("REACH_BROKER_URL") or "amqp://guest:guest@127.0.0.1:5672//"


@pytest.fixture
def agent_id() -> str:
    return f"test_client_{uuid.uuid4().hex[:12]}"


class Broker:
    """A second connection playing the fleet's part: taps intents, publishes receipts."""

    def __init__(self, url: str) -> None:
        self.conn = Connection(url, transport_options={"confirm_publish": True})
        channel = self.conn.default_channel
        channel.auto_decode = False  # keep bodies as the bytes that were published
        INTENTS(channel).declare()
        RECEIPTS(channel).declare()
        # exclusive + auto_delete: the broker removes it when this connection closes
        self.tap = Queue("", exchange=INTENTS, routing_key="intent", exclusive=True, auto_delete=True)(channel)
        self.tap.declare()
        self.seen: dict[str, Message] = {}
        # auto_declare off: re-declaring by the server-given amq.gen-* name is refused (403)
        self.consumer = Consumer(channel, [self.tap], on_message=self._on_message, no_ack=True, auto_declare=False)
        self.consumer.consume()
        self.producer = Producer(channel, exchange=RECEIPTS, auto_declare=False)

    def _on_message(self, message: Message) -> None:
        if message.properties.get("message_id"):
            self.seen[message.properties["message_id"]] = message

    def intent(self, intent_id: str, timeout: float = 5.0) -> Message:
        deadline = time.monotonic() + timeout
        while intent_id not in self.seen:
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"intent {intent_id} never reached reach.intents"
            try:
                self.conn.drain_events(timeout=remaining)
            except TimeoutError:
                pass
        return self.seen.pop(intent_id)

    def send_receipt(self, receipt: Receipt | bytes, routing_key: str, content_type: str = "application/json") -> None:
        body = receipt.to_json() if isinstance(receipt, Receipt) else receipt
        props = {"correlation_id": receipt.intent_id} if isinstance(receipt, Receipt) else {}
        self.producer.publish(
            body,
            routing_key=routing_key,
            content_type=content_type,
            content_encoding="utf-8",
            delivery_mode=2,
            **props,
        )

    def close(self) -> None:
        self.conn.release()


@pytest.fixture
def broker(broker_url: str) -> Iterator[Broker]:
    b = Broker(broker_url)
    yield b
    b.close()


@pytest.fixture
def client(broker_url: str, agent_id: str, broker: Broker) -> Iterator[ReachClient]:
    with ReachClient(agent_id, broker_url, connect_timeout=5) as c:
        yield c


def make_receipt(agent_id: str, intent_id: str | None = None, **kw: Any) -> Receipt:
    now = datetime.now(UTC).isoformat()
    fields: dict[str, Any] = {
        "intent_id": intent_id or f"never-sent-{uuid.uuid4().hex}",
        "agent_id": agent_id,
        "action": "create_ticket",
        "connector": "local_ticket_system",
        "status": "succeeded",
        "success": True,
        "data": {"ticket_id": "TK-0001"},
        "execution": Execution(trace_id=uuid.uuid4().hex, attempts=1, received_at=now, finished_at=now),
    }
    fields.update(kw)
    return Receipt(**fields)


# -- what goes on the wire ---------------------------------------------------------------------


def test_published_intent_is_plain_persistent_json_with_message_id(
    client: ReachClient, broker: Broker, agent_id: str
) -> None:
    deadline = datetime(2030, 1, 31, 12, 0, tzinfo=UTC)
    intent_id = client.publish(
        "local_ticket_system__create_ticket",
        {"title": "Printer broken", "priority": "high"},
        idempotency_key="k-1",
        deadline=deadline,
        context={"domain": "it"},
        traceparent="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    )
    message = broker.intent(intent_id)

    assert json.loads(message.body) == {
        "intent_id": intent_id,
        "agent_id": agent_id,
        "action": "local_ticket_system__create_ticket",
        "params": {"title": "Printer broken", "priority": "high"},
        "idempotency_key": "k-1",
        "deadline": "2030-01-31T12:00:00+00:00",
        "context": {"domain": "it"},
        "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    }
    assert message.content_type == "application/json"
    assert message.content_encoding == "utf-8"
    assert message.properties["delivery_mode"] == 2
    assert message.properties["message_id"] == intent_id
    # no Celery task protocol: the only header is the agent identity
    assert message.headers == {"agent_id": agent_id}
    assert message.delivery_info["exchange"] == "reach.intents"
    assert message.delivery_info["routing_key"] == "intent"


def test_user_id_property_is_set_on_every_message_only_when_asked(
    client: ReachClient, broker_url: str, broker: Broker
) -> None:
    assert client.user_id is None
    plain = client.publish("no_such_action_for_client_tests")
    assert "user_id" not in broker.intent(plain).properties

    login = Connection(broker_url).userid or "guest"
    with ReachClient(login, broker_url, authenticated=True) as authenticated:
        assert authenticated.user_id == login
        intent_id = authenticated.publish("no_such_action_for_client_tests")
        authenticated.publish_raw(b'{"action": "x"}', message_id=intent_id + "-raw")
    assert broker.intent(intent_id).properties["user_id"] == login
    assert broker.intent(intent_id + "-raw").properties["user_id"] == login


def test_user_id_must_be_the_agent_id(broker_url: str) -> None:
    with pytest.raises(ValueError, match="must equal agent_id"):
        ReachClient("ok_agent", broker_url, user_id="someone_else")
    with pytest.raises(ValueError, match="not both"):
        ReachClient("ok_agent", broker_url, user_id="ok_agent", authenticated=True)


def test_generated_intent_ids_are_unique_uuid_hex(client: ReachClient, broker: Broker) -> None:
    ids = [client.publish("query_ticket", {"tid": "TK-0001"}) for _ in range(3)]
    assert len(set(ids)) == 3
    for intent_id in ids:
        uuid.UUID(hex=intent_id)
        assert json.loads(broker.intent(intent_id).body)["params"] == {"tid": "TK-0001"}


def test_caller_chosen_intent_id_and_reply_to_are_sent(broker_url: str, broker: Broker, agent_id: str) -> None:
    reply_to = f"{agent_id}.session-1"
    with ReachClient(agent_id, broker_url, reply_to=reply_to) as client:
        chosen = f"my-id:{uuid.uuid4().hex}"
        intent_id = client.publish("query_ticket", intent_id=chosen)
    body = json.loads(broker.intent(chosen).body)
    assert intent_id == chosen
    assert body["reply_to"] == reply_to
    assert body["params"] == {}


def test_publish_raw_sends_the_body_unchanged_with_agent_header(
    client: ReachClient, broker: Broker, agent_id: str
) -> None:
    body = b'{"type":"tool_use","id":"toolu_1","name":"query_ticket","input":{}}'
    message_id = f"raw-{uuid.uuid4().hex}"
    client.publish_raw(body, message_id=message_id)
    message = broker.intent(message_id)
    assert message.body == body
    assert message.headers == {"agent_id": agent_id}
    assert message.content_type == "application/json"
    assert message.properties["delivery_mode"] == 2

    # a valid intent, so that a running router answers it instead of dead-lettering it
    bare = json.dumps({"action": "query_ticket", "agent_id": agent_id}).encode()
    client.publish_raw(bare, headers={}, message_id=message_id + "-bare")
    assert not broker.intent(message_id + "-bare").headers


def test_broker_url_comes_from_environment_when_not_given(
    broker_url: str, broker: Broker, agent_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REACH_BROKER_URL", broker_url)
    with ReachClient(agent_id) as client:
        intent_id = client.publish("query_ticket")
    assert broker.intent(intent_id)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"params": {"x": float("nan")}}, "Out of range float"),
        ({"deadline": datetime(2030, 1, 1)}, "timezone"),
        ({"deadline": "tomorrow"}, "RFC 3339"),
        ({"intent_id": "has space"}, "intent_id"),
        ({"params": ["not", "an", "object"]}, "params"),
    ],
)
def test_malformed_intent_is_refused_before_publishing(client: ReachClient, kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        client.publish("query_ticket", **kwargs)


def test_malformed_agent_id_or_reply_to_is_refused(broker_url: str) -> None:
    with pytest.raises(ValueError, match="agent_id"):
        ReachClient("bad agent", broker_url)
    with pytest.raises(ValueError, match="reply_to"):
        ReachClient("ok_agent", broker_url, reply_to="agents.#")


def test_unreachable_broker_raises_reach_error_quickly() -> None:
    started = time.monotonic()
    with pytest.raises(ReachError, match="cannot set up with the broker") as info:
        ReachClient("ok_agent", "amqp://guest:secret@127.0.0.1:1//", connect_timeout=1)
    assert time.monotonic() - started < 10
    assert "secret" not in str(info.value)


# -- receipts ----------------------------------------------------------------------------------


def test_wait_returns_the_matching_receipt_and_buffers_others(
    client: ReachClient, broker: Broker, agent_id: str
) -> None:
    first, second = (
        make_receipt(agent_id),
        make_receipt(
            agent_id,
            status="rejected",
            success=False,
            data=None,
            error=ErrorInfo(
                code=ErrorCode.UNKNOWN_ACTION,
                message="no such action",
                retryable=False,
                suggestion="list the tools",
            ),
        ),
    )
    broker.send_receipt(first, agent_id)
    broker.send_receipt(second, agent_id)

    assert client.wait(second.intent_id, timeout=5) == second
    # the first one arrived while waiting for the second and was kept
    assert client.wait(first.intent_id, timeout=0.5) == first


def test_buffered_receipts_come_out_of_receipts_first_in_arrival_order(
    client: ReachClient, broker: Broker, agent_id: str
) -> None:
    sent = [make_receipt(agent_id) for _ in range(3)]
    for receipt in sent:
        broker.send_receipt(receipt, agent_id)
    assert client.wait(sent[2].intent_id, timeout=5) == sent[2]

    mine = {r.intent_id for r in sent}
    got = [r for r in client.receipts(timeout=0.5) if r.intent_id in mine]
    assert got == sent[:2]


def test_a_second_receipt_for_the_same_intent_is_dropped_and_counted(
    client: ReachClient, broker: Broker, agent_id: str
) -> None:
    # what the fleet sends when a pool dies between the broker's confirm and its "sent" mark
    receipt, other = make_receipt(agent_id), make_receipt(agent_id)
    for sent in (receipt, receipt, other, receipt):
        broker.send_receipt(sent, agent_id)
    assert client.wait(other.intent_id, timeout=5) == other
    got = [r for r in client.receipts(timeout=0.5) if r.intent_id in (receipt.intent_id, other.intent_id)]
    assert got == [receipt]
    assert client.duplicate_receipts == 2


def test_a_different_receipt_for_the_same_intent_id_is_kept(client: ReachClient, broker: Broker, agent_id: str) -> None:
    # a dead letter replayed after its "poison" answer, or an intent id reused a day later
    first = make_receipt(agent_id)
    later = first.model_copy(
        update={"execution": first.execution.model_copy(update={"finished_at": "2099-01-01T00:00:00Z"})}
    )
    broker.send_receipt(first, agent_id)
    broker.send_receipt(later, agent_id)
    got = [r for r in client.receipts(timeout=0.5) if r.intent_id == first.intent_id]
    assert got == [first, later] and client.duplicate_receipts == 0


def test_with_drop_duplicates_off_every_receipt_is_shown(broker_url: str, broker: Broker, agent_id: str) -> None:
    receipt = make_receipt(agent_id)
    with ReachClient(agent_id, broker_url, drop_duplicates=False) as raw:
        broker.send_receipt(receipt, agent_id)
        broker.send_receipt(receipt, agent_id)
        got = [r for r in raw.receipts(timeout=0.5) if r.intent_id == receipt.intent_id]
        assert got == [receipt, receipt] and raw.duplicate_receipts == 0


def test_receipts_stops_after_the_given_silence(client: ReachClient, broker: Broker, agent_id: str) -> None:
    receipt = make_receipt(agent_id)
    broker.send_receipt(receipt, agent_id)
    started = time.monotonic()
    got = [r for r in client.receipts(timeout=0.4) if r.intent_id == receipt.intent_id]
    assert got == [receipt]
    assert 0.35 < time.monotonic() - started < 5


def test_receipts_for_reply_to_arrive_and_agent_key_is_not_bound(
    broker_url: str, broker: Broker, agent_id: str
) -> None:
    reply_to = f"{agent_id}.worker-2"
    with ReachClient(agent_id, broker_url, reply_to=reply_to) as client:
        for_agent, for_reply = make_receipt(agent_id), make_receipt(agent_id)
        broker.send_receipt(for_agent, agent_id)
        broker.send_receipt(for_reply, reply_to)
        assert client.wait(for_reply.intent_id, timeout=5) == for_reply
        with pytest.raises(ReceiptTimeout):
            client.wait(for_agent.intent_id, timeout=0.3)


def test_wait_times_out_with_the_intent_id_in_the_message(client: ReachClient) -> None:
    started = time.monotonic()
    with pytest.raises(ReceiptTimeout, match="never-sent-xyz") as info:
        client.wait("never-sent-xyz", timeout=0.3)
    assert isinstance(info.value, TimeoutError)
    assert 0.25 < time.monotonic() - started < 5


def test_malformed_and_non_json_receipts_are_skipped(client: ReachClient, broker: Broker, agent_id: str) -> None:
    good = make_receipt(agent_id)
    broker.send_receipt(b"not json at all", agent_id)
    broker.send_receipt(b'{"intent_id": "x"}', agent_id)
    broker.send_receipt(b'{"intent_id": "\xff"}', agent_id)
    broker.send_receipt(b"\x80\x04\x95.", agent_id, content_type="application/x-python-serialize")
    broker.send_receipt(good, agent_id)
    assert client.wait(good.intent_id, timeout=5) == good


def test_call_publishes_and_waits_for_the_receipt_of_that_intent(
    client: ReachClient, broker: Broker, agent_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # play the fleet without touching reach.intents: a running router would answer a real
    # intent too, and its receipt could win the race against this one
    published: list[tuple[Any, ...]] = []
    answer = make_receipt(agent_id, data={"status": "open"})

    def publish_and_answer(action: str, params: Any = None, **kwargs: Any) -> str:
        published.append((action, params, kwargs))
        broker.send_receipt(make_receipt(agent_id), agent_id)  # someone else's, arrives first
        broker.send_receipt(answer, agent_id)
        return answer.intent_id

    monkeypatch.setattr(client, "publish", publish_and_answer)
    receipt = client.call("query_ticket", {"tid": "TK-0001"}, timeout=5, idempotency_key="k")
    assert receipt == answer
    assert published == [("query_ticket", {"tid": "TK-0001"}, {"idempotency_key": "k"})]


def test_tools_renders_the_routers_tool_list(
    client: ReachClient, agent_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = {
        "name": "local_ticket_system__query_ticket",
        "description": "Get a ticket by its id",
        "input_schema": {
            "type": "object",
            "properties": {"tid": {"type": "string"}},
            "required": ["tid"],
            "additionalProperties": False,
        },
    }
    calls: list[tuple[Any, ...]] = []

    def fake_call(action: str, params: Any = None, *, timeout: float = 30.0, **kw: Any) -> Receipt:
        calls.append((action, params, timeout))
        return make_receipt(agent_id, action=action, connector=None, data={"tools": [spec]})

    monkeypatch.setattr(client, "call", fake_call)
    assert client.tools("mcp", timeout=3) == [
        {
            "name": spec["name"],
            "description": spec["description"],
            "inputSchema": spec["input_schema"],
        }
    ]
    assert client.tools()[0]["function"]["parameters"] == spec["input_schema"]
    assert calls[0] == ("reach.list_tools", {}, 3)


def test_tools_raises_reach_error_carrying_a_failed_receipt(
    client: ReachClient, agent_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    denied = make_receipt(
        agent_id,
        status="rejected",
        success=False,
        data=None,
        error=ErrorInfo(
            code=ErrorCode.PERMISSION_DENIED,
            message="agent unknown",
            retryable=False,
            suggestion="register the agent app in the catalog",
        ),
    )
    monkeypatch.setattr(client, "call", lambda *a, **k: denied)
    with pytest.raises(ReachError, match="PERMISSION_DENIED") as info:
        client.tools()
    assert info.value.receipt == denied

    monkeypatch.setattr(client, "call", lambda *a, **k: make_receipt(agent_id, data={"tools": "none"}))
    with pytest.raises(ReachError, match="'tools'"):
        client.tools()
    with pytest.raises(ValueError, match="unknown tool format"):
        client.tools("yaml")


def test_closed_client_refuses_to_publish_and_close_is_idempotent(broker_url: str, agent_id: str) -> None:
    client = ReachClient(agent_id, broker_url)
    client.close()
    client.close()
    with pytest.raises(ReachError, match="closed"):
        client.publish("query_ticket")
    with pytest.raises(ReachError, match="closed"):
        client.wait("x", timeout=0.1)


def test_unconfirmed_publish_stops_publishing_but_receipts_still_arrive(
    client: ReachClient, broker: Broker, agent_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def never_confirmed(*args: Any, **kwargs: Any) -> None:
        raise TimeoutError("confirm timed out")

    monkeypatch.setattr(client._producer, "publish", never_confirmed)
    with pytest.raises(ReachError, match="did not confirm intent lost-1"):
        client.publish("query_ticket", intent_id="lost-1")
    monkeypatch.undo()
    # a late ack could now be taken for the confirm of the next message: refuse instead
    with pytest.raises(ReachError, match="new ReachClient"):
        client.publish("query_ticket")
    receipt = make_receipt(agent_id)
    broker.send_receipt(receipt, agent_id)
    assert client.wait(receipt.intent_id, timeout=5) == receipt
