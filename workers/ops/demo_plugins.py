"""The installed connector plugins' scenes in ``reach demo``.

A usable plugin whose manifest names a ``demo`` hook (``module:attribute``) takes part: the hook
starts the plugin's system and returns a :class:`~connectors.adapters.plugin.DemoScene`, whose
catalog documents join the demo's catalog (a copy in the demo's log directory), whose connector gets
a pool like the others and whose intents join the demo's table. A hook that fails, or whose
documents do not fit the demo's catalog, is reported in one line and left out; the demo goes on.
Without such a plugin the demo runs on its own catalog, as if this module did not exist.
"""

from __future__ import annotations

import importlib
import shutil
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from connectors.adapters.plugin import DemoScene
from connectors.adapters.registry import Plugin
from connectors.catalog import Catalog, build
from connectors.loader import Problem, load_directory
from producers.client import ReachClient, ReceiptTimeout
from producers.wire import Receipt

# each scene's intents: (agent, what, receipt, expected status or code), as the demo's table rows
Row = tuple[str, str, Receipt | None, str]


@dataclass(frozen=True)
class Scene:
    """One plugin's scene, its system running."""

    plugin: Plugin
    scene: DemoScene

    @property
    def name(self) -> str:
        return f"plugin {self.plugin.type} ({self.plugin.package})"


def start_scenes(plugins: Iterable[Plugin], base: Path, out: Path) -> tuple[list[Scene], Path]:
    """Call the demo hook of each usable plugin that declares one, keep the scenes whose documents
    build with the demo's catalog, and return them with the catalog directory to run on: ``out``
    (the demo's files and one file per scene) when a scene was kept, else ``base``."""
    candidates = [p for p in plugins if p.status == "ok" and p.manifest is not None and p.manifest.demo]
    if not candidates:
        return [], base
    out.mkdir(parents=True, exist_ok=True)
    for path in sorted(base.iterdir()):
        if path.is_file():
            shutil.copy(path, out / path.name)
    kept: list[Scene] = []
    for plugin in candidates:
        scene = _start(plugin)
        if scene is None:
            continue
        problem = _fits(scene, out)
        if problem:
            _left_out(scene.name, problem)
            close(scene)
            continue
        kept.append(scene)
    return kept, out if kept else base


def _start(plugin: Plugin) -> Scene | None:
    assert plugin.manifest is not None and plugin.manifest.demo is not None
    name = f"plugin {plugin.type} ({plugin.package})"
    module, _, attr = plugin.manifest.demo.partition(":")
    try:
        made = getattr(importlib.import_module(module), attr)()
    except Exception as exc:  # a plugin's hook may fail in any way; the demo goes on without it
        _left_out(name, f"its demo hook {plugin.manifest.demo} failed: {type(exc).__name__}: {_first_line(exc)}")
        return None
    if not isinstance(made, DemoScene):
        _left_out(name, f"its demo hook {plugin.manifest.demo} returned {type(made).__name__}, not a DemoScene")
        return None
    return Scene(plugin, made)


def _fits(scene: Scene, out: Path) -> str | None:
    """Write the scene's documents into ``out``; None when the catalog still builds and holds what
    the scene names, else why not (and the file is removed again)."""
    path = out / f"plugin-{scene.plugin.type}.yaml"
    path.write_text(scene.scene.catalog, encoding="utf-8")
    why = _why_not(scene, *build(load_directory(out)))
    if why:
        path.unlink()
    return why


def _why_not(scene: Scene, catalog: Catalog, problems: list[Problem]) -> str | None:
    if problems:
        return f"its catalog does not fit the demo's: {problems[0]}"
    connector = catalog.connectors.get(scene.scene.connector)
    if connector is None or connector.type != scene.plugin.type:
        return f"its catalog declares no connector {scene.scene.connector!r} of type {scene.plugin.type}"
    unknown = sorted({i.agent for i in scene.scene.intents} - set(catalog.agents))
    if unknown:
        return f"its intents name agents its catalog does not declare: {', '.join(unknown)}"
    return None


def send(scene: Scene, broker_url: str) -> tuple[list[Row], bool]:
    """Send the scene's intents, each as its agent; the table's rows, and True when every receipt
    is what the scene expects (status or code, and the ``data`` keys it names)."""
    rows: list[Row] = []
    ok = True
    clients: dict[str, ReachClient] = {}
    try:
        for intent in scene.scene.intents:
            if intent.agent not in clients:
                clients[intent.agent] = ReachClient(intent.agent, broker_url)
            client = clients[intent.agent]
            try:  # a pool that has just started may still be connecting: a generous wait
                receipt: Receipt | None = client.call(intent.action, intent.params, timeout=60)
            except ReceiptTimeout:
                receipt = None
            what = f"{intent.action} " + " ".join(f"{k}={v}" for k, v in intent.params.items())
            rows.append((intent.agent, what[:60], receipt, intent.expect))
            data = (receipt.data or {}) if receipt is not None else {}
            ok = ok and all(data.get(k) == v for k, v in (intent.data or {}).items())
    finally:
        for client in clients.values():
            client.close()
    return rows, ok


def close(scene: Scene) -> None:
    try:
        scene.scene.close()
    except Exception as exc:  # stopping a plugin's system must not hide the demo's outcome
        print(f"{scene.name}: its demo system did not stop cleanly: {type(exc).__name__}: {exc}", file=sys.stderr)


def _left_out(name: str, why: str) -> None:
    print(f"{name} is left out of the demo: {why}", file=sys.stderr)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else "no message"
