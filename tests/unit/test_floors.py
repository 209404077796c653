"""The house's floors (docs/architecture.md): the ``reach`` command on top, which nothing else
imports; rooms (subpackages), packages at any depth and modules whose imports never go round in a
circle (the static import graph, function-level imports too); no module too long to read.

``test_layers.py`` checks the order of the floors inside workers; this checks the house as a whole.
"""

from __future__ import annotations

import ast
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path

from tests.unit.test_layers import PACKAGES, REPO, imports_of, modules

TOP_FLOOR = "workers.cli"
MAX_MODULE_LINES = 500
# tests and benchmarks drive the command as a user does, through its entry point
ENTRY_POINT = "main"


def room(module: str) -> str:
    """The subpackage a module lives in: its first two dotted parts (``workers.ops``, ``connectors.adapters``)."""
    return ".".join(module.split(".")[:2])


def _imported(path: Path) -> Iterator[tuple[str, tuple[str, ...]]]:
    """Each module ``path`` imports, with the names it takes from it (function-level imports too)."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from ((alias.name, ()) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module, tuple(alias.name for alias in node.names)


def _on_top_floor(module: str) -> bool:
    return module == TOP_FLOOR or module.startswith(TOP_FLOOR + ".")


def test_nothing_in_the_product_imports_the_command_line() -> None:
    problems = [
        f"{name} imports {imported}"
        for name, path in modules().items()
        if not _on_top_floor(name)
        for imported in sorted(imports_of(path, name))
        if _on_top_floor(imported)
    ]
    assert not problems, "the reach command is the top floor: nothing below may import it\n" + "\n".join(problems)


def test_tests_and_benchmarks_use_the_command_only_through_its_entry_point() -> None:
    problems = []
    for folder in ("tests", "bench"):
        for path in sorted((REPO / folder).rglob("*.py")):
            for module, names in _imported(path):
                if _on_top_floor(module) and (module != TOP_FLOOR or set(names) - {ENTRY_POINT}):
                    problems.append(f"{path.relative_to(REPO)} imports {module} {list(names)}")
    assert not problems, f"import {TOP_FLOOR}.{ENTRY_POINT} and run commands through it:\n" + "\n".join(problems)


def test_the_reach_script_is_the_top_floor() -> None:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert pyproject["project"]["scripts"]["reach"] == f"{TOP_FLOOR}:{ENTRY_POINT}"
    assert (REPO / "workers" / "cli" / "__main__.py").is_file(), "python -m workers.cli must be the same command"


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of more than one node, each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def test_strongly_connected_finds_cycles_and_only_them() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"f"}, "f": {"e"}}
    assert strongly_connected(graph) == [["a", "b", "c"], ["e", "f"]]
    assert strongly_connected({"a": {"b"}, "b": set()}) == []


def room_graph() -> dict[str, set[str]]:
    """Which room imports which; a package's ``__init__`` re-exporting its own modules is no edge."""
    graph: dict[str, set[str]] = {}
    for name, path in modules().items():
        targets = {room(m) for m in imports_of(path, name) if not m.startswith(name + ".")}
        graph.setdefault(room(name), set()).update(targets - {room(name)})
    return graph


def test_no_two_rooms_import_each_other_even_round_about() -> None:
    cycles = strongly_connected(room_graph())
    assert not cycles, "rooms that import each other (split what they share into a lower room):\n" + "\n".join(
        " <-> ".join(c) for c in cycles
    )


# Package cycles known and kept, each with why it is not fixed yet. Each is a package and its own
# subpackages: the subpackages use what sits flat in the parent, and other flat modules of the
# parent use the subpackages; no module imports itself back round about (the test below).
KNOWN_PACKAGE_CYCLES = {
    ("connectors", "connectors.spec", "connectors.workflows"): "the spec models parse values with the "
    "flat connectors.durations, .rates, .patterns and .conditions, and the flat connectors.catalog, "
    ".loader, .schema, .hours and .approval_policy read the spec models; the fix is those value "
    "parsers in a subpackage of their own, under spec",
    ("connectors.adapters", "connectors.adapters.auth"): "the auth subpackage uses the adapters' "
    "shared base, errors and common, and the flat http adapter and scrub use auth; the fix is the shared "
    "parts in a subpackage of their own (soap and sql left this cycle in issue 34: the factory reaches "
    "them through the registry's entry points, no longer by import)",
}


def package_of(module: str) -> str:
    """The package a module belongs to: a package's ``__init__`` is the package itself."""
    return module if modules()[module].name == "__init__.py" else module.rpartition(".")[0]


def module_graph() -> dict[str, set[str]]:
    """Which module imports which, anywhere in the three roles; a package's ``__init__`` re-exporting
    its own modules is no edge."""
    graph: dict[str, set[str]] = {}
    for name, path in modules().items():
        own = name + "." if path.name == "__init__.py" else None
        graph[name] = {m for m in imports_of(path, name) if own is None or not m.startswith(own)}
    return graph


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Which package imports which, at any depth (``connectors.adapters`` and ``connectors.adapters.sql``
    are two), from the module graph."""
    packages: dict[str, set[str]] = {}
    for name, targets in graph.items():
        package = package_of(name)
        packages.setdefault(package, set()).update({package_of(m) for m in targets} - {package})
    return packages


def test_package_of_a_module_and_of_a_package() -> None:
    assert package_of("connectors.adapters.sql.postgres") == "connectors.adapters.sql"
    assert package_of("connectors.adapters.sql") == "connectors.adapters.sql"
    assert package_of("workers.settings") == "workers"


def test_no_two_modules_import_each_other_even_round_about() -> None:
    cycles = strongly_connected(module_graph())
    assert not cycles, "modules that import each other (move what they share into a third one):\n" + "\n".join(
        " <-> ".join(c) for c in cycles
    )


def test_no_two_packages_import_each_other_even_round_about_but_the_known_ones() -> None:
    cycles = {tuple(c) for c in strongly_connected(package_graph(module_graph()))}
    new = sorted(cycles - KNOWN_PACKAGE_CYCLES.keys())
    assert not new, "packages that import each other (what they share goes into a package below both):\n" + (
        "\n".join(" <-> ".join(c) for c in new)
    )
    fixed = sorted(KNOWN_PACKAGE_CYCLES.keys() - cycles)
    assert not fixed, "no longer cycles as listed: update KNOWN_PACKAGE_CYCLES\n" + "\n".join(
        " <-> ".join(c) for c in fixed
    )


BROKER_LIBRARIES = ("celery", "kombu", "amqp", "aiormq")
# outside workers.transport, the modules that may import a broker library, as docs/architecture.md lists them
BROKER_LIBRARY_USERS = {
    "workers.observability.probes": "Celery bootsteps: the health probes hook into the worker",
    "workers.ops.startup": "Celery's start and shutdown signals",
    "workers.ops.workflow_runner": "Celery's signals; the runner's handler takes kombu's message",
    "workers.ops.fleet": "a kombu connection to publish a replayed dead letter",
    "workers.ops.approval_decisions": "a kombu connection to publish a decision",
    "workers.ops.local_fleet": "waits for the broker before starting processes",
    "workers.ops.demo": "checks the broker before the demo starts",
    "workers.cli.broker": "reach setup checks the broker",
    "workers.ops.demo_assets.warehouse": "the demo's system that answers over AMQP",
    "workers.mcp.clients": "aiormq: the facade's own asynchronous connection",
    "producers.client.publishing": "the agent SDK speaks AMQP",
    "producers.client.receiving": "the agent SDK speaks AMQP",
    "producers.client.session": "the agent SDK speaks AMQP",
    "producers.serve.server": "an agent that answers a connector speaks AMQP",
    "connectors.adapters.amqp": "calls a system over AMQP",
    "connectors.adapters.amqp_rpc": "calls a system over AMQP",
    "connectors.adapters.builtin.amqp_fixture": "the conformance kit's fake system behind a broker",
    "connectors.adapters.agent": "calls an agent over AMQP",
}


def test_broker_libraries_only_in_transport_and_the_modules_listed() -> None:
    users = {
        name
        for name, path in modules().items()
        if not name.startswith("workers.transport")
        and any(module.split(".")[0] in BROKER_LIBRARIES for module, _ in _imported(path))
    }
    assert users <= BROKER_LIBRARY_USERS.keys(), (
        "these import Celery, kombu, py-amqp or aiormq outside workers.transport: go through transport, or "
        "list them here and in docs/architecture.md with why\n" + "\n".join(sorted(users - BROKER_LIBRARY_USERS.keys()))
    )
    assert not BROKER_LIBRARY_USERS.keys() - users, "no longer import a broker library: take them off the list"


def test_the_architecture_page_lists_every_command_in_its_module_row() -> None:
    import click

    from workers.cli import main

    rows = dict(re.findall(r"^\| `(\w+)\.py` \| (.*) \|$", (REPO / "docs" / "architecture.md").read_text(), re.M))
    missing = []
    for name, command in sorted(main.commands.items()):
        module = (command.callback.__module__ if command.callback else "").rpartition(".")[2]
        spans = re.findall(r"`([^`]+)`", rows.get(module, ""))
        if not any(span.split()[0] == name for span in spans):
            missing.append(f"{name} (in the row of {module}.py)")
        if isinstance(command, click.Group):
            words = {word for span in spans for word in span.split()}
            missing += [
                f"{name} {sub} (in the row of {module}.py)" for sub in sorted(command.commands) if sub not in words
            ]
    assert not missing, "docs/architecture.md's command table lacks:\n" + "\n".join(missing)


def test_no_product_module_is_too_long_to_read() -> None:
    long = sorted(
        f"{path.relative_to(REPO)}: {n} lines"
        for name, path in modules().items()
        if name.split(".")[0] in PACKAGES and (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    )
    assert not long, f"split these by idea (at most {MAX_MODULE_LINES} lines a module):\n" + "\n".join(long)
