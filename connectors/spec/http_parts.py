"""The parts of an HTTP request a catalog writes: the method and path template, and header names.

Both are checked when the catalog loads (`reach validate`), never found out on a call.
"""

from __future__ import annotations

import re
from typing import Any

HTTP_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
PATH_PARAM = re.compile(r"\{([^{}]*)\}")
# an HTTP field name (RFC 7230 token), at most an AMQP short string: header names the catalog
# writes are checked by `reach validate`, not found out on every call (a newline in one broke them all)
HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,255}$")


def header_name_problem(what: str, name: str) -> str | None:
    """Why ``name`` cannot be an HTTP header name (``what`` says whose), or None."""
    if HEADER_NAME.fullmatch(name):  # (match would let a trailing newline through `$`)
        return None
    return (
        f"{what} {name[:80]!r} is not a valid HTTP header name: use 1-255 letters, digits and "
        "!#$%&'*+-.^_`|~ (no spaces, colons or control characters)"
    )


def split_path(path: str) -> tuple[str, str]:
    """``"POST /tickets/{tid}"`` -> ``("POST", "/tickets/{tid}")``."""
    parts = path.split(None, 1) if isinstance(path, str) else []
    if len(parts) != 2:
        raise ValueError(f"path {path!r} must be 'METHOD /template', e.g. 'GET /tickets/{{tid}}'")
    method, template = parts[0], parts[1].strip()
    if method not in HTTP_METHODS:
        raise ValueError(f"method {method!r} in path is not one of {', '.join(HTTP_METHODS)}")
    if not template.startswith("/") or "://" in template or any(c in template for c in " \t\r\n?#"):
        raise ValueError(
            f"template {template!r} must be an absolute path like /tickets/{{tid}} (no scheme, query or fragment)"
        )
    for name in PATH_PARAM.findall(template):
        if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", name):
            raise ValueError(f"path parameter {{{name}}} is not a valid name")
    return method, template


def path_param_problems(path: Any, placements: dict[str, Any]) -> list[str]:
    """Path parameters of ``path`` not declared in input, or declared elsewhere (name -> ``in``)."""
    try:
        _, template = split_path(path)
    except ValueError:
        return []  # reported as a bad path on its own
    named = PATH_PARAM.findall(template)
    problems = []
    for name in named:
        if name not in placements:
            problems.append(f"path parameter {{{name}}} is not declared in input")
        elif placements[name] not in (None, "path"):
            problems.append(f"path parameter {{{name}}} is declared with in: {placements[name]}")
    for name, place in placements.items():
        if place == "path" and name not in named:
            problems.append(f"input {name} has in: path but the template has no {{{name}}}")
    return problems
