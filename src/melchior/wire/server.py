"""One connection's worth of the socket rules, in one place.

Every socket in melchior answers the same way: a call gets exactly one reply
(result or refusal), an event gets none, a body that is not a usable message gets
a refusal and the connection carries on, and lost framing gets a refusal and then
the connection closes. Handlers only ever see well-formed calls and events.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

from melchior.wire import frames
from melchior.wire.codec import JSONObject, WireError
from melchior.wire.envelope import Refused, check_family, ok, refusal_of, refused, shape

CallHandler = Callable[[str, list[Any], JSONObject], Awaitable[list[Any]]]
EventHandler = Callable[[JSONObject], Awaitable[None]]


async def answer(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    on_call: CallHandler,
    on_event: EventHandler | None = None,
    *,
    limit: int | None = None,
) -> None:
    """Serve one connection until the peer closes it or the framing is lost."""
    try:
        while True:
            try:
                msg = await frames.read(reader, limit=limit)
            except WireError as exc:
                await _reply(writer, refusal_of(exc), limit)
                if exc.fatal:
                    return
                continue
            if msg is None:
                return
            await _dispatch(writer, msg, on_call, on_event, limit)
    except (ConnectionError, asyncio.IncompleteReadError):
        return
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


async def _dispatch(
    writer: asyncio.StreamWriter,
    msg: JSONObject,
    on_call: CallHandler,
    on_event: EventHandler | None,
    limit: int | None,
) -> None:
    rid = msg.get("id")
    try:
        kind = shape(msg)
        check_family(msg)
    except WireError as exc:
        await _reply(writer, refusal_of(exc, id=rid), limit)
        return
    if kind == "event":
        if on_event is not None:
            await on_event(msg)
        return
    if kind == "reply":
        await _reply(
            writer,
            refused("a reply was sent where a call was expected", code="bad-shape", id=rid),
            limit,
        )
        return
    try:
        result = await on_call(msg["call"], list(msg.get("args", [])), msg)
    except Refused as exc:
        await _reply(writer, refused(exc.reason, code=exc.code, id=rid, **exc.detail), limit)
        return
    except WireError as exc:
        await _reply(writer, refusal_of(exc, id=rid), limit)
        return
    await _reply(writer, ok(result, id=rid), limit)


async def _reply(writer: asyncio.StreamWriter, msg: JSONObject, limit: int | None) -> None:
    try:
        data = frames.pack(msg, limit=limit)
    except WireError as exc:
        data = frames.pack(
            refused(f"the answer could not be sent: {exc.reason}", code=exc.code, id=msg.get("id"))
        )
    writer.write(data)
    await writer.drain()
