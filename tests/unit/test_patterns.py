"""Field patterns run on RE2: linear time on agent input, and refused when the catalog loads if RE2
cannot run them (issue 30, item 1)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from connectors.patterns import MAX_PATTERN_CHARS, PatternError, compile_pattern, translate
from connectors.schema import compile_field
from connectors.spec import FieldSpec
from tests.unit.test_catalog_validate import assert_reported, catalog_of, marked_lines, write

# Patterns seen in vendors' OpenAPI documents and hand-written catalogs that backtrack
# exponentially on Python's re (the first costs 130 s of CPU on 32 characters there).
CATASTROPHIC = [
    r"^([a-zA-Z0-9]+\s?)*$",
    r"^(a+)+$",
    r"^(\w+\s?)*$",
    r"^([a-z0-9]+([-_.][a-z0-9]+)*)+@example\.com$",
    r"^(.*a){12}$",
]


def finishes(call: object, seconds: float = 20.0) -> bool:
    """Whether ``call()`` returns within ``seconds`` (a stalled match would not)."""
    done = threading.Event()

    def run() -> None:
        call()  # type: ignore[operator]
        done.set()

    threading.Thread(target=run, daemon=True).start()
    return done.wait(seconds)


@pytest.mark.parametrize("source", CATASTROPHIC)
def test_a_backtracking_pattern_answers_a_long_hostile_value(source: str) -> None:
    check = compile_field(FieldSpec(type="string", pattern=source))
    problems: list[object] = []
    hostile = "a" * 100_000 + "!"  # far past the 32 characters that stalled Python's re for minutes
    assert finishes(lambda: check(hostile, "f", problems))  # type: ignore[arg-type]
    assert [getattr(p, "code", None) for p in problems] == ["pattern"]


def test_matching_keeps_json_schema_semantics() -> None:
    assert compile_pattern(r"^[A-Z]{3}-[0-9]+$").search("ABC-12")
    assert not compile_pattern(r"^[A-Z]{3}-[0-9]+$").search("ABC-12x")
    assert compile_pattern(r"[0-9]").search("order 7")  # unanchored: a match anywhere, as JSON Schema
    assert compile_pattern(r"^\p{L}+$").search("Zürich")  # ECMA's Unicode classes run too
    # stricter than Python's re where the two differ: `$` is the very end, \d is ASCII
    assert not compile_pattern(r"^abc$").search("abc\n")
    assert not compile_pattern(r"^\d+$").search("١٢٣")


@pytest.mark.parametrize(
    ("source", "translated", "matches", "misses"),
    [
        (r"^abc\Z", r"^abc\z", "abc", "abc\n"),
        (r"^\u00e9+$", r"^\x{00e9}+$", "éé", "e"),
        (r"^a{,2}b$", r"^a{0,2}b$", "aab", "aaab"),
        (r"^[]a]+$", r"^[]a]+$", "a]a", "b"),
        (r"^\\Z$", r"^\\Z$", "\\Z", "Z"),  # an escaped backslash, then a literal Z
    ],
)
def test_spellings_re2_lacks_are_translated(source: str, translated: str, matches: str, misses: str) -> None:
    assert translate(source) == translated
    pattern = compile_pattern(source)
    assert pattern.search(matches) and not pattern.search(misses)


@pytest.mark.parametrize(
    ("source", "fragment"),
    [
        (r"^(?=.*\d).{8,}$", "lookahead"),
        (r"^(?!admin).*$", "negative lookahead"),
        (r"(?<=\$)\d+", "lookbehind"),
        (r"^(a)\1$", "backreference"),
        (r"^[a-z", "not a regular expression"),
        ("a" * (MAX_PATTERN_CHARS + 1), "at most"),
    ],
)
def test_patterns_re2_cannot_run_are_refused_with_the_reason(source: str, fragment: str) -> None:
    with pytest.raises(PatternError, match=fragment):
        compile_pattern(source)


VALIDATE_CASES = {
    "lookahead": (r"^(?=.*[0-9]).+$", "lookahead"),
    "backreference": (r"^(ab)\1$", "backreference"),
}


@pytest.mark.parametrize("case", sorted(VALIDATE_CASES))
def test_reach_validate_refuses_a_pattern_re2_cannot_run_with_file_and_line(tmp_path: Path, case: str) -> None:
    source, fragment = VALIDATE_CASES[case]
    text = f"""\
connector:
  name: c
  endpoint: http://127.0.0.1:8000
  actions:
    - action: a
      path: POST /a
      input:
        code:
          type: string
          pattern: '{source}'   #!
"""
    path = write(tmp_path, "bad.yaml", text)
    (line,) = marked_lines(text)
    assert_reported(tmp_path, path, line, "pattern", fragment)


def test_reach_validate_accepts_a_catastrophic_pattern_because_it_runs_in_linear_time(tmp_path: Path) -> None:
    write(
        tmp_path,
        "ok.yaml",
        r"""
        connector:
          name: c
          endpoint: http://127.0.0.1:8000
          actions:
            - action: a
              path: POST /a
              input:
                words: {type: string, pattern: '^([a-zA-Z0-9]+\s?)*$'}
        """,
    )
    assert catalog_of(tmp_path)
