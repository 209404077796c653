"""How deep a JSON text nests, found before (and without) parsing it: an answer's bounds are checked
on its raw bytes, so no recursive decoder ever meets a hostile nesting. Used by the http and amqp
adapters on the answers they read."""

from __future__ import annotations

from array import array
from itertools import accumulate

_NOT_BRACKET = bytes(b for b in range(256) if b not in b"[]{}")
_ONE_KIND = bytes.maketrans(b"{}", b"[]")  # depth does not depend on which kind of bracket
_BRACKET_STEP = bytes.maketrans(b"[]", b"\x01\xff")  # +1 / -1 as signed bytes


def _brackets(raw: bytes) -> bytes:
    """The JSON text's brackets outside strings, in order. All in C, no parsing: escaped
    backslashes go first, then escaped quotes, so every quote left opens or closes a string."""
    unescaped = raw.replace(b"\\\\", b"").replace(b'\\"', b"")
    return b"".join(unescaped.split(b'"')[::2]).translate(_ONE_KIND, _NOT_BRACKET)


def json_depth(raw: bytes) -> int:
    """The deepest nesting of arrays and objects in a JSON text, found without parsing it (no
    recursion, so no limit a hostile answer can hit): brackets inside strings do not count."""
    return _nesting(_brackets(raw))


def _nesting(brackets: bytes) -> int:
    return max(accumulate(array("b", brackets.translate(_BRACKET_STEP))), default=0)


def depth_past(raw: bytes, limit: int) -> int | None:
    """How deep ``data`` would nest (one more than the answer when an array is wrapped in
    ``{"result": ...}``) if that is past ``limit``; None when within it, or not JSON nesting at all."""
    start = raw.lstrip(b" \t\r\n\xef\xbb\xbf")[:1]
    if start not in (b"[", b"{"):
        return None  # a scalar or text: never parsed recursively
    limit -= start == b"["
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return None  # the usual answer: too few brackets to nest that deep
    brackets = remaining = _brackets(raw)
    for _ in range(limit):  # each pass removes the innermost level (every container without one inside)
        peeled = remaining.replace(b"[]", b"")
        if not peeled:
            return None
        if len(peeled) == len(remaining):
            break  # unbalanced: only the exact figure can tell
        remaining = peeled
    depth = _nesting(brackets)  # past the limit (or unbalanced): worth the exact figure
    return depth + (start == b"[") if depth > limit else None
