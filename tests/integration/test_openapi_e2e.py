"""From an OpenAPI document to receipts: `reach import openapi` Petstore 3.0, `reach validate`, then
a real fleet (router + pool) calls a real HTTP Petstore (in-memory pets) built from that catalog."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from producers.client import ReachClient
from tests import openapi_docs as docs
from tests.fleet import Fleet, agent

API_KEY = "s3cret-pet-key"
BINDING = """
---
agent_app:
  name: pet_agent
  connector_bindings:
    - connector: petstore
      allowed_actions: ["*"]
"""


class PetstoreState:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pets: dict[int, dict[str, Any]] = {}
        self.next_id = 1
        self.requests: list[dict[str, Any]] = []


class _Handler(BaseHTTPRequestHandler):
    """The few Petstore operations the tests call, under /v2, behind the api_key header."""

    server: PetstoreServer
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    def _answer(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _handle(self, method: str) -> None:
        state = self.server.state
        parts = urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        with state.lock:
            state.requests.append(
                {"method": method, "path": parts.path, "query": parts.query, "api_key": self.headers.get("api_key")}
            )
        if self.headers.get("api_key") != API_KEY:
            return self._answer(401, {"message": "api_key missing or wrong"})
        body = json.loads(raw) if raw else None
        one = re.fullmatch(r"/v2/pet/(\d+)", parts.path)
        with state.lock:
            if method == "POST" and parts.path == "/v2/pet":
                if not isinstance(body, dict) or "name" not in body or "photoUrls" not in body:
                    return self._answer(405, {"message": "Invalid input"})
                pet = {**body, "id": state.next_id}
                state.pets[state.next_id] = pet
                state.next_id += 1
                return self._answer(200, pet)
            if method == "GET" and parts.path == "/v2/pet/findByStatus":
                wanted = parse_qs(parts.query).get("status", [])
                return self._answer(200, [p for p in state.pets.values() if p.get("status") in wanted])
            if one and method == "GET":
                pet = state.pets.get(int(one.group(1)))
                return self._answer(200, pet) if pet else self._answer(404, {"message": "Pet not found"})
            if one and method == "DELETE":
                pet = state.pets.pop(int(one.group(1)), None)
                return self._answer(200, {"deleted": True}) if pet else self._answer(404, {"message": "Pet not found"})
        return self._answer(404, {"message": f"no route {method} {parts.path}"})

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_DELETE(self) -> None:
        self._handle("DELETE")


class PetstoreServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.state = PetstoreState()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


def reach(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "workers.cli", *args], capture_output=True, text=True, timeout=120, check=False
    )


@pytest.fixture(scope="module")
def petstore() -> Iterator[PetstoreServer]:
    server = PetstoreServer()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def catalog(petstore: PetstoreServer, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The walk-through of docs/openapi.md: import, bind, validate."""
    folder = tmp_path_factory.mktemp("catalog")
    spec = docs.document(docs.PETSTORE_30)
    imported = reach(
        "import", "openapi", str(spec), "--connector", "petstore", "--include", "pet",
        "--endpoint", f"{petstore.url}/v2", "-o", str(folder / "petstore.yaml"),
    )  # fmt: skip
    assert imported.returncode == 0, imported.stderr
    (folder / "agents.yaml").write_text(BINDING)
    checked = reach("validate", str(folder))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "ok: 1 connector(s), 8 action(s), 1 agent app(s)" in checked.stdout
    return (folder / "petstore.yaml").read_text() + BINDING


@pytest.fixture(scope="module")
def fleet(catalog: str) -> Iterator[Fleet]:
    with Fleet(catalog, ["petstore"], env={"PETSTORE_API_KEY": API_KEY}) as running:
        yield running


@pytest.fixture
def pets(fleet: Fleet) -> Iterator[ReachClient]:
    with agent("pet_agent") as client:
        yield client


def test_imported_actions_reach_the_system_and_answer_with_receipts(
    petstore: PetstoreServer, pets: ReachClient
) -> None:
    added = pets.call("petstore.addPet", {"name": "Rex", "photoUrls": ["https://img/rex"], "status": "available"})
    assert added.status == "succeeded", added.error
    assert added.data is not None and added.data["name"] == "Rex"
    pet_id = added.data["id"]

    got = pets.call("getPetById", {"petId": pet_id})  # the bare name: only one connector offers it
    assert got.status == "succeeded", got.error
    # the imported output (Pet requires name and photoUrls) was checked against the answer
    assert got.data == {"name": "Rex", "photoUrls": ["https://img/rex"], "status": "available", "id": pet_id}

    found = pets.call("petstore__findPetsByStatus", {"status": ["available", "sold"]})
    assert found.status == "succeeded", found.error
    assert [p["id"] for p in found.data["result"]] == [pet_id]  # type: ignore[index]
    assert petstore.state.requests[-1]["query"] == "status=available&status=sold"

    assert pets.call("deletePet", {"petId": pet_id}).status == "succeeded"
    gone = pets.call("getPetById", {"petId": pet_id})
    assert gone.status == "failed" and gone.error is not None and gone.error.code == "DOWNSTREAM_NOT_FOUND"
    # the connector's auth, imported from the api_key scheme, was on every request
    assert {r["api_key"] for r in petstore.state.requests} == {API_KEY}
    assert [(r["method"], r["path"]) for r in petstore.state.requests] == [
        ("POST", "/v2/pet"),
        ("GET", f"/v2/pet/{pet_id}"),
        ("GET", "/v2/pet/findByStatus"),
        ("DELETE", f"/v2/pet/{pet_id}"),
        ("GET", f"/v2/pet/{pet_id}"),
    ]


def test_params_that_break_the_imported_schema_are_rejected_before_the_system(
    petstore: PetstoreServer, pets: ReachClient
) -> None:
    before = len(petstore.state.requests)
    receipt = pets.call("addPet", {"photoUrls": ["u"], "status": "lost", "owner": "me"})
    assert receipt.status == "rejected" and receipt.error is not None
    assert receipt.error.code == "VALIDATION_FAILED"
    problems = {(d["field"], d["code"]) for d in receipt.error.details}
    assert problems == {("name", "required"), ("status", "enum"), ("owner", "unknown")}
    wrong_type = pets.call("getPetById", {"petId": "seven"})
    assert wrong_type.error is not None and wrong_type.error.code == "VALIDATION_FAILED"
    assert len(petstore.state.requests) == before  # nothing reached the system


def test_a_responses_api_function_call_is_an_intent(petstore: PetstoreServer, pets: ReachClient) -> None:
    tools = {t["name"]: t for t in pets.tools("openai-responses")}
    assert tools["petstore__addPet"]["type"] == "function" and tools["petstore__addPet"]["strict"] is False
    assert tools["petstore__addPet"]["parameters"]["required"] == ["name", "photoUrls"]
    # the output item a model returns, forwarded unchanged
    call_id = f"call_{uuid.uuid4().hex[:12]}"
    item = {
        "type": "function_call",
        "id": f"fc_{uuid.uuid4().hex[:12]}",
        "call_id": call_id,
        "name": "petstore__addPet",
        "arguments": json.dumps({"name": "Tom", "photoUrls": []}),
        "status": "completed",
    }
    pets.publish_raw(json.dumps(item).encode())
    receipt = pets.wait(call_id, timeout=30)
    assert receipt.status == "succeeded", receipt.error
    assert receipt.data is not None and petstore.state.pets[receipt.data["id"]]["name"] == "Tom"
