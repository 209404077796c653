"""Output patterns through ``reach mcp --stdio`` and the official MCP client, against a real fleet
(issue 30): the facade checks a success's data against the declared output with RE2, as the pool
does, and gives clients an ``outputSchema`` without patterns.

Two patterns a catalog may declare on an output field, both valid RE2: ``^\\p{L}+$``, which
Python's ``re`` cannot compile (so a success used to fail in the facade, and the client's own
check refused the schema), and ``^([a-zA-Z0-9]+\\s?)*$``, copied from a vendor's OpenAPI document,
on which ``re`` backtracks for ever over a long value that does not match. The downstream (the
counting system) echoes the title it is sent, so each call chooses the answer.

Each pattern is on two actions. ``letters`` and ``words`` carry it in the fleet's catalog too,
so the pool refuses a mismatch before the facade sees it. ``letters_ahead`` and ``words_ahead``
carry it only in the facade's catalog (a catalog the facade loaded before the pool did): there
the facade's own check is what finds the mismatch.
"""

from __future__ import annotations

import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import anyio
import mcp_types as types
import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from tests.fleet import REPO, Fleet
from tests.integration.counting_system import CountingSystem

RUN = uuid.uuid4().hex[:6]
AGENT = f"patterns_{RUN}"
CONNECTOR = "mcp_patterns"
LETTERS, WORDS = r"^\p{L}+$", r"^([a-zA-Z0-9]+\s?)*$"
MATCHING = {LETTERS: "Zürich", WORDS: "plain words 42"}
LONG_MISMATCH = {LETTERS: "a" * 4999 + "1", WORDS: "a" * 4999 + "!"}  # 5,000 characters each


def action(name: str, pattern: str | None) -> str:
    output = f"{{ type: string, pattern: '{pattern}' }}" if pattern else "{ type: string }"
    return f"""
    - action: {name}
      description: Create an item and answer its title
      path: POST /items
      input:
        title: {{ type: string, required: true, max_length: 6000 }}
      output:
        title: {output}
        status: {{ type: string }}
      permission: write
      idempotent: false"""


def catalog(url: str, *, facade: bool) -> str:
    """The fleet's catalog, or the facade's (which also puts the patterns on the ``_ahead`` actions)."""
    actions = [action("letters", LETTERS), action("words", WORDS)]
    actions += [action("letters_ahead", LETTERS if facade else None), action("words_ahead", WORDS if facade else None)]
    return f"""
connector:
  name: {CONNECTOR}
  endpoint: {url}
  actions:{"".join(actions)}
---
agent_app:
  name: {AGENT}
  connector_bindings:
    - connector: {CONNECTOR}
      allowed_actions: ["*"]
"""


@pytest.fixture(scope="module")
def system() -> Iterator[CountingSystem]:
    downstream = CountingSystem().start()
    yield downstream
    downstream.stop()


@pytest.fixture(scope="module")
def fleet(system: CountingSystem) -> Iterator[Fleet]:
    with Fleet(catalog(system.url, facade=False), [CONNECTOR]) as running:
        yield running


@pytest.fixture(scope="module")
def client(fleet: Fleet, system: CountingSystem) -> Iterator[tuple[BlockingPortal, ClientSession]]:
    """One ``reach mcp --stdio`` for the module, reading the facade's catalog, and its MCP client."""
    facade_dir = Path(tempfile.mkdtemp(prefix="reach-test-mcp-patterns-"))
    (facade_dir / "catalog.yaml").write_text(catalog(system.url, facade=True))
    server = StdioServerParameters(
        command=sys.executable,
        args=["-m", "workers.cli", "mcp", "--stdio", "--agent", AGENT],
        env={**fleet.env, "REACH_CATALOG": str(facade_dir), "REACH_MCP_WAIT": "20s"},
        cwd=REPO,
    )

    with start_blocking_portal() as portal, ExitStack() as stack:
        errlog = stack.enter_context(open(fleet.log_dir / "mcp-stdio-patterns.log", "a"))
        streams = stack.enter_context(portal.wrap_async_context_manager(stdio_client(server, errlog=errlog)))
        session = stack.enter_context(portal.wrap_async_context_manager(ClientSession(*streams)))
        portal.call(session.initialize)
        portal.call(session.list_tools)  # the client checks structuredContent against the listed outputSchema
        yield portal, session


def text_of(result: types.CallToolResult) -> str:
    return "\n".join(block.text for block in result.content if isinstance(block, types.TextContent))


def code_of(result: types.CallToolResult) -> str | None:
    assert result.meta is not None, text_of(result)
    error = result.meta["agent-reach/receipt"]["error"]
    return None if error is None else str(error["code"])


def timed_calls(
    client: tuple[BlockingPortal, ClientSession], calls: list[tuple[str, str]]
) -> list[tuple[types.CallToolResult, float]]:
    """``calls`` (tool, title) sent at once on the one session; each result with its seconds."""
    portal, session = client
    answers: list[tuple[types.CallToolResult, float] | None] = [None] * len(calls)

    async def one(index: int, tool: str, title: str) -> None:
        started = time.monotonic()
        with anyio.fail_after(30):
            result = await session.call_tool(f"{CONNECTOR}__{tool}", {"title": title})
        answers[index] = (result, time.monotonic() - started)

    async def all_at_once() -> None:
        async with anyio.create_task_group() as tg:
            for index, (tool, title) in enumerate(calls):
                tg.start_soon(one, index, tool, title)

    portal.call(all_at_once)
    assert all(answer is not None for answer in answers)
    return [answer for answer in answers if answer is not None]


def test_clients_get_output_schemas_without_patterns(client: tuple[BlockingPortal, ClientSession]) -> None:
    portal, session = client
    tools = {tool.name: tool for tool in portal.call(session.list_tools).tools}
    for name in ("letters", "words", "letters_ahead", "words_ahead"):
        schema = tools[f"{CONNECTOR}__{name}"].output_schema
        assert schema is not None and schema["properties"]["title"] == {"type": "string"}, schema


@pytest.mark.parametrize("tool", ["letters", "words", "letters_ahead", "words_ahead"])
def test_a_matching_answer_is_a_success(tool: str, client: tuple[BlockingPortal, ClientSession]) -> None:
    title = MATCHING[LETTERS if tool.startswith("letters") else WORDS]
    ((result, took),) = timed_calls(client, [(tool, title)])
    assert not result.is_error, text_of(result)
    assert result.structured_content is not None and result.structured_content["title"] == title
    assert took < 3, took


@pytest.mark.parametrize("pattern", [LETTERS, WORDS])
def test_a_long_mismatch_the_pool_checks_is_a_contract_violation_at_once(
    pattern: str, client: tuple[BlockingPortal, ClientSession]
) -> None:
    tool = "letters" if pattern == LETTERS else "words"
    ((result, took),) = timed_calls(client, [(tool, LONG_MISMATCH[pattern])])
    assert result.is_error and code_of(result) == "DOWNSTREAM_CONTRACT_VIOLATION", text_of(result)
    assert took < 3, took


@pytest.mark.parametrize("pattern", [LETTERS, WORDS])
def test_a_long_mismatch_only_the_facade_checks_is_found_at_once_and_other_calls_are_served_meanwhile(
    pattern: str, client: tuple[BlockingPortal, ClientSession]
) -> None:
    tool = "letters_ahead" if pattern == LETTERS else "words_ahead"
    answers = timed_calls(
        client,
        [(tool, LONG_MISMATCH[pattern]), (tool, LONG_MISMATCH[pattern]), ("letters", MATCHING[LETTERS])],
    )
    for result, took in answers[:2]:
        # what the facade does for any success that breaks the schema: an error saying it took effect
        assert result.is_error and code_of(result) is None, text_of(result)
        text = text_of(result)
        assert "succeeded, but its data does not match this tool's output schema" in text
        assert f"title: does not match the pattern {pattern}" in text and "do not call it again" in text
        assert took < 3, took
    other, took = answers[2]
    assert not other.is_error and other.structured_content is not None, text_of(other)
    assert other.structured_content["title"] == MATCHING[LETTERS] and took < 3, took
