"""The ``reach`` command: the top floor, a thin shell over the library. Nothing in the product
imports it; it imports whatever it starts (``tests/unit/test_floors.py`` checks both).

One module per family of commands::

    common.py       exit codes, settings, the catalog: what every command shares
    catalog.py      validate, catalog, route (rank, warm), import openapi
    broker.py       setup
    processes.py    router, worker, beat, mcp, console (hash-password), demo
    steering.py     pause, resume, status, trace
    dlq.py          dlq list, dlq replay
    approvals.py    approvals list, show, approve, deny
    send.py         send
    users.py        agent-user create, delete, sweep-bindings; mcp-user create, delete
    workflows.py    workflows (the runner); workflow list, show, resume, abort
    history.py      history (show), history purge, history migrate
    plugins.py      plugins list, plugins check

Exit codes: 0 success; 1 the thing checked is not right (catalog problems, a receipt that did
not succeed, no receipt in time); 2 usage or configuration errors (unknown connector, missing
secret, unreadable catalog, broker unreachable).
"""

from __future__ import annotations

import click

from workers.cli import (
    approvals,
    broker,
    catalog,
    dlq,
    history,
    plugins,
    processes,
    send,
    steering,
    users,
    workflows,
)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """agent-reach: a governed path from AI agents' intents to business systems."""


for command in (
    catalog.validate,
    catalog.catalog_cmd,
    catalog.route_cmd,
    broker.setup,
    processes.router,
    processes.worker,
    processes.beat,
    steering.pause,
    steering.resume,
    steering.status,
    steering.trace,
    dlq.dlq,
    catalog.import_group,
    send.send,
    processes.demo,
    processes.mcp_cmd,
    processes.console_cmd,
    approvals.approvals,
    users.mcp_user,
    users.agent_user,
    workflows.workflows,
    workflows.workflow,
    plugins.plugins,
    history.history,
):
    main.add_command(command)

__all__ = ["main"]
