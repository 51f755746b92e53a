"""Server-sent events for A2A streams: one ``data:`` line of JSON per event.

No ``id:`` fields (A2A streams are not resumed by Last-Event-ID; a client reconnects
with SubscribeToTask and gets a fresh snapshot); ``event: error`` marks a failure after
the stream began (the data is the binding's error body), as A2A clients expect. A
comment line is sent while nothing happens so proxies and idle timeouts do not cut a
quiet stream.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.responses import StreamingResponse

from melchior.mellan.relay.a2a import jsontext

KEEPALIVE_SECONDS = 15.0
HEADERS = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}

QUIET: dict[str, Any] = {}
"""Yielded (this very object) by an event source that looked and found nothing new, so
the stream can say it is alive: the source is driven in the response's own task, with
no task or wait per event between an event and its frame."""


_LINE_SEPARATORS = (("\u2028".encode(), b"\\u2028"), ("\u2029".encode(), b"\\u2029"))


def frame(obj: Any, event: str | None = None) -> bytes:
    """One SSE event. U+2028 and U+2029 are written escaped: they can only occur inside
    JSON strings, where an escape means the same character, and clients that split lines
    on them (JavaScript's, some Python ones) would otherwise cut the ``data:`` line and
    fail to parse it."""
    data = jsontext.dumpb(obj)
    for raw, escaped in _LINE_SEPARATORS:
        data = data.replace(raw, escaped)
    head = f"event: {event}\n".encode() if event else b""
    return head + b"data: " + data + b"\n\n"


async def _frames(
    events: AsyncIterator[dict[str, Any]],
    wrap: Callable[[dict[str, Any]], Any],
    on_error: Callable[[Exception], Any],
    keepalive: float,
) -> AsyncIterator[bytes]:
    """Frames of ``events``; a comment when :data:`QUIET` comes ``keepalive`` seconds or
    more after the last frame (the source must look at least that often: ``follow``
    does every poll interval)."""
    loop = asyncio.get_running_loop()
    last = loop.time()
    try:
        async for event in events:
            if event is QUIET:
                if loop.time() - last >= keepalive:
                    last = loop.time()
                    yield b": keepalive\n\n"
                continue
            last = loop.time()
            yield frame(wrap(event))
    except Exception as exc:  # a failure mid-stream becomes an ``error`` event
        yield frame(on_error(exc), "error")
    finally:
        aclose = getattr(events, "aclose", None)
        if aclose is not None:
            with contextlib.suppress(BaseException):
                await aclose()


def stream(
    events: AsyncIterator[dict[str, Any]],
    wrap: Callable[[dict[str, Any]], Any],
    on_error: Callable[[Exception], Any],
    *,
    keepalive: float = KEEPALIVE_SECONDS,
) -> StreamingResponse:
    return StreamingResponse(
        _frames(events, wrap, on_error, keepalive),
        media_type="text/event-stream",
        headers=HEADERS,
    )
