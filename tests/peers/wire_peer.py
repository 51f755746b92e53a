"""A second process for wire integration tests: a socket server and a pipe child.

It binds the unix socket named on its command line, answers calls with
``melchior.wire.server.Answerer``, reads pipe events from stdin and echoes them back as
``pong`` events on stdout, and exits when stdin closes, as a session's serve does.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from melchior.wire import Refused, lines
from melchior.wire.codec import JSONObject, WireError
from melchior.wire.server import Answerer


async def on_call(name: str, args: list[Any], msg: JSONObject) -> list[Any]:
    if name == "echo":
        return args
    if name == "refuse":
        raise Refused("refused on purpose", code="test")
    raise Refused(f"unknown verb {name!r}", code="unknown-verb")


async def main(path: str) -> None:
    seen_events: list[JSONObject] = []

    async def on_event(msg: JSONObject) -> None:
        seen_events.append(msg)

    async def calls(name: str, args: list[Any], msg: JSONObject) -> list[Any]:
        if name == "events":
            return list(seen_events)
        return await on_call(name, args, msg)

    loop = asyncio.get_running_loop()
    server = await loop.create_unix_server(lambda: Answerer(calls, on_event, limit=1024), path=path)
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    out = sys.stdout.buffer
    lines.write_sync(out, {"event": "listening", "at": path})
    async for item in lines.aiter_messages(reader):
        if isinstance(item, WireError):
            lines.write_sync(out, {"event": "refused", "reason": item.reason})
        else:
            lines.write_sync(out, {"event": "pong", "got": item})
    server.close()
    await server.wait_closed()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
