"""The socket transport: four bytes of big-endian length, then that many bytes of JSON.

The length is checked before a byte of the body is buffered, so a peer cannot make
us allocate what it claims. A zero or over-limit length loses the framing (we
cannot know where the next frame starts): the reader answers with a refusal and
the connection closes. A body that is not a UTF-8 JSON object is refused but the
framing is intact, so the connection stays usable.
"""

from __future__ import annotations

import struct

from melchior.wire.codec import TYPE_CHECKING, JSONObject, WireError, decode, encode
from melchior.wire.limits import frame_limit

HEADER = struct.Struct(">I")

if TYPE_CHECKING:  # asyncio, socket and typing cost start-up time; annotations only
    import _socket
    import asyncio
    from collections.abc import Iterator


def pack(msg: JSONObject, *, limit: int | None = None) -> bytes:
    """Frame one message; refuses to write what the far side would refuse to read."""
    body = encode(msg)
    cap = frame_limit(limit)
    if len(body) > cap:
        raise WireError(
            f"message is {len(body)} bytes, over the {cap}-byte frame limit", code="too-large"
        )
    return HEADER.pack(len(body)) + body


def check_length(length: int, limit: int) -> None:
    if length == 0:
        raise WireError(
            "frame length is 0; every frame carries a JSON object", fatal=True, code="bad-frame"
        )
    if length > limit:
        raise WireError(
            f"frame length {length} is over the {limit}-byte limit", fatal=True, code="too-large"
        )


class FrameDecoder:
    """Incremental decoder: feed any bytes, get messages or errors, never a crash.

    After a fatal error the decoder is closed and ignores further input, because the
    byte stream no longer has frame boundaries anyone can trust.
    """

    def __init__(self, limit: int | None = None) -> None:
        self.limit = frame_limit(limit)
        self._buf = bytearray()
        self._want: int | None = None
        self.closed = False

    def feed(self, data: bytes | bytearray) -> Iterator[JSONObject | WireError]:
        if self.closed:
            return
        self._buf += data
        while True:
            if self._want is None:
                if len(self._buf) < HEADER.size:
                    return
                (length,) = HEADER.unpack_from(self._buf)
                del self._buf[: HEADER.size]
                try:
                    check_length(length, self.limit)
                except WireError as exc:
                    self.closed = True
                    self._buf.clear()
                    yield exc
                    return
                self._want = length
            if len(self._buf) < self._want:
                return
            body = bytes(self._buf[: self._want])
            del self._buf[: self._want]
            self._want = None
            try:
                yield decode(body)
            except WireError as exc:
                yield exc

    def eof(self) -> WireError | None:
        """Say whether the stream ended inside a frame."""
        if self.closed:
            return None
        if self._want is not None or self._buf:
            got = len(self._buf)
            self.closed = True
            return WireError(
                f"connection closed inside a frame ({got} bytes of "
                f"{'header' if self._want is None else self._want} received)",
                fatal=True,
                code="truncated",
            )
        return None


# -- blocking sockets (the argv tool: no event loop, fast start) ---------------------------


def _recv_exact(sock: _socket.socket, n: int, *, started: bool) -> bytes | None:
    first = sock.recv(n)
    if len(first) == n:  # the usual case: a small frame arrives whole
        return first
    chunks = bytearray(first)
    if not first:
        if not started:
            return None
        raise WireError(
            f"connection closed inside a frame (0 of {n} bytes received)",
            fatal=True,
            code="truncated",
        )
    while len(chunks) < n:
        part = sock.recv(n - len(chunks))
        if not part:
            if not chunks and not started:
                return None
            raise WireError(
                f"connection closed inside a frame ({len(chunks)} of {n} bytes received)",
                fatal=True,
                code="truncated",
            )
        chunks += part
    return bytes(chunks)


def recv(sock: _socket.socket, *, limit: int | None = None) -> JSONObject | None:
    """Read one message from a blocking socket; ``None`` on a clean EOF between frames."""
    cap = frame_limit(limit)
    header = _recv_exact(sock, HEADER.size, started=False)
    if header is None:
        return None
    (length,) = HEADER.unpack(header)
    check_length(length, cap)
    body = _recv_exact(sock, length, started=True)
    assert body is not None
    return decode(body)


def send(sock: _socket.socket, msg: JSONObject, *, limit: int | None = None) -> None:
    sock.sendall(pack(msg, limit=limit))


# -- asyncio streams (a client on an event loop) ----------------------------------------------


async def read(reader: asyncio.StreamReader, *, limit: int | None = None) -> JSONObject | None:
    """Read one message from a stream; ``None`` on a clean EOF between frames."""
    import asyncio  # already loaded: a stream reader implies a running loop

    cap = frame_limit(limit)
    try:
        header = await reader.readexactly(HEADER.size)
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise WireError(
            f"connection closed inside a frame header ({len(exc.partial)} of 4 bytes)",
            fatal=True,
            code="truncated",
        ) from None
    (length,) = HEADER.unpack(header)
    check_length(length, cap)
    try:
        body = await reader.readexactly(length)
    except asyncio.IncompleteReadError as exc:
        raise WireError(
            f"connection closed inside a frame ({len(exc.partial)} of {length} bytes received)",
            fatal=True,
            code="truncated",
        ) from None
    return decode(body)


async def write(writer: asyncio.StreamWriter, msg: JSONObject, *, limit: int | None = None) -> None:
    writer.write(pack(msg, limit=limit))
    await writer.drain()
