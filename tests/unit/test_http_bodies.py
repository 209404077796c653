"""The bodies the HTTP adapter writes besides a JSON object: a form, multipart with file parts, raw
bytes, and a JSON array as the whole body (action key ``body:``, field places ``in: file`` and
``in: whole_body``). Each test looks at the request the adapter builds, or the receipt's outcome
when it refuses one; the catalog models refuse what no request could carry.
"""

from __future__ import annotations

import base64
import email.parser
import email.policy
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

import httpx
import pytest
import yaml
from pydantic import ValidationError

from connectors.adapters.base import CallContext
from connectors.adapters.http import HttpAdapter
from connectors.loader import load_directory
from connectors.schema import ParamValidator, field_json_schema
from connectors.spec import DEFAULT_FILE_BYTES, ActionSpec, ConnectorSpec
from producers.wire import ErrorCode

ACTIONS: list[dict[str, Any]] = [
    {
        "action": "rename_pet",
        "path": "POST /pets/{pet_id}",
        "body": "form",
        "permission": "write",
        "input": {
            "pet_id": {"type": "integer", "required": True},
            "name": {"type": "string"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "adopted": {"type": "boolean"},
            "note": {"type": "string", "nullable": True},
            "X_Tenant": {"type": "string", "in": "header"},
        },
    },
    {
        "action": "upload_photo",
        "path": "POST /pets/{pet_id}/photo",
        "body": "multipart",
        "permission": "write",
        "input": {
            "pet_id": {"type": "integer", "required": True},
            "caption": {"type": "string"},
            "photo": {
                "type": "string",
                "in": "file",
                "required": True,
                "filename": "photo.png",
                "content_type": "image/png",
                "max_bytes": 64,
            },
            "scan": {"type": "string", "in": "file", "name": "scan-file"},
        },
    },
    {
        "action": "put_document",
        "path": "PUT /documents/{doc_id}",
        "body": "binary",
        "permission": "write",
        "input": {
            "doc_id": {"type": "string", "required": True},
            "content": {"type": "string", "in": "file", "required": True, "content_type": "application/pdf"},
        },
    },
    {
        "action": "create_users",
        "path": "POST /users/batch",
        "permission": "write",
        "input": {
            "users": {
                "type": "array",
                "in": "whole_body",
                "required": True,
                "max_length": 10,
                "items": {"type": "object", "properties": {"name": {"type": "string", "required": True}}},
            },
            "dry_run": {"type": "boolean", "in": "query"},
        },
    },
]


@pytest.fixture(scope="module")
def adapter() -> HttpAdapter:
    spec = ConnectorSpec.model_validate({"name": "pets", "endpoint": "http://pets.example/api", "actions": ACTIONS})
    made = HttpAdapter(spec, transport=httpx.MockTransport(lambda request: httpx.Response(200, json={})))
    yield made
    made.close()


def built(adapter: HttpAdapter, name: str, params: dict[str, Any]) -> httpx.Request:
    action = adapter.connector.action(name)
    assert action is not None
    return adapter.build_request(action, params, CallContext("intent-1"))


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def parts_of(request: httpx.Request) -> list[Any]:
    """The multipart body as a mail parser reads it (an independent reader of RFC 7578)."""
    head = f"Content-Type: {request.headers['Content-Type']}\r\n\r\n".encode()
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(head + request.content)
    assert message.is_multipart()
    return list(message.iter_parts())


# -- form ---------------------------------------------------------------------------------------


def test_a_form_body_is_url_encoded_with_a_list_repeating_its_name(adapter: HttpAdapter) -> None:
    request = built(
        adapter,
        "rename_pet",
        {"pet_id": 7, "name": "Rex & Co=1 ü", "tags": ["a b", "c"], "adopted": True, "note": None, "X_Tenant": "t1"},
    )
    assert request.url.path == "/api/pets/7"
    assert request.headers["Content-Type"] == "application/x-www-form-urlencoded"
    assert request.headers["X_Tenant"] == "t1"  # a header field stays a header
    assert parse_qsl(request.content.decode("ascii"), keep_blank_values=True) == [
        ("name", "Rex & Co=1 ü"),
        ("tags", "a b"),
        ("tags", "c"),
        ("adopted", "true"),  # a form has no booleans: JSON's words
    ]  # note was null: a form has no null, so it is left out


def test_a_lone_surrogate_in_a_form_field_is_refused_before_sending(adapter: HttpAdapter) -> None:
    action = adapter.connector.action("rename_pet")
    assert action is not None
    outcome = adapter.call(action, {"pet_id": 1, "name": "bad \ud800"}, CallContext("intent-1"))
    assert outcome.code == ErrorCode.VALIDATION_FAILED and outcome.sent is False


# -- multipart ----------------------------------------------------------------------------------


def test_a_multipart_body_carries_text_parts_and_the_decoded_file_under_the_catalogs_names(
    adapter: HttpAdapter,
) -> None:
    png = b"\x89PNG\r\n\x1a\n\x00\x01binary\r\n--not-a-boundary"
    request = built(adapter, "upload_photo", {"pet_id": 3, "caption": 'say "cheese"', "photo": b64(png)})
    assert request.headers["Content-Type"].startswith("multipart/form-data; boundary=")
    assert int(request.headers["Content-Length"]) == len(request.content)
    caption, photo = parts_of(request)
    assert caption.get_param("name", header="content-disposition") == "caption"
    assert caption.get_filename() is None and caption.get_payload(decode=True) == b'say "cheese"'
    assert photo.get_param("name", header="content-disposition") == "photo"
    assert photo.get_filename() == "photo.png" and photo.get_content_type() == "image/png"
    assert photo.get_payload(decode=True) == png  # the bytes themselves, not the base64 text


def test_a_file_part_without_a_declared_file_name_is_named_by_its_wire_name(adapter: HttpAdapter) -> None:
    request = built(adapter, "upload_photo", {"pet_id": 3, "photo": b64(b"x"), "scan": b64(b"%PDF")})
    photo, scan = parts_of(request)
    assert scan.get_param("name", header="content-disposition") == "scan-file"
    assert scan.get_filename() == "scan-file" and scan.get_content_type() == "application/octet-stream"
    assert scan.get_payload(decode=True) == b"%PDF"


def test_two_requests_never_share_a_boundary(adapter: HttpAdapter) -> None:
    first = built(adapter, "upload_photo", {"pet_id": 1, "photo": b64(b"a")})
    second = built(adapter, "upload_photo", {"pet_id": 1, "photo": b64(b"a")})
    assert first.headers["Content-Type"] != second.headers["Content-Type"]


# -- binary and a whole JSON body ---------------------------------------------------------------


def test_a_binary_body_is_the_files_bytes_with_its_declared_media_type(adapter: HttpAdapter) -> None:
    data = bytes(range(256))
    request = built(adapter, "put_document", {"doc_id": "a/b", "content": b64(data)})
    assert request.method == "PUT" and request.url.raw_path == b"/api/documents/a%2Fb"
    assert request.headers["Content-Type"] == "application/pdf"
    assert request.content == data


def test_a_whole_body_field_is_the_json_body_itself(adapter: HttpAdapter) -> None:
    users = [{"name": "ann"}, {"name": "bo"}]
    request = built(adapter, "create_users", {"users": users, "dry_run": True})
    assert request.headers["Content-Type"] == "application/json"
    assert request.content == b'[{"name":"ann"},{"name":"bo"}]'
    assert request.url.params["dry_run"] == "true"


# -- bounds and bad base64: VALIDATION_FAILED, never an exception --------------------------------


def test_bad_base64_is_refused_by_the_params_check_and_by_the_adapter(adapter: HttpAdapter) -> None:
    action = adapter.connector.action("upload_photo")
    assert action is not None
    for bad in ("not base64!", "YQ", "YQ==\n", "YWJj\u00e9"):
        _, problems = ParamValidator(action).validate({"pet_id": 1, "photo": bad})
        assert [(p.field, p.code) for p in problems] == [("photo", "format")], bad
        outcome = adapter.call(action, {"pet_id": 1, "photo": bad}, CallContext("intent-1"))
        assert outcome.code == ErrorCode.VALIDATION_FAILED and outcome.sent is False, bad
        assert outcome.details == [{"field": "photo", "code": "format", "message": outcome.message}]


def test_a_file_past_max_bytes_is_refused_before_it_is_decoded(adapter: HttpAdapter) -> None:
    action = adapter.connector.action("upload_photo")
    assert action is not None
    validator = ParamValidator(action)
    assert not validator.validate({"pet_id": 1, "photo": b64(b"x" * 64)})[1]  # exactly max_bytes: fine
    _, problems = validator.validate({"pet_id": 1, "photo": b64(b"x" * 65)})
    assert [(p.field, p.code) for p in problems] == [("photo", "max_length")]
    assert "at most 64 bytes" in problems[0].message
    # far past the bound: refused by its length alone (a 4 MB string is never decoded)
    huge = "A" * (4 << 20)
    _, problems = validator.validate({"pet_id": 1, "photo": huge})
    assert [(p.field, p.code) for p in problems] == [("photo", "max_length")]
    outcome = adapter.call(action, {"pet_id": 1, "photo": huge}, CallContext("intent-1"))
    assert outcome.code == ErrorCode.VALIDATION_FAILED and outcome.sent is False
    assert outcome.details[0]["code"] == "max_length"


def test_a_file_field_without_max_bytes_is_bounded_by_the_default() -> None:
    action = ActionSpec.model_validate(
        {"action": "up", "path": "POST /f", "body": "binary", "input": {"f": {"in": "file"}}}
    )
    validator = ParamValidator(action)
    assert not validator.validate({"f": b64(b"\0" * DEFAULT_FILE_BYTES)})[1]
    assert validator.validate({"f": b64(b"\0" * (DEFAULT_FILE_BYTES + 1))})[1][0].code == "max_length"


def test_the_tool_schema_tells_a_model_the_file_is_base64_and_how_long_it_may_be() -> None:
    spec = ActionSpec.model_validate(ACTIONS[1]).input["photo"]
    schema = field_json_schema(spec)
    assert schema == {"type": "string", "contentEncoding": "base64", "contentMediaType": "image/png", "maxLength": 88}


# -- what the catalog refuses ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("action", "message"),
    [
        ({"path": "POST /f", "input": {"f": {"in": "file"}}}, "needs body: multipart or body: binary"),
        ({"path": "POST /f", "body": "form", "input": {"o": {"type": "object"}}}, "a form field carries text"),
        (
            {"path": "POST /f", "body": "multipart", "input": {"o": {"type": "array", "items": {"type": "object"}}}},
            "a multipart field carries text",
        ),
        ({"path": "POST /f", "body": "binary", "input": {"a": {}}}, "exactly one input with in: file"),
        (
            {"path": "POST /f", "input": {"w": {"type": "array", "items": {}, "in": "whole_body"}, "x": {}}},
            "no other input can go in the body",
        ),
        ({"path": "POST /f", "body": "form", "input": {"w": {"in": "whole_body"}}}, "whole_body, which is a JSON"),
        ({"path": "GET /f", "body": "form"}, "needs a method that sends a body"),
        (
            {"path": "POST /f", "body": "multipart", "input": {"f": {"in": "file", "filename": "../../etc/passwd"}}},
            "no /, \\, quotes or ..",
        ),
        (
            {"path": "POST /f", "body": "multipart", "input": {"f": {"in": "file", "filename": 'a"; x="y'}}},
            "must be 1-128 letters",
        ),
        (
            {"path": "POST /f", "body": "binary", "input": {"f": {"in": "file", "content_type": "png\r\nX: y"}}},
            "must be a media type",
        ),
        ({"path": "POST /f", "body": "binary", "input": {"f": {"in": "file", "max_bytes": 9 << 20}}}, "less than"),
        ({"path": "POST /f", "body": "binary", "input": {"f": {"in": "file", "type": "integer"}}}, "type: string"),
        ({"path": "POST /f", "input": {"f": {"max_bytes": 5}}}, "only apply to fields with in: file"),
    ],
)
def test_the_catalog_refuses_a_body_no_request_could_carry(action: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError) as raised:
        ActionSpec.model_validate({"action": "a", **action})
    assert message in str(raised.value)


def test_reach_validate_names_the_file_and_line_of_a_body_problem(tmp_path: Path) -> None:
    (tmp_path / "pets.yaml").write_text(
        "connector:\n"
        "  name: pets\n"
        "  endpoint: http://pets.example\n"
        "  actions:\n"
        "    - action: ok\n"
        "      path: POST /ok\n"
        "    - action: upload\n"
        "      path: POST /up\n"
        "      body: form\n"
        "      input:\n"
        "        photo: {type: string, in: file}\n"
    )
    problems = [str(p) for p in load_directory(tmp_path).problems]
    assert any("pets.yaml:7" in p and "needs body: multipart or body: binary" in p for p in problems), problems


def test_body_is_a_key_of_http_actions_only(tmp_path: Path) -> None:
    with pytest.raises(ValidationError) as raised:
        ConnectorSpec.model_validate(
            {
                "name": "legacy",
                "type": "soap",
                "wsdl": "service.wsdl",
                "actions": [{"action": "a", "operation": "A", "body": "form"}],
            }
        )
    assert "`body` belongs to http actions, not soap" in str(raised.value)


def test_the_contracts_request_body_example_loads_as_written() -> None:
    contract = (Path(__file__).parents[2] / "docs" / "contract.md").read_text(encoding="utf-8")
    section = contract.split('<a id="request-bodies"></a>', 1)[1]
    block = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    actions = [ActionSpec.model_validate(a) for a in yaml.safe_load(block)]
    assert [(a.action, a.body) for a in actions] == [("upload_photo", "multipart"), ("create_users", None)]
    assert actions[0].input["photo"].max_bytes == 2 << 20 and actions[1].input["users"].in_ == "whole_body"


def test_file_and_whole_body_places_belong_to_http_actions_only() -> None:
    with pytest.raises(ValidationError) as raised:
        ConnectorSpec.model_validate(
            {
                "name": "legacy",
                "type": "sql",
                "dsn_env": "LEGACY_DSN",
                "actions": [{"action": "a", "procedure": "p", "input": {"blob": {"in": "file"}}}],
            }
        )
    assert "input blob has in: file, which only an http action's body has" in str(raised.value)
