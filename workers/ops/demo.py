"""``reach demo``: the whole fleet on this machine, against an example ticket system.

Starts the demo's systems (in this process: the ticket system, the warehouse on the broker, the
web shop), ``reach router``, a ``reach worker`` per connector and the workflow runner ``reach
workflows`` (as child processes), sends a handful of intents as three agents and prints their
receipts as a table. An installed connector plugin whose manifest names a demo hook adds its own
system, connector, agent and intents (workers/ops/demo_plugins.py). Then a fourth agent runs the workflow ``refund_order`` twice: once through,
and once with a last step that fails, so that the steps before it are undone; each run's steps,
and what the shop did, are printed. It stops everything it started.
"""

from __future__ import annotations

import socket
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from connectors.adapters.registry import registry
from producers.client import ReachClient, ReceiptTimeout
from producers.wire import Receipt
from workers.ops.demo_assets import CATALOG_DIR
from workers.ops.demo_assets.shop import Shop
from workers.ops.demo_assets.ticket_system import TicketSystem
from workers.ops.demo_assets.warehouse import QUEUE as WAREHOUSE_QUEUE
from workers.ops.demo_assets.warehouse import Warehouse
from workers.ops.demo_plugins import Scene, close, send, start_scenes
from workers.ops.fleet import Unreachable, redact_url
from workers.ops.local_fleet import FleetProcesses, ProcessGroup
from workers.ops.table import print_table
from workers.settings import Settings
from workers.transport.topology import WORKFLOW_RECEIPTS_QUEUE_NAME, WORKFLOWS_QUEUE_NAME, TopologyMismatch

CONNECTOR = "local_ticket_system"
WAREHOUSE = "warehouse"  # the demo's second system: type amqp (workers/ops/demo_assets/warehouse.py)
SHOP = "shop"  # the third, behind the workflow (workers/ops/demo_assets/shop.py)
WORKFLOW = "refund_order"
# each run of the workflow: its order, and its steps as (step, status, undone). The first goes
# through; the second's customer has no email address, so its last step fails and the refund and
# the hold are undone, newest first.
RUNS = {
    "ORD-1001": [("hold", "succeeded", False), ("refund", "succeeded", False), ("notify", "succeeded", False)],
    "ORD-1002": [("hold", "succeeded", True), ("refund", "succeeded", True), ("notify", "failed", False)],
}
SHOP_LOG = [
    "held ORD-1001",
    "refunded ORD-1001",
    "emailed ada@example.com",
    "held ORD-1002",
    "refunded ORD-1002",
    "could not email the customer of ORD-1002",
    "cancelled RF-ORD-1002",
    "released H-ORD-1002",
]


def _reachable(url: str, default_port: int) -> bool:
    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname or "localhost", parts.port or default_port), timeout=2):
            return True
    except OSError:
        return False


def _row(n: int, who: str, what: str, receipt: Receipt | None) -> tuple[str, ...]:
    if receipt is None:
        return (str(n), who, what, "-", "-", "no receipt")
    if receipt.success:
        outcome = ", ".join(f"{k}={v}" for k, v in list((receipt.data or {}).items())[:4])
    else:
        assert receipt.error is not None
        outcome = receipt.error.message
    code = receipt.error.code.value if receipt.error else "-"
    return (str(n), who, what, receipt.status, code, outcome)


def declare_topology(settings: Settings, catalog_dir: Path = CATALOG_DIR) -> None:
    """Declare what the demo's clients and fleet use, so it runs on a broker that never saw the fleet.

    Raises:
        Unreachable: The broker refused the connection or the declarations.
    """
    from kombu import Connection
    from kombu.exceptions import OperationalError

    from connectors.catalog import build
    from connectors.loader import load_directory
    from workers.ops.startup import dead_letter_bounds
    from workers.transport.topology import declare_all

    catalog, _ = build(load_directory(catalog_dir))
    conn = Connection(settings.broker_url, connect_timeout=10)
    try:
        with conn:
            conn.ensure_connection(max_retries=1)
            declare_all(conn, catalog.connectors, dead_letter_bounds(settings), settings.queue_type)
    except (OperationalError, *conn.connection_errors, *conn.channel_errors) as exc:
        # access refused, no such vhost: the broker's own words say which
        raise Unreachable("RabbitMQ", exc) from exc


def run_demo(settings: Settings, keep_running: bool = False) -> int:
    """Returns the process exit code: 0 when every receipt was what the script expects."""
    for name, url, port in (("RabbitMQ", settings.broker_url, 5672), ("Redis", settings.redis_url, 6379)):
        if not _reachable(url, port):
            print(
                f"{name} is not reachable at {url}: start it, or set REACH_BROKER_URL / REACH_REDIS_URL "
                "(in a checkout, `bash .ci/demo` installs and starts both).",
                file=sys.stderr,
            )
            return 2
    logs = Path(tempfile.mkdtemp(prefix="reach-demo-"))
    scenes, catalog_dir = start_scenes(registry().all(), CATALOG_DIR, logs / "catalog")
    try:
        return _run(settings, keep_running, scenes, catalog_dir, logs)
    finally:
        for scene in scenes:
            close(scene)
            print(f"stopped the demo system of {scene.name}")


def _run(settings: Settings, keep_running: bool, scenes: list[Scene], catalog_dir: Path, logs: Path) -> int:
    try:
        declare_topology(settings, catalog_dir)  # the clients check the exchanges exist before the router is up
    except Unreachable as exc:
        print(f"cannot declare the fleet's topology: {exc} (at {redact_url(settings.broker_url)})", file=sys.stderr)
        return 2
    except TopologyMismatch as exc:  # queues of an earlier demo, of another type
        print(f"cannot declare the fleet's topology: {exc}", file=sys.stderr)
        return 2
    tickets = TicketSystem(0).start()
    warehouse = Warehouse(settings.broker_url).start()
    shop = Shop().start()
    env = {"TICKETS_URL": tickets.url, "WAREHOUSE_BROKER_URL": settings.broker_url, "SHOP_URL": shop.url}
    for scene in scenes:
        env.update(scene.scene.env)
    fleet = FleetProcesses(
        ProcessGroup(logs), catalog_dir, settings.broker_url, settings.redis_url, env=env, metrics=False
    )
    print(
        f"ticket system on {tickets.url}, warehouse on queue {WAREHOUSE_QUEUE}, shop on {shop.url}; "
        f"fleet logs in {logs}"
    )
    for scene in scenes:
        print(f"{scene.name}: {scene.scene.system}")
    try:
        for proc in (
            fleet.start_router(),
            fleet.start_pool(CONNECTOR),
            fleet.start_pool(WAREHOUSE),
            fleet.start_pool(SHOP),
            *(fleet.start_pool(scene.scene.connector) for scene in scenes),
            fleet.start("workflows", ["workflows"]),
        ):
            print(f"started reach {' '.join(proc.argv[3:])} (pid {proc.pid})")
        return _script(settings, tickets, warehouse, shop, fleet, logs, keep_running, scenes, catalog_dir)
    finally:
        fleet.stop_all()
        tickets.stop()
        warehouse.stop()
        shop.stop()
        print("stopped the router, the pools, the workflow runner, the ticket system, the warehouse and the shop")


def _script(
    settings: Settings,
    tickets: TicketSystem,
    warehouse: Warehouse,
    shop: Shop,
    fleet: FleetProcesses,
    logs: Path,
    keep_running: bool,
    scenes: list[Scene],
    catalog_dir: Path,
) -> int:
    procs = list(fleet.group.items.values())
    desk = ReachClient("ticket_desk_bot", settings.broker_url)
    qa = ReachClient("ticket_qa_bot", settings.broker_url)
    stock = ReachClient("stock_bot", settings.broker_url)
    try:
        deadline = time.time() + 90
        tools: list[dict[str, Any]] = []
        while not tools:
            if any(p.poll() is not None for p in procs) or time.time() > deadline:
                print(f"the fleet did not come up; see the logs in {logs}", file=sys.stderr)
                return 1
            try:
                tools = desk.tools("openai", timeout=3)
            except ReceiptTimeout:
                continue
        print(
            f"fleet ready; ticket_desk_bot sees {len(tools)} tools: {', '.join(t['function']['name'] for t in tools)}\n"
        )
        results: list[tuple[str, str, Receipt | None, str]] = []

        def run(client: ReachClient, what: str, expect: str, action: str, params: dict[str, Any]) -> Receipt | None:
            try:
                receipt = client.call(action, params, timeout=20)
            except ReceiptTimeout:
                receipt = None
            results.append((client.agent_id, what, receipt, expect))
            return receipt

        created = run(
            desk,
            "create_ticket priority=high",
            "succeeded",
            "create_ticket",
            {"title": "Printer on fire", "description": "Third floor, smells of toner", "priority": "high"},
        )
        run(
            desk,
            "create_ticket priority=urgent",
            "VALIDATION_FAILED",
            "create_ticket",
            {"title": "VPN down", "description": "since 9am", "priority": "urgent"},
        )
        run(
            qa,
            "create_ticket (read-only agent)",
            "PERMISSION_DENIED",
            "local_ticket_system.create_ticket",
            {"title": "Hello", "description": "I should not be able to do this"},
        )
        tid = (created.data or {}).get("ticket_id", "TK-0001") if created and created.success else "TK-0001"
        run(qa, f"query_ticket tid={tid}", "succeeded", "query_ticket", {"tid": tid})
        run(
            qa,
            "query_ticket tid=TK-9999",
            "DOWNSTREAM_NOT_FOUND",
            "local_ticket_system__query_ticket",
            {"tid": "TK-9999"},
        )
        run(desk, "delete_everything", "UNKNOWN_ACTION", "delete_everything", {})
        # the second system is not REST: the same intent and receipt, over a message queue
        run(stock, "check_stock sku=PRN-42", "succeeded", "check_stock", {"sku": "PRN-42"})
        run(stock, "check_stock sku=ZZZ-9", "DOWNSTREAM_NOT_FOUND", "check_stock", {"sku": "ZZZ-9"})
        # a malformed message: not JSON at all, identified by its agent_id header; a new id each run,
        # since the fleet answers an intent id once a day (a second demo would wait in vain)
        malformed_id = f"demo-malformed-{uuid.uuid4().hex[:12]}"
        desk.publish_raw(b"{this is not json", headers={"agent_id": "ticket_desk_bot"}, message_id=malformed_id)
        try:
            malformed: Receipt | None = desk.wait(malformed_id, timeout=20)
        except ReceiptTimeout:
            malformed = None
        results.append(("ticket_desk_bot", "{this is not json", malformed, "INVALID_INTENT"))
        scenes_ok = True
        for scene in scenes:  # each installed plugin's intents, to its own system
            rows, data_ok = send(scene, settings.broker_url)
            results += rows
            scenes_ok = scenes_ok and data_ok

        print_table(
            ("#", "agent", "intent", "status", "code", "result"),
            [_row(n, who, what, r) for n, (who, what, r, _) in enumerate(results, 1)],
            max_width=60,
        )
        ok = scenes_ok and all(
            r is not None and (r.status == expect or (r.error and r.error.code.value == expect))
            for _, _, r, expect in results
        )
        calls = tickets.requests()
        print(
            f"\nthe ticket system received {len(calls)} request(s): "
            + ", ".join(f"{c['method']} {c['path']}" for c in calls)
        )
        print("the bad enum, the forbidden action, the unknown action and the malformed message never reached it.")
        print(
            f"the warehouse (type: amqp, a queue and reply_to instead of HTTP) answered {len(warehouse.requests)} "
            "stock request(s)."
        )
        ok = _workflow_runs(settings, shop, fleet, logs) and ok
        print("\nall receipts as expected" if ok else "\nSOME RECEIPTS WERE NOT AS EXPECTED")
        if keep_running:
            print(
                f"\nthe fleet keeps running (TICKETS at {tickets.url}); try:\n"
                f"  REACH_CATALOG={catalog_dir} reach send query_ticket --agent ticket_qa_bot -p tid={tid} --wait\n"
                f"  REACH_CATALOG={catalog_dir} reach send {WORKFLOW} --agent refund_bot -p order_id=ORD-1001 --wait\n"
                f"  REACH_CATALOG={catalog_dir} reach workflow list\n"
                "Ctrl-C stops everything."
            )
            try:
                while all(p.poll() is None for p in procs):
                    time.sleep(1)
            except KeyboardInterrupt:
                pass
        return 0 if ok and len(calls) == 3 and len(warehouse.requests) == 2 else 1
    finally:
        desk.close()
        qa.close()
        stock.close()


def _workflow_runs(settings: Settings, shop: Shop, fleet: FleetProcesses, logs: Path) -> bool:
    """Run the workflow for each order of RUNS as refund_bot and print what happened: each final
    receipt, each run's steps (status, code, undone), and what the shop did. True when all of it
    is what RUNS and SHOP_LOG expect."""
    print(
        f"\nthe workflow {WORKFLOW} (hold the order, refund it, email the customer; "
        "a step that fails undoes the ones before it, newest first):"
    )
    try:
        for queue in (WORKFLOWS_QUEUE_NAME, WORKFLOW_RECEIPTS_QUEUE_NAME):
            fleet.wait_consuming(queue, 60)
    except RuntimeError as exc:  # the runner did not come up, or died
        print(f"the workflow runner is not consuming: {exc}", file=sys.stderr)
        return False
    ok = True
    rows: list[tuple[str, ...]] = []
    with ReachClient("refund_bot", settings.broker_url) as bot:
        for n, (order, expected) in enumerate(RUNS.items(), 1):
            try:
                receipt: Receipt | None = bot.call(WORKFLOW, {"order_id": order}, timeout=60)
            except ReceiptTimeout:
                receipt = None
            if receipt is None:
                print(f"run {n} ({order}): no final receipt within 60 s; see the logs in {logs}")
                ok = False
                continue
            if receipt.success:
                outcome = ", ".join(f"{k}={v}" for k, v in (receipt.data or {}).items())
            else:
                assert receipt.error is not None
                outcome = f"{receipt.error.code.value}: {receipt.error.message}"
            print(f"run {n}: {WORKFLOW} order_id={order} -> {receipt.status}; {outcome}")
            steps = receipt.execution.steps or []
            rows += [
                (str(n), str(s["step"]), str(s["status"]), str(s["code"] or "-"), "yes" if s["undone"] else "no")
                for s in steps
            ]
            got = [(s["step"], s["status"], bool(s["undone"])) for s in steps]
            wanted_code = None if order == "ORD-1001" else "STEP_FAILED"
            code = receipt.error.code.value if receipt.error else None
            ok = ok and got == expected and code == wanted_code
    print()
    print_table(("run", "step", "status", "code", "undone"), rows)
    done = shop.done()
    print(f"\nthe shop did, in order: {', '.join(done)}")
    return ok and done == SHOP_LOG
