"""A system that answers with what agents may not send: lone surrogates (``"\\ud800"`` escapes) and
NULs in its JSON (issue 30, beside the generated hostile-input run).

Agents' unpaired surrogates are refused by the router, but a system's answer decodes to such a str
all the same. Each write must still end in exactly one receipt that says what happened, the system
must be called once, and the pool must not log a traceback for it.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from tests.fleet import Fleet, agent

RUN = uuid.uuid4().hex[:6]
AGENT = f"ha_{RUN}"
CONNECTOR = "odd_answers"
ANSWER = b'{"thing_id": "T-\\ud800", "note": "\\udfff\\u0000\\uffff", "nested": {"k\\udc00": ["\\ud83d"]}}'


class OddSystem(ThreadingHTTPServer):
    """Answers every POST with :data:`ANSWER` (201) and counts the calls per title."""

    daemon_threads = True

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}
        self.lock = threading.Lock()

        system = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                with system.lock:
                    system.calls[body.get("title", "")] = system.calls.get(body.get("title", ""), 0) + 1
                self.send_response(201)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(ANSWER)))
                self.end_headers()
                self.wfile.write(ANSWER)

        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


@pytest.fixture(scope="module")
def system() -> Iterator[OddSystem]:
    server = OddSystem()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def fleet(system: OddSystem) -> Iterator[Fleet]:
    catalog = f"""
connector:
  name: {CONNECTOR}
  endpoint: {system.url}
  actions:
    - action: create_thing
      path: POST /things
      input: {{ title: {{ type: string, required: true }} }}
      permission: write
      idempotent: false
    - action: create_checked_thing
      path: POST /checked
      input: {{ title: {{ type: string, required: true }} }}
      output: {{ thing_id: {{ type: string, pattern: "^T-[0-9]+$" }} }}
      permission: write
      idempotent: false
---
agent_app:
  name: {AGENT}
  connector_bindings:
    - connector: {CONNECTOR}
      allowed_actions: ["*"]
"""
    with Fleet(catalog, [CONNECTOR]) as running:
        yield running


@pytest.mark.parametrize(
    ("action", "status", "code"),
    [("create_thing", "succeeded", None), ("create_checked_thing", "failed", "DOWNSTREAM_CONTRACT_VIOLATION")],
)
def test_an_answer_with_lone_surrogates_ends_in_one_receipt_and_one_call(
    fleet: Fleet, system: OddSystem, action: str, status: str, code: str | None
) -> None:
    title = f"{action}-{uuid.uuid4().hex[:8]}"
    log_path = fleet.log_dir / f"{CONNECTOR}.log"
    log_before = log_path.stat().st_size
    with agent(AGENT, fleet.broker_url) as client:
        receipt = client.call(f"{CONNECTOR}.{action}", {"title": title}, timeout=20)
    with log_path.open("rb") as log:
        log.seek(log_before)
        grown = log.read()
    assert system.calls.get(title) == 1, f"the system was called {system.calls.get(title)} times"
    assert receipt.status == status, receipt
    assert (receipt.error.code.value if receipt.error else None) == code, receipt.error
    assert b"Traceback" not in grown, grown[-1500:].decode("utf-8", "replace")
