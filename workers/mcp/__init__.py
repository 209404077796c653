"""The MCP facade: ``reach mcp`` serves each agent its own catalog actions and workflows as Model
Context Protocol tools.

A ``tools/call`` becomes an intent on ``reach.intents``, published as that agent, and its receipt
becomes the tool result, so the router's guardrails and the pools' guarantees hold for MCP clients
exactly as for any other agent. The facade decides nothing itself (docs/operations.md "The MCP
facade", docs/contract.md §7)::

    tools.py        the catalog as MCP tools: the agent's own actions and workflows, hints, output schemas
    results.py      a receipt (or a call that got none) as an MCP tool result
    tokens.py       who is calling over HTTP: JWTs and static per-agent bearer tokens
    clients.py      the facade's asyncio broker link: every agent's intents out, their receipts in
    metrics.py      the facade's Prometheus metrics
    server.py       the MCP server (the SDK's lowlevel Server): its handlers, and the stdio transport
    stdio.py        stdin and stdout served by the event loop rather than by worker threads
    http.py         the same over stateless Streamable HTTP, behind bearer tokens
    exchange.py     a plain tools/call or tools/list over HTTP, answered in the request's own task
    broker_user.py  the facade's own RabbitMQ user, which may publish as any agent (impersonator)

Only ``reach mcp`` imports the MCP SDK; ``reach mcp-user`` needs nothing of it.
"""
