"""The pipe transport: one JSON object per line, both directions.

Lines are split on the LF byte only, before decoding, so U+2028 and friends inside
a string can never end a line. A line over the limit is refused and skipped up to
its newline: unlike a bad socket length, a pipe can always find the next message.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import IO, TYPE_CHECKING

from melchior.wire.codec import JSONObject, WireError, decode, encode
from melchior.wire.limits import frame_limit

if TYPE_CHECKING:  # asyncio costs start-up time; the argv tool never needs it
    import asyncio


def pack(msg: JSONObject) -> bytes:
    # Compact JSON escapes control characters, so the body never holds a raw LF.
    return encode(msg) + b"\n"


class LineDecoder:
    """Incremental NDJSON decoder that never buffers more than the limit."""

    def __init__(self, limit: int | None = None) -> None:
        self.limit = frame_limit(limit)
        self._buf = bytearray()
        self._skipping = False
        self._line_no = 0

    def feed(self, data: bytes) -> Iterator[JSONObject | WireError]:
        start = 0
        while start <= len(data):
            nl = data.find(b"\n", start)
            piece = data[start:] if nl < 0 else data[start:nl]
            if self._skipping:
                if nl >= 0:
                    self._skipping = False
            elif len(self._buf) + len(piece) > self.limit:
                self._line_no += 1
                self._buf.clear()
                self._skipping = nl < 0
                yield WireError(
                    f"line {self._line_no} is over the {self.limit}-byte limit; skipped",
                    code="too-large",
                )
            else:
                self._buf += piece
                if nl >= 0:
                    line = bytes(self._buf)
                    self._buf.clear()
                    item = self._finish(line)
                    if item is not None:
                        yield item
            if nl < 0:
                return
            start = nl + 1

    def _finish(self, line: bytes) -> JSONObject | WireError | None:
        self._line_no += 1
        if line.endswith(b"\r"):
            line = line[:-1]
        if not line.strip():
            return None
        try:
            return decode(line)
        except WireError as exc:
            return WireError(f"line {self._line_no}: {exc.reason}", code=exc.code)

    def eof(self) -> Iterator[JSONObject | WireError]:
        """A last line without its newline is still a line: pipes end that way."""
        if self._skipping or not self._buf:
            self._buf.clear()
            return
        line = bytes(self._buf)
        self._buf.clear()
        item = self._finish(line)
        if item is not None:
            yield item


def write_sync(stream: IO[bytes], msg: JSONObject) -> None:
    stream.write(pack(msg))
    stream.flush()


async def write(writer: asyncio.StreamWriter, msg: JSONObject) -> None:
    writer.write(pack(msg))
    await writer.drain()


async def aiter_messages(
    reader: asyncio.StreamReader, *, limit: int | None = None, chunk: int = 65536
) -> AsyncIterator[JSONObject | WireError]:
    """Yield decoded messages (or non-fatal errors) until EOF."""
    dec = LineDecoder(limit)
    while True:
        data = await reader.read(chunk)
        if not data:
            for item in dec.eof():
                yield item
            return
        for item in dec.feed(data):
            yield item
