"""The MCP facade's broker link (``workers.mcp.clients``) on its own, against the real broker: what
it does when a node of a cluster's list is not set up, and when the broker never answers."""

from __future__ import annotations

import socket
import threading
import time
import uuid
from collections.abc import Iterator

import anyio
import pytest
from kombu import Connection, Exchange, Queue

from producers.wire import INTENT_ROUTING_KEY, INTENTS_EXCHANGE_NAME, RECEIPTS_EXCHANGE_NAME
from tests.fleet import queue_depth
from tests.integration.legacy_responder import legacy_vhost
from workers.mcp.clients import AgentClients, Call, Undelivered


def a_call(wait: float = 2.0) -> Call:
    intent_id = uuid.uuid4().hex
    return Call("link_bot", "tickets.create_ticket", {"title": "t"}, intent_id, None, None, wait)


@pytest.fixture
def set_up() -> Iterator[tuple[str, str]]:
    """A vhost with the fleet's two exchanges and a queue taking the intents (no router behind it):
    its URL and that queue's name."""
    with legacy_vhost() as url, Connection(url) as conn:
        channel = conn.channel()
        Exchange(RECEIPTS_EXCHANGE_NAME, type="topic", durable=True)(channel).declare()
        intents = Exchange(INTENTS_EXCHANGE_NAME, type="direct", durable=True)
        queue = Queue(f"intents-{uuid.uuid4().hex[:8]}", intents, routing_key=INTENT_ROUTING_KEY, durable=False)
        queue(channel).declare()
        yield url, str(queue.name)


def test_a_node_that_is_not_set_up_is_passed_over_for_the_next_one_in_the_list(set_up: tuple[str, str]) -> None:
    good, queue = set_up

    async def scenario() -> list[Undelivered]:
        clients = AgentClients(f"{bare};{good}", per_agent=4, set_user_id=False, connect_timeout=5)
        failures = []
        try:
            for _ in range(3):
                with pytest.raises(Undelivered) as caught:
                    await clients.call(a_call(wait=0.5))
                failures.append(caught.value)
        finally:
            await clients.aclose()
        return failures

    with legacy_vhost() as bare:  # reachable, but without the fleet's exchanges
        failures = anyio.run(scenario)
    # every call went out through the second node (confirmed there; no router answers in this test)
    assert [(f.published, str(f)) for f in failures] == [(True, "no receipt within 0.5 s")] * 3
    assert queue_depth(queue, good)[0] == 3


def test_a_single_node_without_the_fleet_says_so() -> None:
    async def scenario() -> Undelivered:
        clients = AgentClients(bare, per_agent=4, set_user_id=False, connect_timeout=5)
        try:
            with pytest.raises(Undelivered) as caught:
                await clients.call(a_call())
        finally:
            await clients.aclose()
        return caught.value

    with legacy_vhost() as bare:
        failure = anyio.run(scenario)
    assert failure.published is False and "run `reach setup` or start `reach router`" in str(failure)


def test_calls_waiting_for_a_broker_that_never_answers_share_one_connect_attempt() -> None:
    """Eight calls at once, a listener that accepts and never speaks AMQP, 1 s to connect: all are
    told within about that second, not one after another (8 s)."""
    silent = socket.create_server(("127.0.0.1", 0))
    port = silent.getsockname()[1]
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        silent.settimeout(0.2)
        while not stop.is_set():
            try:
                accepted.append(silent.accept()[0])
            except TimeoutError:
                continue

    acceptor = threading.Thread(target=accept, daemon=True)
    acceptor.start()

    async def scenario() -> list[BaseException]:
        clients = AgentClients(
            f"amqp://guest:guest@127.0.0.1:{port}//", per_agent=8, set_user_id=False, connect_timeout=1
        )
        failures: list[BaseException] = []

        async def one() -> None:
            try:
                await clients.call(a_call(wait=20))
            except Undelivered as exc:
                failures.append(exc)

        async with anyio.create_task_group() as tg:
            for _ in range(8):
                tg.start_soon(one)
        await clients.aclose()
        return failures

    try:
        started = time.monotonic()
        failures = anyio.run(scenario)
        took = time.monotonic() - started
    finally:
        stop.set()
        acceptor.join(5)
        silent.close()
        for conn in accepted:
            conn.close()
    assert len(failures) == 8 and all(isinstance(f, Undelivered) and f.published is False for f in failures)
    assert all("cannot reach the broker" in str(f) for f in failures)
    assert took < 4.0, f"8 calls took {took:.1f} s: they connected one after another"
    assert len(accepted) == 1  # one attempt, shared


def queued_ids(url: str, queue: str) -> set[str]:
    """The message ids of the intents in ``queue`` (taken off it)."""
    ids = set()
    with Connection(url) as conn:
        channel = conn.channel()
        while (message := channel.basic_get(queue, no_ack=True)) is not None:
            ids.add(str(message.properties["message_id"]))
    return ids


def test_a_publish_the_broker_refuses_never_makes_other_calls_say_not_sent_when_theirs_were_queued(
    set_up: tuple[str, str],
) -> None:
    """The facade logs in as ``guest`` and sets user_id: the broker takes guest's intents and
    refuses (closing the shared publishing channel) the one that claims to be another agent. A call
    answered "not sent" (published False) must not have its intent in the queue."""
    url, queue = set_up

    async def scenario() -> dict[str, BaseException | None]:
        clients = AgentClients(url, per_agent=64, set_user_id=True, connect_timeout=5)
        outcomes: dict[str, BaseException | None] = {}

        async def one(agent: str) -> None:
            call = a_call(wait=1.0)
            call = Call(agent, call.action, call.params, call.intent_id, None, None, call.wait)
            try:
                await clients.call(call)
                outcomes[call.intent_id] = None
            except Undelivered as exc:
                outcomes[call.intent_id] = exc

        async with anyio.create_task_group() as tg:
            for i in range(60):
                tg.start_soon(one, "guest")
                if i == 20:
                    tg.start_soon(one, "impostor_bot")
        await clients.aclose()
        return outcomes

    outcomes = anyio.run(scenario)
    queued = queued_ids(url, queue)
    said_not_sent = {i for i, exc in outcomes.items() if isinstance(exc, Undelivered) and exc.published is False}
    assert len(outcomes) == 61 and len(queued) >= 1
    assert said_not_sent, "the impostor's intent is refused: that call is told so"
    assert not said_not_sent & queued, "a call was told 'not sent' although its intent was queued"
