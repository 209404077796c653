"""The installed connector types: every entry point of the group ``agent_reach.adapters``,
checked once per process. The built-in types (http, soap, sql, amqp, agent) are entry points of
agent-reach's own package, registered exactly as a third party's are.

A plugin that cannot be imported, has no valid manifest, implements another contract version,
names a type other than its entry point's, or claims a type another package claims too is
refused: one line naming the package says why (logged once, shown by ``reach plugins list``),
and the connectors of its type are answered CONNECTOR_UNAVAILABLE while every other one is
served. When two packages claim one type, the built-in keeps it; two third parties both lose it.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from importlib import metadata
from types import ModuleType
from typing import Any, Literal

from pydantic import ValidationError

from connectors.adapters.plugin import CONTRACT_VERSION, SUPPORTED_CONTRACT_VERSIONS, BuildAdapter, Manifest

GROUP = "agent_reach.adapters"
CORE_PACKAGE = "agent-reach"
log = logging.getLogger("reach.plugins")


@dataclass(frozen=True)
class Plugin:
    """One entry point and what became of it."""

    type: str  # the entry point's name
    package: str  # the distribution that declares it, with its version
    target: str  # the entry point's value (the module)
    status: Literal["ok", "refused"]
    reason: str = ""  # why it was refused: the one line
    manifest: Manifest | None = None
    module: ModuleType | None = field(default=None, repr=False)

    @property
    def builtin(self) -> bool:
        return self.package.split(" ")[0] == CORE_PACKAGE

    @property
    def build(self) -> BuildAdapter:
        assert self.module is not None, "a refused plugin builds nothing"
        built: BuildAdapter = self.module.build
        return built

    def problems_hook(self) -> Any:
        return getattr(self.module, "problems", None)


class Registry:
    """The plugins of this process, by type; built from entry points (or given ones, in tests)."""

    def __init__(self, entry_points: Iterable[metadata.EntryPoint]) -> None:
        found = [_load(ep) for ep in entry_points]
        self.plugins: dict[str, Plugin] = {}
        self.refused: list[Plugin] = []
        by_type: dict[str, list[Plugin]] = {}
        for plugin in found:
            if plugin.status == "refused":
                self.refused.append(plugin)
            else:
                by_type.setdefault(plugin.type, []).append(plugin)
        for kind, claimants in sorted(by_type.items()):
            builtins = [p for p in claimants if p.builtin]
            keep = claimants[0] if len(claimants) == 1 else builtins[0] if len(builtins) == 1 else None
            if keep is not None:
                self.plugins[kind] = keep
            for plugin in claimants:
                if plugin is keep:
                    continue
                others = ", ".join(p.package for p in claimants if p is not plugin)
                self.refused.append(_refuse_clash(plugin, others, keep))
        for plugin in self.refused:
            log.error("%s", plugin.reason)

    def get(self, kind: str) -> Plugin | None:
        return self.plugins.get(kind)

    def refusal(self, kind: str) -> str | None:
        """Why connectors of ``kind`` cannot be served: the refusal's line, or that no package
        registers the type; None when a plugin serves it."""
        if kind in self.plugins:
            return None
        for plugin in self.refused:
            if plugin.type == kind:
                return plugin.reason
        return f"no installed plugin serves type {kind!r} (installed: {', '.join(sorted(self.plugins))}; see `reach plugins list`)"

    def all(self) -> list[Plugin]:
        return sorted([*self.plugins.values(), *self.refused], key=lambda p: (p.type, p.package))


def _refuse_clash(plugin: Plugin, others: str, keep: Plugin | None) -> Plugin:
    kept = f"; {keep.package} keeps it" if keep is not None else "; neither is used"
    return Plugin(
        plugin.type,
        plugin.package,
        plugin.target,
        "refused",
        f"plugin {plugin.type} from package {plugin.package} refused: type {plugin.type!r} is also claimed by {others}{kept}",
        plugin.manifest,
    )


def _package(ep: metadata.EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    return f"{dist.name} {dist.version}" if dist is not None else "(unknown package)"


def _load(ep: metadata.EntryPoint) -> Plugin:
    package = _package(ep)

    def refused(why: str, manifest: Manifest | None = None) -> Plugin:
        return Plugin(
            ep.name, package, ep.value, "refused", f"plugin {ep.name} from package {package} refused: {why}", manifest
        )

    try:
        module = ep.load()
    except Exception as exc:  # a plugin's import may fail in any way; it must not stop the fleet
        return refused(f"cannot be imported ({type(exc).__name__}: {_first_line(exc)})")
    raw = getattr(module, "manifest", None)
    if raw is None:
        return refused(f"{ep.value} has no `manifest` (a connectors.adapters.plugin.Manifest)")
    try:
        manifest = raw if isinstance(raw, Manifest) else Manifest.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "manifest"
        return refused(f"invalid manifest: {where}: {err['msg']}")
    if manifest.contract_version not in SUPPORTED_CONTRACT_VERSIONS:
        return refused(
            f"implements contract version {manifest.contract_version}, this fleet speaks {CONTRACT_VERSION}", manifest
        )
    if manifest.type != ep.name:
        return refused(f"its manifest serves type {manifest.type!r} but its entry point is named {ep.name!r}", manifest)
    if not callable(getattr(module, "build", None)):
        return refused(f"{ep.value} has no `build(connector, config, options)`", manifest)
    return Plugin(ep.name, package, ep.value, "ok", "", manifest, module)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else "no message"


_lock = threading.Lock()


@functools.cache
def _installed() -> Registry:
    return Registry(metadata.entry_points(group=GROUP))


def registry() -> Registry:
    """The process's registry, read from the installed entry points the first time it is asked for."""
    with _lock:  # pool threads may build adapters at once; plugins are imported once
        return _installed()


def reload() -> Registry:
    """Read the entry points again (after installing a plugin in a running shell; tests)."""
    with _lock:
        _installed.cache_clear()
        return _installed()


__all__ = ["GROUP", "Plugin", "Registry", "registry", "reload"]
