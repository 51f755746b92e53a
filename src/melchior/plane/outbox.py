"""The outbox: the file one turn's notes are written to, and the only route to the plane.

There is no connection from a turn to the plane — opening one so an agent could call
another would be a new way in for whatever takes the first agent over — so ``send_to``
appends a line to a file the turn's environment names, and the plane reads it once the
turn is over (seed 001). One note per line, NDJSON::

    {"to": "ledger", "text": "what did we spend in August?", "id": "3f2a…"}

The file is hostile input (the agent can write anything there), so reading is bounded
and forgiving in the right way: at most :data:`MAX_BYTES` are read and at most
:data:`MAX_LINES` lines; a line that is not a note becomes a problem with its line
number; whatever was a good note is kept. Nothing in a bad line can cost the others.
A symlink, a FIFO or a device in its place is refused without being followed or read.
"""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from typing import NamedTuple

MAX_BYTES = 256 * 1024
"""The most of an outbox the plane reads; the rest is refused, clearly."""
MAX_NOTE_BYTES = 64 * 1024
"""The longest note (UTF-8 bytes of its text)."""
MAX_LINES = 16
"""Lines read from one outbox (three notes a turn; the slack is for refusals to name)."""
KEYS = frozenset({"to", "text", "id"})
_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")


class Note(NamedTuple):
    line: int
    to: str
    text: str
    id: str | None


class Outbox(NamedTuple):
    notes: list[Note]
    problems: list[str]


class OutboxError(Exception):
    """The verb could not write a note (the reason is for the agent)."""


def _open_regular(path: Path, flags: int) -> int:
    fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(0, "it is not a regular file")
    except BaseException:
        os.close(fd)
        raise
    return fd


def append(path: Path, to: str, text: str, note_id: str) -> None:
    """Append one note (the agent's side: ``send_to``)."""
    size = len(text.encode("utf-8"))
    if size > MAX_NOTE_BYTES:
        raise OutboxError(
            f"the note is {size} bytes; a note may be at most {MAX_NOTE_BYTES} "
            "(nothing was written)"
        )
    line = json.dumps({"to": to, "text": text, "id": note_id}, ensure_ascii=False) + "\n"
    try:
        fd = _open_regular(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    except OSError as exc:
        raise OutboxError(f"the outbox {path} cannot be written: {exc.strerror}") from None
    try:
        if os.fstat(fd).st_size + len(line.encode("utf-8")) > MAX_BYTES:
            raise OutboxError("the outbox is full; nothing was written")
        os.write(fd, line.encode("utf-8"))
    finally:
        os.close(fd)


def recipients(path: Path) -> list[str]:
    """Who this turn's outbox already writes to, in order (for the per-turn quota)."""
    return [n.to for n in read(path).notes]


def read(path: Path) -> Outbox:
    """Every good note in the outbox at ``path``, and what was wrong with the rest."""
    try:
        fd = _open_regular(path, os.O_RDONLY)
    except FileNotFoundError:
        return Outbox([], [])
    except OSError as exc:
        return Outbox([], [f"the outbox could not be read ({exc.strerror}); no note was read"])
    try:
        with os.fdopen(fd, "rb") as f:
            data = f.read(MAX_BYTES + 1)
    except OSError as exc:
        return Outbox([], [f"the outbox could not be read ({exc.strerror}); no note was read"])
    problems: list[str] = []
    if len(data) > MAX_BYTES:
        problems.append(
            f"the outbox is over {MAX_BYTES} bytes; the notes in its first {MAX_BYTES} bytes "
            "were read and the rest was refused"
        )
        data = data[:MAX_BYTES]
        cut = data.rfind(b"\n")
        data = data[: cut + 1] if cut >= 0 else b""
    notes: list[Note] = []
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    for number, raw in enumerate(lines, start=1):
        if number > MAX_LINES:
            problems.append(f"the outbox has more than {MAX_LINES} lines; the rest were refused")
            break
        if not raw.strip():
            continue
        note, problem = _note(number, raw)
        if note is not None:
            notes.append(note)
        else:
            problems.append(f"line {number} of the outbox is not a note: {problem}")
    return Outbox(notes, problems)


def _note(number: int, raw: bytes) -> tuple[Note | None, str]:
    try:
        text = raw.decode("utf-8")
        value = json.loads(text)
    except UnicodeDecodeError:
        return None, "it is not UTF-8"
    except (ValueError, RecursionError):
        return None, "it is not JSON"
    if not isinstance(value, dict):
        return None, "it is not a JSON object"
    extra = sorted(set(value) - KEYS)
    if extra:
        return None, f"unknown key {extra[0]!r} (a note has to, text, id)"
    to, body, nid = value.get("to"), value.get("text"), value.get("id")
    if not isinstance(to, str) or not to:
        return None, "'to' must name an agent"
    if not isinstance(body, str):
        return None, "'text' must be text"
    if len(body.encode("utf-8", "surrogatepass")) > MAX_NOTE_BYTES:
        return None, f"its text is over {MAX_NOTE_BYTES} bytes"
    try:
        body.encode("utf-8")
    except UnicodeEncodeError:
        return None, "its text is not valid Unicode"
    if nid is not None and (not isinstance(nid, str) or not _ID.fullmatch(nid)):
        return None, "'id' must be 1-64 letters, digits, '_' or '-'"
    return Note(number, to[:200], body, nid), ""
