"""One connection's worth of the socket rules, in one place.

Every socket in melchior answers the same way: a call gets exactly one reply
(result or refusal), an event gets none, a body that is not a usable message gets
a refusal and the connection carries on, and lost framing gets a refusal and then
the connection closes. Handlers only ever see well-formed calls and events.

A connection is an :class:`asyncio.Protocol`, not a pair of asyncio streams: a call
whose answer is ready at once (``status`` — the common call) is answered inside the
loop's read callback, with no task switch and no extra trip round the event loop.
Profiled, the stream machinery (a reader buffer, a waiter future, a task wake-up on
the next loop pass with its own ``epoll_wait``, ``drain``) was most of what a status
round trip cost over a raw echo (docs/benchmarks.md). A call that must wait runs in a
task owned by its connection, and the connection reads nothing more until it is
answered, so replies keep the order of the calls.

Reads land in one buffer the connection keeps (:class:`asyncio.BufferedProtocol`):
asyncio's own reads allocate 256 KiB per ``recv``, which glibc serves with an
``mmap``/``munmap`` pair each time — ~30 µs a read on this machine, as much as a
whole echo round trip.

Back-pressure as the streams had it: reading stops while a call is being answered and
while the peer is not reading its replies (the transport's high-water mark), so a
flood of small calls buffers at most one read's worth of replies; a frame's length is
checked before its body is buffered (:class:`~melchior.wire.frames.FrameDecoder`).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from melchior.wire import frames
from melchior.wire.calls import Refused, check_family, ok, refusal_of, refused, shape
from melchior.wire.codec import JSONObject, WireError
from melchior.wire.limits import frame_limit

CallHandler = Callable[[str, list[Any], JSONObject], Awaitable[list[Any]]]
EventHandler = Callable[[JSONObject], Awaitable[None]]
NowHandler = Callable[[str, list[Any], JSONObject], "list[Any] | None"]
"""Answers a call at once, or returns None to leave it to the :data:`CallHandler`; it
must decide None before doing anything, since the call handler will start over."""
PeerCheck = Callable[[Any], "JSONObject | None"]
"""Looks at a new connection's socket: None to serve it, or the one refusal it gets."""


READ_SIZE = 64 * 1024
"""Bytes read at most per ``recv`` into the connection's buffer (below glibc's mmap
threshold, so the buffer is an ordinary heap block, allocated once)."""


class Answerer(asyncio.BufferedProtocol):
    """Serve one connection until the peer closes it or the framing is lost."""

    def __init__(
        self,
        on_call: CallHandler,
        on_event: EventHandler | None = None,
        *,
        now: NowHandler | None = None,
        peer: PeerCheck | None = None,
        limit: int | None = None,
    ) -> None:
        self.on_call = on_call
        self.on_event = on_event
        self.now = now
        self.peer = peer
        self.limit = frame_limit(limit)  # read once per connection, as the decoder does
        self._decoder = frames.FrameDecoder(self.limit)
        self._inbox = bytearray(READ_SIZE)
        self._pending: deque[JSONObject | WireError] = deque()
        self._transport: asyncio.Transport | None = None
        self._task: asyncio.Task[None] | None = None
        self._write_paused = False
        self._reading = True
        self._eof = False
        self._done = False

    # -- asyncio.BufferedProtocol ---------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        if self.peer is not None:
            refusal = self.peer(transport.get_extra_info("socket"))
            if refusal is not None:
                self._send(refusal)
                self._close()

    def get_buffer(self, sizehint: int) -> bytearray:
        return self._inbox

    def buffer_updated(self, nbytes: int) -> None:
        if self._done:
            return
        self._pending.extend(self._decoder.feed(self._inbox[:nbytes]))
        self._work()

    def eof_received(self) -> bool:
        truncated = self._decoder.eof()
        if truncated is not None:
            self._pending.append(truncated)
        self._eof = True
        self._work()
        return True  # keep the write side open until the last reply is out

    def pause_writing(self) -> None:
        self._write_paused = True
        self._flow()

    def resume_writing(self) -> None:
        self._write_paused = False
        self._work()

    def connection_lost(self, exc: Exception | None) -> None:
        self._done = True
        self._pending.clear()
        if self._task is not None:
            self._task.cancel()

    # -- answering ------------------------------------------------------------------------

    def _work(self) -> None:
        """Answer what has arrived, in order, until a call must wait or writing is paused."""
        while self._pending and self._task is None and not self._write_paused and not self._done:
            item = self._pending.popleft()
            if isinstance(item, WireError):
                self._send(refusal_of(item))
                if item.fatal:
                    self._close()
                    return
                continue
            later = self._dispatch(item)
            if later is not None:
                self._task = asyncio.get_running_loop().create_task(self._finish(later))
        if self._eof and not self._pending and self._task is None:
            self._close()
            return
        self._flow()

    def _flow(self) -> None:
        """Read only while nothing waits: no call in a task, the peer reading its replies."""
        if self._transport is None or self._done or self._eof:
            return
        read = self._task is None and not self._write_paused and not self._pending
        if read != self._reading:
            self._reading = read
            if read:
                self._transport.resume_reading()
            else:
                self._transport.pause_reading()

    async def _finish(self, later: Awaitable[None]) -> None:
        try:
            await later
        except BaseException:
            self._close()
            raise
        finally:
            self._task = None
        self._work()

    def _dispatch(self, msg: JSONObject) -> Awaitable[None] | None:
        """Answer ``msg`` now, or return what will answer it (a call or event that waits)."""
        rid = msg.get("id")
        try:
            kind = shape(msg)
            check_family(msg)
        except WireError as exc:
            self._send(refusal_of(exc, id=rid))
            return None
        if kind == "event":
            return self.on_event(msg) if self.on_event is not None else None
        if kind == "reply":
            wrong = "a reply was sent where a call was expected"
            self._send(refused(wrong, code="bad-shape", id=rid))
            return None
        verb, args = msg["call"], list(msg.get("args", []))
        try:
            result = self.now(verb, args, msg) if self.now is not None else None
        except (Refused, WireError) as exc:
            self._send(_refusal(exc, rid))
            return None
        if result is None:
            return self._later(verb, args, msg, rid)
        self._send(ok(result, id=rid))
        return None

    async def _later(self, verb: str, args: list[Any], msg: JSONObject, rid: Any) -> None:
        try:
            result = await self.on_call(verb, args, msg)
        except (Refused, WireError) as exc:
            self._send(_refusal(exc, rid))
            return
        self._send(ok(result, id=rid))

    def _send(self, msg: JSONObject) -> None:
        try:
            data = frames.pack(msg, limit=self.limit)
        except WireError as exc:
            data = frames.pack(
                refused(
                    f"the answer could not be sent: {exc.reason}", code=exc.code, id=msg.get("id")
                )
            )
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(data)

    def _close(self) -> None:
        self._done = True
        self._pending.clear()
        if self._transport is not None:
            self._transport.close()  # what was written still goes out first


def _refusal(exc: Refused | WireError, rid: Any) -> JSONObject:
    if isinstance(exc, Refused):
        return refused(exc.reason, code=exc.code, id=rid, **exc.detail)
    return refusal_of(exc, id=rid)


async def start(
    sock: Any,
    on_call: CallHandler,
    on_event: EventHandler | None = None,
    *,
    now: NowHandler | None = None,
    peer: PeerCheck | None = None,
    limit: int | None = None,
) -> asyncio.AbstractServer:
    """Serve a listening unix socket with :class:`Answerer` (one per connection)."""
    loop = asyncio.get_running_loop()
    return await loop.create_unix_server(
        lambda: Answerer(on_call, on_event, now=now, peer=peer, limit=limit), sock=sock
    )
