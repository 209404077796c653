"""A small web shop: the system behind the demo's workflow (``catalog/shop.yaml``).

Stdlib only. It holds orders, refunds them and emails their customers, and undoes the first two:

    POST /holds {order_id}             201 {hold_id}; 404 for an order it does not know
    POST /holds/release {hold_id}      200 {released}
    POST /refunds {order_id}           201 {refund_id, amount}
    POST /refunds/cancel {refund_id}   200 {cancelled}
    POST /emails {order_id, text}      200 {sent_to}; 422 when the customer has no email address

A repeated Idempotency-Key gets the first answer again and does nothing twice. ``log`` says what
the shop did, in order, so the demo can show it (a refused email is logged as refused).
"""

from __future__ import annotations

import json
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

# order -> (the customer's email address or None, the amount paid)
ORDERS: dict[str, tuple[str | None, float]] = {
    "ORD-1001": ("ada@example.com", 42.0),
    "ORD-1002": (None, 17.5),  # nobody to tell: the last step of its refund fails
}


class _Handler(BaseHTTPRequestHandler):
    server: Shop
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:  # noqa: N802
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            body = json.loads(raw) if raw else {}
        except ValueError:
            body = {}
        shop = self.server
        key = self.headers.get("Idempotency-Key") or uuid.uuid4().hex
        with shop.lock:
            answer = shop.answers.get(key)
            if answer is None:
                answer = shop.answers[key] = shop.execute(self.path, body if isinstance(body, dict) else {})
        status, doc = answer
        data = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class Shop(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, port: int = 0) -> None:
        super().__init__(("127.0.0.1", port), _Handler)
        self.lock = threading.Lock()
        self.answers: dict[str, tuple[int, dict[str, Any]]] = {}  # Idempotency-Key -> the answer given
        self.log: list[str] = []
        self._thread = threading.Thread(target=self.serve_forever, daemon=True, name="demo-shop")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def start(self) -> Shop:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.shutdown()
        self.server_close()

    def done(self) -> list[str]:
        with self.lock:
            return list(self.log)

    def execute(self, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """Do what a request asks (called once per Idempotency-Key, under the lock)."""
        order = str(body.get("order_id", ""))
        if path == "/holds":
            if order not in ORDERS:
                return 404, {"detail": f"no order {order}"}
            self.log.append(f"held {order}")
            return 201, {"hold_id": f"H-{order}"}
        if path == "/holds/release":
            self.log.append(f"released {body.get('hold_id')}")
            return 200, {"released": True}
        if path == "/refunds":
            if order not in ORDERS:
                return 404, {"detail": f"no order {order}"}
            self.log.append(f"refunded {order}")
            return 201, {"refund_id": f"RF-{order}", "amount": ORDERS[order][1]}
        if path == "/refunds/cancel":
            self.log.append(f"cancelled {body.get('refund_id')}")
            return 200, {"cancelled": True}
        if path == "/emails":
            address = ORDERS.get(order, (None, 0.0))[0]
            if address is None:
                self.log.append(f"could not email the customer of {order}")
                return 422, {"detail": f"the customer of {order} has no email address on file"}
            self.log.append(f"emailed {address}")
            return 200, {"sent_to": address}
        return 404, {"detail": "no such route"}
