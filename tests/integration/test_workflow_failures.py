"""Workflows when things go wrong, through the real fleet (router, the shop's two pools, the runner)
against the fake shop of tests/integration/workflow_shop.py, which logs what it did in order.

Each test asserts what a user sees: the agent's one final receipt, the shop's calls (how many, in
which order), the run as ``reach workflow show`` prints it, and the runner's metrics:

- the pool killed during a step that is not safe to repeat: the run ends ``unknown``
  (STEP_OUTCOME_UNKNOWN), nothing undone, the step not repeated;
- step 3 refused (409) and the runner killed between the two undos: undo 2 then undo 1, once each;
- an undo failing until a switch flips: the run parks (COMPENSATION_FAILED, once); ``reach workflow
  resume`` then undoes each step once, with no second final receipt; ``abort`` records and sends nothing;
- every start job and step receipt delivered to the runner three times: no extra call;
- the catalog reloaded mid-run (the fleet reads it at start: router and runner restarted on a new
  file): the run finishes on the definition it started with, the next run on the new one;
- the broker dropping every connection, RabbitMQ restarted (``broker_restart``, a phase of its own
  in CI) and Redis killed and restarted (a Redis of the test's own, with its append-only file):
  no extra call, one final receipt;
- the runner stopped (SIGSTOP) until a step's receipt waits for it, then continued;
- a guardrail refusing step 2 mid-run (a value budget): the step fails, step 1 is undone.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import unquote, urlsplit

import pytest
from click.testing import CliRunner

from producers.client import ReachClient
from producers.wire import Receipt
from tests.fleet import Fleet
from tests.integration.legacy_responder import close_connections, legacy_vhost
from tests.integration.redis_topologies import LocalRedis
from tests.integration.workflow_shop import (
    AGENT,
    NOTICE,
    THRIFTY,
    Copier,
    Mailbox,
    Shop,
    catalog,
    order,
    run,
    running_shop,
    start_runner,
)
from tests.waiting import wait_for
from workers.cli import main
from workers.transport.topology import (
    INTENTS_QUEUE,
    WORKFLOW_RECEIPTS_QUEUE_NAME,
    WORKFLOW_REPLY_KEY,
    WORKFLOWS_QUEUE_NAME,
    connector_queue,
)


@pytest.fixture(scope="module")
def shop() -> Iterator[Shop]:
    with running_shop() as server:
        yield server


@pytest.fixture(scope="module")
def fleet(shop: Shop) -> Iterator[Fleet]:
    with Fleet(catalog(shop.url), ["wfshop", "wfpost"]) as running:
        start_runner(running)
        yield running


@pytest.fixture(autouse=True)
def whole_fleet(request: pytest.FixtureRequest) -> None:
    """A test that failed midway may leave the runner or a pool down: bring them back first."""
    if "fleet" not in request.fixturenames:
        return
    fleet: Fleet = request.getfixturevalue("fleet")
    if "workflows" not in fleet.processes.names:
        start_runner(fleet)
    else:
        os.killpg(fleet.processes.pid("workflows"), signal.SIGCONT)
    for pool in ("wfshop", "wfpost"):
        if pool not in fleet.processes.names:
            start_pool(fleet, pool)


@pytest.fixture()
def agent(fleet: Fleet) -> Iterator[ReachClient]:
    with ReachClient(AGENT, fleet.broker_url, drop_duplicates=False) as client:
        yield client


def start_pool(fleet: Fleet, pool: str) -> None:
    fleet.start_process(pool, ["worker", pool])
    fleet.wait_consuming(connector_queue(pool).name, 60)


def reach(fleet: Fleet, *args: str) -> Any:
    env = {"REACH_BROKER_URL": fleet.broker_url, "REACH_REDIS_URL": fleet.redis_url}
    return CliRunner().invoke(main, list(args), env=env)


def show(fleet: Fleet, run_id: str, agent: str = AGENT) -> dict[str, Any]:
    shown = reach(fleet, "workflow", "show", run_id, "--agent", agent, "--json")
    assert shown.exit_code == 0, shown.output
    return dict(json.loads(shown.output))


def no_other_receipt(client: ReachClient, intent_id: str, seconds: float = 1.5) -> None:
    with pytest.raises(TimeoutError):
        client.wait(intent_id, timeout=seconds)


def waiting_in(fleet: Fleet, queue: str) -> int:
    """Messages in a queue, ready or delivered to a consumer that has not acked them (a stopped one)."""
    vhost = unquote(urlsplit(fleet.broker_url).path[1:]) or "/"
    out = subprocess.run(
        ["rabbitmqctl", "-q", "list_queues", "-p", vhost, "name", "messages"],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == queue:
            return int(parts[1])
    return 0


def steps_of(receipt: Receipt) -> list[tuple[str, str, str | None, bool]]:
    return [(s["step"], s["status"], s["code"], s["undone"]) for s in receipt.execution.steps or []]


# -- 1. the pool killed during a step that is not safe to repeat -------------------------------------


def test_the_pool_killed_during_a_step_not_safe_to_repeat_ends_unknown_without_undo_or_repeat(
    fleet: Fleet, shop: Shop, agent: ReachClient
) -> None:
    order_id = order()
    letter = shop.gate("/letters", order_id)
    intent_id = agent.publish("post_order", {"order_id": order_id})
    wait_for(lambda: shop.reached("/letters", order_id), 20, "the letter never reached the shop")
    fleet.kill_process("wfpost")
    letter.set()  # the shop posts it; the pool that asked never hears back
    wait_for(lambda: shop.tries("/letters", order_id) == [200], 10, "the shop never posted the letter")
    start_pool(fleet, "wfpost")
    receipt = agent.wait(intent_id, timeout=30)
    assert receipt.status == "unknown" and receipt.error is not None, receipt
    assert receipt.error.code == "STEP_OUTCOME_UNKNOWN" and receipt.error.retryable is False
    assert "'letter'" in receipt.error.message
    assert steps_of(receipt) == [("hold", "succeeded", None, False), ("letter", "unknown", "OUTCOME_UNKNOWN", False)]
    no_other_receipt(agent, intent_id)
    assert shop.calls(order_id) == ["/holds", "/letters"]  # the hold is not released, the letter not sent again
    assert shop.tries("/letters", order_id) == [200]
    shown = show(fleet, intent_id)
    assert shown["state"] == "unknown" and shown["final_receipt"]["error"]["code"] == "STEP_OUTCOME_UNKNOWN"


# -- 2. the runner killed between two undos ------------------------------------------------------------


def test_a_conflict_with_the_runner_killed_between_the_undos_undoes_2_then_1_once_each(
    fleet: Fleet, shop: Shop, agent: ReachClient
) -> None:
    order_id = order()
    shop.conflict_on.add(order_id)
    second_undo = shop.gate("/refunds/cancel", f"R-{order_id}")
    intent_id = agent.publish("refund_order", {"order_id": order_id})
    wait_for(lambda: shop.reached("/refunds/cancel", f"R-{order_id}"), 20, "undo 2 never reached the shop")
    fleet.kill_process("workflows")
    second_undo.set()
    wait_for(lambda: waiting_in(fleet, WORKFLOW_RECEIPTS_QUEUE_NAME) >= 1, 20, "undo 2's receipt never came", 0.3)
    start_runner(fleet)
    receipt = agent.wait(intent_id, timeout=30)
    assert receipt.error is not None and receipt.error.code == "STEP_FAILED", receipt
    assert shop.calls(order_id) == ["/holds", "/refunds", "/refunds/cancel", "/holds/release"]
    assert shop.tries("/refunds/cancel", f"R-{order_id}") == [200]
    assert shop.tries("/holds/release", f"H-{order_id}") == [200]
    assert [(s, undone) for s, _, _, undone in steps_of(receipt)] == [
        ("hold", True),
        ("refund", True),
        ("notify", False),
    ]
    no_other_receipt(agent, intent_id)


# -- 3. an undo that keeps failing: parked, then resumed or aborted ---------------------------------


def parked_run(shop: Shop, agent: ReachClient) -> tuple[str, str, Receipt]:
    """A run of refund_quick whose notice is refused and whose refund cannot be cancelled (500)."""
    order_id = order()
    shop.conflict_on.add(order_id)
    shop.failing.add(("/refunds/cancel", f"R-{order_id}"))
    intent_id = agent.publish("refund_quick", {"order_id": order_id})
    return order_id, intent_id, agent.wait(intent_id, timeout=30)


def test_an_undo_failing_until_a_switch_flips_parks_the_run_and_resume_undoes_each_step_once(
    fleet: Fleet, shop: Shop, agent: ReachClient
) -> None:
    order_id, intent_id, receipt = parked_run(shop, agent)
    assert receipt.status == "unknown" and receipt.error is not None, receipt
    assert receipt.error.code == "COMPENSATION_FAILED" and receipt.error.retryable is False
    assert "'refund'" in receipt.error.message
    tries = shop.tries("/refunds/cancel", f"R-{order_id}")
    assert len(tries) >= 2 and set(tries) == {500}  # tried again with backoff, then parked
    assert shop.calls(order_id) == ["/holds", "/refunds"]  # nothing undone yet
    assert show(fleet, intent_id)["state"] == "parked"

    shop.failing.discard(("/refunds/cancel", f"R-{order_id}"))  # the switch flips
    resumed = reach(fleet, "workflow", "resume", intent_id, "--agent", AGENT, "--as", "ops_ann")
    assert resumed.exit_code == 0 and "no second final receipt" in resumed.output, resumed.output
    shown = wait_for(
        lambda: show(fleet, intent_id), 20, "the resumed run never ended", 0.3, lambda r: r["state"] == "failed"
    )
    assert shop.calls(order_id) == ["/holds", "/refunds", "/refunds/cancel", "/holds/release"]
    assert shop.tries("/refunds/cancel", f"R-{order_id}") == [*tries, 200]
    assert shop.tries("/holds/release", f"H-{order_id}") == [200]
    # every try of one undo, the resumed one too, carries one idempotency key, so a system behind
    # idempotency_header applies it once even when a try's answer was lost
    keys = shop.keys_sent("/refunds/cancel", f"R-{order_id}")
    assert len(keys) == len(tries) + 1 and len(set(keys)) == 1 and None not in keys, keys
    assert [s["undone"] for s in shown["steps"]] == [True, True, False]
    assert any(e["what"].startswith("resumed") and e["by"] == "ops_ann" for e in shown["events"]), shown["events"]
    traced = reach(fleet, "trace", intent_id, "--agent", AGENT)
    assert traced.exit_code == 0 and "run_resumed" in traced.output and "ops_ann" in traced.output, traced.output
    assert shown["final_receipt"]["error"]["code"] == "COMPENSATION_FAILED"  # what the agent was told stays
    no_other_receipt(agent, intent_id)
    again = reach(fleet, "workflow", "resume", intent_id, "--agent", AGENT)
    assert again.exit_code == 1 and "only a parked or unknown run" in again.output


def test_abort_of_a_parked_run_records_it_and_sends_nothing(fleet: Fleet, shop: Shop, agent: ReachClient) -> None:
    order_id, intent_id, receipt = parked_run(shop, agent)
    assert receipt.error is not None and receipt.error.code == "COMPENSATION_FAILED", receipt
    tries = shop.tries("/refunds/cancel", f"R-{order_id}")
    shop.failing.discard(("/refunds/cancel", f"R-{order_id}"))
    aborted = reach(fleet, "workflow", "abort", intent_id, "--agent", AGENT, "--as", "ops_bob")
    assert aborted.exit_code == 0, aborted.output
    shown = show(fleet, intent_id)
    assert shown["state"] == "failed"
    assert shown["outbound"] is None or shown["outbound"]["kind"] == "final"  # the one sent at parking
    assert any(e["what"].startswith("aborted") and e["by"] == "ops_bob" for e in shown["events"])
    assert "run_aborted" in reach(fleet, "trace", intent_id, "--agent", AGENT).output
    no_other_receipt(agent, intent_id, 3.0)  # the sweep (every second) had time to send anything
    assert shop.tries("/refunds/cancel", f"R-{order_id}") == tries
    assert shop.calls(order_id) == ["/holds", "/refunds"]
    assert reach(fleet, "workflow", "abort", intent_id, "--agent", AGENT).exit_code == 1


# -- 4. every runner message delivered three times ------------------------------------------------------


def test_each_runner_message_delivered_three_times_calls_nothing_extra(
    fleet: Fleet, shop: Shop, agent: ReachClient
) -> None:
    order_id, intent_id = order(), f"dup{os.urandom(8).hex()}"
    with Copier(fleet.broker_url, AGENT, intent_id) as copier:
        agent.publish("refund_order", {"order_id": order_id}, intent_id=intent_id)
        receipt = agent.wait(intent_id, timeout=30)
        wait_for(lambda: len(copier.copied), 10, "the copier copied nothing", until=lambda n: n >= 4)
        no_other_receipt(agent, intent_id, 2.0)
    assert receipt.status == "succeeded", receipt
    assert sorted(copier.copied) == [WORKFLOW_REPLY_KEY] * 3 + [WORKFLOWS_QUEUE_NAME]
    assert shop.calls(order_id) == ["/holds", "/refunds", "/notify"]
    assert shop.tries("/holds", order_id) == [201] and shop.tries("/notify", order_id) == [200]
    assert shop.tries("/refunds", order_id) == [201]


# -- 5. a catalog reload mid-run ------------------------------------------------------------------------


def restart_router_and_runner(fleet: Fleet) -> None:
    fleet.stop_process("workflows")
    fleet.stop_process("router")
    fleet.start_process("router", ["router"])
    fleet.wait_consuming(INTENTS_QUEUE.name, 60)
    start_runner(fleet)


def test_a_run_finishes_on_the_definition_it_started_with_across_a_catalog_reload(
    fleet: Fleet, shop: Shop, agent: ReachClient
) -> None:
    order_id = order()
    refund = shop.gate("/refunds", order_id)
    intent_id = agent.publish("refund_order", {"order_id": order_id})
    wait_for(lambda: shop.reached("/refunds", order_id), 20, "the refund never reached the shop")
    changed = "Changed: {$steps.refund.refund_id} is on its way"
    (fleet.dir / "catalog.yaml").write_text(catalog(shop.url, notice=changed))
    restart_router_and_runner(fleet)  # the fleet reads its catalog when a process starts
    refund.set()
    receipt = agent.wait(intent_id, timeout=30)
    assert receipt.status == "succeeded", receipt
    assert shop.calls(order_id) == ["/holds", "/refunds", "/notify"]
    assert shop.texts[order_id] == NOTICE.replace("{$steps.refund.refund_id}", f"R-{order_id}")
    later = order()
    assert run(agent, later).status == "succeeded"
    assert shop.texts[later] == f"Changed: R-{later} is on its way"  # the reload took
    no_other_receipt(agent, intent_id, 0.5)


# -- 6. the broker and Redis going away mid-run --------------------------------------------------------


def one_run_through(
    fleet: Fleet, shop: Shop, outage: Callable[[str, threading.Event], None], asked_once: bool = True
) -> None:
    """A run whose refund is held at the shop while ``outage(order_id, gate)`` happens (it lets the
    refund go): the run succeeds once, each call executed once. ``asked_once``: and each asked
    once (else a call may be asked again with its Idempotency-Key, which the shop executes once)."""
    order_id = order()
    refund = shop.gate("/refunds", order_id)
    with Mailbox(fleet.broker_url) as mailbox:
        with ReachClient(AGENT, fleet.broker_url, reply_to=mailbox.reply_to) as client:
            intent_id = client.publish("refund_order", {"order_id": order_id})
        wait_for(lambda: shop.reached("/refunds", order_id), 20, "the refund never reached the shop")
        outage(order_id, refund)
        receipts = mailbox.receipts(intent_id, timeout=40)
    assert len(receipts) == 1 and receipts[0].status == "succeeded", receipts
    assert shop.calls(order_id) == ["/holds", "/refunds", "/notify"]
    tries = [shop.tries(p, order_id) for p in ("/holds", "/refunds", "/notify")]
    assert tries == [[201], [201], [200]] if asked_once else {s for t in tries for s in t} == {200, 201}, tries


def test_the_broker_dropping_every_connection_mid_run_calls_nothing_extra(fleet: Fleet, shop: Shop) -> None:
    def outage(order_id: str, refund: threading.Event) -> None:
        close_connections(fleet.broker_url)  # the runner's, the pools', the router's
        refund.set()

    one_run_through(fleet, shop, outage)
    fleet.check_alive()


@pytest.mark.broker_restart
def test_a_broker_restart_mid_run_calls_nothing_extra(fleet: Fleet, shop: Shop) -> None:
    def outage(order_id: str, refund: threading.Event) -> None:
        try:
            subprocess.run(["rabbitmqctl", "stop_app"], check=True, capture_output=True, timeout=120)
        finally:  # whatever happens, the machine's broker comes back
            subprocess.run(["rabbitmqctl", "start_app"], check=True, capture_output=True, timeout=120)
            subprocess.run(["rabbitmqctl", "await_startup"], check=True, capture_output=True, timeout=120)
        refund.set()

    one_run_through(fleet, shop, outage)
    fleet.check_alive()


def test_redis_killed_and_restarted_mid_run_calls_nothing_extra(shop: Shop) -> None:
    """On a fleet of its own (its own vhost, a Redis with an append-only file it can kill)."""
    with LocalRedis() as server, legacy_vhost() as broker_url:
        with Fleet(catalog(shop.url), ["wfshop"], broker_url=broker_url, redis_url=server.url) as own:
            start_runner(own)

            def outage(order_id: str, refund: threading.Event) -> None:
                server.kill()  # kill -9: what Redis answered is in its append-only file
                refund.set()  # the shop refunds while Redis is down
                wait_for(lambda: shop.tries("/refunds", order_id) == [201], 10, "the shop never refunded")
                time.sleep(2.0)  # Redis stays down while the fleet runs on (not an assertion)
                server.start()

            # the pool that had the refund's answer could not record it while Redis was down: its
            # next delivery asks the shop again, with the same Idempotency-Key
            one_run_through(own, shop, outage, asked_once=False)
            own.check_alive()


# -- 7. the runner stopped until a receipt waits for it -------------------------------------------------


def test_the_runner_stopped_until_a_step_receipt_waits_loses_and_repeats_nothing(
    fleet: Fleet, shop: Shop, agent: ReachClient
) -> None:
    order_id = order()
    refund = shop.gate("/refunds", order_id)
    intent_id = agent.publish("refund_order", {"order_id": order_id})
    wait_for(lambda: shop.reached("/refunds", order_id), 20, "the refund never reached the shop")
    pid = fleet.processes.pid("workflows")
    os.killpg(pid, signal.SIGSTOP)
    try:
        refund.set()
        wait_for(
            lambda: waiting_in(fleet, WORKFLOW_RECEIPTS_QUEUE_NAME) >= 1, 20, "the refund's receipt never came", 0.3
        )
    finally:
        os.killpg(pid, signal.SIGCONT)
    receipt = agent.wait(intent_id, timeout=30)
    assert receipt.status == "succeeded", receipt
    assert shop.calls(order_id) == ["/holds", "/refunds", "/notify"]
    assert [shop.tries(p, order_id) for p in ("/holds", "/refunds", "/notify")] == [[201], [201], [200]]
    no_other_receipt(agent, intent_id)
    assert fleet.processes.pid("workflows") == pid


# -- 8. a guardrail refusing a step mid-run -------------------------------------------------------------


def test_a_budget_refusing_step_2_fails_the_run_and_undoes_step_1(fleet: Fleet, shop: Shop) -> None:
    first, order_id = order(), order()
    with ReachClient(THRIFTY, fleet.broker_url, drop_duplicates=False) as thrifty:
        assert thrifty.call("refund_order", {"order_id": first, "amount": 80}, timeout=30).status == "succeeded"
        # 80 of the budget's 100 an hour are spent: the next refund of 80 is refused at the router
        receipt = thrifty.call("refund_order", {"order_id": order_id, "amount": 80}, timeout=30)
        no_other_receipt(thrifty, receipt.intent_id)
    assert receipt.status == "failed" and receipt.error is not None, receipt
    assert receipt.error.code == "STEP_FAILED" and "'refund'" in receipt.error.message
    assert receipt.error.details[0]["code"] == "BUDGET_EXCEEDED"
    assert steps_of(receipt) == [("hold", "succeeded", None, True), ("refund", "rejected", "BUDGET_EXCEEDED", False)]
    assert shop.calls(order_id) == ["/holds", "/holds/release"]  # the refund never reached the shop
    assert show(fleet, receipt.intent_id, THRIFTY)["state"] == "failed"


# -- metrics ----------------------------------------------------------------------------------------------


def scrape(fleet: Fleet) -> dict[str, float]:
    """The runner's reach_workflow_* samples, keyed ``name{label="value",...}`` with labels sorted."""
    url = f"http://127.0.0.1:{fleet.metrics_port('workflows')}/metrics"
    with urllib.request.urlopen(url, timeout=10) as answer:
        text = answer.read().decode()
    found = {}
    for line in text.splitlines():
        match = re.match(r"^(reach_workflow_[a-z_]+)(?:\{([^}]*)\})? ([0-9.e+-]+)$", line)
        if match:
            labels = ",".join(sorted(match.group(2).split(","))) if match.group(2) else ""
            found[f"{match.group(1)}{{{labels}}}" if labels else match.group(1)] = float(match.group(3))
    return found


def test_the_runner_counts_runs_by_outcome_and_times_steps(fleet: Fleet, shop: Shop, agent: ReachClient) -> None:
    before = scrape(fleet)
    assert run(agent, order()).status == "succeeded"
    refused = order()
    shop.conflict_on.add(refused)
    assert run(agent, refused).status == "failed"
    after = wait_for(
        lambda: scrape(fleet),
        10,
        "the runner's metrics never moved",
        until=lambda m: (
            m.get('reach_workflow_runs_total{outcome="failed",workflow="refund_order"}', 0)
            > before.get('reach_workflow_runs_total{outcome="failed",workflow="refund_order"}', 0)
        ),
    )

    def moved(name: str) -> float:
        return after.get(name, 0) - before.get(name, 0)

    assert moved('reach_workflow_runs_total{outcome="succeeded",workflow="refund_order"}') == 1
    assert moved('reach_workflow_runs_total{outcome="failed",workflow="refund_order"}') == 1
    assert moved('reach_workflow_runs_started_total{workflow="refund_order"}') == 2
    assert moved('reach_workflow_step_seconds_count{kind="do",step="refund",workflow="refund_order"}') == 2
    assert moved('reach_workflow_step_seconds_count{kind="undo",step="hold",workflow="refund_order"}') == 1
    assert "reach_workflow_runs_in_flight" in after
