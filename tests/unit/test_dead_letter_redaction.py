"""Dead letters whose sensitive params were redacted: pools mark them with a header, and
`reach dlq replay` recognizes them by that header or, for letters written before pools did, by
the redaction marker in their params — such a letter must never be sent back to a system."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from connectors.catalog import Catalog
from tests.unit.routing_catalog import routing_catalog
from workers.observability.redaction import REDACTED, REDACTED_HEADER, contains_redacted
from workers.ops.fleet import DeadLetter, was_redacted
from workers.pool.runtime import PoolRuntime


@pytest.fixture(scope="module")
def catalog(tmp_path_factory: pytest.TempPathFactory) -> Catalog:
    return routing_catalog(tmp_path_factory.mktemp("catalog"))


def letter(body: Any, headers: dict[str, Any] | None = None, connector: str = "tickets") -> DeadLetter:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return DeadLetter(
        message_id="i-1",
        reason="poison",
        agent="a",
        connector=connector,
        received_at="",
        preview="",
        body=raw,
        headers={"x-reach-connector": connector, **(headers or {})},
    )


def job(params: Any, action: str = "create_ticket") -> dict[str, Any]:
    return {"v": 1, "intent_id": "i-1", "agent_id": "a", "connector": "tickets", "action": action, "params": params}


# --------------------------------------------------------------------------- detection


@pytest.mark.parametrize("value", ["true", "True", b"true"])
def test_the_pools_header_marks_a_letter_redacted_whatever_its_body(value: Any) -> None:
    assert was_redacted(letter(job({"title": "t"}), {REDACTED_HEADER: value}))
    assert was_redacted(letter(b"{not json", {REDACTED_HEADER: value}))


@pytest.mark.parametrize(
    "params",
    [
        {"title": "t", "api_token": REDACTED},
        {"title": "t", "card": {"number": REDACTED, "holder": "h"}},
        {"title": "t", "tokens": ["x", REDACTED]},
        {"title": "t", "cards": [{"number": REDACTED}]},
        REDACTED,  # an action the pool's catalog did not know: all params replaced
    ],
)
def test_a_letter_without_the_header_is_recognized_by_the_marker_in_its_params(params: Any) -> None:
    assert was_redacted(letter(job(params)))
    # the router's letters are intents, redacted the same way (no header)
    assert was_redacted(letter({"action": "tickets.create_ticket", "params": params}, connector=""))


@pytest.mark.parametrize(
    "body,headers",
    [
        (job({"title": "t", "api_token": "s3cret", "card": {"number": "4111", "holder": "h"}}), {}),
        (job({"title": "t"}), {REDACTED_HEADER: "false"}),
        (job({}), {}),
        (job(None), {}),
        ({"action": "tickets.create_ticket", "note": REDACTED}, {}),  # the marker outside the params
        (b"{not json", {}),
        (b"\xff\xfe", {}),
        (b"[" * 100_000 + b"]" * 100_000, {}),
        ([[job({"api_token": REDACTED})], {}, {}], {}),  # a raw task message (not a job letter)
    ],
)
def test_neither_header_nor_marker_is_not_redacted(body: Any, headers: dict[str, Any]) -> None:
    assert not was_redacted(letter(body, headers))


def test_contains_redacted_looks_at_every_depth_and_only_for_the_exact_marker() -> None:
    assert contains_redacted({"a": [{"b": [REDACTED]}]})
    assert not contains_redacted({"a": [{"b": ["[redacted] but more", 1, None, True]}], "c": "REDACTED"})


# --------------------------------------------------------------------------- the pool's header


class RecordingPublisher:
    def __init__(self) -> None:
        self.published: list[tuple[bytes, dict[str, Any]]] = []

    def publish(self, body: bytes, **options: Any) -> None:
        self.published.append((body, options))


def dead_letter(catalog: Catalog, the_job: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the letter's body, its headers) as ``PoolRuntime._dead_letter`` publishes them."""
    publisher = RecordingPublisher()
    runtime = SimpleNamespace(catalog=catalog, connector=SimpleNamespace(name="tickets"), publisher=publisher)
    runtime._letter = lambda *args: PoolRuntime._letter(runtime, *args)  # type: ignore[arg-type]
    PoolRuntime._dead_letter(runtime, the_job, "poison")  # type: ignore[arg-type]
    [(body, options)] = publisher.published
    return json.loads(body), options["headers"]


@pytest.mark.parametrize(
    "params",
    [
        {"title": "t", "api_token": "s3cret"},
        {"title": "t", "card": {"number": "4111", "holder": "h"}},
    ],
)
def test_the_pool_marks_a_letter_whose_params_it_redacted(catalog: Catalog, params: dict[str, Any]) -> None:
    body, headers = dead_letter(catalog, job(params))
    assert headers[REDACTED_HEADER] == "true" and headers["x-reach-connector"] == "tickets"
    assert "s3cret" not in json.dumps(body) and "4111" not in json.dumps(body)
    assert was_redacted(letter(body, headers))


def test_the_pool_marks_a_letter_of_an_action_it_does_not_know(catalog: Catalog) -> None:
    body, headers = dead_letter(catalog, job({"anything": "x"}, action="no_such_action"))
    assert body["params"] == REDACTED and headers[REDACTED_HEADER] == "true"


def test_the_pool_does_not_mark_a_letter_it_left_as_it_was(catalog: Catalog) -> None:
    params = {"title": "t", "priority": "high", "card": {"holder": "h"}}
    body, headers = dead_letter(catalog, job(params))
    assert REDACTED_HEADER not in headers and body["params"] == params
    assert not was_redacted(letter(body, headers))
