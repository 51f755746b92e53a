"""gate-wire: refuse any message whose tag key is not ``event``.

Two spellings of one tag on two copies of a wire do not fail loudly: the surface
just stops being answered. So every message on our wires, fixtures and emitted
code is checked: it must be a call, a reply or an event, and it must not carry a
competing tag key at its top level.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from melchior.wire.calls import shape
from melchior.wire.codec import JSONObject, WireError, decode
from melchior.wire.frames import FrameDecoder

FORBIDDEN_TAGS = ("type", "kind", "method", "action", "op", "cmd", "command", "msg_type", "tag")


@dataclass(frozen=True)
class Offence:
    source: str
    line: int
    key: str
    reason: str

    def __str__(self) -> str:
        return f"{self.source}:{self.line}: {self.key}: {self.reason}"


def check(msg: JSONObject) -> list[tuple[str, str]]:
    """Return ``(key, reason)`` for each thing wrong with one message; empty if clean."""
    found: list[tuple[str, str]] = []
    for key in FORBIDDEN_TAGS:
        if key in msg:
            found.append((key, f"tag key {key!r} is not allowed; the tag key is 'event'"))
    try:
        shape(msg)
    except WireError as exc:
        found.append(("-", exc.reason))
    return found


def _offences(source: str, items: Iterable[JSONObject | WireError]) -> Iterator[Offence]:
    for n, item in enumerate(items, start=1):
        if isinstance(item, WireError):
            yield Offence(source, n, "-", item.reason)
            continue
        for key, reason in check(item):
            yield Offence(source, n, key, reason)


def scan_lines(source: str, data: bytes) -> list[Offence]:
    """Check NDJSON; line numbers are physical lines (blank lines count, are not offences)."""
    out: list[Offence] = []
    for n, raw in enumerate(data.split(b"\n"), start=1):
        line = raw.rstrip(b"\r")
        if not line.strip():
            continue
        try:
            msg = decode(line)
        except WireError as exc:
            out.append(Offence(source, n, "-", exc.reason))
            continue
        out.extend(Offence(source, n, key, reason) for key, reason in check(msg))
    return out


def scan_frames(source: str, data: bytes) -> list[Offence]:
    """Check a capture of length-prefixed frames; numbers count frames."""
    dec = FrameDecoder(limit=max(len(data), 1))
    items: list[JSONObject | WireError] = list(dec.feed(data))
    tail = dec.eof()
    if tail is not None:
        items.append(tail)
    return list(_offences(source, items))


__all__ = ["FORBIDDEN_TAGS", "Offence", "check", "scan_frames", "scan_lines"]
