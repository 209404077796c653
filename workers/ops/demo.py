"""``reach demo``: the whole fleet on this machine, against an example ticket system.

Starts the ticket system (in this process), ``reach router`` and ``reach worker
local_ticket_system`` (as child processes), sends a handful of intents as two agents, prints
their receipts as a table, and stops everything it started.
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

from producers.client import ReachClient, ReceiptTimeout
from producers.wire import Receipt
from workers.ops.demo_assets import CATALOG_DIR
from workers.ops.demo_assets.ticket_system import TicketSystem
from workers.ops.demo_assets.warehouse import QUEUE as WAREHOUSE_QUEUE
from workers.ops.demo_assets.warehouse import Warehouse
from workers.ops.fleet import Unreachable, redact_url
from workers.ops.processes import FleetProcesses, Proc, ProcessGroup
from workers.ops.table import print_table
from workers.settings import Settings
from workers.transport.topology import TopologyMismatch

CONNECTOR = "local_ticket_system"
WAREHOUSE = "warehouse"  # the demo's second system: type amqp (workers/ops/demo_assets/warehouse.py)


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


def declare_topology(settings: Settings) -> None:
    """Declare what the demo's clients and fleet use, so it runs on a broker that never saw the fleet.

    Raises:
        Unreachable: The broker refused the connection or the declarations.
    """
    from kombu import Connection
    from kombu.exceptions import OperationalError

    from connectors.catalog import build
    from connectors.loader import load_directory
    from workers.ops.runner import dead_letter_bounds
    from workers.transport.topology import declare_all

    catalog, _ = build(load_directory(CATALOG_DIR))
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
    try:
        declare_topology(settings)  # the clients check the exchanges exist before the router is up
    except Unreachable as exc:
        print(f"cannot declare the fleet's topology: {exc} (at {redact_url(settings.broker_url)})", file=sys.stderr)
        return 2
    except TopologyMismatch as exc:  # queues of an earlier demo, of another type
        print(f"cannot declare the fleet's topology: {exc}", file=sys.stderr)
        return 2
    tickets = TicketSystem(0).start()
    warehouse = Warehouse(settings.broker_url).start()
    logs = Path(tempfile.mkdtemp(prefix="reach-demo-"))
    fleet = FleetProcesses(
        ProcessGroup(logs),
        CATALOG_DIR,
        settings.broker_url,
        settings.redis_url,
        env={"TICKETS_URL": tickets.url, "WAREHOUSE_BROKER_URL": settings.broker_url},
        metrics=False,
    )
    print(f"ticket system on {tickets.url}, warehouse on queue {WAREHOUSE_QUEUE}; fleet logs in {logs}")
    try:
        for proc in (fleet.start_router(), fleet.start_pool(CONNECTOR), fleet.start_pool(WAREHOUSE)):
            print(f"started reach {' '.join(proc.argv[3:])} (pid {proc.pid})")
        return _script(settings, tickets, warehouse, list(fleet.group.items.values()), logs, keep_running)
    finally:
        fleet.stop_all()
        tickets.stop()
        warehouse.stop()
        print("stopped the router, the pools, the ticket system and the warehouse")


def _script(
    settings: Settings, tickets: TicketSystem, warehouse: Warehouse, procs: list[Proc], logs: Path, keep_running: bool
) -> int:
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

        print_table(
            ("#", "agent", "intent", "status", "code", "result"),
            [_row(n, who, what, r) for n, (who, what, r, _) in enumerate(results, 1)],
            max_width=60,
        )
        ok = all(
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
        print("\nall receipts as expected" if ok else "\nSOME RECEIPTS WERE NOT AS EXPECTED")
        if keep_running:
            print(
                f"\nthe fleet keeps running (TICKETS at {tickets.url}); try:\n"
                f"  REACH_CATALOG={CATALOG_DIR} reach send query_ticket --agent ticket_qa_bot -p tid={tid} --wait\n"
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
