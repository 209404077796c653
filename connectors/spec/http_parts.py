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


BODY_KINDS = ("json", "form", "multipart", "binary")


def body_problems(path: Any, body: str | None, fields: dict[str, Any]) -> list[str]:
    """What an action's ``body:`` kind and its fields' ``in:`` places say that cannot be sent.

    ``fields``: input name -> (``in``, ``type``, the ``items``' type or None), from a model or raw YAML.
    """
    try:
        method, template = split_path(path)
    except ValueError:
        method, template = "POST", ""  # a bad path is reported on its own (and a plugin type has none)
    kind = body or "json"
    named = set(PATH_PARAM.findall(template))
    default = "query" if method in ("GET", "DELETE") else "body"
    places = {name: place or ("path" if name in named else default) for name, (place, _, _) in fields.items()}
    files = [n for n, p in places.items() if p == "file"]
    whole = [n for n, p in places.items() if p == "whole_body"]
    parts = [n for n, p in places.items() if p == "body"]
    problems = []
    if body is not None and body != "json" and method == "GET":
        problems.append(f"body: {body} needs a method that sends a body (POST, PUT, PATCH or DELETE), not GET")
    if files and kind not in ("multipart", "binary"):
        problems.append(f"input {files[0]} has in: file, which needs body: multipart or body: binary")
    if whole and kind != "json":
        problems.append(f"input {whole[0]} has in: whole_body, which is a JSON body (body: json)")
    if len(whole) > 1:
        problems.append(f"only one input may be the whole body; {', '.join(whole)} all have in: whole_body")
    if whole and parts:
        problems.append(
            f"input {whole[0]} is the whole body, so no other input can go in the body ({', '.join(parts[:5])} "
            "do: give them in: query, header or path)"
        )
    if kind == "binary":
        if len(files) != 1:
            problems.append("body: binary sends one file as the whole body: declare exactly one input with in: file")
        if parts:
            problems.append(
                f"body: binary has no room for other body fields ({', '.join(parts[:5])}): give them "
                "in: query, header or path"
            )
    if kind in ("form", "multipart"):
        for name in parts:
            _, kind_of, items = fields[name]
            if kind_of == "object" or (kind_of == "array" and items in ("object", "array")):
                problems.append(
                    f"input {name} is an {kind_of}{' of ' + str(items) + 's' if kind_of == 'array' else ''}: "
                    f"a {kind} field carries text (or a list of texts); declare its parts as fields of their own"
                )
    return problems
