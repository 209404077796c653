"""Field patterns from a catalog, run in time linear in the input.

A field's ``pattern`` is applied to agent input, and catalogs copy patterns verbatim from vendors'
OpenAPI documents. On a backtracking engine (Python's ``re``) one short string can cost minutes
of CPU: ``^([a-zA-Z0-9]+\\s?)*$`` spends 130 s on 32 characters, holding the GIL the whole time, so
the process also misses its broker heartbeats. Patterns therefore run on RE2 (google-re2): its time
is linear in the input, its memory per pattern is capped (``MAX_PROGRAM_MEMORY``), and it releases
the GIL while it matches.

RE2 has no lookaround and no backreferences; a pattern that needs them is refused when the catalog
loads (``reach validate`` names file and line) and left out, with a note, by ``reach import
openapi``. A few spellings that Python or ECMA-262 (JSON Schema's dialect) accept and RE2 spells
differently are translated first: ``\\Z`` → ``\\z``, ``\\uXXXX`` / ``\\UXXXXXXXX`` → ``\\x{...}``,
and ``{,n}`` → ``{0,n}``. Where the engines differ in meaning, RE2's is the stricter one: ``$``
matches only at the very end (Python's also before a final newline) and ``\\d``, ``\\w``, ``\\s`` are
ASCII classes, as in JSON Schema.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import re2

MAX_PATTERN_CHARS = 1000  # longer patterns are refused: nothing a field needs is that long
MAX_PROGRAM_MEMORY = 2 << 20  # RE2's budget per pattern (compiled program and DFA cache), bytes

_OPTIONS = re2.Options()
_OPTIONS.log_errors = False  # a refused pattern is reported as data, not printed to stderr by C++
_OPTIONS.max_mem = MAX_PROGRAM_MEMORY

_HEX4 = re.compile(r"[0-9A-Fa-f]{4}")
_HEX8 = re.compile(r"[0-9A-Fa-f]{8}")
_UPTO = re.compile(r"\{,(\d+)\}")

# Why RE2 refuses a construct, in words a catalog author can act on.
_REASONS = (
    ("(?=", "a lookahead (?=...)"),
    ("(?!", "a negative lookahead (?!...)"),
    ("(?<=", "a lookbehind (?<=...)"),
    ("(?<!", "a negative lookbehind (?<!...)"),
    ("(?>", "an atomic group (?>...)"),
)


class PatternError(ValueError):
    """A pattern that cannot run in linear time, or is not a regular expression at all."""


@dataclass(frozen=True)
class Pattern:
    """A compiled field pattern. ``source`` is the catalog's text; ``search`` never backtracks."""

    source: str
    _compiled: Any

    def search(self, value: str) -> bool:
        """Whether the pattern matches anywhere in ``value`` (JSON Schema's ``pattern`` semantics).

        A value with a lone surrogate (a system's JSON ``"\\ud800"``; agents' are refused earlier)
        is not Unicode text, and RE2 matches UTF-8: it never matches, rather than raise in a check.
        """
        try:
            return self._compiled.search(value) is not None
        except UnicodeEncodeError:
            return False


def translate(source: str) -> str:
    """Rewrite the spellings RE2 lacks but has an equivalent for (see the module docstring).

    Escapes are read pairwise, so ``\\\\Z`` (a backslash, then Z) stays as it is.
    """
    out: list[str] = []
    i, n, in_class = 0, len(source), False
    while i < n:
        ch = source[i]
        if ch == "\\" and i + 1 < n:
            nxt = source[i + 1]
            if nxt == "Z" and not in_class:
                out.append("\\z")
                i += 2
                continue
            if nxt == "u" and _HEX4.fullmatch(source, i + 2, i + 6):
                out.append("\\x{" + source[i + 2 : i + 6] + "}")
                i += 6
                continue
            if nxt == "U" and _HEX8.fullmatch(source, i + 2, i + 10):
                out.append("\\x{" + source[i + 2 : i + 10] + "}")
                i += 10
                continue
            out.append(source[i : i + 2])
            i += 2
            continue
        if in_class:
            if ch == "]":
                in_class = False
        elif ch == "[":
            in_class = True
            # a ']' right after '[' or '[^' is a literal member, not the end of the class
            lead = 2 if source.startswith("[^", i) else 1
            if source.startswith("]", i + lead):
                out.append(source[i : i + lead + 1])
                i += lead + 1
                continue
        elif ch == "{":
            upto = _UPTO.match(source, i)
            if upto is not None:
                out.append("{0," + upto.group(1) + "}")
                i = upto.end()
                continue
        out.append(ch)
        i += 1
    return "".join(out)


def compile_pattern(source: str) -> Pattern:
    """Compile a catalog pattern for RE2, translating first; raises :class:`PatternError`."""
    if len(source) > MAX_PATTERN_CHARS:
        raise PatternError(f"pattern is {len(source)} characters long; at most {MAX_PATTERN_CHARS} are allowed")
    try:
        compiled = re2.compile(translate(source), _OPTIONS)
    except re2.error as exc:
        raise PatternError(f"pattern {source!r} is refused: {_reason(source, exc)}") from exc
    return Pattern(source, compiled)


def _reason(source: str, exc: Exception) -> str:
    for needle, words in _REASONS:
        if needle in source:
            return f"it uses {words}, which RE2 (the linear-time engine) does not support"
    detail = exc.args[0] if exc.args else exc
    if isinstance(detail, bytes):
        detail = detail.decode("utf-8", "replace")
    if re.search(r"\\[1-9]", source):
        return "it uses a backreference (\\1...), which RE2 (the linear-time engine) does not support"
    if "pattern too large" in str(detail):
        return f"it compiles to more than {MAX_PROGRAM_MEMORY >> 20} MiB; simplify it (e.g. smaller repetition counts)"
    return f"it is not a regular expression RE2 can read ({detail})"
