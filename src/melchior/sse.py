"""Server-sent events parsed from bytes: WHATWG's field rules, two deliberate deviations.

The one SSE parser of the project: the provider clients read model streams with it
(:mod:`melchior.providers.sse` re-exports it) and the relay client reads A2A streams
(:mod:`melchior.mellan.client.caller`). It sits this low, beside :mod:`melchior.numbers`,
because it is pure (bytes in, events out) and both need it without importing each other.

A stream arrives in chunks that split wherever the network pleases: inside a
multi-byte UTF-8 character, between the CR and LF of one line ending, inside the
three bytes of a BOM. Decoding each chunk as text is how other decoders lose or corrupt
characters, so this one never decodes a chunk: it splits lines on the bytes CR and LF
(which never occur inside a multi-byte UTF-8 sequence) and decodes each *complete* line
on its own. A U+2028 or U+0085 inside JSON is therefore data, never a line break.

The rules, as in WHATWG HTML "Interpreting an event stream":

- lines end with CRLF, LF or CR; a CR that ends a chunk ends its line at once (the line
  is not held back waiting to see whether an LF follows), and an LF that then opens the
  next chunk is swallowed, so a split CRLF is one line ending, never two;
- one leading BOM (EF BB BF) is dropped; a BOM anywhere else is kept;
- a blank line dispatches, but only when ``data`` was seen: blocks holding only an
  ``id``, an ``event``, a ``retry`` or comments dispatch nothing (no phantom events);
- ``id`` persists across events and is ignored when it contains NUL; ``retry`` counts
  only when all ASCII digits (and at most :data:`RETRY_MAX_DIGITS` of them, so a
  hostile number never reaches ``int``); unknown fields are ignored.

The deviations, both on purpose:

- **malformed UTF-8 raises** :class:`SSEDecodeError` (overlong forms, lone continuation
  bytes, surrogates, code points past U+10FFFF, a sequence cut short by a line end or
  by the end of the body) where a browser substitutes U+FFFD. A provider stream that
  is not UTF-8 is a broken attempt, and the transport retries it; a replacement
  character inside tool-call arguments would be silently wrong data.
- **the last event is delivered at a clean end of body** even without the blank line
  that should end it, marked ``tail=True``. :meth:`SSEDecoder.close` is that clean end;
  after a transport error the caller drops the decoder instead, and the fragment is
  never seen. Tail delivery does not make a stream complete: provider clients still
  require their terminal event.

Sizes are bounded: a line longer than ``max_line`` bytes (pending or complete) and an
event whose ``data`` lines exceed ``max_event`` bytes raise :class:`SSELimitError`;
nothing is truncated or dropped silently. This is not a browser EventSource: there is
no reconnection, ``retry`` is only reported.
"""

from __future__ import annotations

from typing import NamedTuple

BOM = b"\xef\xbb\xbf"
DEFAULT_MAX_LINE = 16 * 1024 * 1024
"""Bytes in one line, terminator excluded. Generous: one streamed JSON chunk is a line."""
DEFAULT_MAX_EVENT = 16 * 1024 * 1024
"""Bytes of ``data`` lines in one event."""
RETRY_MAX_DIGITS = 10
"""A longer ``retry`` value (over 115 days in milliseconds) is ignored, not converted."""

_CR = 0x0D
_LF = 0x0A


class SSEEvent(NamedTuple):
    """One dispatched event.

    ``id`` is the last event id seen so far in the stream (it persists, as in the
    spec); ``retry`` is the reconnection time this event's block set, if any; ``tail``
    says the event was delivered at end of body without its closing blank line. A
    NamedTuple rather than a dataclass: one is built per event, and a frozen
    dataclass's ``__init__`` was a third of the decoder's time.
    """

    data: str
    event: str = "message"
    id: str = ""
    retry: int | None = None
    tail: bool = False


class SSEError(ValueError):
    """The stream cannot be parsed; the decoder is unusable afterwards."""


class SSEDecodeError(SSEError):
    """A line is not valid UTF-8. The message names the line and offset, never its bytes."""


class SSELimitError(SSEError):
    """A line or an event is larger than the decoder's cap."""


class SSEDecoder:
    """Feed bytes as they arrive; get every event completed so far.

    ``feed(chunk)`` returns the events the chunk completed; ``close()`` marks a clean
    end of body and returns the tail event, if one is pending. Any error poisons the
    decoder: further calls raise :class:`SSEError`.
    """

    __slots__ = (
        "_data",
        "_data_size",
        "_event",
        "_first",
        "_lineno",
        "_max_event",
        "_max_line",
        "_pending",
        "_retry",
        "_skip_lf",
        "_state",
        "last_event_id",
        "retry",
    )

    def __init__(
        self, *, max_line: int = DEFAULT_MAX_LINE, max_event: int = DEFAULT_MAX_EVENT
    ) -> None:
        if max_line < 1 or max_event < 1:
            raise ValueError("max_line and max_event must be positive")
        self._max_line = max_line
        self._max_event = max_event
        self._pending = bytearray()  # the current line, not yet terminated
        self._skip_lf = False  # the last byte seen was a CR that ended a line
        self._first = True  # no line completed yet: the BOM check is still due
        self._lineno = 0
        self._data: list[str] = []
        self._data_size = 0
        self._event = ""
        self._retry: int | None = None  # set in the current block
        self._state = "open"
        self.last_event_id = ""
        """The id buffer: the last valid ``id`` field, kept across events."""
        self.retry: int | None = None
        """The last valid ``retry`` value seen anywhere in the stream."""

    def feed(self, chunk: bytes | bytearray | memoryview) -> list[SSEEvent]:
        """Consume ``chunk``; return the events it completed, in order."""
        self._check_open()
        out: list[SSEEvent] = []
        if not chunk:
            return out
        data = chunk if isinstance(chunk, bytes) else bytes(chunk)
        if self._skip_lf:
            self._skip_lf = False
            if data[0] == _LF:
                data = data[1:]
                if not data:
                    return out
        last = data[-1]
        lines = data.splitlines()  # on bytes: CR, LF and CRLF only
        if last in (_LF, _CR):
            self._skip_lf = last == _CR
            rest = b""
        else:
            rest = lines.pop()
        try:
            if lines:
                if self._pending:
                    self._pending += lines[0]
                    lines[0] = bytes(self._pending)
                    self._pending.clear()
                self._lines(lines, out)
            if rest:
                self._pending += rest
                if len(self._pending) > self._max_line:
                    raise SSELimitError(
                        f"line {self._lineno + 1} exceeds {self._max_line} bytes "
                        "before its end arrived"
                    )
        except SSEError:
            self._state = "failed"
            raise
        return out

    def close(self) -> list[SSEEvent]:
        """The body ended cleanly: finish the pending line, deliver the tail event."""
        self._check_open()
        out: list[SSEEvent] = []
        try:
            if self._pending:
                line = bytes(self._pending)
                self._pending.clear()
                self._lines([line], out)
            if self._data:
                self._dispatch(out, tail=True)
        except SSEError:
            self._state = "failed"
            raise
        self._state = "closed"
        return out

    def _check_open(self) -> None:
        if self._state != "open":
            raise SSEError(f"the decoder is {self._state}; start a new one for a new stream")

    def _lines(self, lines: list[bytes], out: list[SSEEvent]) -> None:
        """Apply the field rules to complete lines (terminators already removed).

        The hot loop of the decoder: state lives in locals while it runs and is written
        back at the end (an error poisons the decoder, so a half-written state is never
        read). A batch whose total size is within ``max_line`` cannot hold a long line,
        so the per-line length check runs only when one is possible.
        """
        if self._first:
            self._first = False
            if lines[0].startswith(BOM):
                lines[0] = lines[0][3:]
        max_line, max_event = self._max_line, self._max_event
        long_possible = sum(map(len, lines)) > max_line
        data, size, event, retry = self._data, self._data_size, self._event, self._retry
        base = self._lineno
        for number, raw in enumerate(lines, base + 1):
            if not raw:
                if data:
                    text = data[0] if len(data) == 1 else "\n".join(data)
                    out.append(SSEEvent(text, event or "message", self.last_event_id, retry))
                    data = []
                    size = 0
                event = ""
                retry = None
                continue
            if long_possible and len(raw) > max_line:
                raise SSELimitError(f"line {number} exceeds {max_line} bytes")
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise SSEDecodeError(
                    f"line {number} is not UTF-8 at byte {exc.start}: {exc.reason}"
                ) from None
            if line[0] == ":":
                continue
            name, colon, value = line.partition(":")
            if colon and value[:1] == " ":
                value = value[1:]
            if name == "data":
                size += len(raw) + 1
                if size > max_event:
                    raise SSELimitError(f"event data exceeds {max_event} bytes at line {number}")
                data.append(value)
            elif name == "event":
                event = value
            elif name == "id":
                if "\x00" not in value:
                    self.last_event_id = value
            elif (
                name == "retry"
                and value
                and len(value) <= RETRY_MAX_DIGITS
                and value.isascii()
                and value.isdigit()
            ):
                retry = self.retry = int(value)
        self._lineno = base + len(lines)
        self._data, self._data_size, self._event, self._retry = data, size, event, retry

    def _dispatch(self, out: list[SSEEvent], *, tail: bool) -> None:
        data = self._data[0] if len(self._data) == 1 else "\n".join(self._data)
        out.append(SSEEvent(data, self._event or "message", self.last_event_id, self._retry, tail))
        self._data = []
        self._data_size = 0
        self._event = ""
        self._retry = None


def decode(body: bytes, **limits: int) -> list[SSEEvent]:
    """Every event of a complete body (a clean end: the tail event is delivered)."""
    decoder = SSEDecoder(**limits)
    return decoder.feed(body) + decoder.close()
