"""The catalog's routing: document and the agent app's domain, checked like the rest of the catalog
(reach validate: every problem with its file and line), and the contract's example kept true."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from connectors.catalog import build
from connectors.loader import load_directory
from connectors.spec import RoutingSpec

REPO = Path(__file__).resolve().parents[2]
CONNECTOR = """\
connector:
  name: desk
  endpoint: http://127.0.0.1:9
  actions:
    - { action: create_ticket, path: POST /t }
---
agent_app:
  name: bot
  domain: it_ops
  connector_bindings:
    - { connector: desk, allowed_actions: ["*"] }
"""


def problems_of(tmp_path: Path, routing: str) -> list[str]:
    (tmp_path / "c.yaml").write_text(CONNECTOR + "---\n" + routing)
    _, problems = build(load_directory(tmp_path))
    return [f"{Path(p.file).name}:{p.line}: {p.message}" for p in problems]


def test_without_a_routing_document_the_defaults_apply(tmp_path: Path) -> None:
    (tmp_path / "c.yaml").write_text(CONNECTOR)
    catalog, problems = build(load_directory(tmp_path))
    assert not problems and catalog.routing == RoutingSpec()
    assert catalog.agents["bot"].domain == "it_ops"


def test_a_routing_document_sets_model_margin_and_weights(tmp_path: Path) -> None:
    assert problems_of(tmp_path, "routing:\n  model: use-m3\n  margin: 0.1\n  weights: { lexical: 0.5 }\n") == []
    catalog, _ = build(load_directory(tmp_path))
    assert (catalog.routing.model, catalog.routing.margin, catalog.routing.weights.lexical) == ("use-m3", 0.1, 0.5)
    assert catalog.routing.weights.semantic == 1.0  # the rest keep their defaults


@pytest.mark.parametrize(
    "routing, line, words",
    [
        ("routing:\n  model: gpt-9\n", 14, "model"),
        ("routing:\n  margin: -1\n", 14, "greater than or equal to 0"),
        ("routing:\n  weights: { semantic: 11 }\n", 14, "less than or equal to 10"),
        ("routing:\n  margine: 0.1\n", 14, "unknown key"),
    ],
)
def test_bad_routing_settings_are_reported_with_their_line(tmp_path: Path, routing: str, line: int, words: str) -> None:
    problems = problems_of(tmp_path, routing)
    assert len(problems) == 1 and problems[0].startswith(f"c.yaml:{line}: routing.") and words in problems[0]


def test_a_second_routing_document_is_a_problem(tmp_path: Path) -> None:
    problems = problems_of(tmp_path, "routing:\n  margin: 0.1\n---\nrouting:\n  margin: 0.2\n")
    # the documents start on lines 13 and 16 (after the connector and agent documents and a "---")
    assert problems == [f"c.yaml:16: a second routing: document (the first is at {tmp_path / 'c.yaml'}:13)"]


def test_the_contracts_routing_example_is_the_default() -> None:
    contract = (REPO / "docs" / "contract.md").read_text()
    block = re.search(r"```yaml\n(routing:\n.*?)```", contract, re.S)
    assert block is not None
    assert RoutingSpec.model_validate(yaml.safe_load(block.group(1))["routing"]) == RoutingSpec()
