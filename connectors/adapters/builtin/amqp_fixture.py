"""The conformance kit's fake system behind a broker: a consumer of a queue of its own on the
broker the kit is given (the fleet's, ``REACH_BROKER_URL``), answering on ``reply_to`` as the
kit's script says. The queue is auto-deleted with its consumer: nothing is left behind."""

from __future__ import annotations

import json
import threading
import uuid
from typing import Any
from urllib.parse import urlsplit

import amqp
from amqp.exceptions import AMQPError

from connectors.adapters.builtin.fixtures import IDEMPOTENCY_HEADER, KIT_SECRET, closed_port
from connectors.adapters.kit import Downstream, Fixture, KitContext, Received, json_answer
from producers.serve import AGENT_REPLIES_EXCHANGE_NAME, AGENTS_EXCHANGE_NAME, agent_queue_name


class Responder:
    """Consumes ``queue`` on its own connection and thread until closed; ``agent``: answer as an
    agent of the fleet does (producers.serve's wire) instead of a legacy system over RPC."""

    def __init__(self, url: str, queue: str, downstream: Downstream, agent: str | None = None) -> None:
        self.downstream = downstream
        self.queue = queue
        self.agent = agent
        self.closing = threading.Event()
        self.conn = amqp.Connection(**_connection_args(url))
        self.conn.connect()
        self.channel = self.conn.channel()
        # auto-deleted with its consumer; not exclusive: the agent adapter looks at it (passively)
        self.channel.queue_declare(queue, exclusive=agent is None, auto_delete=True)
        if agent is not None:  # the fleet's exchanges, declared as the fleet declares them
            self.channel.exchange_declare(AGENTS_EXCHANGE_NAME, "direct", durable=True, auto_delete=False)
            self.channel.exchange_declare(AGENT_REPLIES_EXCHANGE_NAME, "topic", durable=True, auto_delete=False)
            self.channel.queue_bind(queue, AGENTS_EXCHANGE_NAME, agent)
        self.channel.basic_consume(queue, callback=self._on_request, no_ack=True)
        self.thread = threading.Thread(target=self._run, daemon=True, name="kit-amqp-system")
        self.thread.start()

    def _run(self) -> None:
        while not self.closing.is_set():
            try:
                self.conn.drain_events(timeout=0.2)
            except TimeoutError:
                continue
            except (AMQPError, OSError):
                return

    def _on_request(self, message: amqp.Message) -> None:
        props = message.properties
        text = bytes(message.body).decode("utf-8", "replace")
        if self.agent is not None:
            try:
                key = json.loads(text).get("idempotency_key")
            except (ValueError, AttributeError):
                key = None
        else:
            key = (props.get("application_headers") or {}).get(IDEMPOTENCY_HEADER)
        reply = self.downstream.handle(Received(str(key) if key is not None else None, text))
        if reply.kind == "hang" or not props.get("reply_to"):
            return  # silence: the adapter's deadline must end the wait
        error = {"code": "DOWNSTREAM_ERROR", "message": reply.message}
        if self.agent is not None:
            body = (
                json.dumps({"status": "failed", "error": error}).encode()
                if reply.kind == "fail"
                else b'{"status": "succeeded", "data": ' + json_answer(reply) + b"}"
            )
        else:
            body = json.dumps({"error": error}).encode() if reply.kind == "fail" else json_answer(reply)
        answer = amqp.Message(body, content_type="application/json", correlation_id=props.get("correlation_id"))
        exchange = AGENT_REPLIES_EXCHANGE_NAME if self.agent is not None else ""
        self.channel.basic_publish(answer, exchange=exchange, routing_key=props["reply_to"])

    def close(self) -> None:
        self.closing.set()
        self.thread.join(timeout=5)
        try:
            self.conn.close()
        except (AMQPError, OSError):
            pass


def _connection_args(url: str) -> dict[str, Any]:
    parts = urlsplit(url)
    vhost = parts.path[1:] if len(parts.path) > 1 else "/"
    return {
        "host": f"{parts.hostname}:{parts.port or 5672}",
        "userid": parts.username or "guest",
        "password": parts.password or "guest",
        "virtual_host": vhost,
        "connect_timeout": 5,
    }


def amqp_fixture(downstream: Downstream, context: KitContext) -> Fixture:
    """The amqp type: requests to the responder's queue on the default exchange."""
    if not context.broker_url:
        raise ValueError("the amqp kit needs a broker: set REACH_BROKER_URL")
    queue = f"reach.kit.{uuid.uuid4().hex[:12]}"
    responder = Responder(context.broker_url, queue, downstream)
    dead = f"amqp://kit:{KIT_SECRET}@127.0.0.1:{closed_port()}/"

    def connector(reachable: bool, idempotency: bool) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "name": "kit",
            "type": "amqp",
            "url_env": "KIT_AMQP_URL" if reachable else "KIT_DEAD_AMQP_URL",
            "actions": [
                {
                    "action": "kit_read",
                    "description": "Read something from the kit's fake system.",
                    "routing_key": queue,
                    "input": {"q": {"type": "string"}},
                },
                {
                    "action": "kit_write",
                    "description": "Write something to the kit's fake system.",
                    "routing_key": queue,
                    "permission": "write",
                    "input": {"q": {"type": "string"}},
                },
            ],
        }
        if idempotency:
            doc["idempotency_header"] = IDEMPOTENCY_HEADER
        return doc

    # the credential watched for is the broker URL with its password, whole
    environ = {"KIT_AMQP_URL": context.broker_url, "KIT_DEAD_AMQP_URL": dead}
    return Fixture(connector=connector, close=responder.close, secret=context.broker_url, environ=environ)


def agent_fixture(downstream: Downstream, context: KitContext) -> Fixture:
    """The agent type: a fake agent consuming its queue on the fleet's broker, answering on
    reach.agent-replies; the unreachable connector names an agent nobody serves."""
    if not context.broker_url:
        raise ValueError("the agent kit needs the fleet's broker: set REACH_BROKER_URL")
    name = f"kit{uuid.uuid4().hex[:10]}"
    responder = Responder(context.broker_url, agent_queue_name(name), downstream, agent=name)

    def connector(reachable: bool, idempotency: bool) -> dict[str, Any]:
        actions = [
            {"action": "kit_read", "description": "Ask the kit's fake agent.", "input": {"q": {"type": "string"}}},
            {
                "action": "kit_write",
                "description": "Tell the kit's fake agent to do something.",
                "permission": "write",
                "input": {"q": {"type": "string"}},
            },
        ]
        doc: dict[str, Any] = {
            "name": "kit",
            "type": "agent",
            "agent": name if reachable else f"{name}x",
            "actions": actions,
        }
        if idempotency:
            doc["idempotency_header"] = IDEMPOTENCY_HEADER  # the agent dedupes by the request's key
        return doc

    return Fixture(connector=connector, close=responder.close, secret=context.broker_url)
