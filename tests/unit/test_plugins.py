"""Connector plugins (issue 34): registered from real entry points, a broken one refused with one
line naming its package while the other connectors are served, checked by `reach validate`, and
the conformance kit passing the built-in http adapter and failing deliberately bad ones."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest
from click.testing import CliRunner

from connectors.adapters import registry as registry_module
from connectors.adapters.base import CallContext
from connectors.adapters.factory import Unavailable, build_adapter
from connectors.adapters.registry import GROUP, Registry
from connectors.spec import ConnectorSpec, type_problems
from producers.wire import ErrorCode
from tests.plugin_packages import install_zoo
from workers.cli import main
from workers.ops.conformance import check

BUILTINS = ("agent", "amqp", "http", "soap", "sql")


@pytest.fixture(scope="module")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, str]]]:
    """The broken plugins installed on sys.path for this module; the process registry re-read."""
    root = tmp_path_factory.mktemp("plugins")
    tag = uuid.uuid4().hex[:6]
    packages = install_zoo(root, tag)
    sys.path.insert(0, str(root))
    registry_module.reload()
    try:
        yield tag, packages
    finally:
        sys.path.remove(str(root))
        registry_module.reload()


def test_builtins_register_through_agent_reach_entry_points() -> None:
    ours = [ep for ep in metadata.entry_points(group=GROUP) if ep.dist is not None and ep.dist.name == "agent-reach"]
    assert sorted(ep.name for ep in ours) == list(BUILTINS)
    found = Registry(ours)
    assert sorted(found.plugins) == list(BUILTINS) and not found.refused


def test_each_broken_plugin_is_refused_with_one_line_naming_its_package(zoo: tuple[str, dict[str, str]]) -> None:
    tag, packages = zoo
    found = registry_module.registry()
    reasons = {p.type: p.reason for p in found.refused}
    assert (
        "cannot be imported (ModuleNotFoundError: No module named 'grpc_that_is_not_installed')"
        in reasons[f"grpcish{tag}"]
    )
    assert "implements contract version 99, this fleet speaks 1" in reasons[f"old{tag}"]
    assert "invalid manifest: guarantees: Field required" in reasons[f"invalid{tag}"]
    for kind, package in packages.items():
        assert reasons[kind].startswith(f"plugin {kind} from package {package} 0.1 refused: ")
        assert "\n" not in reasons[kind]
    clash = [p for p in found.refused if p.type == "http"]
    assert len(clash) == 1 and clash[0].package == f"reach-clash-{tag} 0.1"
    assert "also claimed by agent-reach" in clash[0].reason and "agent-reach 0.1.0 keeps it" in clash[0].reason
    # the built-ins are all still served
    assert all(found.get(kind) is not None and found.get(kind).builtin for kind in BUILTINS)  # type: ignore[union-attr]


def _connector(kind: str, **extra: object) -> ConnectorSpec:
    action = {"action": "ping", "description": "ping", **({} if kind == "http" else {})}
    if kind == "http":
        action["path"] = "GET /ping"
    return ConnectorSpec.model_validate(
        {"name": f"c_{kind}", "type": kind, "endpoint": "http://127.0.0.1:9", "actions": [action], **extra}
    )


def test_a_connector_of_a_refused_type_answers_unavailable_and_the_others_are_built(
    zoo: tuple[str, dict[str, str]],
) -> None:
    tag, _ = zoo
    broken = build_adapter(_connector(f"old{tag}"))
    assert isinstance(broken, Unavailable)
    action = _connector(f"old{tag}").actions[0]
    outcome = broken.call(action, {}, CallContext(intent_id="i1"))
    assert outcome.code is ErrorCode.CONNECTOR_UNAVAILABLE and not outcome.sent
    assert f"from package reach-old-{tag} 0.1 refused" in outcome.message
    assert not broken.probe(1.0).healthy
    unknown = build_adapter(_connector("nosuchtype"))
    assert isinstance(unknown, Unavailable) and "no installed plugin serves type 'nosuchtype'" in unknown.reason
    crashy = build_adapter(_connector(f"crashy{tag}"))  # a third party's build that raises
    assert isinstance(crashy, Unavailable)
    assert f"plugin crashy{tag} (reach-crashy-{tag} 0.1) failed to build it: AssertionError" in crashy.reason
    served = build_adapter(_connector("http"))
    assert not isinstance(served, Unavailable)
    served.close()


def test_a_plugin_type_takes_config_and_no_builtin_keys() -> None:
    with pytest.raises(ValueError, match="`wsdl` belongs to connectors of type soap"):
        _connector("graphqlish", wsdl="x.wsdl")
    with pytest.raises(ValueError, match="`config` is for connectors of a plugin's type"):
        _connector("http", config={"a": 1})
    assert _connector("graphqlish", config={"a": 1}).config == {"a": 1}
    doc = {"type": "graphqlish", "actions": [{"action": "ping", "path": "GET /x", "config": {"q": 1}}]}
    assert type_problems(doc) == ["action ping: `path` belongs to http actions, not graphqlish"]
    with pytest.raises(ValueError, match="must be one of agent, amqp, http, soap, sql or an installed plugin's type"):
        _connector("No-Such")


def test_validate_names_an_uninstalled_type_and_bad_config_at_their_lines(
    zoo: tuple[str, dict[str, str]], tmp_path: Path
) -> None:
    tag, _ = zoo
    (tmp_path / "c.yaml").write_text(
        "connector:\n"
        "  name: lost\n"
        "  type: graphqlish\n"
        "  actions:\n"
        "    - action: ping\n"
        "      description: ping\n"
        "---\n"
        "connector:\n"
        "  name: wrapped\n"
        f"  type: double{tag}\n"
        "  endpoint: http://127.0.0.1:9\n"
        "  config:\n"
        "    token_envv: X\n"
        "  actions:\n"
        "    - action: ping\n"
        "      description: ping\n"
    )
    result = CliRunner().invoke(main, ["validate", str(tmp_path)])
    assert result.exit_code == 1, result.output
    file = str(tmp_path / "c.yaml")
    assert f"{file}:3: connector lost: type 'graphqlish': no installed plugin serves type 'graphqlish'" in result.output
    assert f"{file}:13: connector wrapped: config.token_envv: Extra inputs are not permitted" in result.output
    assert f"{file}:12: connector wrapped: config.token_env: Field required" in result.output


def test_plugins_list_shows_each_type_and_why_one_was_refused(zoo: tuple[str, dict[str, str]]) -> None:
    tag, _ = zoo
    result = CliRunner().invoke(main, ["plugins", "list"])
    assert result.exit_code == 1
    lines = {line.split()[0] + " " + line.split()[1]: line for line in result.output.splitlines()[2:]}
    assert lines["http agent-reach"].split()[-1] == "ok"
    assert f"refused: plugin old{tag} from package reach-old-{tag} 0.1 refused" in lines[f"old{tag} reach-old-{tag}"]


@pytest.mark.parametrize("kind", ["http", "soap"])  # amqp and agent need a broker: tests/integration/test_plugin_kit.py
def test_the_kit_passes_a_builtin_adapter(kind: str) -> None:
    rows = check(kind, Registry(metadata.entry_points(group=GROUP).select(name=kind)))
    assert [r for r in rows if r.status == "FAIL"] == []
    assert len([r for r in rows if r.status == "PASS"]) == 12


def test_the_kit_fails_an_adapter_that_sends_a_write_twice(zoo: tuple[str, dict[str, str]]) -> None:
    tag, _ = zoo
    result = CliRunner().invoke(main, ["plugins", "check", f"double{tag}"])
    assert result.exit_code == 1
    status = {line[:60].strip(): line[60:].split()[0] for line in result.output.splitlines()[2:] if len(line) > 60}
    assert status["a non-idempotent write is never sent twice"] == "FAIL"
    assert status["a write that times out is OUTCOME_UNKNOWN and not retried"] == "FAIL"
    assert status["secrets never appear in receipts, logs or errors"] == "PASS"
    assert "system received 2" in result.output


def test_the_kit_fails_an_adapter_that_logs_its_secret(zoo: tuple[str, dict[str, str]]) -> None:
    tag, _ = zoo
    rows = {r.guarantee: r for r in check(f"leaky{tag}")}
    assert rows["secrets never appear in receipts, logs or errors"].status == "FAIL"
    assert "a log line" in rows["secrets never appear in receipts, logs or errors"].detail
    assert rows["a non-idempotent write is never sent twice"].status == "PASS"


def test_the_kit_fails_an_adapter_that_ignores_the_deadline_and_the_idempotency_key(
    zoo: tuple[str, dict[str, str]],
) -> None:
    tag, _ = zoo
    rows = {r.guarantee: r for r in check(f"careless{tag}")}
    assert rows["the deadline cancels the call"].status == "FAIL"
    assert rows["a retried idempotent call carries the same idempotency key"].status == "FAIL"
    assert (
        "keys received: [None, None, None]" in rows["a retried idempotent call carries the same idempotency key"].detail
    )
    assert rows["a non-idempotent write is never sent twice"].status == "PASS"


def test_the_kit_refuses_to_run_for_a_refused_plugin(zoo: tuple[str, dict[str, str]]) -> None:
    tag, _ = zoo
    result = CliRunner().invoke(main, ["plugins", "check", f"old{tag}"])
    assert result.exit_code == 2
    assert f"plugin old{tag} from package reach-old-{tag} 0.1 refused" in result.output
