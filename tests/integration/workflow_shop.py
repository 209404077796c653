"""The fake shop the workflow tests run against, and its catalog (tests/integration/test_workflows.py,
test_workflow_failures.py).

The shop keeps an ordered log of what it *did*: each Idempotency-Key executes once, and an answer
of 5xx is not kept (a failed request did nothing, so the same key may try again). A test can make
it answer 409 (``conflict_on``), leave a declared field out (``rename_for``), answer 500 for one
path and id until a switch flips (``failing``), or hold one request until the test lets it go
(``gate``: a request that reached the shop, with the pool waiting for its answer).

On the broker: ``Copier`` delivers a run's start job and step receipts to the runner twice more;
``Mailbox`` keeps an agent's receipts in a durable queue across a broker outage.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from kombu import Connection, Consumer, Exchange, Producer, Queue

from producers.client import ReachClient
from producers.wire import Receipt
from tests.fleet import Fleet
from workers.transport.topology import (
    DISPATCH_EXCHANGE,
    RECEIPTS_EXCHANGE,
    WORKFLOW_RECEIPTS_QUEUE_NAME,
    WORKFLOW_REPLY_KEY,
    WORKFLOWS_QUEUE_NAME,
)
from workers.workflows.ids import run_digest

COPY_HEADER = "x-test-copy"
RUN = uuid.uuid4().hex[:6]
AGENT = f"wf_{RUN}"
OTHER = f"wfo_{RUN}"
THRIFTY = f"wfb_{RUN}"  # bound with a value budget on refunds' ``amount``
GATE_SECONDS = 20.0  # a held request is let go after this at the latest (a test that failed midway)
NOTICE = "Refund {$steps.refund.refund_id} done"


class Shop(ThreadingHTTPServer):
    """Holds, refunds, notices, letters, and the undos. ``log``: (path, order id or undone id) in
    the order executed; ``attempts``: (path, id, status) of every request, failed ones too;
    ``texts``: the text of each notice, by order id."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _ShopHandler)
        self.daemon_threads = True
        self.lock = threading.Lock()
        self.log: list[tuple[str, str]] = []
        self.attempts: list[tuple[str, str, int]] = []
        self.keys: list[tuple[str, str, str | None]] = []  # (path, id, Idempotency-Key) of each request
        self.texts: dict[str, str] = {}
        self.done: dict[str, dict[str, Any]] = {}  # Idempotency-Key -> the answer given
        self.conflict_on: set[str] = set()
        self.rename_for: set[str] = set()
        self.failing: set[tuple[str, str]] = set()  # (path, id): answers 500 while in here
        self.gates: dict[tuple[str, str], threading.Event] = {}
        self.arrived: set[tuple[str, str]] = set()  # gated requests that reached the shop
        self.delay = 0.0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def calls(self, order: str) -> list[str]:
        """The paths executed for an order (its hold ``H-<order>`` and refund ``R-<order>`` too), in order."""
        with self.lock:
            return [path for path, about in self.log if order in about]

    def tries(self, path: str, about: str) -> list[int]:
        """The statuses the shop answered to ``path`` for ``about``, in order."""
        with self.lock:
            return [status for p, a, status in self.attempts if p == path and a == about]

    def keys_sent(self, path: str, about: str) -> list[str | None]:
        """The Idempotency-Key headers of the requests to ``path`` for ``about``, in order."""
        with self.lock:
            return [key for p, a, key in self.keys if p == path and a == about]

    def gate(self, path: str, about: str) -> threading.Event:
        """Hold the request to ``path`` for ``about`` until the returned event is set."""
        event = threading.Event()
        with self.lock:
            self.gates[(path, about)] = event
        return event

    def reached(self, path: str, about: str) -> bool:
        with self.lock:
            return (path, about) in self.arrived


class _ShopHandler(BaseHTTPRequestHandler):
    server: Shop
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        sent_key = self.headers.get("Idempotency-Key")
        key = sent_key or uuid.uuid4().hex
        shop = self.server
        about = _about(body)
        with shop.lock:
            shop.keys.append((self.path, about, sent_key))
        time.sleep(shop.delay)
        with shop.lock:
            gate = shop.gates.get((self.path, about))
            if gate is not None:
                shop.arrived.add((self.path, about))
        if gate is not None:
            gate.wait(GATE_SECONDS)
        with shop.lock:
            answer = shop.done.get(key)
            if answer is None:
                answer = self._execute(body, about)
                if answer["status"] < 500:
                    shop.done[key] = answer
            shop.attempts.append((self.path, about, answer["status"]))
        status, doc = answer["status"], answer["doc"]
        data = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _execute(self, body: dict[str, Any], order: str) -> dict[str, Any]:
        shop, path = self.server, self.path
        if path == "/notify" and order in shop.conflict_on:
            return {"status": 409, "doc": {"error": "the customer cannot be told"}}
        if (path, order) in shop.failing:
            return {"status": 500, "doc": {"error": "try later"}}
        shop.log.append((path, order))
        if path == "/holds":
            doc = {"hold_id": f"H-{order}", "level": "soft", "note": "fragile"}
            if order in shop.rename_for:
                del doc["note"]
            return {"status": 201, "doc": doc}
        if path == "/refunds":
            return {"status": 201, "doc": {"refund_id": f"R-{order}"}}
        if path == "/notify":
            shop.texts[order] = str(body.get("text"))
        return {"status": 200, "doc": {}}


def _about(body: dict[str, Any]) -> str:
    return str(body.get("order_id") or body.get("hold_id") or body.get("refund_id") or "")


def _refund_workflow(name: str, timeout: str, notice: str) -> str:
    return f"""
workflow:
  name: {name}
  description: Hold the order, refund it, tell the customer.
  timeout: {timeout}
  input:
    order_id: {{ type: string, required: true }}
    amount: {{ type: number }}
  steps:
    - id: hold
      action: wfshop.hold_order
      params: {{ order_id: $input.order_id }}
      compensate: {{ action: wfshop.release_hold, params: {{ hold_id: $steps.hold.hold_id }} }}
    - id: refund
      action: wfshop.refund
      params: {{ order_id: $input.order_id, level: $steps.hold.level, memo: $steps.hold.note, amount: $input.amount }}
      compensate: {{ action: wfshop.cancel_refund, params: {{ refund_id: $steps.refund.refund_id }} }}
    - id: notify
      action: wfshop.notify
      params: {{ order_id: $input.order_id, text: "{notice}" }}
  output: {{ refund_id: $steps.refund.refund_id }}
"""


def catalog(url: str, notice: str = NOTICE) -> str:
    """Two connectors of the shop: ``wfshop`` deduplicates by Idempotency-Key, ``wfpost`` sends
    letters and deduplicates nothing (a letter is not safe to send twice). Workflows:
    ``refund_order`` (hold, refund, notify), ``refund_quick`` (the same with a 6 s timeout: an undo
    that keeps failing parks it within seconds) and ``post_order`` (hold, then a letter that cannot
    be undone). ``notice``: the notify step's text (a catalog reload changes it)."""
    return f"""
connector:
  name: wfshop
  endpoint: {url}
  idempotency_header: Idempotency-Key
  pool: {{ concurrency: 4 }}
  retry: {{ max_attempts: 1 }}
  breaker: {{ fail_max: 1000 }}
  actions:
    - action: hold_order
      path: POST /holds
      permission: write
      input: {{ order_id: {{ type: string, required: true }} }}
      output:
        hold_id: {{ type: string, required: true }}
        level: {{ type: enum, values: [soft, hard], required: true }}
        note: {{ type: string }}
    - action: release_hold
      path: POST /holds/release
      permission: write
      input: {{ hold_id: {{ type: string, required: true }} }}
    - action: refund
      path: POST /refunds
      permission: write
      input:
        order_id: {{ type: string, required: true }}
        level: {{ type: enum, values: [soft, hard] }}
        memo: {{ type: string }}
        amount: {{ type: number, default: 0 }}
      output: {{ refund_id: {{ type: string, required: true }} }}
    - action: cancel_refund
      path: POST /refunds/cancel
      permission: write
      input: {{ refund_id: {{ type: string, required: true }} }}
    - action: notify
      path: POST /notify
      permission: write
      input:
        order_id: {{ type: string, required: true }}
        text: {{ type: string, required: true }}
---
connector:
  name: wfpost
  endpoint: {url}
  pool: {{ concurrency: 2 }}
  retry: {{ max_attempts: 1 }}
  actions:
    - action: send_letter
      path: POST /letters
      permission: write
      input: {{ order_id: {{ type: string, required: true }} }}
---
{_refund_workflow("refund_order", "60s", notice)}
---
{_refund_workflow("refund_quick", "6s", notice)}
---
workflow:
  name: post_order
  description: Hold the order, then post the customer a letter.
  timeout: 60s
  input: {{ order_id: {{ type: string, required: true }} }}
  steps:
    - id: hold
      action: wfshop.hold_order
      params: {{ order_id: $input.order_id }}
      compensate: {{ action: wfshop.release_hold, params: {{ hold_id: $steps.hold.hold_id }} }}
    - id: letter
      action: wfpost.send_letter
      params: {{ order_id: $input.order_id }}
  output: {{ hold_id: $steps.hold.hold_id }}
---
agent_app:
  name: {AGENT}
  connector_bindings:
    - {{ connector: wfshop, allowed_actions: ["*"] }}
    - {{ connector: wfpost, allowed_actions: ["*"] }}
  workflows: [refund_order, refund_quick, post_order]
---
agent_app:
  name: {OTHER}
  connector_bindings: [{{ connector: wfshop, allowed_actions: ["*"] }}]
---
agent_app:
  name: {THRIFTY}
  connector_bindings:
    - connector: wfshop
      allowed_actions: ["*"]
      budget: {{ param: amount, max: 100, per: 1h }}
  workflows: [refund_order]
"""


@contextmanager
def running_shop() -> Iterator[Shop]:
    server = Shop()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        for gate in list(server.gates.values()):
            gate.set()
        server.shutdown()
        server.server_close()


def start_runner(fleet: Fleet, extra_env: dict[str, str] | None = None) -> None:
    fleet.start_process("workflows", ["workflows"], extra_env)
    fleet.wait_consuming(WORKFLOW_RECEIPTS_QUEUE_NAME, 60)
    fleet.wait_consuming(WORKFLOWS_QUEUE_NAME, 60)


def order() -> str:
    return f"o-{uuid.uuid4().hex[:10]}"


def run(agent: ReachClient, order_id: str, timeout: float = 30.0, workflow: str = "refund_order") -> Receipt:
    return agent.call(workflow, {"order_id": order_id}, timeout=timeout)


# -- on the broker: copies of the runner's messages, an agent's receipts across an outage ---------


class Copier:
    """Delivers each start job of ``run_id`` and each receipt of its steps to the runner twice more
    (a copy of the message, headers and all), from queues of its own bound beside the runner's."""

    def __init__(self, broker_url: str, owner: str, run_id: str) -> None:
        self.broker_url = broker_url
        self.run_id = run_id
        self.step_prefix = f"wf.{owner}.{run_digest(owner, run_id)}."
        self.copied: list[str] = []
        self.stopped = threading.Event()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Copier:
        self.thread.start()
        assert self.ready.wait(20), "the copier never bound its queues"
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopped.set()
        self.thread.join(10)

    def _run(self) -> None:
        tag = uuid.uuid4().hex[:8]
        starts = Queue(f"test-copier-{tag}-starts", DISPATCH_EXCHANGE, routing_key=WORKFLOWS_QUEUE_NAME, exclusive=True)
        replies = Queue(f"test-copier-{tag}-replies", RECEIPTS_EXCHANGE, routing_key=WORKFLOW_REPLY_KEY, exclusive=True)
        with Connection(self.broker_url) as conn:
            producer = Producer(conn.channel())

            def copy(message: Any) -> None:
                message.ack()
                headers = dict(message.headers or {})
                if headers.get(COPY_HEADER):
                    return
                doc = json.loads(message.body)
                exchange: Exchange = RECEIPTS_EXCHANGE
                key = WORKFLOW_REPLY_KEY
                if isinstance(doc, list):  # a start job: [[job], {}, {}]
                    if doc[0][0].get("intent_id") != self.run_id:
                        return
                    exchange, key = DISPATCH_EXCHANGE, WORKFLOWS_QUEUE_NAME
                elif not str(doc.get("intent_id", "")).startswith(self.step_prefix):
                    return
                for _ in range(2):
                    producer.publish(
                        message.body,
                        exchange=exchange,
                        routing_key=key,
                        headers={**headers, COPY_HEADER: "1"},
                        content_type=message.content_type,
                        content_encoding=message.content_encoding,
                        delivery_mode=2,
                    )
                self.copied.append(key)

            with Consumer(conn.channel(), [starts, replies], on_message=copy, no_ack=False):
                self.ready.set()
                while not self.stopped.is_set():
                    try:
                        conn.drain_events(timeout=0.2)
                    except TimeoutError:
                        pass


class Mailbox:
    """A durable queue of the test's own for an agent's receipts: it outlives the connections a
    broker outage drops (a client's own queue is exclusive and goes with its connection)."""

    def __init__(self, broker_url: str) -> None:
        tag = uuid.uuid4().hex[:8]
        self.broker_url = broker_url
        self.reply_to = f"{AGENT}.mailbox{tag}"
        self.queue = Queue(f"test-wf-mailbox-{tag}", RECEIPTS_EXCHANGE, routing_key=self.reply_to, durable=True)

    def __enter__(self) -> Mailbox:
        with Connection(self.broker_url) as conn:
            self.queue(conn.default_channel).declare()
        return self

    def __exit__(self, *exc: object) -> None:
        with Connection(self.broker_url) as conn:
            self.queue(conn.default_channel).delete()

    def receipts(self, intent_id: str, timeout: float, grace: float = 2.0) -> list[Receipt]:
        """Every receipt for ``intent_id`` that comes within ``timeout``, and ``grace`` after the first."""
        got: list[Any] = []
        with Connection(self.broker_url) as conn:
            with Consumer(conn, [self.queue], on_message=got.append, no_ack=False):
                end = time.monotonic() + timeout
                while time.monotonic() < end:
                    if any(Receipt.model_validate_json(m.body).intent_id == intent_id for m in got):
                        end = min(end, time.monotonic() + grace)
                    try:
                        conn.drain_events(timeout=0.2)
                    except TimeoutError:
                        pass
            for message in got:
                message.ack()
        receipts = [Receipt.model_validate_json(m.body) for m in got]
        return [r for r in receipts if r.intent_id == intent_id]
