"""Loading a catalog directory like a compiler: every problem, each with its file and line.

Any ``*.yaml`` / ``*.yml`` under the directory (recursively) is read; a file may hold several
documents separated by ``---``. Each document is ``connector:``, ``agent_app:``, ``workflow:``
(steps over actions, connectors/workflows/spec.py), ``approvers:`` (approver groups and their
people) or (at most one in a catalog) ``routing:``.

Documents are composed one at a time (by libyaml when PyYAML has it) and their node trees are
dropped once the document is checked, so a large catalog never holds all its trees at once (a
process keeps the memory its peak took). The rare problem found later (by ``catalog.build``)
composes its file again to name the line.

libyaml and PyYAML's own parser disagree on a few corners of YAML: libyaml refuses a ``:`` right
before ``}`` or ``,`` in a flow mapping and some ``%YAML`` headers, and accepts tabs and ``?``
inside flow text that PyYAML refuses. A file libyaml refuses is read again by PyYAML's parser, so
every file PyYAML accepts loads, and a file neither reads gets PyYAML's message (it names the
character or alias). Without libyaml, PyYAML's parser reads everything.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from connectors.spec import (
    AgentApp,
    AgentAppDocument,
    ApproversDocument,
    ConnectorDocument,
    ConnectorSpec,
    RoutingDocument,
    RoutingSpec,
    path_param_problems,
    type_problems,
)
from connectors.workflows.spec import WorkflowDocument, WorkflowSpec


@dataclass(frozen=True, order=True)
class Problem:
    file: str
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.message}"


@dataclass
class LoadedDocument:
    file: str
    line: int
    index: int  # the document's place in its file (0 for the first), to find its lines again
    model: ConnectorSpec | AgentApp | RoutingSpec | ApproversDocument | WorkflowSpec


@dataclass
class LoadResult:
    connectors: list[LoadedDocument] = field(default_factory=list)
    agents: list[LoadedDocument] = field(default_factory=list)
    routing: list[LoadedDocument] = field(default_factory=list)
    approvers: list[LoadedDocument] = field(default_factory=list)
    workflows: list[LoadedDocument] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    warnings: list[Problem] = field(default_factory=list)
    # names of connectors whose documents failed: bindings to them are not reported again
    broken_connectors: set[str] = field(default_factory=set)
    # each file read: the digest of its text and the parser that read it (see line_of)
    _sources: dict[str, tuple[str, type[yaml.SafeLoader]]] = field(default_factory=dict, repr=False)
    # files composed again to name a problem's line, each once (see line_of)
    _composed: dict[str, list[yaml.Node | None]] = field(default_factory=dict, repr=False)

    def line_of(self, loaded: LoadedDocument, *loc: Any) -> int:
        """The line of ``loc`` in a loaded document. Node trees are not kept from loading, so the
        document's file is composed again — only for a problem, and once per file. A file that
        changed since it was read gives its document's first line."""
        if loaded.file not in self._composed:
            digest, composer = self._sources.get(loaded.file, ("", _Composer))
            self._composed[loaded.file] = _compose_again(loaded.file, digest, composer)
        nodes = self._composed[loaded.file]
        node = nodes[loaded.index] if loaded.index < len(nodes) else None
        return _line_of(node, loc) if node is not None else loaded.line


class CatalogError(Exception):
    """The catalog has problems; ``problems`` lists every one of them."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = sorted(problems)
        shown = "\n".join(f"  {p}" for p in self.problems[:20])
        more = f"\n  … and {len(self.problems) - 20} more" if len(self.problems) > 20 else ""
        super().__init__(f"catalog has {len(self.problems)} problem(s):\n{shown}{more}")


_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def expand_env(text: str, environ: Mapping[str, str]) -> str:
    """``${VAR}`` / ``${VAR:-default}`` in an endpoint, so one catalog serves staging and production.

    The variables are the catalog's own (data, not fleet settings), read from ``environ``.
    """

    def sub(match: re.Match[str]) -> str:
        value = environ.get(match.group(1))
        if value is None or value == "":
            if match.group(2) is None:
                raise ValueError(f"environment variable {match.group(1)} is not set and has no default")
            return match.group(2)
        return value

    return _ENV_REF.sub(sub, text)


def catalog_files(directory: Path) -> list[Path]:
    """Every *.yaml / *.yml below ``directory``, skipping hidden parts (below it) such as the
    ``..2024_01_01_00_00_00.123`` folders a Kubernetes ConfigMap volume holds beside its
    symlinks: reading both would declare every connector twice."""
    return sorted(
        p
        for p in directory.rglob("*")
        if p.suffix in (".yaml", ".yml")
        and p.is_file()
        and not any(part.startswith(".") for part in p.relative_to(directory).parts)
    )


def load_directory(directory: str | Path, environ: Mapping[str, str] | None = None) -> LoadResult:
    """Parse and type-check every document; cross-references are checked by ``catalog.build``.

    ``${VAR}`` in endpoints is expanded from ``environ`` (default: the process environment).
    """
    env = os.environ if environ is None else environ
    root = Path(directory)
    result = LoadResult()
    if not root.is_dir():
        result.problems.append(Problem(str(root), 0, "catalog directory does not exist"))
        return result
    files = catalog_files(root)
    if not files:
        result.problems.append(Problem(str(root), 0, "no *.yaml or *.yml files in the catalog directory"))
    for path in files:
        _load_file(path, result, env)
    return result


def _load_file(path: Path, result: LoadResult, env: Mapping[str, str]) -> None:
    name = str(path)
    try:
        text = _read(path)
    except (OSError, UnicodeDecodeError) as exc:
        result.problems.append(Problem(name, 0, f"cannot read file: {exc}"))
        return
    # a file that is not valid YAML is one problem, with nothing taken from its earlier documents
    error: yaml.YAMLError | None = None
    for composer in _COMPOSERS:
        found = LoadResult()
        try:
            for index, node in enumerate(yaml.compose_all(text, Loader=composer)):
                _load_document(name, text, index, node, found, env)
        except yaml.YAMLError as exc:
            error = exc
            continue
        result._sources[name] = (_digest(text), composer)
        result.connectors.extend(found.connectors)
        result.agents.extend(found.agents)
        result.routing.extend(found.routing)
        result.approvers.extend(found.approvers)
        result.workflows.extend(found.workflows)
        result.problems.extend(found.problems)
        result.warnings.extend(found.warnings)
        result.broken_connectors |= found.broken_connectors
        return
    mark = getattr(error, "problem_mark", None)
    line = mark.line + 1 if mark is not None else 0
    result.problems.append(Problem(name, line, f"not valid YAML: {getattr(error, 'problem', error)}"))


def _load_document(
    name: str, text: str, index: int, node: yaml.Node | None, result: LoadResult, env: Mapping[str, str]
) -> None:
    """Check one composed document and keep its model (not its node tree)."""
    if node is None:
        return
    line = node.start_mark.line + 1
    for fixed_line, words in _rejoin_flow_commas(node, text):
        result.warnings.append(
            Problem(
                name,
                fixed_line,
                f"read {words!r} as part of the text before it (a comma inside "
                "{ } splits a value; quote the text to say so explicitly)",
            )
        )
    doc, duplicates = _UniqueKeyLoader.construct(node)
    if duplicates:
        result.problems.extend(Problem(name, dup.line, str(dup)) for dup in duplicates)
        return
    if not isinstance(doc, dict) or len(doc) != 1 or next(iter(doc)) not in _KINDS:
        keys = ", ".join(map(str, doc)) if isinstance(doc, dict) else type(doc).__name__
        result.problems.append(
            Problem(
                name,
                line,
                "a document must hold exactly one of connector:, agent_app:, workflow:, approvers: or routing: "
                f"(found {keys})",
            )
        )
        return
    kind = next(iter(doc))
    structural = _structure_problems(doc, node, name) if kind == "connector" else []
    result.problems.extend(structural)
    for key in ("endpoint", "wsdl"):
        if kind == "connector" and isinstance(doc["connector"], dict) and isinstance(doc["connector"].get(key), str):
            try:
                doc["connector"][key] = expand_env(doc["connector"][key], env)
            except ValueError as exc:
                result.problems.append(Problem(name, _line_of(node, ("connector", key)), str(exc)))
                return
    try:
        if kind == "connector":
            model: ConnectorSpec | AgentApp | RoutingSpec | ApproversDocument | WorkflowSpec = (
                ConnectorDocument.model_validate(doc).connector
            )
            result.connectors.append(LoadedDocument(name, line, index, model))
        elif kind == "routing":
            model = RoutingDocument.model_validate(doc).routing
            result.routing.append(LoadedDocument(name, line, index, model))
        elif kind == "approvers":
            model = ApproversDocument.model_validate(doc)
            result.approvers.append(LoadedDocument(name, line, index, model))
        elif kind == "workflow":
            model = WorkflowDocument.model_validate(doc).workflow
            result.workflows.append(LoadedDocument(name, line, index, model))
        else:
            model = AgentAppDocument.model_validate(doc).agent_app
            result.agents.append(LoadedDocument(name, line, index, model))
    except ValidationError as exc:
        if kind == "connector" and isinstance(doc["connector"], dict) and isinstance(doc["connector"].get("name"), str):
            result.broken_connectors.add(doc["connector"]["name"])
        for err in exc.errors():
            problem = Problem(name, _line_of(node, err["loc"]), _describe(err))
            if problem not in structural:  # the model re-checks what the raw pass reported
                result.problems.append(problem)
        return
    if structural and isinstance(model, ConnectorSpec):
        result.broken_connectors.add(model.name)
        result.connectors.pop()


_KINDS = ("connector", "agent_app", "workflow", "approvers", "routing")
_TEXT_KEYS = ("description",)


def _rejoin_flow_commas(node: yaml.Node, text: str) -> list[tuple[int, str]]:
    """Undo YAML's split of ``{ description: Ticket title, at most 100 chars }``.

    In a flow mapping the comma ends the value, so "at most 100 chars" becomes a key with no
    value. Authors (and the contract's own example) mean one sentence: such bare words that follow a
    description are joined back onto it. Returns (line, words) for each repair, for a warning.
    """
    repairs: list[tuple[int, str]] = []
    if isinstance(node, yaml.MappingNode):
        kept: list[tuple[yaml.Node, yaml.Node]] = []
        for key, value in node.value:
            bare = (
                node.flow_style
                and isinstance(key, yaml.ScalarNode)
                and not key.style  # plain: None, or "" from libyaml
                and isinstance(value, yaml.ScalarNode)
                and value.tag == "tag:yaml.org,2002:null"
                and ":" not in text[key.end_mark.index : value.start_mark.index]  # no colon at all after the words
            )
            if bare and kept:
                prev_key, prev_value = kept[-1]
                if (
                    isinstance(prev_key, yaml.ScalarNode)
                    and prev_key.value in _TEXT_KEYS
                    and isinstance(prev_value, yaml.ScalarNode)
                    and prev_value.tag == "tag:yaml.org,2002:str"
                ):
                    prev_value.value = f"{prev_value.value}, {key.value}"
                    repairs.append((key.start_mark.line + 1, key.value))
                    continue
            kept.append((key, value))
            repairs.extend(_rejoin_flow_commas(value, text))
        node.value = kept
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            repairs.extend(_rejoin_flow_commas(item, text))
    return repairs


def _structure_problems(doc: dict[str, Any], node: yaml.Node, file: str) -> list[Problem]:
    """Checks across fields, made on the raw document so they are reported even when some
    field has its own problem (pydantic skips a model's cross-field checks then)."""
    connector = doc.get("connector")
    actions = connector.get("actions") if isinstance(connector, dict) else None
    if not isinstance(actions, list):
        return []
    problems = [
        Problem(file, _line_of(node, ("connector",)), f"connector: {message}")
        for message in type_problems(connector)  # type: ignore[arg-type]
    ]
    seen: set[str] = set()
    for i, action in enumerate(actions):
        if not isinstance(action, dict):
            continue
        loc = ("connector", "actions", i)
        name = action.get("action")
        if isinstance(name, str):
            if name in seen:
                problems.append(
                    Problem(
                        file,
                        _line_of(node, (*loc, "action")),
                        f"connector.actions.{i}.action: action {name!r} is declared twice in this connector",
                    )
                )
            seen.add(name)
        declared = action.get("input")
        inputs: dict[Any, Any] = declared if isinstance(declared, dict) else {}
        placements = {str(k): (v.get("in") if isinstance(v, dict) else None) for k, v in inputs.items()}
        for message in path_param_problems(action.get("path"), placements):
            problems.append(Problem(file, _line_of(node, loc), f"connector.actions.{i}: {message}"))
    return problems


def _describe(err: Any) -> str:
    loc = ".".join(str(p) for p in err["loc"])
    msg = err["msg"]
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    if err["type"] == "extra_forbidden":
        msg = "unknown key (check its spelling against docs/contract.md section 5)"
    elif err["type"] == "literal_error":
        msg = f"{msg} (got {err.get('input')!r})"
    return f"{loc}: {msg}" if loc else msg


def _line_of(node: yaml.Node, loc: tuple[Any, ...] | list[Any]) -> int:
    """The line of the deepest YAML node that a pydantic error location reaches."""
    line = node.start_mark.line + 1
    current: yaml.Node | None = node
    for part in loc:
        if current is None:
            break
        if isinstance(current, yaml.MappingNode):
            nxt = None
            for key_node, value_node in current.value:
                if str(key_node.value) == str(part):
                    # point at the key itself: that is where the author looks
                    line = key_node.start_mark.line + 1
                    nxt = value_node
                    break
            current = nxt
        elif isinstance(current, yaml.SequenceNode) and isinstance(part, int) and part < len(current.value):
            current = current.value[part]
            line = current.start_mark.line + 1
        else:
            break
    return line


def _read(path: Path) -> str:
    # without its byte-order mark: libyaml's mark indexes skip it, and slices of the text use them
    return path.read_text(encoding="utf-8").removeprefix("\ufeff")


def _digest(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8", "surrogatepass")).hexdigest()


def _compose_again(file: str, digest: str, composer: type[yaml.SafeLoader]) -> list[yaml.Node | None]:
    """A file's documents as node trees, repaired as when it was loaded, by the parser that read
    it then; [] if the file is gone or changed since (a problem then names its document's first line)."""
    try:
        text = _read(Path(file))
        if _digest(text) != digest:
            return []
        nodes: list[yaml.Node | None] = list(yaml.compose_all(text, Loader=composer))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return []
    for node in nodes:
        if node is not None:
            _rejoin_flow_commas(node, text)
    return nodes


class _DuplicateKey(ValueError):
    def __init__(self, key: str, line: int) -> None:
        super().__init__(f"key {key!r} appears twice in the same mapping")
        self.line = line


class _Composer(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """Builds node trees only (with libyaml's faster parser when PyYAML was built with it)."""


class _PyComposer(yaml.SafeLoader):
    """PyYAML's own parser: for the files libyaml refuses (see the module's docstring)."""


_COMPOSERS = tuple(dict.fromkeys((_Composer, _PyComposer)))  # libyaml first, when there is one


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that notes every duplicate key (PyYAML silently keeps the last one)."""

    duplicates: list[_DuplicateKey]

    @classmethod
    def construct(cls, node: yaml.Node) -> tuple[Any, list[_DuplicateKey]]:
        loader = cls("")
        loader.duplicates = []
        try:
            return loader.construct_document(node), loader.duplicates
        finally:
            loader.dispose()

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
                seen.add(key)
            except TypeError:  # an unhashable key; PyYAML reports it itself
                continue
            if duplicate:
                self.duplicates.append(_DuplicateKey(str(key), key_node.start_mark.line + 1))
        return super().construct_mapping(node, deep=deep)
