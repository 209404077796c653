"""The fleet: the router, the connector pools and the commands that run and operate them.

Layers, lowest first; a module imports only from its own layer or lower ones
(``tests/unit/test_layers.py`` and ``test_floors.py`` check it; docs/architecture.md)::

    settings          every REACH_* variable, read in one place
    state/            everything kept in Redis: keys, ledger, breaker, rate limits, health, control
    transport/        the only code that knows Celery and kombu: app, consuming, publishing, topology
    observability/    metrics, audit trail, tracing, probes, redaction
    router/  pool/    the two roles, each reading top to bottom
    mcp/              the MCP facade: a third role, beside them (reach mcp)
    ops/              process wiring, status, dead letters, approvals, agent users, demo
    console/          the operator web page, over ops' functions
    cli/              the ``reach`` command: the top floor, which nothing else imports
"""
