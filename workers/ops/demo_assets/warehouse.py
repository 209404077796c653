"""A legacy warehouse system that is not REST: it reads stock requests from a RabbitMQ queue and
answers on the request's ``reply_to`` (the demo's ``type: amqp`` connector reaches it).

    request  {"sku": "PRN-42"}        on queue demo.warehouse.stock, with correlation_id and reply_to
    answer   {"sku": "PRN-42", "in_stock": 7, "location": "B-3"}
             or {"error": {"code": "DOWNSTREAM_NOT_FOUND", "message": "..."}} for an unknown sku
"""

from __future__ import annotations

import json
import threading
from typing import Any

from kombu import Connection, Consumer, Exchange, Message, Producer, Queue

QUEUE = "demo.warehouse.stock"
STOCK = {"PRN-42": (7, "B-3"), "TNR-7": (0, "B-4"), "KBD-1": (31, "A-1")}


class Warehouse:
    """Answers stock requests on ``QUEUE`` of ``broker_url`` from a thread of its own."""

    def __init__(self, broker_url: str) -> None:
        self._url = broker_url
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="demo-warehouse", daemon=True)
        self.requests: list[dict[str, Any]] = []

    def start(self, timeout: float = 30.0) -> Warehouse:
        self._thread.start()
        if not self._ready.wait(timeout):
            raise RuntimeError(f"the warehouse could not start consuming {QUEUE}")
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        # auto_delete: the queue goes when the demo does; nothing of the demo stays on the broker
        queue = Queue(QUEUE, durable=False, auto_delete=True)
        with Connection(self._url) as conn:
            producer = Producer(conn.channel(), exchange=Exchange(""))
            with Consumer(conn, [queue], callbacks=[lambda body, message: self._answer(producer, message)]):
                self._ready.set()
                while not self._stop.is_set():
                    try:
                        conn.drain_events(timeout=0.5)
                    except TimeoutError:
                        continue

    def _answer(self, producer: Producer, message: Message) -> None:
        try:
            request = json.loads(message.body)
        except ValueError:
            request = {}
        self.requests.append(request)
        sku = request.get("sku") if isinstance(request, dict) else None
        if sku in STOCK:
            count, location = STOCK[sku]
            answer: dict[str, Any] = {"sku": sku, "in_stock": count, "location": location}
        else:
            answer = {"error": {"code": "DOWNSTREAM_NOT_FOUND", "message": f"no article {sku!r} in this warehouse"}}
        reply_to = message.properties.get("reply_to")
        if reply_to:
            producer.publish(
                json.dumps(answer),
                routing_key=reply_to,
                correlation_id=message.properties.get("correlation_id"),
                content_type="application/json",
            )
        message.ack()
