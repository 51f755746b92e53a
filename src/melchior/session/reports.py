"""Reports: a session's latest account of its work, stored beside its socket.

A submission atomically replaces the stored report and always gets a new revision,
even for identical text: the parent is notified per submission, and "the child said
the same thing again on a later turn" is information. The SHA-256 digest lets a
reader tell bodies apart without comparing them. A report is not evidence that the
work is finished; status says what the session is doing now.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any

from melchior import names
from melchior.files import atomic_write
from melchior.session.registry import Registry

MAX_REPORT = 4 * 1024 * 1024
"""Largest report body, in UTF-8 bytes."""

PAGE_CHARS = 8000
"""Characters per page when a report is read in pages."""


class ReportError(ValueError):
    """A report that cannot be stored or read, with why; nothing was changed."""


@dataclass(frozen=True)
class Report:
    who: str
    revision: int
    sha256: str
    text: str
    format: str
    """'json' for reports this version wrote, 'plain' for older plain-text files."""

    def whole(self) -> dict[str, Any]:
        return {
            "who": self.who,
            "revision": self.revision,
            "sha256": self.sha256,
            "text": self.text,
            "format": self.format,
        }

    def page(self, number: int) -> dict[str, Any]:
        pages = max(1, math.ceil(len(self.text) / PAGE_CHARS))
        if not 1 <= number <= pages:
            raise ReportError(f"{self.who}'s report has {pages} page(s); page {number} is not one")
        start = (number - 1) * PAGE_CHARS
        return {
            "who": self.who,
            "revision": self.revision,
            "sha256": self.sha256,
            "page": number,
            "pages": pages,
            "text": self.text[start : start + PAGE_CHARS],
        }


def digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def decode_body(data: bytes) -> str:
    """A report body from raw bytes (stdin): complete, bounded, strict UTF-8."""
    if len(data) > MAX_REPORT:
        raise ReportError(
            f"the report is over the {MAX_REPORT}-byte limit; nothing was stored. Shorten it "
            "or keep the detail in a file and report where it is"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ReportError(
            f"the report is not valid UTF-8 (bad byte at offset {exc.start}); nothing was stored"
        ) from None
    return check_body(text)


def check_body(text: str) -> str:
    if not text.strip():
        raise ReportError("the report is empty; nothing was stored")
    if len(text.encode("utf-8")) > MAX_REPORT:
        raise ReportError(f"the report is over the {MAX_REPORT}-byte limit; nothing was stored")
    return text


def read(reg: Registry, who: str) -> Report | None:
    path = reg.dir / f"{who}.report"
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        data = json.loads(raw)
    except ValueError:
        data = None
    if (
        isinstance(data, dict)
        and isinstance(data.get("text"), str)
        and isinstance(data.get("revision"), int)
    ):
        text = data["text"]
        return Report(who, data["revision"], digest(text), text, "json")
    # An older plain-text report file: readable as it is, revision 0.
    text = raw.decode("utf-8", errors="replace")
    return Report(who, 0, digest(text), text, "plain")


def submit(reg: Registry, who: str, text: str) -> Report:
    check_body(text)
    with names.locked(reg.dir):
        previous = read(reg, who)
        revision = (previous.revision if previous is not None else 0) + 1
        report = Report(who, revision, digest(text), text, "json")
        body = {"revision": revision, "sha256": report.sha256, "text": text}
        atomic_write(reg.dir / f"{who}.report", json.dumps(body).encode("utf-8"))
    return report
