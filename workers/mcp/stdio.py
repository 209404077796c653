"""stdin and stdout of ``reach mcp --stdio``, read and written by the event loop itself.

The SDK's ``stdio_server`` reads each line, and writes and flushes each answer, in a worker thread
(``anyio.wrap_file``): three thread hand-offs per call on top of the one the call itself needs,
each a wake-up of another thread and a wait for the GIL. When stdin and stdout are pipes or
sockets (as an MCP host starts its servers) the loop waits for them to be readable or writable
instead and then reads or writes what they take without blocking. Anything else (a terminal, a
file) keeps the SDK's own streams.

As the SDK does, fds 0 and 1 are pointed elsewhere while serving (stdin at the null device, stdout
at stderr), so nothing the process or its children print can corrupt the wire; the wire itself
is served from private duplicates, and fds 0 and 1 are restored at the end.
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any, cast

import anyio

# a pipe always takes this much when poll says writable (Linux: one free page), so a write of at
# most this never blocks the loop
CHUNK = 4096
READ_BYTES = 65536


def usable(fd: int) -> bool:
    """Whether the loop can wait on ``fd``: a pipe or a socket (not a file or a terminal)."""
    if sys.platform == "win32":
        return False
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


class Lines:
    """The lines arriving on ``fd``, as ``str`` with their newline; at most ``limit`` bytes each.

    A longer line is skipped up to its newline and yielded as an empty line instead, which the
    SDK's reader refuses as invalid JSON, so one oversized message costs no more than ``limit``
    bytes of memory.
    """

    def __init__(self, fd: int, limit: int) -> None:
        self._fd, self._limit = fd, limit
        self._buffer = bytearray()
        self._skipping = False
        self._eof = False

    def __aiter__(self) -> Lines:
        return self

    async def __anext__(self) -> str:
        while True:
            end = self._buffer.find(b"\n")
            if end >= 0:
                line = bytes(self._buffer[: end + 1])
                del self._buffer[: end + 1]
                if self._skipping:
                    self._skipping = False
                    return "\n"
                return line.decode("utf-8", errors="replace")
            if self._eof:
                if self._buffer and not self._skipping:
                    line = bytes(self._buffer)
                    self._buffer.clear()
                    return line.decode("utf-8", errors="replace")
                raise StopAsyncIteration
            if len(self._buffer) > self._limit:
                self._buffer.clear()
                self._skipping = True
            await anyio.wait_readable(self._fd)
            chunk = os.read(self._fd, READ_BYTES)  # readable: returns what is there, never blocks
            if chunk:
                self._buffer += chunk
            else:
                self._eof = True


class Writer:
    """Writes text to ``fd`` in chunks the pipe takes without blocking."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    async def write(self, text: str) -> None:
        data = memoryview(text.encode("utf-8"))
        while data:
            await anyio.wait_writable(self._fd)
            written = os.write(self._fd, data[:CHUNK])
            data = data[written:]

    async def flush(self) -> None:
        return None  # nothing is buffered here


@contextmanager
def claimed() -> Iterator[tuple[int, int]]:
    """Private duplicates of fds 0 and 1 to serve the wire from, while 0 reads the null device and
    1 writes to stderr; both restored at the end."""
    wire_in = os.dup(0)
    wire_out = os.dup(1)
    null = os.open(os.devnull, os.O_RDONLY)
    try:
        os.dup2(null, 0)
        os.dup2(2, 1)
        yield wire_in, wire_out
    finally:
        os.dup2(wire_in, 0)
        os.dup2(wire_out, 1)
        for fd in (null, wire_in, wire_out):
            os.close(fd)


@asynccontextmanager
async def stdio_streams(limit: int) -> AsyncIterator[tuple[Any, Any]]:
    """The SDK's stdio transport (its read and write streams), over the loop-served wire when
    stdin and stdout are pipes or sockets, else over its own thread-served streams."""
    from mcp.server.stdio import stdio_server

    if not (usable(0) and usable(1)):
        async with stdio_server() as streams:
            yield streams
        return
    with claimed() as (wire_in, wire_out):
        # duck-typed: the transport only iterates stdin's lines and awaits stdout's write and flush
        async with stdio_server(cast(Any, Lines(wire_in, limit)), cast(Any, Writer(wire_out))) as streams:
            yield streams
