"""The stdio wire served by the event loop: whole lines in, bounded; answers out without blocking the loop."""

from __future__ import annotations

import os
import time

import anyio

from workers.mcp.stdio import Lines, Writer, claimed, usable


def read_all(chunks: list[bytes], limit: int = 100) -> list[str]:
    read_fd, write_fd = os.pipe()

    async def run() -> list[str]:
        got: list[str] = []

        async def feed() -> None:
            for chunk in chunks:
                os.write(write_fd, chunk)
                await anyio.sleep(0.01)  # each chunk arrives on its own
            os.close(write_fd)

        async with anyio.create_task_group() as tg:
            tg.start_soon(feed)
            async for line in Lines(read_fd, limit):
                got.append(line)
        return got

    try:
        return anyio.run(run)
    finally:
        os.close(read_fd)


def test_lines_come_whole_however_they_arrive() -> None:
    chunks = [b'{"a":', b' 1}\n{"b": 2}\n{"c"', b": 3}\n", '{"é": 4}\n'.encode(), b'{"last": 5}']
    assert read_all(chunks) == ['{"a": 1}\n', '{"b": 2}\n', '{"c": 3}\n', '{"é": 4}\n', '{"last": 5}']


def test_a_line_longer_than_the_limit_is_skipped_as_an_empty_line() -> None:
    long = b"x" * 150
    assert read_all([long[:120], long[120:] + b"\n", b'{"next": 1}\n'], limit=100) == ["\n", '{"next": 1}\n']
    # an endless line costs at most the limit, and ends with the input
    assert read_all([b"y" * 90] * 5, limit=100) == []


def test_a_long_answer_is_written_whole_while_the_loop_keeps_running() -> None:
    read_fd, write_fd = os.pipe()
    text = "z" * 300_000 + "\n"  # several times what a pipe holds

    async def run() -> tuple[str, int]:
        received = bytearray()
        ticks = 0

        async def drain() -> None:
            while len(received) < len(text):
                await anyio.wait_readable(read_fd)
                received.extend(os.read(read_fd, 65536))
                await anyio.sleep(0.005)  # a slow reader: the writer must wait, not block

        async def tick() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await anyio.sleep(0.001)

        async with anyio.create_task_group() as tg:
            tg.start_soon(drain)
            tg.start_soon(tick)
            started = time.monotonic()
            await Writer(write_fd).write(text)
            await Writer(write_fd).flush()
            assert time.monotonic() - started < 30
            while len(received) < len(text):
                await anyio.sleep(0.01)
            tg.cancel_scope.cancel()
        return received.decode(), ticks

    try:
        received, ticks = anyio.run(run)
    finally:
        os.close(read_fd)
        os.close(write_fd)
    assert received == text
    assert ticks > 5  # the loop ran other tasks while the answer was waiting for room


def test_while_serving_fds_0_and_1_point_away_from_the_wire_and_come_back_after() -> None:
    in_read, in_write = os.pipe()
    out_read, out_write = os.pipe()
    saved = os.dup(0), os.dup(1)
    try:
        os.dup2(in_read, 0)
        os.dup2(out_write, 1)
        assert usable(0) and usable(1)
        with claimed() as (wire_in, wire_out):
            os.write(1, b"stray output\n")  # goes to stderr, not to the wire
            os.write(wire_out, b"answer\n")
            os.write(in_write, b"request\n")
            assert os.read(wire_in, 100) == b"request\n"
            assert os.read(0, 100) == b""  # the null device
        assert os.read(out_read, 100) == b"answer\n"
        os.write(1, b"after\n")
        assert os.read(out_read, 100) == b"after\n"
    finally:
        os.dup2(saved[0], 0)
        os.dup2(saved[1], 1)
        for fd in (*saved, in_read, in_write, out_read, out_write):
            os.close(fd)


def test_a_device_or_a_file_keeps_the_sdk_streams() -> None:
    fd = os.open(os.devnull, os.O_RDONLY)
    try:
        assert not usable(fd)  # a character device, as a terminal is
    finally:
        os.close(fd)
