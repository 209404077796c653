"""The catalog from the shell: ``reach validate``, ``reach catalog`` (what an agent can do),
``reach route`` (how the router would rank connectors for a request) and ``reach import openapi``
(connectors written from a system's own description)."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Mapping
from pathlib import Path

import click

from connectors.catalog import Catalog, build
from connectors.loader import LoadResult, Problem, load_directory
from connectors.spec import ConnectorSpec, FieldSpec
from workers.cli.common import EXIT_PROBLEMS, check_agent, fail, load_catalog, read_settings
from workers.ops.table import print_table
from workers.state.client import connect_redis


@click.command()
@click.argument("directory", required=False)
def validate(directory: str | None) -> None:
    """Check a catalog (default: $REACH_CATALOG) and report every problem with file and line."""
    target = directory or read_settings().catalog_dir
    loaded = load_directory(target)
    catalog, problems = build(loaded)
    for warning in sorted(loaded.warnings):
        click.echo(f"{warning} (warning)")
    for problem in sorted(problems):
        click.echo(str(problem))
    problems.extend(_system_problems(catalog, loaded))
    if problems:
        click.echo(f"{len(problems)} problem(s) in {target}", err=True)
        sys.exit(EXIT_PROBLEMS)
    actions = sum(len(c.actions) for c in catalog.connectors.values())
    flows = f", {len(catalog.workflows)} workflow(s)" if catalog.workflows else ""
    click.echo(
        f"ok: {len(catalog.connectors)} connector(s), {actions} action(s), {len(catalog.agents)} agent app(s)"
        f"{flows} in {target}"
    )


def _system_problems(catalog: Catalog, loaded: LoadResult) -> list[Problem]:
    """Check connectors against their systems' own descriptions (a SOAP connector's WSDL), and
    print what does not match."""
    from connectors.adapters.factory import plugin_problems, system_problems

    found = []
    for doc in loaded.connectors:
        connector = doc.model
        if not isinstance(connector, ConnectorSpec) or connector.name not in catalog.connectors:
            continue
        # the type's plugin and the connector's config against its models, at the key's line
        typed = plugin_problems(connector)
        for loc, message in typed:
            problem = Problem(
                doc.file, loaded.line_of(doc, "connector", *loc), f"connector {connector.name}: {message}"
            )
            click.echo(str(problem))
            found.append(problem)
        if typed:
            continue
        for message in system_problems(connector):
            problem = Problem(doc.file, doc.line, f"connector {connector.name}: {message}")
            click.echo(str(problem))
            found.append(problem)
    return found


@click.command("catalog")
@click.option("--agent", "agent", help="Only the actions this agent app may use.")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["table", "json", "openai", "openai-responses", "anthropic", "mcp"]),
    default="table",
    show_default=True,
)
@click.option("--dir", "directory", help="Catalog directory (default: $REACH_CATALOG).")
def catalog_cmd(agent: str | None, fmt: str, directory: str | None) -> None:
    """Show what an agent can do (its actions, then its workflows), as a table or as tool schemas."""
    from producers.tools import export

    catalog = load_catalog(directory or read_settings().catalog_dir)
    if agent is not None:
        check_agent(catalog, agent)
    tools = catalog.tools_for(agent) if agent else catalog.all_tools()
    if fmt != "table":
        click.echo(json.dumps(export(tools, fmt), indent=2, ensure_ascii=False))
        return
    refs = [r for r in catalog.refs.values() if agent is None or catalog.allows(agent, r)]
    rows: list[tuple[str, ...]] = [
        (r.qualified, r.action.permission, r.action.target, _params(r.action.input), r.action.description or "")
        for r in refs
    ]
    # then the workflows, called by their own names; "call" lists the actions their steps run
    names = [t.name for t in tools]
    rows += [
        (w.name, "workflow", " > ".join(s.action for s in w.steps), _params(w.input), w.description or "")
        for w in catalog.workflows.values()
        if w.name in names
    ]
    print_table(("action", "permission", "call", "params (* required)", "description"), rows)


def _params(fields: Mapping[str, FieldSpec]) -> str:
    return ", ".join(f"{n}{'*' if f.required else ''}" for n, f in fields.items())


class _RouteGroup(click.Group):
    """``reach route TEXT ...`` ranks (the command ``rank``, which may be left out); ``reach route
    warm`` saves vectors."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ctx.help_option_names:
            args = ["rank", *args]
        return super().parse_args(ctx, args)


@click.group("route", cls=_RouteGroup)
def route_cmd() -> None:
    """How the router chooses between connectors offering a bare action.

    \b
    reach route TEXT --action A --agent G [--domain D] [--json]   rank, as the router would
    reach route warm [--dir DIR] [--file PATH]                    save the catalog's vectors
    """


@route_cmd.command("rank")
@click.argument("text")
@click.option("--action", "action", required=True, help="The bare action the agent would send, e.g. create_ticket.")
@click.option("--agent", "agent", required=True, help="The agent app whose connectors are ranked.")
@click.option("--domain", help="The intent's context.domain, if it would carry one.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output: the routing note.")
@click.option("--dir", "directory", help="Catalog directory (default: $REACH_CATALOG).")
def rank_cmd(text: str, action: str, agent: str, domain: str | None, as_json: bool, directory: str | None) -> None:
    """Rank the connectors offering ACTION for a request TEXT, as the router would for the intent
    {"action": ACTION, "context": {"description": TEXT}} of AGENT, and say what it would do.

    Embeddings come from the router's cache in Redis ($REACH_REDIS_URL) when it answers; the
    candidates' texts are embedded here otherwise. The rule checks that need an intent's params
    or the time of day are not applied. Exit codes: 0 the ranking was printed, 2 unknown agent or
    action.
    """
    from connectors.catalog import Candidates, Refusal
    from workers.router.semantic import SemanticRouting
    from workers.state.embeddings import RedisVectorCache

    settings = read_settings()
    logging.basicConfig(level="ERROR")  # the cache's warning when Redis is away is enough
    catalog = load_catalog(directory or settings.catalog_dir)
    check_agent(catalog, agent)
    found = catalog.resolve_candidates(action, agent)
    if isinstance(found, Refusal):
        fail(f"{found.code.value}: {found.message}")
    if not isinstance(found, Candidates):
        click.echo(f"{found.qualified}: the only connector of {agent} offering {action!r}; no ranking needed")
        return
    routing = SemanticRouting(catalog, RedisVectorCache(connect_redis(settings)), embed_all=False)
    choice = routing.choose(found, agent, text, domain, runnable=lambda ref: None)
    if as_json:
        click.echo(json.dumps({"dispatch": choice.ref.qualified if choice.ref else None, **choice.note}, indent=2))
        return
    descriptions = {r.qualified: r.connector.description or r.action.description or "" for r in found.refs}
    rows = [
        (
            str(i + 1),
            c["action"],
            *(f"{c[k]:.4f}" if k in c else "-" for k in ("score", "semantic", "lexical", "rules")),
            descriptions.get(c["action"], "")[:60],
        )
        for i, c in enumerate(choice.note["candidates"])
    ]
    print_table(("#", "action", "score", "semantic", "lexical", "rules", "connector"), rows)
    how = f"{choice.note['method']}, model {choice.note.get('model', '-')}"
    lead, margin = choice.note.get("lead"), catalog.routing.margin
    if choice.ref is not None:
        click.echo(f"dispatch to {choice.ref.qualified} ({how}; tier dispatch, lead {lead} >= margin {margin})")
    elif choice.tier == "confirm":
        first, second = (c["action"] for c in choice.note["candidates"][:2])
        click.echo(
            f"AMBIGUOUS_ACTION, tier confirm ({how}; confirm_margin {catalog.routing.confirm_margin} <= lead {lead} "
            f"< margin {margin}): the agent would ask its user whether {first} is meant, else {second}"
        )
    else:
        click.echo(
            f"AMBIGUOUS_ACTION, tier open ({how}; lead {lead} < confirm_margin {catalog.routing.confirm_margin}): "
            "the agent would be asked to let its user choose"
        )


@route_cmd.command("warm")
@click.option("--dir", "directory", help="Catalog directory (default: $REACH_CATALOG).")
@click.option("--file", "file", help="Where to save (default: $REACH_ROUTING_VECTORS, else beside the catalog).")
def warm_cmd(directory: str | None, file: str | None) -> None:
    """Embed every text of the catalog semantic routing reads (action texts, examples, workflows)
    by its routing model and save the vectors to a file beside the catalog, and in Redis when it
    answers, so routers start without embedding anything. Vectors already in the file or in Redis
    are reused: a changed text is the only one embedded again. Run it ahead of a deploy.

    Exit codes: 0 saved (or nothing to save: model none), 2 no file to save to (REACH_ROUTING_VECTORS=none)
    or the model's package is missing.
    """
    import time

    from connectors.routing import ActionIndex, ModelUnavailable, load_embedder
    from connectors.routing.embedders import cache_models
    from connectors.routing.saved import Layered, Recording, SavedVectors, save
    from workers.state.embeddings import RedisVectorCache

    settings = read_settings()
    logging.basicConfig(level="ERROR")
    target = directory or settings.catalog_dir
    catalog = load_catalog(target)
    path = Path(file) if file else settings.routing_vectors_path(target)
    if path is None:
        fail("REACH_ROUTING_VECTORS is none: give --file to save somewhere")
    model = catalog.routing.model
    if model == "none":
        click.echo("routing model none: no vectors to save")
        return
    started = time.monotonic()
    try:
        embedder = load_embedder(model)
    except ModelUnavailable as exc:
        fail(str(exc))
    shared = RedisVectorCache(connect_redis(settings))
    saved = SavedVectors.load(path)
    recording = Recording(Layered(saved, shared))
    index = ActionIndex(catalog, embedder, recording)
    index.prepare()
    written = save(path, recording.seen, dict(cache_models(model)))
    shared.put_many(recording.seen)  # replicas without the file find them in Redis
    click.echo(
        f"saved {written} vector(s) of {model} for {index.size} text(s) to {path}: {index.embedded} embedded here, "
        f"{index.from_cache} found in the file or Redis ({saved.hits} vector(s) from the file), {index.rejected} "
        f"stored vector(s) refused, in {time.monotonic() - started:.1f} s"
    )


@click.group("import")
def import_group() -> None:
    """Write catalog connectors from a system's own description."""


@import_group.command("openapi")
@click.argument("spec", type=click.Path(dir_okay=False, allow_dash=True))
@click.option("--connector", "connector", required=True, help="The connector's name (lowercase letters, digits, _).")
@click.option(
    "--endpoint", help="The system's base URL; overrides the document's servers (needed when they are relative)."
)
@click.option("--include", multiple=True, metavar="TAG|/GLOB", help="Import only these tags or paths. Repeatable.")
@click.option("--exclude", multiple=True, metavar="TAG|/GLOB", help="Leave out these tags or paths. Repeatable.")
@click.option(
    "--max",
    "max_operations",
    type=click.IntRange(min=1),
    default=200,  # connectors.openapi.DEFAULT_MAX_OPERATIONS, without importing the importer for every command
    show_default=True,
    help="Refuse to import more operations than this (choose some with --include).",
)
@click.option(
    "--validate-all",
    is_flag=True,
    help="Validate every operation of the document, not only those imported and what they refer to.",
)
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Write the catalog here instead of to stdout.")
def import_openapi_cmd(
    spec: str,
    connector: str,
    endpoint: str | None,
    include: tuple[str, ...],
    exclude: tuple[str, ...],
    max_operations: int,
    validate_all: bool,
    output: str | None,
) -> None:
    """Write a connector for the OpenAPI document SPEC (Swagger 2.0, OpenAPI 3.0 or 3.1; JSON or
    YAML; - for stdin): one action per operation, to edit and then check with `reach validate`.

    Exit codes: 1 the document is not valid OpenAPI or nothing in it can be imported; 2 it cannot
    be read, or the options do not fit it (too many operations, a relative server URL).
    """
    from connectors.openapi import MAX_DOCUMENT_BYTES, ImportOptions, OpenAPIError, OptionsError, import_openapi

    try:
        with click.open_file(spec, "rb") as handle:
            data = handle.read(MAX_DOCUMENT_BYTES + 1)
    except OSError as exc:
        fail(f"cannot read {spec}: {exc.strerror or exc}")
    options = ImportOptions(
        connector=connector,
        endpoint=endpoint,
        include=include,
        exclude=exclude,
        max_operations=max_operations,
        source=Path(spec).name if spec != "-" else "",
        whole_document=validate_all,
    )
    try:
        result = import_openapi(data, options)
    except OptionsError as exc:  # too many operations, a relative server URL, a bad connector name
        fail(f"not imported: {exc}")
    except OpenAPIError as exc:
        click.echo(f"cannot import {spec}: {exc}", err=True)
        sys.exit(EXIT_PROBLEMS)
    if output:
        target = Path(output)
        partial = target.with_name(f".{target.name}.partial")  # hidden: a catalog directory skips it
        try:
            partial.write_text(result.text, encoding="utf-8")
            partial.replace(target)  # never a half-written catalog
        except OSError as exc:
            fail(f"cannot write {output}: {exc.strerror or exc}")
    else:
        click.echo(result.text, nl=False)
    skipped = f"; {len(result.skipped)} not imported (listed at the top of the file)" if result.skipped else ""
    click.echo(f"{result.actions} action(s) from {result.chosen} operation(s){skipped}", err=True)
    if result.env:
        click.echo(f"credentials are read from: {', '.join(result.env)}", err=True)
    click.echo(
        "next: add what the actions mean to their descriptions, bind them to an agent_app, and run `reach validate`",
        err=True,
    )
