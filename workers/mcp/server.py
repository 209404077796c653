"""``reach mcp``: the catalog as an MCP server, built on the SDK's lowlevel ``Server``.

The lowlevel server (not ``MCPServer``) because the tools differ per caller: ``tools/list``
answers the calling agent's own tools (its actions and workflows), computed from the catalog
(``tools.py``), and ``tools/call`` hands any tool name to the router, which resolves it and
refuses what the agent may not use, exactly as for an intent sent any other way (a workflow's call
starts a run; its result is the run's final receipt). The facade itself decides nothing.

This module holds the handlers and the stdio transport (``--stdio --agent NAME``: one agent per
process, publishing with the process's own broker login, which should be that agent's user);
``http.py`` serves the same server over Streamable HTTP, the agent named by a bearer token.

While a call waits for its receipt it reports MCP progress (if the client sent a progressToken):
once when the intent is sent, naming its id, then every second.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import unquote, urlsplit

import anyio
import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server

from connectors.catalog import Catalog
from producers.formats import value_depth
from producers.tools import ROUTING_GUIDE
from producers.wire import ErrorCode, Receipt
from workers.mcp import results
from workers.mcp.clients import AgentClients, Call, Undelivered
from workers.mcp.metrics import CountRequests, count_tool_call
from workers.mcp.stdio import stdio_streams
from workers.mcp.tools import AgentTools, agent_tools, output_check
from workers.observability import probes
from workers.observability.http_guard import HttpLimits
from workers.settings import Settings

log = logging.getLogger("reach.mcp")

PROGRESS_EVERY = 1.0  # seconds between progress notifications while a call waits
ENVELOPE_BYTES = 64 * 1024  # the JSON-RPC request around the arguments, past REACH_MAX_INTENT_BYTES
INSTRUCTIONS = (
    "Each tool is an action on a business system, or a workflow of several that undoes its done steps "
    "when one fails, checked by agent-reach before it runs. A result "
    "that is an error says what failed, whether trying again can help and what to do instead. "
    "Send _meta.idempotency_key to make an action's call safe to repeat; a workflow's second call is "
    "a second run. " + ROUTING_GUIDE
)


class Facade:
    """The two handlers, for one way of telling who is calling."""

    def __init__(
        self,
        catalog: Catalog,
        clients: AgentClients,
        settings: Settings,
        identify: Callable[[ServerRequestContext[Any, Any]], str],
        refusal: tuple[str, str] | None = None,
    ) -> None:
        """``refusal``: (message, suggestion) every tools/call is answered PERMISSION_DENIED with,
        at once, when the router is known to refuse every intent this facade could send."""
        self.refusal = refusal
        self.catalog = catalog
        self.clients = clients
        self.identify = identify
        self.max_depth = settings.max_depth
        self.wait = float(settings.mcp_wait_seconds)
        self._tools: dict[str, AgentTools] = {}

    def tools(self, agent: str) -> AgentTools:
        found = self._tools.get(agent)
        if found is None:
            found = self._tools[agent] = agent_tools(self.catalog, agent)
        return found

    async def list_tools(
        self, ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=self.tools(self.identify(ctx)).tools)

    async def call_tool(
        self, ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        started = time.perf_counter()
        agent = self.identify(ctx)
        result, outcome = await self._call(ctx, agent, params)
        count_tool_call(outcome, started)
        return result

    async def _call(
        self, ctx: ServerRequestContext[Any, Any], agent: str, params: types.CallToolRequestParams
    ) -> tuple[types.CallToolResult, str]:
        if self.refusal is not None:
            return results.refused(ErrorCode.PERMISSION_DENIED, *self.refusal), "refused"
        arguments = params.arguments or {}
        # params is level 1 (docs/contract.md §2); bounded, before anything recursive sees it
        if value_depth(arguments) > self.max_depth:
            return results.refused(
                ErrorCode.INVALID_INTENT,
                f"the arguments nest deeper than {self.max_depth} levels",
                "Flatten the arguments and call again.",
            ), "refused"
        meta = ctx.meta or {}
        chosen: dict[str, str | None] = {}
        for name in ("idempotency_key", "traceparent"):
            value = meta.get(name)
            if value is not None and not isinstance(value, str):
                return results.refused(
                    ErrorCode.INVALID_INTENT, f"_meta.{name} must be a string", f"Send _meta.{name} as a string."
                ), "refused"
            chosen[name] = value
        call = Call(
            agent,
            params.name,
            arguments,
            intent_id=uuid.uuid4().hex,
            idempotency_key=chosen["idempotency_key"],
            traceparent=chosen["traceparent"],
            wait=self.wait,
        )
        try:
            if meta.get("progress_token") is None:
                receipt = await self.clients.call(call)
            else:
                receipt = await self._with_progress(ctx, call)
        except ValueError as exc:
            return results.refused(ErrorCode.INVALID_INTENT, str(exc), "Fix the call and send it again."), "refused"
        except Undelivered as exc:
            if exc.published is False:
                return results.not_sent(str(exc)), "not_sent"
            if params.name in self.catalog.workflows:  # a call again would be a second run
                return results.no_final_receipt(call.intent_id, params.name, str(exc)), "no_receipt"
            key = call.idempotency_key or call.intent_id  # the router's default key is the intent id
            return results.no_receipt(call.intent_id, key, params.name, str(exc)), "no_receipt"
        return results.from_receipt(receipt, self._output_check(agent, receipt)), receipt.status

    async def _with_progress(self, ctx: ServerRequestContext[Any, Any], call: Call) -> Receipt:
        """The call, reporting progress: once when the intent is sent, then every PROGRESS_EVERY."""
        sent = anyio.Event()

        async def published() -> None:
            sent.set()
            await _progress(ctx, 0, f"intent {call.intent_id} sent; waiting for its receipt")

        async def tick() -> None:
            await sent.wait()
            waited = 0.0
            while True:
                await anyio.sleep(PROGRESS_EVERY)
                waited += PROGRESS_EVERY
                await _progress(ctx, waited, f"waiting for the receipt of intent {call.intent_id} ({waited:g} s)")

        receipt: Receipt | None = None
        failure: Exception | None = None
        async with anyio.create_task_group() as tg:
            tg.start_soon(tick)
            try:
                receipt = await self.clients.call(call, published)
            except (ValueError, Undelivered) as exc:  # raised outside the task group, not as a group
                failure = exc
            tg.cancel_scope.cancel()
        if failure is not None:
            raise failure
        assert receipt is not None
        return receipt

    def _output_check(self, agent: str, receipt: Receipt) -> results.OutputCheck | None:
        # by the receipt's connector and action: the caller may have named the tool another way
        validator = self.tools(agent).outputs.get(f"{receipt.connector}__{receipt.action}")
        return None if validator is None else output_check(validator)

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """The server's lifespan: a liveness heartbeat on the event loop, readiness, and the
        clients closed at the end."""

        async def heartbeat() -> None:
            while True:
                probes.PROBE.beat()
                await anyio.sleep(1.0)

        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(heartbeat)
                probes.PROBE.ready, probes.PROBE.detail = True, "serving MCP"
                try:
                    yield
                finally:
                    probes.PROBE.ready, probes.PROBE.detail = False, "shutting down"
                    tg.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                await self.clients.aclose()


async def _progress(ctx: ServerRequestContext[Any, Any], progress: float, message: str) -> None:
    """Report progress if the client asked for it; a client that went away is not our failure."""
    try:
        await ctx.session.report_progress(progress, None, message)
    except Exception as exc:  # the stream is gone: the receipt still counts, the result may not arrive
        log.debug("progress notification not sent: %s", exc)


def build_server(facade: Facade) -> Server[None]:
    server: Server[None] = Server(
        "agent-reach",
        version=package_version(),
        title="agent-reach",
        instructions=INSTRUCTIONS,
        on_list_tools=facade.list_tools,
        on_call_tool=facade.call_tool,
    )
    server.middleware.append(CountRequests())
    return server


def package_version() -> str:
    """agent-reach's version, as installed (serverInfo.version)."""
    try:
        return importlib.metadata.version("agent-reach")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "0+unknown"


def broker_login(broker_url: str) -> str:
    """The user name of an AMQP URL (guest when it has none, as the client defaults)."""
    return unquote(urlsplit(broker_url).username or "guest")


def run_stdio(settings: Settings, catalog: Catalog, agent: str) -> None:
    """Serve ``agent`` on stdin/stdout until the client closes them."""
    login = broker_login(settings.broker_url)
    own_login = login == agent
    refusal: tuple[str, str] | None = None
    if not own_login and settings.require_user_id:
        # the router would refuse every intent without a user_id, and tell nobody (it cannot know
        # who sent it): each call would wait REACH_MCP_WAIT for nothing. Say so at once instead.
        refusal = (
            f"this fleet accepts intents only with the broker-validated AMQP user_id (REACH_REQUIRE_USER_ID=1), "
            f"and this reach mcp --stdio is logged in to the broker as {login!r}, not as the agent {agent!r}",
            f"Start reach mcp --stdio with REACH_BROKER_URL naming {agent!r}'s own broker user "
            "(reach agent-user create), or use reach mcp --http.",
        )
        log.error("every tools/call will be refused: %s", refusal[0])
    elif not own_login:
        log.warning(
            "the broker login %r is not the agent %r: intents carry agent_id without user_id, which a "
            "fleet with REACH_REQUIRE_USER_ID=1 refuses (give the agent its own user: reach agent-user create); "
            "set REACH_REQUIRE_USER_ID=1 here as for the fleet, and such calls are refused at once",
            login,
            agent,
        )
    clients = AgentClients(settings.broker_url, per_agent=settings.mcp_clients_per_agent, set_user_id=own_login)
    facade = Facade(catalog, clients, settings, lambda _ctx: agent, refusal)
    server = build_server(facade)
    probes.serve(settings.metrics_port, limits=HttpLimits.from_settings(settings))

    async def serve() -> None:
        async with facade.running(), stdio_streams(settings.max_intent_bytes + ENVELOPE_BYTES) as (read, write):
            await server.run(read, write, server.create_initialization_options())

    # uvloop when installed (not on Windows), as uvicorn picks it for --http
    anyio.run(serve, backend_options={"use_uvloop": importlib.util.find_spec("uvloop") is not None})
