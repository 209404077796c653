"""``reach workflows`` (the runner) and ``reach workflow list | show | resume | abort`` (runs).

Exit codes: 0 done; 1 the run is not there, or not in a state the action allows; 2 usage or
configuration (Redis unreachable, a bad variable)."""

from __future__ import annotations

import getpass
import json
import sys
from datetime import UTC, datetime
from typing import Any, NoReturn

import click

from workers.cli.common import EXIT_PROBLEMS, load_catalog, read_settings, setup_logging, unreachable
from workers.ops.table import print_table


@click.command("workflows")
def workflows() -> None:
    """Run the workflow runner: drive each workflow run's steps (reach.workflows)."""
    from workers.ops.workflow_runner import run_workflows

    settings = read_settings()
    setup_logging(settings.log_level)
    run_workflows(settings, load_catalog(settings.catalog_dir))


@click.group("workflow")
def workflow() -> None:
    """Workflow runs: list, show, resume or abort one (docs/contract.md "Workflows")."""


def _runs() -> Any:
    from workers.state.client import connect_redis
    from workers.state.workflow_runs import WorkflowRuns

    settings = read_settings()
    return settings, WorkflowRuns(connect_redis(settings), settings.workflow_retention_seconds)


def _problem(message: str) -> NoReturn:
    click.echo(message, err=True)
    sys.exit(EXIT_PROBLEMS)


def _when(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%d %H:%M:%S")


@workflow.command("list")
@click.option("--limit", type=click.IntRange(1, 10000), default=100, show_default=True, help="Runs shown.")
@click.option("--agent", default=None, help="Only this agent's runs.")
@click.option(
    "--state",
    type=click.Choice(["running", "compensating", "parked", "succeeded", "failed", "unknown"]),
    default=None,
    help="Only runs in this state.",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable: a list of runs.")
def workflow_list(limit: int, agent: str | None, state: str | None, as_json: bool) -> None:
    """The newest runs kept, newest first."""
    from redis import RedisError

    from workers.ops.fleet import Unreachable
    from workers.ops.workflow_commands import list_runs

    settings, runs = _runs()
    try:
        rows = list_runs(runs, limit, agent, state)
    except RedisError as exc:
        unreachable(settings, Unreachable("Redis", exc))
    if as_json:
        click.echo(json.dumps([r.to_dict() for r in rows], indent=2))
        return
    if not rows:
        click.echo("no workflow runs are kept")
        return
    print_table(
        ("run id", "agent", "workflow", "state", "started", "step"),
        [(r.run_id, r.owner, r.workflow, r.state, _when(r.started_at), r.step or "-") for r in rows],
    )


@workflow.command("show")
@click.argument("run_id")
@click.option("--agent", default=None, help="The agent whose run it is (another agent's run is not shown).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable.")
def workflow_show(run_id: str, agent: str | None, as_json: bool) -> None:
    """A run: its state, each step's intent id, status and code, and what operators did to it.
    `reach trace INTENT_ID` shows each step's own stages."""
    from redis import RedisError

    from workers.ops.fleet import Unreachable
    from workers.ops.workflow_commands import RunIsShared, RunNotFound, describe, find_run

    settings, runs = _runs()
    try:
        run = find_run(runs, run_id, agent)
    except (RunNotFound, RunIsShared) as exc:
        _problem(str(exc))
    except RedisError as exc:
        unreachable(settings, Unreachable("Redis", exc))
    if as_json:
        click.echo(json.dumps(describe(run), indent=2))
        return
    click.echo(f"run {run.run_id} of {run.owner}: workflow {run.workflow}, {run.state}")
    click.echo(f"started {_when(run.started_at)}, deadline {_when(run.deadline)}, trace {run.trace_id}")
    if run.error is not None:
        click.echo(f"error: {run.error.code}: {run.error.message}")
    print_table(
        ("step", "action", "intent id", "status", "code", "undo"),
        [
            (
                r.step,
                r.action,
                r.intent_id or "-",
                r.status,
                r.code or "-",
                "undone"
                if r.undone
                else (f"{r.undo.status} (try {r.undo.attempt}: {r.undo.intent_id})" if r.undo else "-"),
            )
            for r in run.steps
        ],
    )
    for event in run.events:
        click.echo(f"{_when(event.at)} {event.what}" + (f" (by {event.by})" if event.by else ""))
    if run.final is not None:
        error = run.final.get("error") or {}
        click.echo(f"final receipt: {run.final.get('status')}" + (f" {error.get('code')}" if error else ""))


def _act(action: str, run_id: str, agent: str | None, by: str | None) -> None:
    from redis import RedisError

    from workers.observability.audit import LoggedAudit
    from workers.ops.fleet import Unreachable
    from workers.ops.workflow_commands import RunIsShared, RunNotFound, abort_run, resume_run
    from workers.workflows.machine import NotAllowed

    settings, runs = _runs()
    who = by or getpass.getuser()
    try:
        run = (resume_run if action == "resume" else abort_run)(runs, run_id, who, agent)
    except (RunNotFound, RunIsShared, NotAllowed) as exc:
        _problem(str(exc))
    except RedisError as exc:
        unreachable(settings, Unreachable("Redis", exc))
    # into the run's own trace too (the console writes its own line there): a run's id is the id of
    # the intent that started it
    stage = {"agent": run.owner, "workflow": run.workflow, "by": who, "state": run.state}
    done = "resumed" if action == "resume" else "aborted"
    LoggedAudit(runs.client, "cli").events(run.run_id, [(f"run_{done}", stage)], agent=run.owner)
    click.echo(f"run {run.run_id} of {run.owner}: {run.state} ({done} by {who}; no second final receipt is sent)")


@workflow.command("resume")
@click.argument("run_id")
@click.option("--agent", default=None, help="The agent whose run it is, when several have one of this id.")
@click.option("--as", "by", default=None, help="Who resumes it (recorded on the run; default: your login).")
def workflow_resume(run_id: str, agent: str | None, by: str | None) -> None:
    """Undo a parked or halted run's completed steps again (the runner sends the undos)."""
    _act("resume", run_id, agent, by)


@workflow.command("abort")
@click.argument("run_id")
@click.option("--agent", default=None, help="The agent whose run it is, when several have one of this id.")
@click.option("--as", "by", default=None, help="Who aborts it (recorded on the run; default: your login).")
def workflow_abort(run_id: str, agent: str | None, by: str | None) -> None:
    """Give up on a parked or halted run: it is failed and nothing more is undone."""
    _act("abort", run_id, agent, by)
