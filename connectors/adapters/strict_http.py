"""Reading an HTTP/1.1 answer with ``http.client`` as strictly as h11 reads it, and checking a
request's headers as h11 checks them before anything is written.

The HTTP adapter's transport sends on ``http.client`` connections (through urllib3), whose
reading of an answer is lenient where h11 refuses: it skips only ``100 Continue``, keeps what it
can of a malformed header block, takes the last of two different ``Content-Length`` values, and
reads a body on a 204 that claims one. :class:`StrictResponse` refuses or ignores each as h11 does.
"""

from __future__ import annotations

import http.client
import re
from typing import Any

import httpx

MAX_HEAD_BYTES = 100 * 1024  # a status line and headers, or the trailers: httpcore's bound for h11

# h11's rules (RFC 9110): a name is a token; a value has no control characters, no line breaks
# and no blanks at either end
_HEADER_NAME = re.compile(rb"[-!#$%&'*+.^_`|~0-9a-zA-Z]+")
_HEADER_VALUE = re.compile(rb"(?:[\x21-\x7e\x80-\xff]+(?:[ \t]+[\x21-\x7e\x80-\xff]+)*)?")
_CHUNK_SIZE = re.compile(rb"[0-9A-Fa-f]{1,16}")

_FOLD = re.compile(r"[ \t]*\r?\n[ \t]+")


class _CountedLines:
    """The answer's reader while its head is read: bounds the head's bytes and tells whether the
    head ended with its blank line or with the connection."""

    def __init__(self, fp: Any) -> None:
        self.fp = fp
        self.left = MAX_HEAD_BYTES
        self.last = b"\r\n"

    def readline(self, limit: int = -1) -> bytes:
        line: bytes = self.fp.readline(limit)
        self.left -= len(line)
        if self.left < 0:
            raise http.client.HTTPException(f"the answer's head is longer than {MAX_HEAD_BYTES} bytes")
        self.last = line
        return line

    def __getattr__(self, name: str) -> Any:
        return getattr(self.fp, name)


class StrictResponse(http.client.HTTPResponse):
    """``http.client``'s reading of an answer, as strict as h11 where it is lenient."""

    def _read_status(self) -> tuple[str, int, str]:
        while True:  # http.client skips only 100 Continue; every interim answer but 101 goes
            version, status, reason = super()._read_status()  # type: ignore[misc]
            if not 100 <= status < 200 or status == 101:
                return version, status, reason
            http.client._read_headers(self.fp)  # type: ignore[attr-defined]  # the interim answer's headers

    def begin(self) -> None:
        fp = self.fp
        counted = _CountedLines(fp)
        self.fp = counted  # type: ignore[assignment]
        try:
            super().begin()
        finally:
            if self.fp is not None:  # None: http.client closed it
                self.fp = fp
        if counted.last not in (b"\r\n", b"\n"):  # the connection ended inside the head
            self._close_conn()  # type: ignore[attr-defined]
            raise http.client.IncompleteRead(b"")
        if "\x00" in self.reason or any("\x00" in value for value in self.msg.values()):  # as h11
            self._close_conn()  # type: ignore[attr-defined]
            raise http.client.HTTPException("a NUL in the answer's status line or headers")
        if self.msg.defects:  # e.g. a line that is not a header: what follows it was dropped
            self._close_conn()  # type: ignore[attr-defined]
            raise http.client.HTTPException(f"malformed headers in the answer ({self.msg.defects[0]!r})")
        codings = self.msg.get_all("transfer-encoding")
        if codings and [c.strip().lower() for c in ",".join(codings).split(",")] != ["chunked"]:
            self._close_conn()  # type: ignore[attr-defined]
            raise http.client.HTTPException(f"unsupported Transfer-Encoding {', '.join(codings)[:100]!r}")
        lengths = [value.strip() for value in self.msg.get_all("content-length") or []]
        if lengths and (not all(v.isascii() and v.isdigit() for v in lengths) or len(set(lengths)) > 1):
            self._close_conn()  # type: ignore[attr-defined]
            raise http.client.HTTPException(f"bad Content-Length in the answer: {', '.join(lengths)[:100]!r}")
        if len(lengths) > 1:  # the same length repeated: h11 hands on one
            del self.msg["content-length"]
            self.msg["Content-Length"] = lengths[0]
        if self.length == 0:  # 204, 304, an answer to HEAD: no body, whatever the headers claim
            self.chunked = False

    def _line(self, what: str) -> bytes:
        line: bytes = self.fp.readline(http.client._MAXLINE + 1)  # type: ignore[attr-defined]
        if len(line) > http.client._MAXLINE:  # type: ignore[attr-defined]
            raise http.client.LineTooLong(what)
        return line

    def _read_next_chunk_size(self) -> int:
        size = self._line("chunk size").split(b";", 1)[0].strip(b" \t\r\n")
        if not _CHUNK_SIZE.fullmatch(size):
            self._close_conn()  # type: ignore[attr-defined]
            raise ValueError(f"bad chunk size {size[:40]!r}")  # http.client makes it IncompleteRead
        return int(size, 16)

    def _read_and_discard_trailer(self) -> None:
        left = MAX_HEAD_BYTES
        while (line := self._line("trailer line")) not in (b"\r\n", b"\n", b""):
            left -= len(line)
            if left < 0:
                raise http.client.HTTPException(f"trailers longer than {MAX_HEAD_BYTES} bytes")


def check_request_headers(request: httpx.Request) -> None:
    """Refuse, before anything is written, a header h11 would refuse (an auth flow or a caller
    may set one with a line break or a NUL in it)."""
    for name, value in request.headers.raw:
        if not _HEADER_NAME.fullmatch(name) or not _HEADER_VALUE.fullmatch(value):
            raise httpx.LocalProtocolError(f"illegal header {name[:100]!r}", request=request)


def field_value(value: str) -> bytes:
    """A header value as h11 hands it on: no blanks at either end, folded lines joined by a space."""
    value = value.strip(" \t\r\n")
    if "\n" in value:
        value = _FOLD.sub(" ", value)
    return value.encode("latin-1")
