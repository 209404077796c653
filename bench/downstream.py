"""The benchmark's downstream "business system": a tiny asyncio HTTP/1.1 keep-alive server.

Stdlib only, one process, one thread. It answers quickly so that it is not what is measured:

    POST /tickets, POST /anything     201 {"ticket_id": "TK-<n>", "status": "open"}
    any path under /slow/...          the same, after SLOW_SECONDS (default 2 s; asyncio.sleep,
                                      so any number of slow calls wait at once)
    GET /health                       200 {"ok": true}
    GET /_stats                       200 {"requests": <calls answered>, "slow": <slow calls>}

    python bench/downstream.py [PORT] [--slow SECONDS]    # prints "READY <port>" when listening
"""

from __future__ import annotations

import asyncio
import json
import sys

STATS = {"requests": 0, "slow": 0}
SLOW_SECONDS = 2.0
_HEADERS = b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
_REASONS = {200: b"OK", 201: b"Created", 404: b"Not Found", 400: b"Bad Request"}


def _response(status: int, doc: object) -> bytes:
    body = json.dumps(doc, separators=(",", ":")).encode()
    return _HEADERS % (status, _REASONS[status], len(body)) + body


async def _handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, ConnectionError):
                return
            except asyncio.LimitOverrunError:
                writer.write(_response(400, {"detail": "header too large"}))
                return
            lines = head.split(b"\r\n")
            try:
                method, target, _ = lines[0].split(b" ", 2)
            except ValueError:
                writer.write(_response(400, {"detail": "bad request line"}))
                return
            length = 0
            close = False
            for line in lines[1:]:
                name, _, value = line.partition(b":")
                lname = name.strip().lower()
                if lname == b"content-length":
                    length = int(value.strip() or 0)
                elif lname == b"connection" and value.strip().lower() == b"close":
                    close = True
            if length:
                await reader.readexactly(length)
            path = target.split(b"?", 1)[0]
            if path == b"/health":
                writer.write(_response(200, {"ok": True}))
            elif path == b"/_stats":
                writer.write(_response(200, STATS))
            else:
                if path.startswith(b"/slow"):
                    STATS["slow"] += 1
                    await asyncio.sleep(SLOW_SECONDS)
                STATS["requests"] += 1
                writer.write(
                    _response(
                        201, {"ticket_id": f"TK-{STATS['requests']:06d}", "status": "open", "method": method.decode()}
                    )
                )
            if close:
                return
            if writer.transport.get_write_buffer_size() > 65536:
                await writer.drain()
    finally:
        writer.close()


async def _main(port: int) -> None:
    server = await asyncio.start_server(_handle, "127.0.0.1", port, backlog=1024, reuse_address=True)
    print(f"READY {server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    args = sys.argv[1:]
    if "--slow" in args:
        i = args.index("--slow")
        SLOW_SECONDS = float(args[i + 1])
        del args[i : i + 2]
    try:
        asyncio.run(_main(int(args[0]) if args else 0))
    except KeyboardInterrupt:
        pass
