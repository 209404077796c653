"""Agent identity enforced by the broker: real least-privilege RabbitMQ users against a real fleet.

Each agent here is a RabbitMQ user created with ``workers.ops.agents.create_agent_user`` (unique names
per run, deleted at the end). The fleet runs with ``REACH_REQUIRE_USER_ID=1``. The attacks use
pika with a fresh connection each: RabbitMQ closes the channel on ACCESS_REFUSED.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import pika
import pika.exceptions
import pytest
from celery import Celery
from click.testing import CliRunner
from kombu import Connection

from examples.ticket_system import TicketSystem
from producers.client import ReachClient, ReachError
from producers.wire import Receipt
from tests.fleet import BROKER_URL, Fleet
from workers.cli import main as reach_cli
from workers.ops.agents import agent_permissions, create_agent_user, delete_agent_user, rabbitmqctl_commands, vhost_of
from workers.transport.app import EXECUTE_TASK
from workers.transport.topology import DLQ, INTENTS_QUEUE, connector_queue, declare_all

RUN = uuid.uuid4().hex[:8]
ALICE, BOB, CAROL, DAVE = (f"idt_{RUN}_{name}" for name in ("alice", "bob", "carol", "dave"))
CONNECTOR = "identity_tickets"
CREATE = f"{CONNECTOR}.create_ticket"
NEW_TICKET = {"title": "Printer", "description": "on fire"}
VHOST = vhost_of(BROKER_URL)

# carol is in the catalog but has no broker user: only an unauthenticated claim can name her
CATALOG = "\n---\n".join(
    [
        f"""
connector:
  name: {CONNECTOR}
  endpoint: {{url}}
  actions:
    - action: create_ticket
      path: POST /tickets
      input:
        title: {{{{ type: string, required: true }}}}
        description: {{{{ type: string, required: true }}}}
      permission: write
      idempotent: false
"""
    ]
    + [
        f"""
agent_app:
  name: {name}
  connector_bindings:
    - connector: {CONNECTOR}
      allowed_actions: ["*"]
"""
        for name in (ALICE, BOB, CAROL)
    ]
)


def url_for(user: str, password: str, vhost: str | None = None) -> str:
    parts = urlsplit(BROKER_URL)
    netloc = f"{quote(user, safe='')}:{quote(password, safe='')}@{parts.hostname}:{parts.port or 5672}"
    # "/%2F" rather than "//": pika reads "//" as the empty vhost
    return urlunsplit((parts.scheme, netloc, "/" + quote(vhost or VHOST, safe=""), "", ""))


@pytest.fixture(scope="module")
def topology() -> None:
    """The fleet's exchanges and queues, for tests that run before (or without) the fleet."""
    with Connection(BROKER_URL) as conn:
        declare_all(conn, [CONNECTOR])


@pytest.fixture(scope="module")
def passwords(topology: None) -> Iterator[dict[str, str]]:
    created: dict[str, str] = {}
    try:
        for name in (ALICE, BOB):
            created[name] = secrets.token_urlsafe(24)
            create_agent_user(name, created[name], VHOST)
        yield created
    finally:
        for name in created:
            try:
                delete_agent_user(name, VHOST)
            except Exception as exc:  # cleanup must not hide the test's own failure
                print(f"could not delete agent user {name}: {exc}")


@pytest.fixture(scope="module")
def system() -> Iterator[TicketSystem]:
    downstream = TicketSystem().start()
    yield downstream
    downstream.stop()


@pytest.fixture(scope="module")
def fleet(system: TicketSystem) -> Iterator[Fleet]:
    with Fleet(CATALOG.format(url=system.url), [CONNECTOR], env={"REACH_REQUIRE_USER_ID": "1"}) as running:
        yield running


@pytest.fixture
def downstream(system: TicketSystem, fleet: Fleet) -> TicketSystem:
    system.state.reset()
    return system


def client_for(name: str, passwords: dict[str, str], **kwargs: Any) -> ReachClient:
    return ReachClient(name, url_for(name, passwords[name]), user_id=name, **kwargs)


def intent_body(intent_id: str, **fields: Any) -> bytes:
    return json.dumps({"intent_id": intent_id, "action": CREATE, "params": NEW_TICKET, **fields}).encode()


def nothing_for(client: ReachClient, seconds: float = 1.0) -> list[Receipt]:
    return list(client.receipts(timeout=seconds))


def refusal(name: str, password: str, attempt: Callable[[Any], Any]) -> tuple[int, str] | None:
    """Run ``attempt(channel)`` on a fresh connection; the broker's (code, text) if it refused."""
    connection = pika.BlockingConnection(pika.URLParameters(url_for(name, password)))
    try:
        channel = connection.channel()
        channel.confirm_delivery()  # a refused publish surfaces here, not silently later
        try:
            attempt(channel)
        except pika.exceptions.ChannelClosedByBroker as exc:
            return exc.reply_code, exc.reply_text
        return None
    finally:
        if connection.is_open:
            connection.close()


def forged_task(agent: str) -> tuple[dict[str, Any], bytes]:
    """A genuine ``reach.execute`` Celery message for the pool: it runs whatever job it carries."""
    intent_id = f"forged-{uuid.uuid4().hex}"
    job = {
        "v": 1,
        "intent_id": intent_id,
        "agent_id": agent,
        "connector": CONNECTOR,
        "action": "create_ticket",
        "params": NEW_TICKET,
        "idempotency_key": intent_id,
        "reply_to": agent,
        "deadline": None,
        "trace_id": uuid.uuid4().hex,
        "traceparent": None,
        "format": "native",
        "received_at": time.time(),
        "dispatched_at": time.time(),
    }
    message = Celery("forger", set_as_current=False).amqp.as_task_v2(f"{intent_id}:1", EXECUTE_TASK, args=[job])
    properties = {
        "headers": message.headers,
        "content_type": "application/json",
        "content_encoding": "utf-8",
        "delivery_mode": 2,
        **message.properties,
    }
    return properties, json.dumps(message.body).encode()


def publish_task(channel: Any, exchange: str, agent: str) -> None:
    properties, body = forged_task(agent)
    channel.basic_publish(exchange, connector_queue(CONNECTOR).name, body, pika.BasicProperties(**properties))


def undone(do: Callable[[Any], Any], undo: Callable[[Any], Any]) -> Callable[[Any], None]:
    """An attempt that reverts itself if the broker wrongly allows it, so a failing run leaves no damage."""

    def attempt(channel: Any) -> None:
        do(channel)
        undo(channel)

    return attempt


def bind_receipts(key: str) -> Callable[[Any], None]:
    def attempt(channel: Any) -> None:
        queue = channel.queue_declare("", exclusive=True).method.queue
        channel.queue_bind(queue, "reach.receipts", key)

    return attempt


# -- the users the tool creates --------------------------------------------------------------------


def test_created_agent_user_has_exactly_the_least_privilege_permissions(passwords: dict[str, str]) -> None:
    expected = agent_permissions(ALICE)
    listed = subprocess.run(
        ["rabbitmqctl", "list_user_permissions", "--silent", "--formatter", "json", "--", ALICE],
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(listed.stdout) == [
        {"vhost": VHOST, "configure": expected.configure, "write": expected.write, "read": expected.read}
    ]
    topic = subprocess.run(
        ["rabbitmqctl", "list_user_topic_permissions", "--silent", "--formatter", "json", "--", ALICE],
        capture_output=True,
        text=True,
        check=True,
    )
    assert sorted(json.loads(topic.stdout), key=lambda p: p["exchange"]) == [
        {"vhost": VHOST, "exchange": "reach.agent-replies", "write": expected.reply_topic_write, "read": "^$"},
        {"vhost": VHOST, "exchange": "reach.receipts", "write": "^$", "read": expected.topic_read},
    ]


def test_reserved_or_malformed_agent_names_get_no_user() -> None:
    with pytest.raises(ValueError, match="reserved"):
        agent_permissions(INTENTS_QUEUE.routing_key)  # its receipts could be bound back into reach.intents
    with pytest.raises(ValueError, match="agent name"):
        rabbitmqctl_commands("bad name", "/")
    for outside in ("-x", "Desk", "desk:eu", "desk.eu"):  # ^[a-z][a-z0-9_]{0,62}$: never an option either
        with pytest.raises(ValueError, match="agent name"):
            rabbitmqctl_commands(outside, "/")
    assert rabbitmqctl_commands("x", "/")[0][:4] == ["rabbitmqctl", "add_user", "--", "x"]


def test_cli_creates_prints_rotates_and_deletes_an_agent_user(topology: None, monkeypatch: pytest.MonkeyPatch) -> None:
    runner = CliRunner()
    printed = runner.invoke(reach_cli, ["agent-user", "create", DAVE, "--print", "--vhost", VHOST])
    assert printed.exit_code == 0, printed.output
    assert (
        "<password>" in printed.stdout and "^(reach\\.intents|amq\\.gen-.*|reach\\.agent\\-replies)$" in printed.stdout
    )
    assert runner.invoke(reach_cli, ["agent-user", "create", "bad name"]).exit_code == 2
    try:
        first_password = "first-" + secrets.token_urlsafe(12)
        monkeypatch.setenv("DAVE_PASSWORD", first_password)
        first = runner.invoke(
            reach_cli, ["agent-user", "create", DAVE, "--password-env", "DAVE_PASSWORD", "--vhost", VHOST]
        )
        assert first.exit_code == 0, first.output
        generated = runner.invoke(reach_cli, ["agent-user", "create", DAVE, "--vhost", VHOST])
        assert generated.exit_code == 0, generated.output
        password = generated.stdout.strip()
        assert len(password) >= 32 and "\n" not in password
        # the user existed: the new password replaced the old one
        with ReachClient(DAVE, url_for(DAVE, password), authenticated=True) as dave:
            assert dave.user_id == DAVE
        with pytest.raises(ReachError):
            ReachClient(DAVE, url_for(DAVE, first_password), connect_timeout=5)
    finally:
        deleted = runner.invoke(reach_cli, ["agent-user", "delete", DAVE, "--vhost", VHOST])
    assert deleted.exit_code == 0, deleted.output
    assert runner.invoke(reach_cli, ["agent-user", "delete", DAVE, "--vhost", VHOST]).exit_code == 2


def test_client_only_checks_the_exchanges_and_says_when_the_fleet_is_not_set_up() -> None:
    vhost = f"reach-test-{RUN}"
    subprocess.run(["rabbitmqctl", "-q", "add_vhost", vhost], check=True, capture_output=True)
    try:
        subprocess.run(
            ["rabbitmqctl", "-q", "set_permissions", f"--vhost={vhost}", "guest", ".*", ".*", ".*"],
            check=True,
            capture_output=True,
        )
        empty = url_for("guest", "guest", vhost)
        for _ in range(2):  # the first attempt must not have created them
            with pytest.raises(ReachError, match="exchanges do not exist.*reach setup"):
                ReachClient("anyone", empty, connect_timeout=5)
    finally:
        subprocess.run(["rabbitmqctl", "-q", "delete_vhost", vhost], check=True, capture_output=True)


# -- identity through the fleet ----------------------------------------------------------------------


def test_agent_user_publishes_with_its_login_as_user_id_and_gets_its_receipt(
    downstream: TicketSystem, passwords: dict[str, str]
) -> None:
    with ReachClient(ALICE, url_for(ALICE, passwords[ALICE]), authenticated=True) as alice:
        assert alice.user_id == ALICE
        receipt = alice.call(CREATE, NEW_TICKET, timeout=20)
    assert receipt.status == "succeeded", receipt
    assert receipt.agent_id == ALICE and receipt.data["ticket_id"] == "TK-0001"
    assert len(downstream.requests("POST")) == 1


def test_claiming_another_agents_id_is_denied_and_answered_to_the_authenticated_agent_only(
    downstream: TicketSystem, passwords: dict[str, str]
) -> None:
    with client_for(BOB, passwords) as bob, client_for(ALICE, passwords) as alice:
        plain, redirected = f"claim-{uuid.uuid4().hex}", f"claim-{uuid.uuid4().hex}"
        alice.publish_raw(intent_body(plain, agent_id=BOB), headers={}, message_id=plain)
        alice.publish_raw(
            intent_body(redirected, agent_id=BOB, reply_to=BOB), headers={"agent_id": BOB}, message_id=redirected
        )
        for intent_id in (plain, redirected):
            receipt = alice.wait(intent_id, timeout=20)
            assert receipt.error is not None and receipt.error.code == "PERMISSION_DENIED", receipt
            assert receipt.agent_id == ALICE
        assert nothing_for(bob) == []
    assert downstream.requests() == []


def test_user_id_other_than_the_login_is_refused_by_the_broker(
    downstream: TicketSystem, passwords: dict[str, str]
) -> None:
    with client_for(BOB, passwords) as bob:

        def impersonate(channel: Any) -> None:
            intent_id = f"spoof-{uuid.uuid4().hex}"
            channel.basic_publish(
                "reach.intents",
                "intent",
                intent_body(intent_id, agent_id=BOB),
                pika.BasicProperties(
                    user_id=BOB, message_id=intent_id, delivery_mode=2, content_type="application/json"
                ),
            )

        refused = refusal(ALICE, passwords[ALICE], impersonate)
        assert refused is not None, "the broker accepted a user_id that is not the login"
        code, text = refused
        assert code == 406 and text.startswith("PRECONDITION_FAILED"), refused
        assert ALICE in text and BOB in text
        assert nothing_for(bob) == []
    assert downstream.requests() == []


def test_without_user_id_an_intent_is_refused_and_nobody_is_answered_when_the_fleet_requires_it(
    downstream: TicketSystem,
) -> None:
    # the guest admin may set any agent_id header; only a broker-checked user_id counts, and
    # an unvouched claim gets no receipt (that would let anyone push receipts into CAROL's stream)
    with ReachClient(CAROL, BROKER_URL) as claimed:
        assert claimed.user_id is None
        intent_id = f"unauth-{uuid.uuid4().hex}"
        claimed.publish_raw(intent_body(intent_id), headers={"agent_id": CAROL}, message_id=intent_id)
        dead = None
        with Connection(BROKER_URL) as conn:
            channel = conn.channel()
            deadline = time.time() + 20
            while dead is None and time.time() < deadline:
                message = channel.basic_get("reach.dlq", no_ack=False)
                if message is None:
                    time.sleep(0.1)
                    continue
                # other dead letters stay unacked (a reject would put them back in front of
                # ours); closing the channel returns them to the queue
                if message.properties.get("message_id") == intent_id:
                    dead = message
                    channel.basic_ack(message.delivery_info["delivery_tag"])
        assert dead is not None, "the refused intent was not dead-lettered"
        assert "user_id" in dead.properties["application_headers"]["x-reach-reason"]
        assert [r.intent_id for r in claimed.receipts(timeout=1.0)] == []
    assert downstream.requests() == []


def test_reply_to_of_another_agent_is_invalid_and_answered_to_the_sender(
    downstream: TicketSystem, passwords: dict[str, str]
) -> None:
    with client_for(BOB, passwords) as bob, client_for(ALICE, passwords) as alice:
        intent_id = f"reply-{uuid.uuid4().hex}"
        alice.publish_raw(intent_body(intent_id, agent_id=ALICE, reply_to=f"{BOB}.inbox"), message_id=intent_id)
        receipt = alice.wait(intent_id, timeout=20)
        assert receipt.error is not None and receipt.error.code == "INVALID_INTENT", receipt
        assert "reply_to" in receipt.error.message and receipt.agent_id == ALICE
        assert nothing_for(bob) == []
    assert downstream.requests() == []


# -- every path around the router is closed by the broker ------------------------------------------------


def test_a_forged_task_on_the_connector_queue_would_run(downstream: TicketSystem) -> None:
    """The control for the next test: the message it tries to sneak in is a live one."""
    assert refusal("guest", "guest", lambda ch: publish_task(ch, "", CAROL)) is None
    deadline = time.time() + 20
    while not downstream.requests("POST") and time.time() < deadline:
        time.sleep(0.1)
    assert len(downstream.requests("POST")) == 1


def test_broker_refuses_an_agent_every_way_around_the_router(
    downstream: TicketSystem, passwords: dict[str, str]
) -> None:
    # the attempts only read or revert themselves: if the broker wrongly allowed one, nothing of
    # other users' (dead letters, queues, bindings) may be lost or left behind
    stray_queue, stray_exchange = f"reach.connector.{ALICE}", f"{ALICE}.x"
    attacks: dict[str, Callable[[Any], Any]] = {
        "task to the connector queue via the default exchange": lambda ch: publish_task(ch, "", ALICE),
        "task via reach.dispatch": lambda ch: publish_task(ch, "reach.dispatch", ALICE),
        "forged receipt on reach.receipts": lambda ch: ch.basic_publish(
            "reach.receipts", BOB, b'{"intent_id": "x"}', pika.BasicProperties(content_type="application/json")
        ),
        "bind reach.receipts with #": bind_receipts("#"),
        "bind reach.receipts with another agent's id": bind_receipts(BOB),
        "bind reach.receipts with another agent's reply_to": bind_receipts(f"{BOB}.inbox"),
        "bind reach.receipts into reach.intents": undone(
            lambda ch: ch.exchange_bind("reach.intents", "reach.receipts", "#"),
            lambda ch: ch.exchange_unbind("reach.intents", "reach.receipts", "#"),
        ),
        # unacked deliveries go back to the queue when the connection closes
        "consume the connector queue": lambda ch: ch.basic_consume(connector_queue(CONNECTOR).name, print),
        "consume reach.dlq": lambda ch: ch.basic_consume(DLQ.name, print),
        "consume reach.intents": lambda ch: ch.basic_consume(INTENTS_QUEUE.name, print),
        "get from reach.dlq": lambda ch: ch.basic_get(DLQ.name),
        "delete the connector queue": lambda ch: ch.queue_delete(
            connector_queue(CONNECTOR).name, if_unused=True, if_empty=True
        ),
        "declare a queue": undone(lambda ch: ch.queue_declare(stray_queue), lambda ch: ch.queue_delete(stray_queue)),
        "declare an exchange": undone(
            lambda ch: ch.exchange_declare(stray_exchange, "fanout"), lambda ch: ch.exchange_delete(stray_exchange)
        ),
    }
    outcomes = {name: refusal(ALICE, passwords[ALICE], attack) for name, attack in attacks.items()}
    not_refused = {
        name: outcome
        for name, outcome in outcomes.items()
        if outcome is None or outcome[0] != 403 or not outcome[1].startswith("ACCESS_REFUSED")
    }
    assert not_refused == {}
    # the control above shows a forged task reaches the system in well under a second
    time.sleep(1.0)
    assert downstream.requests() == []


def test_agent_may_still_bind_its_own_keys(passwords: dict[str, str]) -> None:
    """The permissions are not simply 'nothing': the receipt paths an agent needs stay open."""
    for key in (BOB, f"{BOB}.session-2"):
        assert refusal(BOB, passwords[BOB], bind_receipts(key)) is None
