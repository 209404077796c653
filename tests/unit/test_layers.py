"""Dependencies point one way: producers <- connectors <- workers, and inside workers lower layers
never import higher ones (the order is in workers/__init__.py). Function-level imports count too."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("producers", "connectors", "workers")
# rank of each layer; the roles router, pool and mcp share a rank and may not import each other
WORKER_LAYERS = {
    "settings": 0,
    "ids": 0,
    "state": 1,
    "transport": 2,
    "observability": 3,
    "router": 4,
    "pool": 4,
    "ops": 5,
}
WORKER_LAYERS["mcp"] = 4  # the MCP facade: a role beside router and pool
WORKER_LAYERS["workflows"] = 4  # the workflow runner: a role beside them
WORKER_LAYERS["console"] = 5  # the operator web page: over ops' functions
WORKER_LAYERS["cli"] = 6  # the `reach` command: the top floor, over everything it starts


@functools.cache  # read-only: every check walks the same tree
def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            parts = path.relative_to(REPO).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports_of(path: Path, name: str) -> set[str]:
    """Every project module ``path`` imports (``from a.b import c`` counts as a.b.c when that is a module)."""
    known = modules()
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out.update(f"{node.module}.{alias.name}" for alias in node.names if f"{node.module}.{alias.name}" in known)
    return {m for m in out if m.split(".")[0] in PACKAGES and m in known and m != name}


def layer(module: str) -> tuple[int, str]:
    parts = module.split(".")
    if parts[0] != "workers":
        return -1, parts[0]
    if len(parts) == 1:
        return 0, "workers"
    return WORKER_LAYERS[parts[1]], parts[1]


def test_every_workers_module_is_in_a_known_layer() -> None:
    for name in modules():
        if name.startswith("workers."):
            assert name.split(".")[1] in WORKER_LAYERS, f"{name}: put it in one of {sorted(WORKER_LAYERS)}"


@pytest.mark.parametrize("package, forbidden", [("producers", ("connectors", "workers")), ("connectors", ("workers",))])
def test_lower_packages_do_not_import_higher_ones(package: str, forbidden: tuple[str, ...]) -> None:
    for name, path in modules().items():
        if name.split(".")[0] == package:
            bad = sorted(m for m in imports_of(path, name) if m.split(".")[0] in forbidden)
            assert not bad, f"{name} imports {bad}"


def test_no_workers_module_imports_a_higher_layer_or_the_other_role() -> None:
    problems = []
    for name, path in modules().items():
        if not name.startswith("workers"):
            continue
        rank, room = layer(name)
        for imported in imports_of(path, name):
            other_rank, other_room = layer(imported)
            if other_rank > rank or (other_rank == rank and other_room != room and rank == 4):
                problems.append(f"{name} ({room}) imports {imported} ({other_room})")
    assert not problems, "\n".join(sorted(problems))


def test_no_import_cycles() -> None:
    graph = {name: imports_of(path, name) for name, path in modules().items()}
    # a package's __init__ re-exporting its modules is not a cycle through them
    for name in graph:
        graph[name] = {m for m in graph[name] if not m.startswith(name + ".")}
    state: dict[str, int] = {}
    cycle: list[str] = []

    def visit(node: str, trail: list[str]) -> bool:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycle.extend(trail[trail.index(nxt) :] + [node, nxt] if nxt in trail else [node, nxt])
                return True
            if state.get(nxt) is None and visit(nxt, trail + [node]):
                return True
        state[node] = 2
        return False

    for start in sorted(graph):
        if state.get(start) is None and visit(start, []):
            break
    assert not cycle, " -> ".join(cycle)


def test_the_roles_and_state_never_touch_celery_or_kombu() -> None:
    """Transport is the only room that knows the AMQP libraries (ops wires processes and may use them)."""
    problems = []
    for name, path in modules().items():
        if name.split(".")[:2] in (["workers", "router"], ["workers", "pool"], ["workers", "state"]):
            for node in ast.walk(ast.parse(path.read_text())):
                found = [a.name for a in node.names] if isinstance(node, ast.Import) else []
                if isinstance(node, ast.ImportFrom) and node.module:
                    found = [node.module]
                problems += [f"{name} imports {m}" for m in found if m.split(".")[0] in ("celery", "kombu", "amqp")]
    assert not problems, "\n".join(problems)
