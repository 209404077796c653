"""``reach mcp`` driven by the official MCP client SDK over both transports, against a real fleet.

The fleet runs with ``REACH_REQUIRE_USER_ID=1``, so every receipt that comes back proves the intent
carried a broker-checked ``user_id``: over stdio the agent's own RabbitMQ user, over HTTP the
facade's user with the ``impersonator`` tag (``reach mcp-user``) publishing as the bearer token's
agent. Users are created for this run (unique names) and deleted at the end. The downstream is
the counting system, so a test can say what really happened there.
"""

from __future__ import annotations

import json
import re
import secrets
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote, urlsplit, urlunsplit

import anyio
import anyio.to_thread
import httpx
import jwt
import mcp_types as types
import pytest
from amqp.exceptions import AccessRefused
from anyio.from_thread import BlockingPortal, start_blocking_portal
from kombu import Connection
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from tests.fleet import Fleet, free_port, isolated_urls, queue_depth
from tests.integration.counting_system import CountingSystem
from tests.waiting import wait_for
from workers.mcp.broker_user import create_facade_user, delete_facade_user
from workers.mcp.tokens import digest
from workers.ops.agents import create_agent_user, delete_agent_user, vhost_of
from workers.transport.topology import connector_queue

REPO = Path(__file__).resolve().parents[2]
RUN = uuid.uuid4().hex[:8]
ALPHA, BETA = f"mcp_{RUN}_alpha", f"mcp_{RUN}_beta"
FACADE = f"mcp_{RUN}_facade"
CONNECTOR = "mcp_items"
CREATE, SLOW, GET = f"{CONNECTOR}__create_item", f"{CONNECTOR}__create_slow_item", f"{CONNECTOR}__get_item"
TOKENS = {ALPHA: secrets.token_urlsafe(24), BETA: secrets.token_urlsafe(24)}
JWT_SECRET = secrets.token_urlsafe(32)
TRANSPORTS = ["stdio", "http"]
T = TypeVar("T")

CATALOG = f"""
connector:
  name: {CONNECTOR}
  endpoint: {{url}}
  actions:
    - action: create_item
      description: Create an item
      path: POST /items
      input:
        title: {{{{ type: string, required: true, max_length: 40 }}}}
      output:
        item_id: {{{{ type: string }}}}
        status: {{{{ type: enum, values: [open, closed] }}}}
      permission: write
      idempotent: false
    - action: create_slow_item
      description: Create an item in a system that takes its time
      path: POST /slow/items
      input:
        title: {{{{ type: string, required: true }}}}
      permission: write
      idempotent: false
      timeout: 2s
    - action: get_item
      description: Read an item
      path: GET /items/{{{{iid}}}}
      input:
        iid: {{{{ type: string, required: true }}}}
      output:
        status: {{{{ type: enum, values: [open, closed] }}}}
      permission: read
---
agent_app:
  name: {ALPHA}
  connector_bindings:
    - connector: {CONNECTOR}
      allowed_actions: [create_item, create_slow_item, get_item]
---
agent_app:
  name: {BETA}
  connector_bindings:
    - connector: {CONNECTOR}
      allowed_actions: [get_item]
"""


def amqp_url(user: str, password: str) -> str:
    broker = urlsplit(isolated_urls()[0])
    netloc = f"{quote(user, safe='')}:{quote(password, safe='')}@{broker.hostname}:{broker.port or 5672}"
    return urlunsplit((broker.scheme, netloc, broker.path, "", ""))


class Users:
    """This run's broker users: the two agents' own and the facade's. rabbitmqctl takes a second or
    two per call, so they are made in threads while the fleet starts."""

    def __init__(self) -> None:
        self.vhost = vhost_of(isolated_urls()[0])
        self.passwords = {name: secrets.token_urlsafe(24) for name in (ALPHA, BETA, FACADE)}
        self.pool = ThreadPoolExecutor(3)
        self.made = {name: self.pool.submit(self._create, name) for name in self.passwords}

    def _create(self, name: str) -> None:
        if name == FACADE:
            create_facade_user(name, self.passwords[name], self.vhost)
        else:
            create_agent_user(name, self.passwords[name], self.vhost)

    def _delete(self, name: str) -> None:
        try:
            self.made[name].result()
            delete_facade_user(name) if name == FACADE else delete_agent_user(name, self.vhost)
        except Exception as exc:  # cleanup must not hide the test's own failure
            print(f"could not delete broker user {name}: {exc}")

    def url(self, name: str) -> str:
        """The user's broker URL (it may not exist yet)."""
        return amqp_url(name, self.passwords[name])

    def logins(self) -> dict[str, str]:
        """Broker URL per user, once all exist."""
        for made in self.made.values():
            made.result()
        return {name: self.url(name) for name in self.passwords}

    def delete(self) -> None:
        list(self.pool.map(self._delete, self.passwords))
        self.pool.shutdown()


@pytest.fixture(scope="module")
def users() -> Iterator[Users]:
    made = Users()
    try:
        yield made
    finally:
        made.delete()


@pytest.fixture(scope="module")
def system() -> Iterator[CountingSystem]:
    downstream = CountingSystem().start()
    downstream.state.slow_seconds = 3.0  # longer than create_slow_item's 2 s timeout
    yield downstream
    downstream.stop()


class Facade:
    """The ``reach mcp --http`` process of the fleet."""

    def __init__(self, fleet: Fleet, broker_url: str) -> None:
        """Start it: it needs neither its broker user nor the fleet before its first call."""
        self.fleet = fleet
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        tokens_file = Path(tempfile.mkdtemp(prefix="reach-test-mcp-")) / "tokens.yaml"  # not in the catalog dir
        tokens_file.write_text(f"{ALPHA}: {digest(TOKENS[ALPHA])}\n{BETA}: [{digest(TOKENS[BETA])}]\n")
        fleet.start_process(
            "mcp",
            ["mcp", "--http", "--port", str(self.port)],
            {
                "REACH_BROKER_URL": broker_url,
                "REACH_MCP_URL": self.url,
                "REACH_MCP_TOKENS_FILE": str(tokens_file),
                "REACH_MCP_JWT_KEY": JWT_SECRET,
                "REACH_MCP_JWT_ALGORITHM": "HS256",
                "REACH_MCP_WAIT": "20s",
            },
        )
        self.metrics_port = fleet.metrics_port("mcp")

    def wait_answering(self) -> Facade:
        try:
            wait_for(self._answers, 60, "reach mcp --http did not answer")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; its log: {self.fleet.log('mcp')[-3000:]}") from None
        return self

    def _answers(self) -> bool:
        try:
            return httpx.post(self.url, json={}, timeout=2).status_code == 401
        except httpx.TransportError:
            return False

    def metric(self, name: str, **labels: str) -> float:
        text = httpx.get(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5).text
        want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        prefix = f"{name}{{{want}}} " if want else f"{name} "
        lines = [line for line in text.splitlines() if line.startswith(prefix)]
        return float(lines[0].rsplit(" ", 1)[1]) if lines else 0.0


@pytest.fixture(scope="module")
def running(system: CountingSystem, users: Users) -> Iterator[tuple[Fleet, Facade]]:
    """The fleet and its facade, started side by side with the users being made."""
    fleet = Fleet(CATALOG.format(url=system.url), [CONNECTOR], env={"REACH_REQUIRE_USER_ID": "1"})
    try:
        facade = Facade(fleet, users.url(FACADE))
        fleet.start()
        yield fleet, facade
    finally:
        fleet.stop()


@pytest.fixture(scope="module")
def fleet(running: tuple[Fleet, Facade]) -> Fleet:
    return running[0]


@pytest.fixture(scope="module")
def logins(users: Users, fleet: Fleet) -> dict[str, str]:
    return users.logins()


@pytest.fixture(scope="module")
def facade(running: tuple[Fleet, Facade], logins: dict[str, str]) -> Facade:
    return running[1].wait_answering()


@pytest.fixture
def downstream(system: CountingSystem, fleet: Fleet) -> CountingSystem:
    system.state.reset()
    system.state.slow_seconds = 3.0
    return system


def a_jwt(agent: str, audience: str, **changes: Any) -> str:
    claims = {"sub": agent, "aud": audience, "exp": int(time.time()) + 300, **changes}
    return jwt.encode({k: v for k, v in claims.items() if v is not None}, JWT_SECRET, algorithm="HS256")


@asynccontextmanager
async def session(
    transport: str,
    agent: str,
    fleet: Fleet,
    logins: dict[str, str],
    facade: Facade,
    *,
    token: str | None = None,
    **env: str,
) -> AsyncIterator[ClientSession]:
    """An initialised MCP client session acting for ``agent``: over HTTP with its bearer token (or
    ``token``), over stdio as a ``reach mcp --stdio`` child logged in as the agent (``env`` changes that)."""
    if transport == "http":
        headers = {"Authorization": f"Bearer {token or TOKENS[agent]}", **env}
        http = create_mcp_http_client(headers=headers)
        async with http, streamable_http_client(facade.url, http_client=http) as (read, write):
            async with ClientSession(read, write) as client:
                await client.initialize()
                yield client
        return
    server = StdioServerParameters(
        command=sys.executable,
        args=["-m", "workers.cli", "mcp", "--stdio", "--agent", agent],
        env={**fleet.env, "REACH_BROKER_URL": logins[agent], **env},
        cwd=REPO,
    )
    with open(fleet.log_dir / f"mcp-stdio-{agent}.log", "a") as errlog:
        async with stdio_client(server, errlog=errlog) as (read, write):
            async with ClientSession(read, write) as client:
                await client.initialize()
                yield client


class Sessions:
    """MCP sessions that live for the whole module, on an event loop in a thread of their own, so
    the stdio servers start once per agent rather than once per test."""

    def __init__(self, portal: BlockingPortal, fleet: Fleet, logins: dict[str, str], facade: Facade) -> None:
        self.portal, self.fleet, self.logins, self.facade = portal, fleet, logins, facade
        self.open: dict[tuple[str, str], ClientSession] = {}
        self.stack = ExitStack()

    def __call__(self, transport: str, agent: str) -> ClientSession:
        key = (transport, agent)
        if key not in self.open:
            manager = session(transport, agent, self.fleet, self.logins, self.facade)
            self.open[key] = self.stack.enter_context(self.portal.wrap_async_context_manager(manager))
        return self.open[key]

    def open_side_by_side(self, keys: list[tuple[str, str]]) -> None:
        managers = {
            k: self.portal.wrap_async_context_manager(session(*k, self.fleet, self.logins, self.facade)) for k in keys
        }
        with ThreadPoolExecutor(len(keys)) as pool:
            entering = {k: pool.submit(m.__enter__) for k, m in managers.items()}
        failed: BaseException | None = None
        for key, future in entering.items():
            try:
                self.open[key] = future.result()
            except BaseException as exc:
                failed = exc
                continue
            self.stack.push(managers[key].__exit__)
        if failed is not None:
            raise failed

    def run(self, call: Callable[[], Awaitable[T]]) -> T:
        return self.portal.call(call)

    def call_tool(
        self, transport: str, agent: str, tool: str, arguments: dict[str, Any], **kw: Any
    ) -> types.CallToolResult:
        client = self(transport, agent)
        return self.run(lambda: client.call_tool(tool, arguments, **kw))

    def tools(self, transport: str, agent: str) -> dict[str, types.Tool]:
        client = self(transport, agent)
        return {tool.name: tool for tool in self.run(client.list_tools).tools}


@pytest.fixture(scope="module")
def mcp(fleet: Fleet, logins: dict[str, str], facade: Facade) -> Iterator[Sessions]:
    with start_blocking_portal() as portal:
        sessions = Sessions(portal, fleet, logins, facade)
        with sessions.stack:
            sessions.open_side_by_side([("stdio", ALPHA), ("stdio", BETA)])  # each child takes seconds to start
            yield sessions


def text_of(result: types.CallToolResult) -> str:
    return "\n".join(block.text for block in result.content if isinstance(block, types.TextContent))


def receipt_of(result: types.CallToolResult) -> dict[str, Any]:
    assert result.meta is not None, text_of(result)
    receipt: dict[str, Any] = result.meta["agent-reach/receipt"]
    return receipt


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_each_agent_lists_only_its_own_tools_with_hints_and_output_schema(transport: str, mcp: Sessions) -> None:
    alpha, beta = mcp.tools(transport, ALPHA), mcp.tools(transport, BETA)
    assert sorted(alpha) == sorted([CREATE, SLOW, GET]) and list(beta) == [GET]
    create, get = alpha[CREATE], alpha[GET]
    assert create.annotations is not None and get.annotations is not None
    assert (create.annotations.read_only_hint, create.annotations.destructive_hint) == (False, True)
    assert create.annotations.idempotent_hint is False
    assert (get.annotations.read_only_hint, get.annotations.idempotent_hint) == (True, True)
    assert create.input_schema["required"] == ["title"] and create.input_schema["additionalProperties"] is False
    assert create.output_schema is not None
    assert set(create.output_schema["properties"]) >= {"item_id", "status"}
    assert alpha[SLOW].output_schema is None  # no declared output, no schema


def test_a_jwt_for_the_mcp_url_names_its_agent(mcp: Sessions) -> None:
    async def scenario() -> tuple[list[str], types.CallToolResult]:
        token = a_jwt(BETA, mcp.facade.url)
        async with session("http", BETA, mcp.fleet, mcp.logins, mcp.facade, token=token) as client:
            names = [tool.name for tool in (await client.list_tools()).tools]
            return names, await client.call_tool(GET, {"iid": "IT-7"})

    names, result = mcp.run(scenario)
    assert names == [GET]
    assert not result.is_error, text_of(result)
    assert receipt_of(result)["agent_id"] == BETA


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_call_succeeds_with_the_data_as_structured_content_and_the_receipt_in_meta(
    transport: str, mcp: Sessions, downstream: CountingSystem
) -> None:
    title = f"ok-{transport}-{RUN}"
    trace_id = secrets.token_hex(16)
    meta = {"idempotency_key": f"key-{transport}-{RUN}", "traceparent": f"00-{trace_id}-{secrets.token_hex(8)}-01"}
    mcp.tools(transport, ALPHA)  # the client checks structuredContent against the listed outputSchema
    first = mcp.call_tool(transport, ALPHA, CREATE, {"title": title}, meta=meta)
    again = mcp.call_tool(transport, ALPHA, CREATE, {"title": title}, meta=meta)
    assert not first.is_error, text_of(first)
    receipt = receipt_of(first)
    assert receipt["status"] == "succeeded" and receipt["agent_id"] == ALPHA
    assert first.structured_content == receipt["data"]
    assert first.structured_content["title"] == title and first.structured_content["status"] == "open"
    assert receipt["execution"]["trace_id"] == trace_id
    # the same idempotency key: the first outcome again, and the system did it once
    assert again.structured_content == first.structured_content
    assert receipt_of(again)["execution"]["deduplicated"] is True
    assert receipt_of(again)["intent_id"] != receipt["intent_id"]
    assert downstream.executions()[title] == 1


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_arguments_that_break_the_input_come_back_as_a_tool_error_naming_the_code(
    transport: str, mcp: Sessions, downstream: CountingSystem
) -> None:
    result = mcp.call_tool(transport, ALPHA, CREATE, {"title": "x" * 41, "colour": "red"})
    assert result.is_error and result.structured_content is None
    text = text_of(result)
    assert "VALIDATION_FAILED" in text and "not retryable" in text and "Suggestion:" in text
    assert "title" in text and "colour" in text
    assert receipt_of(result)["error"]["code"] == "VALIDATION_FAILED"
    assert downstream.requests() == []


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_an_action_the_agent_is_not_bound_to_is_permission_denied(
    transport: str, mcp: Sessions, downstream: CountingSystem
) -> None:
    result = mcp.call_tool(transport, BETA, CREATE, {"title": f"denied-{RUN}"})
    assert result.is_error and "PERMISSION_DENIED" in text_of(result)
    receipt = receipt_of(result)
    assert (receipt["agent_id"], receipt["status"]) == (BETA, "rejected")
    assert downstream.requests() == []


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_write_that_times_out_downstream_says_the_outcome_is_unknown_and_reports_progress(
    transport: str, mcp: Sessions, downstream: CountingSystem
) -> None:
    title = f"slow-{transport}-{RUN}"
    progress: list[tuple[float, str | None]] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append((value, message))

    result = mcp.call_tool(transport, ALPHA, SLOW, {"title": title}, progress_callback=on_progress)
    assert result.is_error
    text = text_of(result)
    assert text.startswith("Outcome unknown: the action may or may not have taken effect.")
    assert "OUTCOME_UNKNOWN" in text
    receipt = receipt_of(result)
    assert receipt["status"] == "unknown"
    # sent at once, naming the intent, then once a second while the 2 s timeout ran
    assert len(progress) >= 2 and receipt["intent_id"] in (progress[0][1] or "")
    assert [value for value, _ in progress] == sorted(value for value, _ in progress)
    assert len(downstream.requests(title=title)) == 1  # sent once: a write is never retried blind


def test_a_missing_or_wrong_token_is_refused_with_401_and_the_resource_metadata(facade: Facade) -> None:
    refused_before = facade.metric("reach_mcp_auth_refused_total")
    metadata_url = f"http://127.0.0.1:{facade.port}/.well-known/oauth-protected-resource/mcp"
    wrong = [
        None,
        "not-a-token",
        TOKENS[ALPHA] + "x",
        a_jwt(ALPHA, "http://elsewhere.example/mcp"),  # issued for another resource
        a_jwt(ALPHA, facade.url, exp=int(time.time()) - 600),  # expired
        a_jwt(ALPHA, facade.url, exp=None),  # never expires: refused
        a_jwt("Not An Agent", facade.url),
        jwt.encode({"sub": ALPHA, "aud": facade.url, "exp": int(time.time()) + 300}, "another-secret" * 3, "HS256"),
    ]
    request = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    for token in wrong:
        headers = {"Accept": "application/json, text/event-stream"}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        answer = httpx.post(facade.url, json=request, headers=headers, timeout=5)
        assert answer.status_code == 401, (token, answer.text)
        assert f'resource_metadata="{metadata_url}"' in answer.headers["www-authenticate"]
    metadata = httpx.get(metadata_url, timeout=5).json()
    assert metadata["resource"] == facade.url
    assert facade.metric("reach_mcp_auth_refused_total") == refused_before + len(wrong)


def test_answers_are_one_json_body_unless_the_call_asks_for_progress(facade: Facade) -> None:
    headers = {"Authorization": f"Bearer {TOKENS[BETA]}", "Accept": "application/json, text/event-stream"}

    def post(params: dict[str, Any]) -> httpx.Response:
        request = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": params}
        return httpx.post(facade.url, json=request, headers=headers, timeout=30)

    plain = post({"name": GET, "arguments": {"iid": "IT-3"}})
    assert plain.headers["content-type"].startswith("application/json")
    assert plain.json()["result"]["structuredContent"]["item_id"] == "IT-3"
    streamed = post({"name": GET, "arguments": {"iid": "IT-4"}, "_meta": {"progressToken": "p-1"}})
    assert streamed.headers["content-type"].startswith("text/event-stream")
    events = [
        json.loads(line[5:]) for line in streamed.text.splitlines() if line.startswith("data:") and line[5:].strip()
    ]
    assert events[0]["method"] == "notifications/progress" and events[0]["params"]["progressToken"] == "p-1"
    assert events[-1]["result"]["structuredContent"]["item_id"] == "IT-4"


def test_a_token_for_one_agent_can_never_publish_as_another(mcp: Sessions, downstream: CountingSystem) -> None:
    title = f"spoof-{RUN}"
    claims: Any = {"agent_id": ALPHA, "user_id": ALPHA, "agent-reach/agent": ALPHA}

    async def scenario() -> tuple[list[str], list[types.CallToolResult]]:
        # beta's token, alpha named in a header, in _meta and in the arguments
        async with session("http", BETA, mcp.fleet, mcp.logins, mcp.facade, **{"X-Agent-Id": ALPHA}) as client:
            names = [tool.name for tool in (await client.list_tools()).tools]
            return names, [
                await client.call_tool(CREATE, {"title": title}, meta=claims),
                await client.call_tool(f"{CONNECTOR}.create_item", {"title": title, "agent_id": ALPHA}),
                await client.call_tool(GET, {"iid": "IT-1"}, meta=claims),
            ]

    names, (denied, also_denied, own) = mcp.run(scenario)
    assert names == [GET]
    for result in (denied, also_denied):
        assert result.is_error and "PERMISSION_DENIED" in text_of(result)
        assert receipt_of(result)["agent_id"] == BETA
    assert not own.is_error and receipt_of(own)["agent_id"] == BETA
    assert downstream.requests(method="POST") == []


def test_the_facade_user_may_act_as_any_agent_but_read_none_of_their_own_receipts(logins: dict[str, str]) -> None:
    users = json.loads(
        subprocess.run(
            ["rabbitmqctl", "list_users", "--silent", "--formatter", "json"], capture_output=True, text=True, check=True
        ).stdout
    )
    assert [u["tags"] for u in users if u["user"] == FACADE] == [["impersonator"]]
    with Connection(logins[FACADE], connect_timeout=10) as conn:
        channel = conn.channel()
        queue = channel.queue_declare("", exclusive=True).queue
        channel.queue_bind(queue, "reach.receipts", f"{ALPHA}.mcp.{uuid.uuid4().hex}")  # its clients' keys: allowed
        with pytest.raises(AccessRefused):
            channel.queue_bind(queue, "reach.receipts", ALPHA)  # what the agent itself receives: refused


def test_over_stdio_an_agent_named_without_its_own_login_gets_nothing_done(
    mcp: Sessions, downstream: CountingSystem
) -> None:
    """``--agent ALPHA`` with beta's broker login on a fleet with REACH_REQUIRE_USER_ID=1: the
    router would refuse every intent without alpha's user_id (and the broker does not let that
    login bind alpha's receipts either), so each call is refused at once; nothing is sent."""

    async def scenario() -> types.CallToolResult:
        beta_login = {"REACH_BROKER_URL": mcp.logins[BETA]}
        async with session("stdio", ALPHA, mcp.fleet, mcp.logins, mcp.facade, **beta_login) as client:
            return await client.call_tool(CREATE, {"title": f"claimed-{RUN}"})

    result = mcp.run(scenario)
    text = text_of(result)
    assert result.is_error and text.startswith("PERMISSION_DENIED (rejected, nothing was sent)"), text
    assert f"not as the agent {ALPHA!r}" in text and "reach agent-user create" in text
    assert result.meta is None
    assert downstream.requests() == []


def test_calls_are_counted_by_outcome_with_their_latency(mcp: Sessions, downstream: CountingSystem) -> None:
    facade = mcp.facade
    succeeded = facade.metric("reach_mcp_requests_total", method="tools/call", outcome="succeeded")
    rejected = facade.metric("reach_mcp_requests_total", method="tools/call", outcome="rejected")
    listed = facade.metric("reach_mcp_requests_total", method="tools/list", outcome="ok")
    timed = facade.metric("reach_mcp_tool_call_seconds_count")
    mcp.tools("http", ALPHA)
    mcp.call_tool("http", ALPHA, GET, {"iid": "IT-2"})
    mcp.call_tool("http", ALPHA, CREATE, {})
    assert facade.metric("reach_mcp_requests_total", method="tools/call", outcome="succeeded") == succeeded + 1
    assert facade.metric("reach_mcp_requests_total", method="tools/call", outcome="rejected") == rejected + 1
    assert facade.metric("reach_mcp_requests_total", method="tools/list", outcome="ok") == listed + 1
    assert facade.metric("reach_mcp_tool_call_seconds_count") == timed + 2


def close_facade_connections() -> None:
    """Have the broker close the HTTP facade's connections (as a node going away would)."""
    subprocess.run(
        ["rabbitmqctl", "-q", "close_all_user_connections", FACADE, "test: the facade's connection closed"],
        check=True,
        capture_output=True,
        timeout=60,
    )


def reach_cli(fleet: Fleet, *args: str) -> None:
    """The `reach` CLI as an operator runs it, with the fleet's environment."""
    subprocess.run(
        [sys.executable, "-m", "workers.cli", *args],
        env=fleet.env,
        cwd=REPO,
        check=True,
        capture_output=True,
        timeout=60,
    )


def test_a_lost_broker_connection_fails_the_waiting_call_at_once_and_the_next_call_connects_again(
    mcp: Sessions, downstream: CountingSystem
) -> None:
    held, after = f"held-{RUN}", f"after-cut-{RUN}"
    queue = connector_queue(CONNECTOR).name
    assert not mcp.call_tool("http", ALPHA, GET, {"iid": "IT-1"}).is_error  # the facade is connected
    # the connector paused: the call's intent waits in its queue, so no receipt can come before the cut
    reach_cli(mcp.fleet, "pause", CONNECTOR)
    try:
        wait_for(
            lambda: queue_depth(queue, mcp.fleet.broker_url)[1],
            10,
            "the pool to stop consuming",
            until=lambda n: n == 0,
        )

        async def cut_while_waiting() -> types.CallToolResult:
            client = mcp("http", ALPHA)
            result: list[types.CallToolResult] = []

            async def call() -> None:
                result.append(await client.call_tool(CREATE, {"title": held}))

            async with anyio.create_task_group() as tg:
                tg.start_soon(call)
                while (await anyio.to_thread.run_sync(queue_depth, queue, mcp.fleet.broker_url))[0] < 1:
                    await anyio.sleep(0.05)
                await anyio.to_thread.run_sync(close_facade_connections)
            return result[0]

        cut = mcp.run(cut_while_waiting)
    finally:
        reach_cli(mcp.fleet, "resume", CONNECTOR)
    text = text_of(cut)
    # told when the connection went (not after the 20 s wait), with the key to call again with
    assert cut.is_error and "lost the broker connection while waiting" in text, text
    again = mcp.call_tool("http", ALPHA, CREATE, {"title": after})
    assert not again.is_error, text_of(again)
    assert receipt_of(again)["status"] == "succeeded"
    # the intent that was waiting ran once, after the resume; its receipt went to a queue that is gone
    wait_for(lambda: len(downstream.requests(title=held)), 20, "the held intent to run", until=lambda n: n == 1)
    assert len(downstream.requests(title=after)) == 1
    # calling again with the key the answer named gives that intent's outcome, without running it twice
    key = re.search(r'"idempotency_key": "([0-9a-f]{32})"', text)
    assert key is not None, text
    repeats: list[types.CallToolResult] = []

    def answered() -> bool:  # CONNECTOR_UNAVAILABLE while the held intent still finishes: ask again
        repeats.append(mcp.call_tool("http", ALPHA, CREATE, {"title": held}, meta={"idempotency_key": key.group(1)}))
        return not repeats[-1].is_error

    wait_for(answered, 20, "the held intent's outcome under its key", every=0.5)
    repeat = repeats[-1]
    assert receipt_of(repeat)["execution"]["deduplicated"] is True
    assert len(downstream.requests(title=held)) == 1
