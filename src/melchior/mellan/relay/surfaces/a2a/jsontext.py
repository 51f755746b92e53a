"""JSON in and out of the relay without changing a single value.

A relay must hand the destination exactly what the caller sent. Integers are exact in
Python already; fractions are read as :class:`~decimal.Decimal` and written back from
their own digits (``0.10000000000000000001`` and ``1.10`` survive, where a float would
round them) — by the one exact codec every relay surface uses
(:mod:`melchior.mellan.rawjson`); this module adds the A2A-facing checks and errors.
Inputs that cannot survive a round trip are refused with a reason: ``NaN``/``Infinity``
(not JSON), duplicate object keys (the last would silently win), a byte-order mark.
"""

from __future__ import annotations

from typing import Any

from melchior.mellan.rawjson import JSONTextError, Raw, decode, encode, encode_pieces
from melchior.mellan.relay.surfaces.a2a.errors import ParseError

__all__ = ["JSONTextError", "dumpb", "dumpb_chunks", "dumps", "loads", "within"]


def loads(data: bytes | str) -> Any:
    """Decode strict JSON (UTF-8, no BOM); raise :class:`ParseError` saying what is wrong."""
    if isinstance(data, bytes):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ParseError(f"body is not UTF-8 (bad byte at offset {exc.start})") from None
    else:
        text = data
    if text.startswith("\ufeff"):
        raise ParseError("body starts with a byte-order mark; send plain UTF-8 JSON")
    try:
        return decode(text)
    except JSONTextError as exc:
        raise ParseError(f"body is not acceptable JSON: {exc}") from None
    except (ValueError, RecursionError) as exc:
        raise ParseError(f"body is not JSON: {exc}") from None


def dumps(value: Any) -> str:
    """Compact JSON text; exact decimals written from their own digits."""
    return encode(value)


SLICE = 1 << 20
"""Characters of one big spliced string turned into UTF-8 bytes per call in :func:`dumpb`."""


def dumpb(value: Any) -> bytes:
    return b"".join(dumpb_chunks(value))


def dumpb_chunks(value: Any) -> list[bytes]:
    """UTF-8 JSON bytes in chunks that, joined, are :func:`dumpb`. A big
    :class:`~melchior.mellan.rawjson.Raw` piece (a long stored answer) is encoded a
    :data:`SLICE` at a time: ``str.encode`` of 15 MiB of non-ASCII text is one C call
    holding the GIL for tens of milliseconds, which even on a worker thread stalls the
    event loop; a slice at a time, other threads run in between. Its bytes are kept on
    the Raw (:meth:`~melchior.mellan.rawjson.Raw.utf8`), so a kept answer is encoded once.
    A response can send the chunks as they are (never joining 15 MiB into one more
    copy)."""
    out: list[bytes] = []
    small: list[str] = []
    for part in encode_pieces(value):
        if isinstance(part, Raw):
            if len(part.text) <= SLICE:
                small.append(part.text)
                continue
            if small:
                out.append("".join(small).encode("utf-8"))
                small = []
            out.extend(part.utf8(SLICE))
        elif len(part) <= SLICE:
            small.append(part)
        else:
            if small:
                out.append("".join(small).encode("utf-8"))
                small = []
            out.extend(part[i : i + SLICE].encode("utf-8") for i in range(0, len(part), SLICE))
    if small or not out:
        out.append("".join(small).encode("utf-8"))
    return out


def within(value: Any, limit: int) -> bool:
    """Whether ``value`` is small: at most ``limit`` characters of text (stored
    :class:`~melchior.mellan.rawjson.Raw` and strings) and values, counted until the limit
    is passed — so the walk itself is bounded by ``limit`` steps whatever the size. Lets an
    answer that is small be encoded where it is, instead of paying a worker-thread hop that
    costs more than the encoding (docs/benchmarks.md, issue 25, the relay's own path)."""
    seen = 0
    stack = [value]
    while stack:
        item = stack.pop()
        seen += 1
        if isinstance(item, Raw):
            seen += len(item.text)
        elif isinstance(item, str):
            seen += len(item)
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
        if seen > limit:
            return False
    return True
