"""Workflows through the real fleet: router, the shop's pool and the runner (``reach workflows``),
against a fake shop that keeps an ordered log of what it *did* (each Idempotency-Key executes once).

Every test starts runs of its own (order ids of its own) and reads the shop's log for them: the
happy path (three calls, one final receipt), a conflict on the last step (undo 2 then undo 1, once
each), a renamed output field (step 2 never called, the receipt names the reference), a runner
killed at each crash point (each call exactly once, one final receipt), a start sent twice, and
what another agent may not do.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from click.testing import CliRunner

from producers.client import ReachClient
from producers.wire import Receipt
from tests.fleet import Fleet
from tests.waiting import wait_for
from workers.cli import main
from workers.transport.topology import (
    ON_BEHALF_OF_HEADER,
    RUN_ID_HEADER,
    WORKFLOW_RECEIPTS_QUEUE_NAME,
    WORKFLOW_REPLY_KEY,
    WORKFLOWS_QUEUE_NAME,
)

RUN = uuid.uuid4().hex[:6]
AGENT = f"wf_{RUN}"
OTHER = f"wfo_{RUN}"


class Shop(ThreadingHTTPServer):
    """Holds, refunds, notices, and their undos. ``log``: (path, order id or undone id) in the order
    executed; ``conflict_on``/``rename_for``: order ids whose notice answers 409 / whose hold answers
    without ``note`` (the system renamed it: a field the output does not declare would break the
    declared output, so the renamed one is left out here)."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _ShopHandler)
        self.lock = threading.Lock()
        self.log: list[tuple[str, str]] = []
        self.done: dict[str, dict[str, Any]] = {}  # Idempotency-Key -> the answer given
        self.conflict_on: set[str] = set()
        self.rename_for: set[str] = set()
        self.delay = 0.0

    def calls(self, order: str) -> list[str]:
        with self.lock:
            return [path for path, about in self.log if order in about]


class _ShopHandler(BaseHTTPRequestHandler):
    server: Shop
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        key = self.headers.get("Idempotency-Key") or uuid.uuid4().hex
        shop = self.server
        time.sleep(shop.delay)
        with shop.lock:
            answer = shop.done.get(key)
            if answer is None:
                answer = self._execute(body)
                shop.done[key] = answer
        status, doc = answer["status"], answer["doc"]
        data = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _execute(self, body: dict[str, Any]) -> dict[str, Any]:
        shop, path = self.server, self.path
        order = str(body.get("order_id") or body.get("hold_id") or body.get("refund_id") or "")
        if path == "/notify" and order in shop.conflict_on:
            return {"status": 409, "doc": {"error": "the customer cannot be told"}}
        shop.log.append((path, order))
        if path == "/holds":
            doc = {"hold_id": f"H-{order}", "level": "soft", "note": "fragile"}
            if order in shop.rename_for:
                del doc["note"]
            return {"status": 201, "doc": doc}
        if path == "/refunds":
            return {"status": 201, "doc": {"refund_id": f"R-{order}"}}
        return {"status": 200, "doc": {}}


def catalog(url: str) -> str:
    return f"""
connector:
  name: wfshop
  endpoint: {url}
  idempotency_header: Idempotency-Key
  pool: {{ concurrency: 4 }}
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
workflow:
  name: refund_order
  description: Hold the order, refund it, tell the customer.
  timeout: 60s
  input: {{ order_id: {{ type: string, required: true }} }}
  steps:
    - id: hold
      action: wfshop.hold_order
      params: {{ order_id: $input.order_id }}
      compensate: {{ action: wfshop.release_hold, params: {{ hold_id: $steps.hold.hold_id }} }}
    - id: refund
      action: wfshop.refund
      params: {{ order_id: $input.order_id, level: $steps.hold.level, memo: $steps.hold.note }}
      compensate: {{ action: wfshop.cancel_refund, params: {{ refund_id: $steps.refund.refund_id }} }}
    - id: notify
      action: wfshop.notify
      params: {{ order_id: $input.order_id, text: "Refund {{$steps.refund.refund_id}} done" }}
  output: {{ refund_id: $steps.refund.refund_id }}
---
agent_app:
  name: {AGENT}
  connector_bindings: [{{ connector: wfshop, allowed_actions: ["*"] }}]
  workflows: [refund_order]
---
agent_app:
  name: {OTHER}
  connector_bindings: [{{ connector: wfshop, allowed_actions: ["*"] }}]
"""


@pytest.fixture(scope="module")
def shop() -> Iterator[Shop]:
    server = Shop()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()


@pytest.fixture(scope="module")
def fleet(shop: Shop) -> Iterator[Fleet]:
    with Fleet(catalog(f"http://127.0.0.1:{shop.server_address[1]}"), ["wfshop"]) as running:
        start_runner(running)
        yield running


def start_runner(fleet: Fleet, extra_env: dict[str, str] | None = None) -> None:
    fleet.start_process("workflows", ["workflows"], extra_env)
    fleet.wait_consuming(WORKFLOW_RECEIPTS_QUEUE_NAME, 60)
    fleet.wait_consuming(WORKFLOWS_QUEUE_NAME, 60)


@pytest.fixture()
def agent(fleet: Fleet) -> Iterator[ReachClient]:
    with ReachClient(AGENT, fleet.broker_url, drop_duplicates=False) as client:
        yield client


def order() -> str:
    return f"o-{uuid.uuid4().hex[:10]}"


def run(agent: ReachClient, order_id: str, timeout: float = 30.0) -> Receipt:
    return agent.call("refund_order", {"order_id": order_id}, timeout=timeout)


def test_a_run_calls_three_steps_in_order_and_answers_once(fleet: Fleet, shop: Shop, agent: ReachClient) -> None:
    order_id = order()
    receipt = run(agent, order_id)
    assert receipt.status == "succeeded", receipt
    assert receipt.action == "refund_order" and receipt.connector is None
    assert receipt.data == {"refund_id": f"R-{order_id}"}
    steps = receipt.execution.steps
    assert steps is not None and [s["step"] for s in steps] == ["hold", "refund", "notify"]
    assert all(s["status"] == "succeeded" and s["undone"] is False and s["intent_id"] for s in steps)
    assert shop.calls(order_id) == ["/holds", "/refunds", "/notify"]
    with pytest.raises(TimeoutError):
        agent.wait(receipt.intent_id, timeout=1)  # one final receipt, no other


def test_a_conflict_on_the_last_step_undoes_the_others_newest_first(
    fleet: Fleet, shop: Shop, agent: ReachClient
) -> None:
    order_id = order()
    shop.conflict_on.add(order_id)
    receipt = run(agent, order_id)
    assert receipt.status == "failed" and receipt.error is not None and receipt.error.code == "STEP_FAILED"
    assert "notify" in receipt.error.message and receipt.error.retryable is False
    assert shop.calls(order_id) == ["/holds", "/refunds", "/refunds/cancel", "/holds/release"]
    assert [(s["step"], s["undone"]) for s in receipt.execution.steps or []] == [
        ("hold", True),
        ("refund", True),
        ("notify", False),
    ]


def test_a_renamed_output_field_stops_the_run_before_the_step_that_reads_it(
    fleet: Fleet, shop: Shop, agent: ReachClient
) -> None:
    """The pool refuses an answer without a declared output field (DOWNSTREAM_CONTRACT_VIOLATION),
    so a rename is caught at the step that answers, before any step reads it. (A reference with no
    value at run time — a nested path, an answer too large to keep — fails the run naming the
    reference: tests/unit/test_workflow_machine.py.)"""
    order_id = order()
    shop.rename_for.add(order_id)
    receipt = run(agent, order_id)
    assert receipt.error is not None and receipt.error.code == "STEP_FAILED"
    assert "'hold'" in receipt.error.message and receipt.error.details[0]["code"] == "DOWNSTREAM_CONTRACT_VIOLATION"
    assert shop.calls(order_id) == ["/holds"]  # refund never called


@pytest.mark.parametrize("point", ["after_state_write", "after_publish", "before_ack"])
def test_a_runner_killed_at_each_point_repeats_nothing(
    fleet: Fleet, shop: Shop, agent: ReachClient, point: str
) -> None:
    fleet.stop_process("workflows")
    start_runner(fleet, {"REACH_WORKFLOW_CRASH_AT": point})
    order_id = order()
    intent_id = agent.publish("refund_order", {"order_id": order_id})
    proc = fleet.processes.proc("workflows")
    wait_for(lambda: proc.poll() is not None, 30, f"the runner never reached {point}")
    start_runner(fleet)
    receipt = agent.wait(intent_id, timeout=30)
    assert receipt.status == "succeeded", receipt
    assert shop.calls(order_id) == ["/holds", "/refunds", "/notify"]
    with pytest.raises(TimeoutError):
        agent.wait(intent_id, timeout=1)


def test_a_start_sent_twice_runs_once(fleet: Fleet, shop: Shop, agent: ReachClient) -> None:
    order_id = order()
    intent_id = uuid.uuid4().hex
    agent.publish("refund_order", {"order_id": order_id}, intent_id=intent_id)
    agent.publish("refund_order", {"order_id": order_id}, intent_id=intent_id)
    receipt = agent.wait(intent_id, timeout=30)
    assert receipt.status == "succeeded"
    time.sleep(1)
    assert shop.calls(order_id) == ["/holds", "/refunds", "/notify"]


def test_another_agent_cannot_drive_or_read_a_run(fleet: Fleet, shop: Shop, agent: ReachClient) -> None:
    order_id = order()
    receipt = run(agent, order_id)
    step = (receipt.execution.steps or [])[0]["intent_id"]
    with ReachClient(OTHER, fleet.broker_url, drop_duplicates=False) as other:
        # a step intent of the run, as another agent would forge it
        forged = {
            "intent_id": f"{step}x",
            "agent_id": OTHER,
            "action": "wfshop.hold_order",
            "params": {"order_id": order_id},
            "reply_to": WORKFLOW_REPLY_KEY,
        }
        other.publish_raw(
            json.dumps(forged).encode(),
            headers={"agent_id": OTHER, RUN_ID_HEADER: receipt.intent_id},
            message_id=f"{step}x",
        )
        refused = other.wait(f"{step}x", timeout=15)
        assert refused.status == "rejected" and refused.error is not None
        assert refused.error.code in ("PERMISSION_DENIED", "INVALID_INTENT")
        # claiming to act for the owner
        other.publish_raw(
            json.dumps({**forged, "intent_id": f"{step}y"}).encode(),
            headers={"agent_id": OTHER, ON_BEHALF_OF_HEADER: AGENT, RUN_ID_HEADER: receipt.intent_id},
            message_id=f"{step}y",
        )
        assert other.wait(f"{step}y", timeout=15).status == "rejected"
        # the workflow is not bound to it
        denied = other.call("refund_order", {"order_id": order_id}, timeout=15)
        assert denied.error is not None and denied.error.code in ("PERMISSION_DENIED", "UNKNOWN_ACTION")
    assert shop.calls(order_id) == ["/holds", "/refunds", "/notify"]
    env = {"REACH_BROKER_URL": fleet.broker_url, "REACH_REDIS_URL": fleet.redis_url}
    shown = CliRunner().invoke(main, ["workflow", "show", receipt.intent_id, "--agent", OTHER], env=env)
    assert shown.exit_code == 1 and "no run" in shown.output
    mine = CliRunner().invoke(main, ["workflow", "show", receipt.intent_id, "--agent", AGENT], env=env)
    assert mine.exit_code == 0 and step in mine.output
    listed = CliRunner().invoke(main, ["workflow", "list", "--json", "--agent", AGENT], env=env)
    rows = json.loads(listed.output)
    assert {"run_id", "intent_id", "workflow", "state"} <= set(rows[0])
    assert any(r["run_id"] == receipt.intent_id and r["state"] == "succeeded" for r in rows)
