"""A form, a multipart file and a JSON array, from an agent's intent to a real HTTP server.

`reach import openapi` imports all 20 operations of Petstore 3.0 (before, the form, the upload and the
two array bodies were left out); a real fleet (router + pool) sends `updatePetWithForm`,
`uploadFile` and `createUsersWithArrayInput` to a small http.server that parses each body with the
standard library's own readers (urllib's form parser, the email package's MIME parser, json).
"""

from __future__ import annotations

import base64
import email.parser
import email.policy
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl

import pytest

from producers.client import ReachClient
from tests import openapi_docs as docs
from tests.fleet import Fleet, agent
from tests.integration.test_openapi_e2e import reach

API_KEY = "bodies-key"
BINDING = """
---
agent_app:
  name: body_agent
  connector_bindings:
    - connector: petstore
      allowed_actions: [updatePetWithForm, uploadFile, createUsersWithArrayInput]
"""


class _Handler(BaseHTTPRequestHandler):
    """Records each request's method, path, content type and its body as parsed."""

    server: BodyServer
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        kind = self.headers.get("Content-Type", "")
        seen: dict[str, Any] = {"path": self.path, "content_type": kind, "api_key": self.headers.get("api_key")}
        if kind == "application/x-www-form-urlencoded":
            seen["form"] = parse_qsl(raw.decode("ascii"), keep_blank_values=True, strict_parsing=True)
        elif kind.startswith("multipart/form-data"):
            head = f"Content-Type: {kind}\r\n\r\n".encode()
            message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(head + raw)
            seen["parts"] = [
                (
                    part.get_param("name", header="content-disposition"),
                    part.get_filename(),
                    part.get_content_type(),
                    part.get_payload(decode=True),
                )
                for part in message.iter_parts()
            ]
        else:
            seen["json"] = json.loads(raw)
        with self.server.lock:
            self.server.seen.append(seen)
        data = b'{"code": 200, "message": "ok"}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class BodyServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.lock = threading.Lock()
        self.seen: list[dict[str, Any]] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


@pytest.fixture(scope="module")
def server() -> Iterator[BodyServer]:
    running = BodyServer()
    thread = threading.Thread(target=running.serve_forever, daemon=True)
    thread.start()
    yield running
    running.shutdown()
    running.server_close()


@pytest.fixture(scope="module")
def fleet(server: BodyServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    folder = tmp_path_factory.mktemp("catalog")
    imported = reach(
        "import", "openapi", str(docs.document(docs.PETSTORE_30)), "--connector", "petstore",
        "--endpoint", f"{server.url}/v2", "-o", str(folder / "petstore.yaml"),
    )  # fmt: skip
    assert imported.returncode == 0, imported.stderr
    assert "20 action(s) from 20 operation(s)" in imported.stderr
    (folder / "agents.yaml").write_text(BINDING)
    checked = reach("validate", str(folder))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    catalog = (folder / "petstore.yaml").read_text() + BINDING
    with Fleet(catalog, ["petstore"], env={"PETSTORE_API_KEY": API_KEY}) as running:
        yield running


@pytest.fixture
def client(fleet: Fleet) -> Iterator[ReachClient]:
    with agent("body_agent") as made:
        yield made


def test_a_form_a_multipart_file_and_an_array_arrive_as_the_server_reads_them(
    server: BodyServer, client: ReachClient
) -> None:
    form = client.call("updatePetWithForm", {"petId": 7, "name": "Rex & Bo", "status": "sold"})
    assert form.status == "succeeded", form.error
    image = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4
    upload = client.call(
        "uploadFile", {"petId": 7, "additionalMetadata": "front view", "file": base64.b64encode(image).decode()}
    )
    assert upload.status == "succeeded", upload.error
    users = [{"username": "ann", "userStatus": 1}, {"username": "bo", "email": "bo@example.com"}]
    created = client.call("createUsersWithArrayInput", {"body": users})
    assert created.status == "succeeded", created.error

    with server.lock:
        seen = list(server.seen)
    assert [s["path"] for s in seen] == ["/v2/pet/7", "/v2/pet/7/uploadImage", "/v2/user/createWithArray"]
    assert {s["api_key"] for s in seen} == {API_KEY}
    assert seen[0]["content_type"] == "application/x-www-form-urlencoded"
    assert seen[0]["form"] == [("name", "Rex & Bo"), ("status", "sold")]
    assert seen[1]["content_type"].startswith("multipart/form-data; boundary=")
    assert seen[1]["parts"] == [
        ("additionalMetadata", None, "text/plain", b"front view"),
        ("file", "file", "application/octet-stream", image),  # the bytes, not the base64 text
    ]
    assert seen[2]["content_type"] == "application/json" and seen[2]["json"] == users


def test_a_bad_file_is_rejected_before_the_server_and_says_which_field(server: BodyServer, client: ReachClient) -> None:
    with server.lock:
        before = len(server.seen)
    receipt = client.call("uploadFile", {"petId": 7, "file": "this is not base64!"})
    assert receipt.status == "rejected" and receipt.error is not None
    assert receipt.error.code == "VALIDATION_FAILED"
    assert [(d["field"], d["code"]) for d in receipt.error.details] == [("file", "format")]
    # a file past the intent's own bound (REACH_MAX_INTENT_BYTES, 256 KiB) is refused by its size first
    too_big = base64.b64encode(b"\0" * (300 << 10)).decode()
    receipt = client.call("uploadFile", {"petId": 7, "file": too_big})
    assert receipt.status == "rejected" and receipt.error is not None
    assert receipt.error.code == "INVALID_INTENT"
    with server.lock:
        assert len(server.seen) == before  # nothing reached the system
