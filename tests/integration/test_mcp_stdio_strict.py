"""``reach mcp --stdio`` logged in to the broker as someone other than its agent, against a fleet
with REACH_REQUIRE_USER_ID=1: the router would refuse every intent it sends and could tell nobody,
so each call used to wait REACH_MCP_WAIT and then say "outcome unknown". Driven by the official
MCP client SDK."""

from __future__ import annotations

import importlib.metadata
import sys
import time
from collections.abc import Iterator

import anyio
import pytest
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from tests.fleet import REPO, Fleet
from tests.integration.counting_system import CountingSystem

AGENT = "strict_desk"
CATALOG = f"""
connector:
  name: strict_notes
  endpoint: {{url}}
  actions:
    - action: get_note
      description: Read a note
      path: GET /notes/{{{{nid}}}}
      input:
        nid: {{{{ type: string, required: true }}}}
      permission: read
---
agent_app:
  name: {AGENT}
  connector_bindings:
    - connector: strict_notes
      allowed_actions: [get_note]
"""


@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    system = CountingSystem().start()
    try:
        with Fleet(CATALOG.format(url=system.url), ["strict_notes"], env={"REACH_REQUIRE_USER_ID": "1"}) as running:
            yield running
    finally:
        system.stop()


async def call_once(fleet: Fleet) -> tuple[str, float, bool, str]:
    """The server's version, and one tools/call: how long it took, whether it is an error, its text."""
    server = StdioServerParameters(
        command=sys.executable,
        args=["-m", "workers.cli", "mcp", "--stdio", "--agent", AGENT],
        env={**fleet.env, "REACH_MCP_WAIT": "20s"},  # the fleet's own login (guest), not the agent's
        cwd=REPO,
    )
    with open(fleet.log_dir / "mcp-stdio-strict.log", "a") as errlog:
        async with stdio_client(server, errlog=errlog) as (read, write):
            async with ClientSession(read, write) as client:
                init = await client.initialize()
                started = time.monotonic()
                result = await client.call_tool("strict_notes__get_note", {"nid": "n1"})
                text = "".join(getattr(part, "text", "") for part in result.content)
                return init.server_info.version, time.monotonic() - started, bool(result.is_error), text


def test_a_stdio_facade_that_is_not_its_agent_gets_the_refusal_at_once_not_outcome_unknown(fleet: Fleet) -> None:
    version, took, is_error, text = anyio.run(call_once, fleet)
    assert version == importlib.metadata.version("agent-reach")
    assert is_error and took < 5, (took, text)
    assert "PERMISSION_DENIED" in text and "REACH_REQUIRE_USER_ID" in text and "unknown" not in text.lower()
    assert "agent-user create" in text  # what to do instead
