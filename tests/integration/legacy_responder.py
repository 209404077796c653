"""A legacy system that takes requests from a message queue and answers on ``reply_to``: a real
consumer on RabbitMQ, in a vhost of its own (the "other broker" an amqp connector's ``url_env``
names). It counts and keeps every request, and each queue's behaviour is a function the test sets:
answer JSON, answer an error, stay silent, or answer late."""

from __future__ import annotations

import contextlib
import json
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, unquote, urlsplit, urlunsplit

import amqp
from amqp.exceptions import AMQPError, NotFound
from kombu import Connection

from tests.fleet import BROKER_URL


@dataclass(frozen=True)
class Reply:
    """What the system sends back for one request (None from a behaviour: nothing at all)."""

    body: bytes
    headers: dict[str, Any] = field(default_factory=dict)
    delay: float = 0.0  # seconds before it is sent (a late answer)

    @classmethod
    def json(cls, doc: Any, headers: dict[str, Any] | None = None, delay: float = 0.0) -> Reply:
        return cls(json.dumps(doc).encode(), headers or {}, delay)


@dataclass(frozen=True)
class Seen:
    """One request as the system received it."""

    queue: str
    body: bytes
    properties: dict[str, Any]

    @property
    def params(self) -> Any:
        return json.loads(self.body)

    @property
    def headers(self) -> dict[str, Any]:
        return dict(self.properties.get("application_headers") or {})


Behaviour = Callable[[dict[str, Any], int], Reply | None]  # (params, n-th request on the queue) -> reply


def echo(params: dict[str, Any], n: int) -> Reply:
    return Reply.json({"echo": params, "n": n})


class LegacyResponder:
    """Consumes ``queues`` (declared durable, on the default exchange; ``bindings`` adds
    exchange -> queue bindings) and answers with each queue's behaviour (``echo`` until set)."""

    def __init__(
        self,
        url: str,
        queues: list[str],
        bindings: list[tuple[str, str, str]] | None = None,
        reply_exchange: str = "",
    ) -> None:
        """``reply_exchange``: where answers go, with routing key = the request's reply_to (the
        default exchange for direct reply-to; ``reach.agent-replies`` to answer as an agent)."""
        self.url = url
        self.queues = queues
        self.bindings = bindings or []  # (exchange, routing key, queue)
        self.reply_exchange = reply_exchange
        self.behaviours: dict[str, Behaviour] = {}
        self._seen: list[Seen] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="legacy-responder", daemon=True)

    def start(self) -> LegacyResponder:
        self._thread.start()
        if not self._ready.wait(15):
            raise RuntimeError("the legacy responder did not start consuming")
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def reset(self) -> None:
        with self._lock:
            self._seen.clear()
        self.behaviours.clear()

    def seen(self, queue: str | None = None) -> list[Seen]:
        with self._lock:
            return [s for s in self._seen if queue is None or s.queue == queue]

    def count(self, queue: str | None = None) -> int:
        return len(self.seen(queue))

    def _run(self) -> None:
        # reconnects: tests close the vhost's connections to see the adapter reconnect
        while not self._stop.is_set():
            try:
                self._serve()
            except (OSError, AMQPError):
                time.sleep(0.1)

    def _serve(self) -> None:
        with Connection(self.url, transport="pyamqp", heartbeat=0, connect_timeout=5) as conn:
            conn.connect()
            channel = conn.connection.channel()
            channel.auto_decode = False
            pending: list[tuple[float, str, str, Reply]] = []  # due, reply_to, correlation id, reply
            for queue in self.queues:
                try:  # a queue the fleet declared (reach.agent.*, a quorum queue) is used as it is
                    channel.queue_declare(queue, passive=True)
                except NotFound:
                    channel = conn.connection.channel()
                    channel.auto_decode = False
                    channel.queue_declare(queue, durable=True, auto_delete=False)
            for exchange, key, queue in self.bindings:
                channel.exchange_declare(exchange, "direct", durable=True, auto_delete=False)
                channel.queue_bind(queue, exchange, key)

            def on_request(message: amqp.Message, queue: str) -> None:
                seen = Seen(queue, bytes(message.body), dict(message.properties))
                with self._lock:
                    self._seen.append(seen)
                    n = sum(1 for s in self._seen if s.queue == queue)
                try:
                    params = json.loads(seen.body)
                except ValueError:
                    params = {}
                reply = self.behaviours.get(queue, echo)(params, n)
                reply_to, correlation_id = message.properties.get("reply_to"), message.properties.get("correlation_id")
                if reply is not None and reply_to:
                    pending.append((time.monotonic() + reply.delay, reply_to, correlation_id, reply))
                channel.basic_ack(message.delivery_tag)

            for queue in self.queues:
                channel.basic_consume(queue, callback=lambda m, q=queue: on_request(m, q), no_ack=False)
            self._ready.set()
            while not self._stop.is_set():
                with contextlib.suppress(TimeoutError):
                    conn.connection.drain_events(timeout=0.02)
                now = time.monotonic()
                for item in [p for p in pending if p[0] <= now]:
                    pending.remove(item)
                    _, reply_to, correlation_id, reply = item
                    channel.basic_publish(
                        amqp.Message(
                            reply.body,
                            content_type="application/json",
                            correlation_id=correlation_id,
                            application_headers=reply.headers,
                        ),
                        exchange=self.reply_exchange,
                        routing_key=reply_to,
                    )


@contextlib.contextmanager
def legacy_vhost() -> Iterator[str]:
    """A vhost of its own on the test broker, standing for the legacy system's broker: its URL."""
    parts = urlsplit(BROKER_URL)
    vhost = f"reach-legacy-{uuid.uuid4().hex[:10]}"
    user = parts.username or "guest"
    subprocess.run(["rabbitmqctl", "-q", "add_vhost", vhost], check=True, capture_output=True, timeout=60)
    try:
        subprocess.run(
            ["rabbitmqctl", "-q", "set_permissions", "-p", vhost, user, ".*", ".*", ".*"],
            check=True,
            capture_output=True,
            timeout=60,
        )
        yield urlunsplit(parts._replace(path="/" + quote(vhost, safe="")))
    finally:
        subprocess.run(["rabbitmqctl", "-q", "delete_vhost", vhost], capture_output=True, timeout=60)


def close_connections(url: str) -> None:
    """Have the broker close every connection in ``url``'s vhost (as a broker restart would)."""
    vhost = unquote(urlsplit(url).path[1:])
    subprocess.run(
        ["rabbitmqctl", "-q", "close_all_connections", "-p", vhost, "test: broker closed connections"],
        check=True,
        capture_output=True,
        timeout=60,
    )
