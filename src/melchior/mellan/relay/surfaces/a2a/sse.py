"""Server-sent events for A2A streams: one ``data:`` line of JSON per event.

No ``id:`` fields (A2A streams are not resumed by Last-Event-ID; a client reconnects
with SubscribeToTask and gets a fresh snapshot); ``event: error`` marks a failure after
the stream began (the data is the binding's error body), as A2A clients expect. A
comment line is sent while nothing happens so proxies and idle timeouts do not cut a
quiet stream.

A frame's data is the binding's envelope around one ``StreamResponse`` (:class:`Envelope`:
nothing for HTTP+JSON, a JSON-RPC response with the request's id), joined as bytes: an
update many streams send (:class:`Encoded`) is JSON-encoded once and its bytes shared by
every stream, whatever its binding or id.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from starlette.responses import StreamingResponse

from melchior.mellan.relay.surfaces.a2a import jsontext

KEEPALIVE_SECONDS = 15.0
HEADERS = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}

QUIET: dict[str, Any] = {}
"""Yielded (this very object) by an event source that looked and found nothing new, so
the stream can say it is alive: the source is driven in the response's own task, with
no task or wait per event between an event and its frame."""


_LINE_SEPARATORS = (("\u2028".encode(), b"\\u2028"), ("\u2029".encode(), b"\\u2029"))


def line_safe(data: bytes) -> bytes:
    """JSON bytes fit for one ``data:`` line. U+2028 and U+2029 are written escaped: they
    can only occur inside JSON strings, where an escape means the same character, and
    clients that split lines on them (JavaScript's, some Python ones) would otherwise cut
    the ``data:`` line and fail to parse it."""
    for raw, escaped in _LINE_SEPARATORS:
        if raw in data:
            data = data.replace(raw, escaped)
    return data


def frame(obj: Any, event: str | None = None) -> bytes:
    """One SSE event of ``obj`` as JSON."""
    head = f"event: {event}\n".encode() if event else b""
    return head + b"data: " + line_safe(jsontext.dumpb(obj)) + b"\n\n"


class Encoded(dict[str, Any]):
    """A ``StreamResponse`` that many streams send (the same update to every stream of a
    task at the same place): a dict like any other, whose line-safe JSON is encoded the
    first time a stream sends it and then shared. Read-only by contract: every stream
    holds this one object."""

    __slots__ = ("_data",)

    def data(self) -> bytes:
        try:
            return self._data
        except AttributeError:
            self._data: bytes = line_safe(jsontext.dumpb(dict(self)))
            return self._data


def payload(event: dict[str, Any]) -> bytes:
    """``event``'s line-safe JSON: shared if it is :class:`Encoded`, else encoded now."""
    if isinstance(event, Encoded):
        return event.data()
    return line_safe(jsontext.dumpb(event))


@dataclass(frozen=True, slots=True)
class Envelope:
    """What a binding puts around each ``StreamResponse`` in a frame's data, as bytes
    (already line-safe): ``head`` + the event's JSON + ``tail`` is the JSON of the
    binding's object, byte for byte (the codec is compact: no spaces to differ)."""

    head: bytes = b""
    tail: bytes = b""

    def frame(self, event: dict[str, Any]) -> bytes:
        return b"".join((b"data: ", self.head, payload(event), self.tail, b"\n\n"))


BARE = Envelope()
"""The HTTP+JSON binding's: the ``StreamResponse`` itself."""


async def _frames(
    events: AsyncIterator[dict[str, Any]],
    envelope: Envelope,
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
            yield envelope.frame(event)
    except Exception as exc:  # a failure mid-stream becomes an ``error`` event
        yield frame(on_error(exc), "error")
    finally:
        aclose = getattr(events, "aclose", None)
        if aclose is not None:
            with contextlib.suppress(BaseException):
                await aclose()


def stream(
    events: AsyncIterator[dict[str, Any]],
    envelope: Envelope,
    on_error: Callable[[Exception], Any],
    *,
    keepalive: float = KEEPALIVE_SECONDS,
) -> StreamingResponse:
    return StreamingResponse(
        _frames(events, envelope, on_error, keepalive),
        media_type="text/event-stream",
        headers=HEADERS,
    )
