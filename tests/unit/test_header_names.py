"""Header names a catalog writes are checked by `reach validate` with file and line (issue 30): a
name with a newline, a space or a colon used to validate, then fail every call as the agent's fault."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from connectors.spec import HEADER_NAME, header_name_problem
from workers.cli import main

CATALOG = """\
connector:
  name: notes
  endpoint: http://localhost:8000
  idempotency_header: "Idem Key"
  auth: {type: api_key, name: "X-Key\\n", key_env: NOTES_KEY}
  actions:
    - action: add_note
      path: POST /notes
      permission: write
      input:
        text: { type: string, required: true }
        note: { type: string, in: header, name: "X-Note\\nInjected: 1" }
    - action: tag_note
      path: POST /tags
      permission: write
      input:
        "bad header": { type: string, in: header }
        fine: { type: string, in: header, name: X-Fine_1.2~ }
---
agent_app:
  name: note_bot
  connector_bindings:
    - connector: notes
      allowed_actions: ["*"]
"""


def test_bad_header_names_are_problems_with_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "notes.yaml").write_text(CATALOG)
    result = CliRunner().invoke(main, ["validate", str(tmp_path)])
    assert result.exit_code != 0, result.output
    lines = [line for line in result.output.splitlines() if "not a valid HTTP header name" in line]
    where = sorted(int(line.split(":", 2)[1]) for line in lines)
    assert where == [4, 5, 12, 13], result.output  # idempotency_header, api_key name, field name, the action
    assert "X-Fine" not in result.output


@pytest.mark.parametrize("name", ["X-Note\n", "X Note", "X-Note:", "", "Ünicode", "X\x00", "a" * 256, "(x)"])
def test_what_is_not_a_header_name(name: str) -> None:
    assert header_name_problem("name", name) is not None


@pytest.mark.parametrize("name", ["X-Note", "Idempotency-Key", "x_api_key", "!#$%&'*+-.^_`|~09Az", "a" * 255])
def test_what_is_a_header_name(name: str) -> None:
    assert header_name_problem("name", name) is None and HEADER_NAME.fullmatch(name)
