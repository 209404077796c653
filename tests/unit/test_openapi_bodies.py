"""`reach import openapi`: request bodies besides a JSON object (forms, multipart, raw bytes, a JSON
array), and validation limited to the imported operations and what they reach by ``$ref``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from connectors.openapi import ImportOptions, OpenAPIError, document_problems, import_openapi, plan, read_document
from connectors.openapi.document import subtree
from tests import openapi_docs as docs
from tests.unit.test_openapi_import import action, connector_of, oas, op, run
from workers.cli import main


def body_of(media: dict[str, Any], required: bool = True) -> dict[str, Any]:
    return {"required": required, "content": media}


def test_a_form_body_becomes_body_form_with_a_field_per_property(tmp_path: Path) -> None:
    schema = {
        "type": "object",
        "required": ["grant"],
        "properties": {"grant": {"type": "string"}, "scopes": {"type": "array", "items": {"type": "string"}}},
    }
    doc = oas(
        {
            "/token": {
                "post": op(
                    operationId="token", requestBody=body_of({"application/x-www-form-urlencoded": {"schema": schema}})
                )
            }
        }
    )
    token = action(connector_of(run(doc), tmp_path), "token")
    assert token.body == "form"
    assert token.input["grant"].in_ == "body" and token.input["grant"].required
    assert token.input["scopes"].type == "array"


def test_a_multipart_body_makes_binary_properties_file_parts_with_their_encoding(tmp_path: Path) -> None:
    schema = {
        "type": "object",
        "properties": {
            "title": {"type": "string"},
            "scan": {"type": "string", "format": "binary"},
            "thumb": {"type": "string", "contentMediaType": "image/png"},
        },
        "required": ["scan"],
    }
    media = {"multipart/form-data": {"schema": schema, "encoding": {"scan": {"contentType": "application/pdf"}}}}
    doc = oas({"/docs": {"post": op(operationId="upload", requestBody=body_of(media))}}, openapi="3.1.0")
    upload = action(connector_of(run(doc), tmp_path), "upload")
    assert upload.body == "multipart"
    assert upload.input["title"].in_ == "body"
    scan = upload.input["scan"]
    assert (scan.type, scan.in_, scan.content_type, scan.required) == ("string", "file", "application/pdf", True)
    assert upload.input["thumb"].in_ == "file" and upload.input["thumb"].content_type is None


def test_raw_bytes_become_body_binary_and_xml_stays_out(tmp_path: Path) -> None:
    doc = oas(
        {
            "/img/{id}": {
                "parameters": [{"name": "id", "in": "path", "required": True, "schema": {"type": "string"}}],
                "put": op(
                    operationId="put_image",
                    requestBody=body_of({"image/png": {"schema": {"type": "string", "format": "binary"}}}),
                ),
                "post": op(operationId="post_xml", requestBody=body_of({"text/xml": {"schema": {"type": "string"}}})),
            }
        }
    )
    result = run(doc)
    put = action(connector_of(result, tmp_path), "put_image")
    assert put.body == "binary" and put.input["file"].in_ == "file" and put.input["file"].content_type == "image/png"
    assert [label for label, _ in result.skipped] == ["POST /img/{id} (post_xml)"]


def test_a_json_array_body_is_one_whole_body_input_named_as_the_document_names_it(tmp_path: Path) -> None:
    items = {"type": "object", "properties": {"sku": {"type": "string"}}}
    doc = oas(
        {
            "/orders": {
                "post": op(
                    operationId="bulk",
                    requestBody={
                        **body_of({"application/json": {"schema": {"type": "array", "items": items}}}),
                        "x-codegen-request-body-name": "orders",
                    },
                )
            }
        }
    )
    bulk = action(connector_of(run(doc), tmp_path), "bulk")
    assert bulk.body is None and set(bulk.input) == {"orders"}
    orders = bulk.input["orders"]
    assert orders.in_ == "whole_body" and orders.type == "array" and orders.required and orders.name is None


def test_swagger_2_form_data_with_a_file_is_multipart(tmp_path: Path) -> None:
    doc = {
        "swagger": "2.0",
        "info": {"title": "t", "version": "1"},
        "host": "files.example.com",
        "paths": {
            "/up": {
                "post": {
                    "operationId": "up",
                    "consumes": ["multipart/form-data"],
                    "parameters": [
                        {"name": "note", "in": "formData", "type": "string", "required": True},
                        {"name": "data", "in": "formData", "type": "file", "required": True},
                    ],
                    "responses": {"200": {"description": "ok"}},
                }
            }
        },
    }
    up = action(connector_of(run(doc), tmp_path), "up")
    assert up.body == "multipart"
    assert (up.input["note"].in_, up.input["note"].required) == ("body", True)
    assert (up.input["data"].in_, up.input["data"].required) == ("file", True)


# -- validation: the chosen operations and what they reach ------------------------------------------


def broken_doc() -> dict[str, Any]:
    """Two tags; each operation and a schema each one reaches has a problem of its own."""
    return oas(
        {
            "/pets": {
                "get": {
                    **op(operationId="pets", tags=["pets"]),
                    "responses": {"200": {"$ref": "#/components/responses/Pets"}},
                },
            },
            "/pets/{id}": {
                # the path parameter is not declared: invalid, in an operation of tag pets
                "delete": op(operationId="delete_pet", tags=["pets"]),
            },
            "/users": {"get": {**op(operationId="users", tags=["users"]), "responses": {"200": {"description": 5}}}},
        },
        components={
            "responses": {
                "Pets": {
                    "description": "ok",
                    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Pet"}}},
                }
            },
            "schemas": {
                "Pet": {"type": "object", "properties": {"age": {"type": "integr"}}},
                "Unused": {"type": "nothing"},
            },
        },
    )


def test_limited_validation_gives_the_whole_checks_verdicts_on_the_chosen_operations() -> None:
    doc = broken_doc()
    whole = document_problems(doc, limit=50)
    pets = document_problems(doc, limit=50, only=plan(doc, ImportOptions("shop", include=("pets",))))
    users = document_problems(doc, limit=50, only=plan(doc, ImportOptions("shop", include=("users",))))
    assert pets and users
    # every problem found in a part is found, word for word and at the same place, by the whole check
    assert set(pets) <= set(whole) and set(users) <= set(whole)
    assert any("/components/schemas/Pet" in p for p in pets)  # reached through a $ref chain
    assert not any("/paths/~1users" in p for p in pets)  # another tag's operation is not looked at
    assert not any("Unused" in p for p in pets + users)  # nor a schema nothing chosen reaches
    assert any("/paths/~1users" in p for p in users)


def test_an_unresolvable_ref_in_a_chosen_operation_is_still_found() -> None:
    doc = oas({"/a": {"get": {**op(operationId="a"), "responses": {"200": {"$ref": "#/components/responses/Gone"}}}}})
    problems = document_problems(doc, only=plan(doc, ImportOptions("shop")))
    assert problems and "Gone" in " ".join(problems)


def test_an_anchor_reference_falls_back_to_the_whole_document() -> None:
    doc = oas({"/a": {"get": {**op(operationId="a"), "responses": {"200": {"$ref": "#anchor"}}}}})
    assert subtree(doc, plan(doc, ImportOptions("shop"))) is doc


def test_the_import_refuses_an_invalid_chosen_operation_and_validate_all_checks_the_rest(tmp_path: Path) -> None:
    doc = broken_doc()
    with pytest.raises(OpenAPIError, match="not valid OpenAPI"):
        import_openapi(json.dumps(doc).encode(), ImportOptions("shop", include=("users",)))
    spec = tmp_path / "shop.json"
    # a document whose only problem is outside the chosen tag imports; --validate-all refuses it
    doc["paths"]["/pets/{id}"]["delete"]["parameters"] = [
        {"name": "id", "in": "path", "required": True, "schema": {"type": "string"}}
    ]
    doc["components"]["schemas"]["Pet"]["properties"]["age"]["type"] = "integer"
    spec.write_text(json.dumps(doc))
    runner = CliRunner()
    limited = runner.invoke(main, ["import", "openapi", str(spec), "--connector", "shop", "--include", "pets"])
    assert limited.exit_code == 0, limited.output
    whole = runner.invoke(
        main, ["import", "openapi", str(spec), "--connector", "shop", "--include", "pets", "--validate-all"]
    )
    assert whole.exit_code == 1 and "/paths/~1users" in whole.output


def test_github_by_tag_is_validated_without_the_operations_it_does_not_import() -> None:
    github = read_document(docs.read(docs.GITHUB))
    chosen = plan(github, ImportOptions("github", include=("issues",)))
    part = subtree(github, chosen)
    assert len(chosen) == 58 and sum(len(item) for item in part["paths"].values()) < 120
    assert "x-webhooks" not in part  # GitHub's webhooks reach half of its schemas; no operation is in them
    assert len(part["components"]["schemas"]) < len(github["components"]["schemas"]) // 5
    assert document_problems(github, only=chosen) == []
