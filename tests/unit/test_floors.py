"""The house's floors (docs/architecture.md): the ``reach`` command on top, which nothing else
imports; rooms (subpackages) whose imports never go round in a circle; no module too long to read.

``test_layers.py`` checks the order of the floors inside workers; this checks the house as a whole.
"""

from __future__ import annotations

import ast
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


def test_no_product_module_is_too_long_to_read() -> None:
    long = sorted(
        f"{path.relative_to(REPO)}: {n} lines"
        for name, path in modules().items()
        if name.split(".")[0] in PACKAGES and (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    )
    assert not long, f"split these by idea (at most {MAX_MODULE_LINES} lines a module):\n" + "\n".join(long)
