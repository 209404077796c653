"""`reach validate`, `reach catalog` and Catalog.resolve on catalogs written to a temp directory.

A problem is asserted by file AND line: the YAML snippets mark the line a problem must point at
with a trailing ``#!`` comment, so the expected line numbers are read from the text itself.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

import connectors.loader as loader
from connectors.catalog import ActionRef, Catalog, Refusal, build
from connectors.loader import Problem, load_directory
from producers.wire import ErrorCode
from workers.cli import main

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True, params=["libyaml", "pyyaml"])
def parser(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test runs with libyaml first (as installed from wheels) and with PyYAML's own parser
    only (an install without libyaml): the same catalogs must mean the same thing."""
    if request.param == "pyyaml":
        monkeypatch.setattr(loader, "_Composer", loader._PyComposer)
        monkeypatch.setattr(loader, "_COMPOSERS", (loader._PyComposer,))
    elif loader._Composer is loader._PyComposer:
        pytest.fail(
            "PyYAML has no libyaml here: catalogs load 3-4x slower; install PyYAML from its wheel "
            "(pip install --force-reinstall --only-binary :all: pyyaml)"
        )
    return str(request.param)


# docs/contract.md section 5, verbatim (flow-mapping commas in the descriptions included)
DESIGN_EXAMPLE = """\
connector:
  name: local_ticket_system
  endpoint: http://localhost:8000
  auth:
    type: none
  actions:
    - action: create_ticket
      description: Create a new ticket
      path: POST /tickets
      input:
        title: { type: string, required: true, description: Ticket title, at most 100 chars }
        description: { type: string, required: true, description: Problem details }
        priority:
          type: enum
          values: [low, medium, high]
          default: medium
          description: Only low/medium/high
      permission: write
      timeout: 5s
      idempotent: false
    - action: query_ticket
      description: Get a ticket by its id
      path: GET /tickets/{tid}
      input:
        tid: { type: string, required: true, description: Ticket id, e.g. TK-0001 }
      output:
        status: { type: enum, values: [open, closed] }
      permission: read        # read_only is accepted too
      timeout: 5s
      idempotent: true
---
agent_app:
  name: ticket_qa_bot
  connector_bindings:
    - connector: local_ticket_system
      allowed_actions: [query_ticket]
      rate_limit: 10/min
      audit_level: full
"""

# A small valid connector the problem snippets are built around.
TICKETS = """\
connector:
  name: tickets
  endpoint: http://127.0.0.1:8000
  actions:
    - action: create_ticket
      path: POST /tickets
      permission: write
      input:
        title: { type: string, required: true }
        priority: { type: enum, values: [low, medium, high], default: medium }
    - action: query_ticket
      path: GET /tickets/{tid}
      input:
        tid: { type: string, required: true }
"""


def write(root: Path, relative: str, text: str) -> Path:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def marked_lines(text: str) -> list[int]:
    """1-based numbers of the lines carrying a ``#!`` marker."""
    return [n for n, line in enumerate(textwrap.dedent(text).splitlines(), 1) if "#!" in line]


def validate(directory: Path) -> Result:
    return CliRunner().invoke(main, ["validate", str(directory)])


def problems_of(directory: Path) -> list[Problem]:
    _, problems = build(load_directory(directory))
    return sorted(problems)


def catalog_of(directory: Path) -> Catalog:
    catalog, problems = build(load_directory(directory))
    assert problems == []
    return catalog


def assert_reported(directory: Path, file: Path, line: int, *fragments: str) -> None:
    """The problem is in the library's list and in `reach validate`'s output, which exits 1."""
    problems = problems_of(directory)
    hits = [
        p
        for p in problems
        if p.file == str(file) and p.line == line and all(f.lower() in p.message.lower() for f in fragments)
    ]
    assert hits, f"no problem at {file.name}:{line} mentioning {fragments}; got:\n" + "\n".join(map(str, problems))
    result = validate(directory)
    assert result.exit_code == 1, result.output
    assert f"{file}:{line}:" in result.stdout
    assert any(
        all(f.lower() in out.lower() for f in fragments)
        for out in result.stdout.splitlines()
        if out.startswith(f"{file}:{line}:")
    )


# -- the design example and what is read ------------------------------------------------------


def test_design_example_validates_with_exit_zero(tmp_path: Path) -> None:
    write(tmp_path, "catalog.yaml", DESIGN_EXAMPLE)
    result = validate(tmp_path)
    assert result.exit_code == 0, result.output
    assert "ok: 1 connector(s), 2 action(s), 1 agent app(s)" in result.stdout


def test_comma_split_description_is_rejoined_with_a_warning(tmp_path: Path) -> None:
    path = write(tmp_path, "catalog.yaml", DESIGN_EXAMPLE)
    loaded = load_directory(tmp_path)
    catalog, problems = build(loaded)
    assert problems == []
    actions = {a.action: a for a in catalog.connectors["local_ticket_system"].actions}
    assert actions["create_ticket"].input["title"].description == "Ticket title, at most 100 chars"
    assert actions["query_ticket"].input["tid"].description == "Ticket id, e.g. TK-0001"
    assert set(actions["create_ticket"].input) == {"title", "description", "priority"}
    assert set(actions["query_ticket"].input) == {"tid"}
    warned = {(w.file, w.line) for w in loaded.warnings}
    assert (str(path), 11) in warned and (str(path), 25) in warned
    result = validate(tmp_path)
    assert f"{path}:11:" in result.stdout and "at most 100 chars" in result.stdout and "(warning)" in result.stdout
    assert result.exit_code == 0


def test_comma_split_description_after_a_byte_order_mark_is_rejoined_on_its_line(tmp_path: Path) -> None:
    path = tmp_path / "catalog.yaml"
    path.write_text("\ufeff" + DESIGN_EXAMPLE, encoding="utf-8")
    loaded = load_directory(tmp_path)
    catalog, problems = build(loaded)
    assert problems == []
    actions = {a.action: a for a in catalog.connectors["local_ticket_system"].actions}
    assert actions["create_ticket"].input["title"].description == "Ticket title, at most 100 chars"
    assert {(w.file, w.line) for w in loaded.warnings} == {(str(path), 11), (str(path), 25)}


def test_comma_split_description_shows_whole_in_the_tool_schema(tmp_path: Path) -> None:
    write(tmp_path, "catalog.yaml", DESIGN_EXAMPLE)
    tools = {t.name: t for t in catalog_of(tmp_path).all_tools()}
    schema = tools["local_ticket_system__create_ticket"].input_schema
    assert schema["properties"]["title"]["description"] == "Ticket title, at most 100 chars"


def test_the_shipped_example_catalog_validates() -> None:
    result = validate(REPO / "examples" / "catalog")
    assert result.exit_code == 0, result.output
    assert "ok: 1 connector(s), 2 action(s), 2 agent app(s)" in result.stdout


def test_several_documents_files_yml_and_nested_directories_are_all_read(tmp_path: Path) -> None:
    write(
        tmp_path,
        "tickets.yaml",
        TICKETS
        + """\
---
agent_app:
  name: desk_bot
  connector_bindings:
    - connector: tickets
      allowed_actions: [create_ticket]
""",
    )
    write(
        tmp_path,
        "crm.yml",
        """\
        connector:
          name: crm
          endpoint: http://127.0.0.1:8001
          actions:
            - action: find_customer
              path: GET /customers
              input:
                email: { type: string, required: true }
        """,
    )
    write(
        tmp_path,
        "teams/support/bots.yaml",
        """\
        agent_app:
          name: crm_bot
          connector_bindings:
            - connector: crm
              allowed_actions: [find_customer]
        ---
        agent_app:
          name: all_bot
          connector_bindings:
            - connector: crm
              allowed_actions: ["*"]
            - connector: tickets
              allowed_actions: ["*"]
        """,
    )
    write(tmp_path, "notes.txt", "this: is not: a catalog: file")
    catalog = catalog_of(tmp_path)
    assert set(catalog.connectors) == {"tickets", "crm"}
    assert set(catalog.agents) == {"desk_bot", "crm_bot", "all_bot"}
    assert sorted(catalog.visible_actions("all_bot")) == [
        "crm.find_customer",
        "tickets.create_ticket",
        "tickets.query_ticket",
    ]
    result = validate(tmp_path)
    assert result.exit_code == 0, result.output
    assert "ok: 2 connector(s), 3 action(s), 3 agent app(s)" in result.stdout


def test_missing_directory_is_a_problem(tmp_path: Path) -> None:
    result = validate(tmp_path / "nope")
    assert result.exit_code == 1
    assert "does not exist" in result.stdout


def test_directory_without_yaml_files_is_a_problem(tmp_path: Path) -> None:
    write(tmp_path, "readme.md", "# nothing here")
    result = validate(tmp_path)
    assert result.exit_code == 1
    assert "no *.yaml or *.yml files" in result.stdout


# -- each problem with file and line ----------------------------------------------------------

# (snippet appended to TICKETS as a second document or replacing it, fragments the message must hold)
CONNECTOR_PROBLEMS = {
    "unknown_field_key": (
        """\
connector:
  name: c
  endpoint: http://127.0.0.1:8000
  actions:
    - action: a
      path: POST /a
      input:
        title:
          type: string
          requried: true   #!
""",
        ("requried", "unknown key"),
    ),
    "unknown_field_type": (
        """\
connector:
  name: c
  endpoint: http://127.0.0.1:8000
  actions:
    - action: a
      path: POST /a
      input:
        title:
          type: strng   #!
""",
        ("type", "strng"),
    ),
    "bad_method_in_path": (
        """\
connector:
  name: c
  endpoint: http://127.0.0.1:8000
  actions:
    - action: a
      path: FETCH /x   #!
""",
        ("FETCH", "method"),
    ),
    "path_without_method": (
        """\
connector:
  name: c
  endpoint: http://127.0.0.1:8000
  actions:
    - action: a
      path: /x   #!
""",
        ("METHOD /template",),
    ),
    "path_parameter_not_declared": (
        """\
connector:
  name: c
  endpoint: http://127.0.0.1:8000
  actions:
    - action: a   #!
      path: GET /items/{item_id}
      input:
        id: { type: string }
""",
        ("{item_id}", "not declared"),
    ),
    "duration_with_words": (
        """\
connector:
  name: c
  endpoint: http://127.0.0.1:8000
  actions:
    - action: a
      path: GET /a
      timeout: 5 seconds   #!
""",
        ("timeout", "5 seconds", "not a duration"),
    ),
    "duration_as_bare_number": (
        """\
connector:
  name: c
  endpoint: http://127.0.0.1:8000
  actions:
    - action: a
      path: GET /a
      timeout: 5   #!
""",
        ("timeout", "not a duration"),
    ),
    "zero_duration": (
        """\
connector:
  name: c
  endpoint: http://127.0.0.1:8000
  breaker: { fail_max: 3, reset_timeout: 0s }   #!
  actions:
    - action: a
      path: GET /a
""",
        ("reset_timeout", "longer than zero"),
    ),
    "bad_allowed_hours_on_action": (
        """\
connector:
  name: c
  endpoint: http://127.0.0.1:8000
  actions:
    - action: a
      path: GET /a
      allowed_hours: "8-22"   #!
""",
        ("allowed_hours", "08:00-22:00"),
    ),
    "enum_without_values": (
        """\
connector:
  name: c
  endpoint: http://127.0.0.1:8000
  actions:
    - action: a
      path: GET /a
      input:
        level: { type: enum }   #!
""",
        ("values",),
    ),
    "endpoint_not_a_url": (
        """\
connector:
  name: c
  endpoint: localhost:8000   #!
  actions:
    - action: a
      path: GET /a
""",
        ("endpoint", "http"),
    ),
    "unknown_connector_key": (
        """\
connector:
  name: c
  endpoint: http://127.0.0.1:8000
  idempotency_heder: Idempotency-Key   #!
  actions:
    - action: a
      path: GET /a
""",
        ("idempotency_heder", "unknown key"),
    ),
    "auth_inline_secret": (
        """\
connector:
  name: c
  endpoint: http://127.0.0.1:8000
  auth:
    type: bearer
    token: hunter2   #!
  actions:
    - action: a
      path: GET /a
""",
        ("token", "unknown key"),
    ),
}


@pytest.mark.parametrize("case", sorted(CONNECTOR_PROBLEMS))
def test_connector_problem_is_reported_with_file_and_line(tmp_path: Path, case: str) -> None:
    text, fragments = CONNECTOR_PROBLEMS[case]
    path = write(tmp_path, "bad.yaml", text)
    (line,) = marked_lines(text)
    assert_reported(tmp_path, path, line, *fragments)


AGENT_PROBLEMS = {
    "binding_to_unknown_connector": (
        """\
agent_app:
  name: bot
  connector_bindings:
    - connector: tickets
      allowed_actions: [query_ticket]
    - connector: tikets   #!
      allowed_actions: [query_ticket]
""",
        ("tikets", "unknown connector"),
    ),
    "binding_to_unknown_action": (
        """\
agent_app:
  name: bot
  connector_bindings:
    - connector: tickets
      allowed_actions:
        - query_ticket
        - close_ticket   #!
""",
        ("close_ticket", "no action"),
    ),
    "bad_rate_limit": (
        """\
agent_app:
  name: bot
  connector_bindings:
    - connector: tickets
      allowed_actions: [query_ticket]
      rate_limit: 10/day   #!
""",
        ("rate_limit", "10/day"),
    ),
    "zero_rate_limit": (
        """\
agent_app:
  name: bot
  connector_bindings:
    - connector: tickets
      allowed_actions: [query_ticket]
      rate_limit: 0/min   #!
""",
        ("rate_limit",),
    ),
    "impossible_allowed_hours": (
        """\
agent_app:
  name: bot
  connector_bindings:
    - connector: tickets
      allowed_actions: [query_ticket]
      allowed_hours: "25:00-22:00 Asia/Shanghai"   #!
""",
        ("allowed_hours", "impossible"),
    ),
    "allowed_hours_unknown_zone": (
        """\
agent_app:
  name: bot
  connector_bindings:
    - connector: tickets
      allowed_actions: [query_ticket]
      allowed_hours: "08:00-22:00 Mars/Olympus"   #!
""",
        ("allowed_hours", "Mars/Olympus"),
    ),
    "binding_key_typo": (
        """\
agent_app:
  name: bot
  connector_bindings:
    - connector: tickets
      allowed_action: [query_ticket]   #!
""",
        ("allowed_action", "unknown key"),
    ),
    "connector_bound_twice": (
        """\
agent_app:
  name: bot
  connector_bindings:
    - connector: tickets
      allowed_actions: [query_ticket]
    - connector: tickets   #!
      allowed_actions: [create_ticket]
""",
        ("tickets", "twice"),
    ),
}


@pytest.mark.parametrize("case", sorted(AGENT_PROBLEMS))
def test_agent_problem_is_reported_with_file_and_line(tmp_path: Path, case: str) -> None:
    write(tmp_path, "tickets.yaml", TICKETS)
    text, fragments = AGENT_PROBLEMS[case]
    path = write(tmp_path, "agents/bot.yaml", text)
    (line,) = marked_lines(text)
    assert_reported(tmp_path, path, line, *fragments)


@pytest.mark.parametrize("name", ["bad:name", "Desk-Bot", "desk.eu", "desk-eu", "Desk", "_desk", "9desk", "a" * 64])
@pytest.mark.parametrize("kind", ["connector", "agent_app"])
def test_names_outside_the_key_safe_charset_are_refused_with_the_rule(tmp_path: Path, kind: str, name: str) -> None:
    """Redis keys start with "<agent>:" and "<connector>:", so no ':' or '.' (and one spelling
    per name: lowercase only)."""
    if kind == "connector":
        text = (
            f"connector:\n  name: {name}   #!\n  endpoint: http://127.0.0.1:8000\n"
            "  actions:\n    - action: a\n      path: GET /a\n"
        )
    else:
        write(tmp_path, "tickets.yaml", TICKETS)
        text = (
            f"agent_app:\n  name: {name}   #!\n  connector_bindings:\n    - connector: tickets\n"
            "      allowed_actions: [query_ticket]\n"
        )
    path = write(tmp_path, "named.yaml", text)
    assert_reported(tmp_path, path, 2, repr(name), "^[a-z][a-z0-9_]{0,62}$")


@pytest.mark.parametrize("name", ["d", "desk", "desk_eu", "ticket_desk_bot2", "a" * 63])
def test_lowercase_names_with_digits_and_underscores_are_accepted(tmp_path: Path, name: str) -> None:
    write(tmp_path, "tickets.yaml", TICKETS)
    write(
        tmp_path,
        "named.yaml",
        f"agent_app:\n  name: {name}\n  connector_bindings:\n    - connector: tickets\n"
        "      allowed_actions: [query_ticket]\n",
    )
    assert name in catalog_of(tmp_path).agents


def test_duplicate_connector_names_across_files_point_at_the_second_declaration(tmp_path: Path) -> None:
    write(tmp_path, "a_tickets.yaml", TICKETS)
    second = "connector:\n  name: tickets   #!\n  endpoint: http://127.0.0.1:9000\n  actions:\n    - action: ping\n      path: GET /ping\n"
    path = write(tmp_path, "b_tickets.yaml", second)
    assert_reported(tmp_path, path, 2, "tickets", "declared twice")


def test_duplicate_agent_names_point_at_the_second_declaration(tmp_path: Path) -> None:
    write(tmp_path, "tickets.yaml", TICKETS)
    text = """\
agent_app:
  name: bot
  connector_bindings:
    - connector: tickets
      allowed_actions: [query_ticket]
---
agent_app:
  name: bot   #!
  connector_bindings:
    - connector: tickets
      allowed_actions: [create_ticket]
"""
    path = write(tmp_path, "bots.yaml", text)
    assert_reported(tmp_path, path, marked_lines(text)[0], "bot", "declared twice")


def test_duplicate_action_names_are_reported(tmp_path: Path) -> None:
    text = TICKETS + "    - action: query_ticket\n      path: GET /other\n"
    write(tmp_path, "tickets.yaml", text)
    problems = problems_of(tmp_path)
    assert any("query_ticket" in p.message and "twice" in p.message for p in problems)
    assert validate(tmp_path).exit_code == 1


def test_duplicate_action_names_point_at_the_second_action(tmp_path: Path) -> None:
    text = TICKETS + "    - action: query_ticket   #!\n      path: GET /other\n"
    path = write(tmp_path, "tickets.yaml", text)
    assert_reported(tmp_path, path, marked_lines(text)[0], "query_ticket", "twice")


def test_duplicate_yaml_keys_point_at_the_repeated_key(tmp_path: Path) -> None:
    text = """\
connector:
  name: c
  endpoint: http://127.0.0.1:8000
  actions:
    - action: a
      path: GET /a
      path: GET /b   #!
"""
    path = write(tmp_path, "dup.yaml", text)
    assert_reported(tmp_path, path, 7, "path", "twice")


def test_every_duplicate_yaml_key_of_a_document_is_reported(tmp_path: Path) -> None:
    text = """\
connector:
  name: c
  name: d   #!
  endpoint: http://127.0.0.1:8000
  actions:
    - action: a
      path: GET /a
      path: GET /b   #!
"""
    path = write(tmp_path, "dup.yaml", text)
    for line in marked_lines(text):
        assert_reported(tmp_path, path, line, "twice")


@pytest.mark.parametrize(
    "text, line, fragment",
    [
        ("connector:\n  name: c\n  endpoint: http://x\n   actions: []\n", 4, "not valid YAML"),
        ("connector:\n  name: c\n  actions: [a, b\n", 4, "not valid YAML"),
        ("connector:\n  name: 'c\n", 3, "not valid YAML"),
    ],
)
def test_invalid_yaml_syntax_is_reported_with_its_line(tmp_path: Path, text: str, line: int, fragment: str) -> None:
    path = write(tmp_path, "broken.yaml", text)
    assert_reported(tmp_path, path, line, fragment)


def test_invalid_yaml_in_one_file_does_not_hide_problems_in_another(tmp_path: Path) -> None:
    write(tmp_path, "a.yaml", "connector:\n  name: c\n  endpoint: http://x\n   actions: []\n")
    other = write(
        tmp_path,
        "b.yaml",
        "agent_app:\n  name: bot\n  connector_bindings:\n    - connector: ghost\n      allowed_actions: [x]\n",
    )
    assert_reported(tmp_path, other, 4, "ghost")


def test_invalid_yaml_in_a_later_document_keeps_nothing_of_its_file(tmp_path: Path) -> None:
    """Documents are read one at a time, but a file that is not valid YAML is still one problem
    and none of its documents, not even those before the broken one, join the catalog."""
    text = TICKETS + "---\nagent_app:\n  name: bot\n  connector_bindings: [\n"
    broken = write(tmp_path, "tickets.yaml", text)
    other = write(
        tmp_path,
        "bots.yaml",
        "agent_app:\n  name: helper\n  connector_bindings:\n"
        "    - connector: tickets   #!\n      allowed_actions: [query_ticket]\n",
    )
    problems = problems_of(tmp_path)
    in_broken = [p for p in problems if p.file == str(broken)]
    assert len(in_broken) == 1 and "not valid YAML" in in_broken[0].message, problems
    assert in_broken[0].line == len(textwrap.dedent(text).splitlines()) + 1
    assert_reported(tmp_path, other, 4, "unknown connector", "tickets")


def test_a_file_only_pyyaml_reads_loads_as_before_libyaml_was_used(tmp_path: Path) -> None:
    """libyaml refuses a ':' right before '}' in a flow mapping; PyYAML reads `extra:` as a key
    with no value. Such a file is read again by PyYAML: its real problem is named, and its other
    documents load."""
    text = (
        TICKETS.replace(
            "title: { type: string, required: true }", "title: { type: string, required: true, extra:}   #!"
        )
        + "---\nagent_app:\n  name: bot\n  connector_bindings:\n    - connector: nowhere   #!\n"
        "      allowed_actions: [x]\n"
    )
    path = write(tmp_path, "tickets.yaml", text)
    problems = problems_of(tmp_path)
    assert not any("not valid YAML" in p.message for p in problems), problems
    assert_reported(tmp_path, path, marked_lines(text)[0], "extra", "unknown key")
    assert_reported(tmp_path, path, marked_lines(text)[1], "unknown connector", "nowhere")


def test_a_file_no_parser_reads_gets_pyyamls_message(tmp_path: Path) -> None:
    path = write(tmp_path, "broken.yaml", "connector:\n  name: *nowhere\n")
    assert_reported(tmp_path, path, 2, "not valid YAML", "nowhere")


def test_a_file_changed_between_loading_and_building_names_the_documents_first_line(tmp_path: Path) -> None:
    text = (
        TICKETS + "---\nagent_app:   #!\n  name: bot\n  connector_bindings:\n    - connector: ghost\n"
        "      allowed_actions: [x]\n"
    )
    path = write(tmp_path, "tickets.yaml", text)
    loaded = load_directory(tmp_path)
    path.write_text("connector: {}\n---\n" + textwrap.dedent(text), encoding="utf-8")
    _, problems = build(loaded)
    ghost = [p for p in problems if "ghost" in p.message]
    assert [(p.file, p.line) for p in ghost] == [(str(path), marked_lines(text)[0])]


@pytest.mark.parametrize(
    "document, line",
    [
        ("foo:\n  bar: 1\n", 1),
        (
            "connector:\n  name: c\n  endpoint: http://127.0.0.1:1\n  actions: [{action: a, path: GET /a}]\nagent_app:\n  name: b\n",
            1,
        ),
        ("- just\n- a list\n", 1),
        ("hello\n", 1),
    ],
)
def test_document_that_is_neither_connector_nor_agent_app_is_a_problem(
    tmp_path: Path, document: str, line: int
) -> None:
    text = TICKETS + "---\n" + document
    path = write(tmp_path, "mixed.yaml", text)
    assert_reported(tmp_path, path, TICKETS.count("\n") + 1 + line, "a document must hold exactly one of connector:")


def test_all_problems_of_a_file_are_reported_in_one_run(tmp_path: Path) -> None:
    text = """\
connector:
  name: c
  endpoint: http://127.0.0.1:8000
  actions:
    - action: a
      path: GET /a
      input:
        q:
          type: string
          requried: true   #!
    - action: b
      path: FETCH /b   #!
    - action: d
      path: GET /d
      timeout: 5 seconds   #!
---
agent_app:
  name: bot
  connector_bindings:
    - connector: tickets
      allowed_actions: [query_ticket]
      rate_limit: 10/day   #!
---
something_else: true   #!
---
agent_app:
  name: bot2
  connector_bindings:
    - connector: tickets
      allowed_actions: [reopen_ticket]   #!
"""
    write(tmp_path, "tickets.yaml", TICKETS)
    path = write(tmp_path, "many.yaml", text)
    expected = marked_lines(text)
    got = [p.line for p in problems_of(tmp_path) if p.file == str(path)]
    assert got == expected
    result = validate(tmp_path)
    assert result.exit_code == 1
    for line in expected:
        assert f"{path}:{line}:" in result.stdout
    assert f"{len(expected)} problem(s)" in result.stderr


def test_structural_problems_are_reported_alongside_field_problems(tmp_path: Path) -> None:
    text = """\
connector:
  name: c
  endpoint: http://127.0.0.1:8000
  actions:
    - action: a   #!
      path: GET /a/{id}
      timeout: 5   #!
    - action: b
      path: GET /b
      input:
        q: { type: strng }   #!
    - action: b   #!
      path: GET /b2
"""
    path = write(tmp_path, "c.yaml", text)
    assert [p.line for p in problems_of(tmp_path) if p.file == str(path)] == marked_lines(text)


def test_default_outside_the_enum_values_is_a_problem(tmp_path: Path) -> None:
    text = """\
connector:
  name: c
  endpoint: http://127.0.0.1:8000
  actions:
    - action: a
      path: POST /a
      input:
        priority:
          type: enum
          values: [low, medium, high]
          default: urgent   #!
"""
    path = write(tmp_path, "c.yaml", text)
    assert_reported(tmp_path, path, marked_lines(text)[0], "default")


def test_binding_to_a_broken_connector_is_not_reported_twice(tmp_path: Path) -> None:
    text = "connector:\n  name: c\n  endpoint: http://127.0.0.1:1\n  actions:\n    - action: a\n      path: FETCH /a\n"
    write(tmp_path, "c.yaml", text)
    write(
        tmp_path,
        "bot.yaml",
        "agent_app:\n  name: bot\n  connector_bindings:\n    - connector: c\n      allowed_actions: [a]\n",
    )
    problems = problems_of(tmp_path)
    assert len(problems) == 1 and "FETCH" in problems[0].message


# -- reach catalog ----------------------------------------------------------------------------

TWO_BOTS = """\
---
agent_app:
  name: reader_bot
  connector_bindings:
    - connector: tickets
      allowed_actions: [query_ticket]
---
agent_app:
  name: writer_bot
  connector_bindings:
    - connector: tickets
      allowed_actions: [create_ticket]
"""


def run_catalog(directory: Path, *args: str) -> Result:
    return CliRunner().invoke(main, ["catalog", "--dir", str(directory), *args])


def _tools_in(fmt: str, output: str) -> dict[str, tuple[str, dict]]:
    """name -> (description, input schema) whatever the format's shape."""
    doc = json.loads(output)
    out = {}
    for tool in doc:
        if fmt == "openai":
            assert tool["type"] == "function"
            fn = tool["function"]
            out[fn["name"]] = (fn["description"], fn["parameters"])
        elif fmt == "mcp":
            out[tool["name"]] = (tool["description"], tool["inputSchema"])
        else:
            out[tool["name"]] = (tool["description"], tool["input_schema"])
    return out


@pytest.mark.parametrize("fmt", ["openai", "anthropic", "mcp", "json"])
def test_catalog_for_an_agent_lists_only_its_actions_as_tools(tmp_path: Path, fmt: str) -> None:
    write(tmp_path, "tickets.yaml", TICKETS + TWO_BOTS)
    result = run_catalog(tmp_path, "--agent", "writer_bot", "--format", fmt)
    assert result.exit_code == 0, result.output
    tools = _tools_in(fmt, result.stdout)
    assert list(tools) == ["tickets__create_ticket"]
    _, schema = tools["tickets__create_ticket"]
    assert schema["type"] == "object"
    assert schema["additionalProperties"] is False
    assert schema["required"] == ["title"]
    assert schema["properties"]["priority"]["enum"] == ["low", "medium", "high"]
    assert schema["properties"]["priority"]["default"] == "medium"

    result = run_catalog(tmp_path, "--agent", "reader_bot", "--format", fmt)
    assert list(_tools_in(fmt, result.stdout)) == ["tickets__query_ticket"]


def test_catalog_without_agent_lists_every_action(tmp_path: Path) -> None:
    write(tmp_path, "tickets.yaml", TICKETS + TWO_BOTS)
    result = run_catalog(tmp_path, "--format", "json")
    assert result.exit_code == 0
    assert sorted(_tools_in("json", result.stdout)) == ["tickets__create_ticket", "tickets__query_ticket"]


def test_catalog_table_for_an_agent_shows_only_its_actions(tmp_path: Path) -> None:
    write(tmp_path, "tickets.yaml", TICKETS + TWO_BOTS)
    result = run_catalog(tmp_path, "--agent", "reader_bot")
    assert result.exit_code == 0, result.output
    assert "tickets.query_ticket" in result.stdout
    assert "GET /tickets/{tid}" in result.stdout
    assert "tid*" in result.stdout
    assert "create_ticket" not in result.stdout


def test_catalog_for_an_unknown_agent_fails_with_the_known_names(tmp_path: Path) -> None:
    write(tmp_path, "tickets.yaml", TICKETS + TWO_BOTS)
    result = run_catalog(tmp_path, "--agent", "nobody", "--format", "openai")
    assert result.exit_code != 0
    assert "no agent_app named 'nobody'" in result.output
    assert "reader_bot" in result.output and "writer_bot" in result.output
    assert "tickets__" not in result.stdout


def test_catalog_for_an_unknown_agent_exits_with_the_usage_code(tmp_path: Path) -> None:
    write(tmp_path, "tickets.yaml", TICKETS + TWO_BOTS)
    assert run_catalog(tmp_path, "--agent", "nobody").exit_code == 2


def test_catalog_on_a_broken_catalog_exits_with_the_configuration_code(tmp_path: Path) -> None:
    write(
        tmp_path,
        "c.yaml",
        "connector:\n  name: c\n  endpoint: http://x\n  actions:\n    - action: a\n      path: FETCH /a\n",
    )
    result = run_catalog(tmp_path, "--format", "json")
    assert result.exit_code == 2
    assert "FETCH" in result.stderr


# -- Catalog.resolve and check_permission -----------------------------------------------------

TWO_SYSTEMS = """\
connector:
  name: helpdesk
  domain: customer_service
  endpoint: http://127.0.0.1:8001
  actions:
    - action: create_ticket
      path: POST /tickets
      permission: write
    - action: query_ticket
      path: GET /tickets/{tid}
      input:
        tid: { type: string, required: true }
---
connector:
  name: itsm
  domain: it_ops
  endpoint: http://127.0.0.1:8002
  actions:
    - action: create_ticket
      path: POST /incidents
      permission: write
---
agent_app:
  name: both_bot
  connector_bindings:
    - connector: helpdesk
      allowed_actions: [create_ticket, query_ticket]
    - connector: itsm
      allowed_actions: ["*"]
---
agent_app:
  name: helpdesk_bot
  connector_bindings:
    - connector: helpdesk
      allowed_actions: [create_ticket]
---
agent_app:
  name: idle_bot
"""


@pytest.fixture()
def two_systems(tmp_path: Path) -> Catalog:
    write(tmp_path, "systems.yaml", TWO_SYSTEMS)
    return catalog_of(tmp_path)


def resolved(result: ActionRef | Refusal) -> str:
    assert isinstance(result, ActionRef), result
    return result.qualified


@pytest.mark.parametrize("name", ["query_ticket", "helpdesk.query_ticket", "helpdesk__query_ticket"])
def test_resolve_accepts_bare_dotted_and_tool_names(two_systems: Catalog, name: str) -> None:
    assert resolved(two_systems.resolve(name, "both_bot")) == "helpdesk.query_ticket"


@pytest.mark.parametrize(
    "name, expected",
    [
        ("itsm.create_ticket", "itsm.create_ticket"),
        ("itsm__create_ticket", "itsm.create_ticket"),
        ("helpdesk__create_ticket", "helpdesk.create_ticket"),
    ],
)
def test_a_qualified_name_picks_its_connector_among_several(two_systems: Catalog, name: str, expected: str) -> None:
    assert resolved(two_systems.resolve(name, "both_bot")) == expected


def test_unknown_action_suggests_the_closest_visible_action(two_systems: Catalog) -> None:
    result = two_systems.resolve("query_tiket", "both_bot")
    assert isinstance(result, Refusal)
    assert result.code is ErrorCode.UNKNOWN_ACTION
    assert (result.code.status, result.code.retryable) == ("rejected", False)
    assert "query_tiket" in result.message
    assert "Did you mean helpdesk.query_ticket?" in result.suggestion


@pytest.mark.parametrize("name", ["helpdesk.close_ticket", "crm.query_ticket", "crm__query_ticket", "nothing"])
def test_unknown_qualified_or_bare_names_are_unknown_actions(two_systems: Catalog, name: str) -> None:
    result = two_systems.resolve(name, "both_bot")
    assert isinstance(result, Refusal) and result.code is ErrorCode.UNKNOWN_ACTION
    assert name in result.message


def test_same_action_on_two_bound_connectors_is_ambiguous_naming_both(two_systems: Catalog) -> None:
    result = two_systems.resolve("create_ticket", "both_bot")
    assert isinstance(result, Refusal)
    assert result.code is ErrorCode.AMBIGUOUS_ACTION
    assert (result.code.status, result.code.retryable) == ("rejected", False)
    for candidate in ("helpdesk.create_ticket", "itsm.create_ticket"):
        assert candidate in result.message and candidate in result.suggestion


def test_the_agents_bindings_decide_when_it_is_bound_to_one_candidate(two_systems: Catalog) -> None:
    assert resolved(two_systems.resolve("create_ticket", "helpdesk_bot")) == "helpdesk.create_ticket"


@pytest.mark.parametrize(
    "domain, expected", [("customer_service", "helpdesk.create_ticket"), ("it_ops", "itsm.create_ticket")]
)
def test_the_context_domain_decides_between_bound_connectors(two_systems: Catalog, domain: str, expected: str) -> None:
    assert resolved(two_systems.resolve("create_ticket", "both_bot", domain=domain)) == expected


def test_an_unmatched_domain_leaves_the_action_ambiguous(two_systems: Catalog) -> None:
    result = two_systems.resolve("create_ticket", "both_bot", domain="finance")
    assert isinstance(result, Refusal) and result.code is ErrorCode.AMBIGUOUS_ACTION


def test_permission_is_denied_for_an_unbound_action(two_systems: Catalog) -> None:
    ref = two_systems.resolve("itsm.create_ticket", "helpdesk_bot")
    assert isinstance(ref, ActionRef)
    refusal = two_systems.check_permission("helpdesk_bot", ref)
    assert refusal is not None and refusal.code is ErrorCode.PERMISSION_DENIED
    assert "itsm.create_ticket" in refusal.message
    assert "helpdesk.create_ticket" in refusal.suggestion  # what it may use instead
    assert (refusal.code.status, refusal.code.retryable) == ("rejected", False)


def test_permission_is_denied_for_an_agent_without_bindings(two_systems: Catalog) -> None:
    ref = two_systems.resolve("helpdesk.query_ticket", "idle_bot")
    assert isinstance(ref, ActionRef)
    refusal = two_systems.check_permission("idle_bot", ref)
    assert refusal is not None and refusal.code is ErrorCode.PERMISSION_DENIED


def test_permission_is_denied_for_an_unknown_agent(two_systems: Catalog) -> None:
    ref = two_systems.resolve("helpdesk.query_ticket", "ghost")
    assert isinstance(ref, ActionRef)
    refusal = two_systems.check_permission("ghost", ref)
    assert refusal is not None and refusal.code is ErrorCode.PERMISSION_DENIED
    assert "ghost" in refusal.message and "not registered" in refusal.message


@pytest.mark.parametrize("name", ["helpdesk.create_ticket", "itsm.create_ticket", "helpdesk.query_ticket"])
def test_permission_is_granted_for_bound_and_wildcard_actions(two_systems: Catalog, name: str) -> None:
    ref = two_systems.resolve(name, "both_bot")
    assert isinstance(ref, ActionRef)
    assert two_systems.check_permission("both_bot", ref) is None


@pytest.mark.parametrize("agent", ["idle_bot", "ghost"])
def test_a_shared_action_the_agent_may_use_on_no_connector_is_permission_denied(
    two_systems: Catalog, agent: str
) -> None:
    result = two_systems.resolve("create_ticket", agent)
    assert isinstance(result, Refusal)
    assert result.code is ErrorCode.PERMISSION_DENIED


def test_a_kubernetes_configmap_volume_is_read_once(tmp_path: Path) -> None:
    """The kubelet writes ..<timestamp>/FILE plus FILE -> ..data/FILE symlinks; hidden parts are skipped."""
    import os

    stamp = tmp_path / "..2026_11_29_12_00_00.000000001"
    stamp.mkdir()
    (stamp / "tickets.yaml").write_text(
        "connector:\n  name: t\n  endpoint: http://127.0.0.1:9\n  actions:\n    - action: a\n      path: GET /a\n"
    )
    os.symlink(stamp.name, tmp_path / "..data")
    os.symlink("..data/tickets.yaml", tmp_path / "tickets.yaml")
    result = load_directory(tmp_path)
    assert result.problems == [] and [c.model.name for c in result.connectors] == ["t"]
