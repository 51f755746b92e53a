"""Progress of a running turn, held briefly and sent coalesced (issue 25).

Every progress event used to be its own request to the relay, sent before the adapter
went on — and the relay writes each one to its store. For a task that ends at once (the
command adapter's ``started … (pid N)`` status, then the completion a moment later) that
was a second round trip and a second store write for a line the completion supersedes.
So events are held for ``progress_debounce`` seconds (:mod:`.config`), and what is still
held when the turn ends is decided then:

===================  ====================================  ==============================
event                within one window                     when the turn ends
===================  ====================================  ==============================
status (an adapter   merged with the status right before   dropped: the completion (or
line)                it (its text parts appended, details  failure, input-required,
                     updated): one event, not several      cancel-ack) is the newer state
message, artifact,   kept, each its own event, in order    sent, in order, before the
usage                                                      completion
===================  ====================================  ==============================

Only *adjacent* statuses merge, so the order of everything the caller sees is the order
the adapter said it in. Nothing is sent after the turn's end: :meth:`Outbox.run` returns
only once what it keeps is sent, and the runner reports the turn's result after it
returned. Progress is never spooled (it never was): a receiver killed mid-window loses
held progress, never a result — the spool is written before the result is reported,
exactly as before.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

Send = Callable[[str, dict[str, Any]], Awaitable[None]]
"""Sends one progress event (``kind``, ``body``) to the relay; may raise to stop the turn."""


@dataclass
class Held:
    kind: str
    body: dict[str, Any]
    superseded_by_end: bool
    """A plain status: merged with its neighbour, dropped when the turn ends first."""


def merge(older: dict[str, Any], newer: dict[str, Any]) -> dict[str, Any]:
    """Two adjacent status bodies as one: the message's parts in order (no line is lost),
    the newer detail over the older."""
    parts = [*older["message"].get("parts", []), *newer["message"].get("parts", [])]
    body: dict[str, Any] = {**older, **newer, "message": {**newer["message"], "parts": parts}}
    if "detail" in older or "detail" in newer:
        body["detail"] = {**older.get("detail", {}), **newer.get("detail", {})}
    return body


HOLD_LIMIT = 100
"""Events held at most: a full outbox is sent at once, and the adapter waits until it is
taken — the pace of the relay, as when each event was sent before the adapter went on —
so a chatty turn beside a slow relay does not grow the receiver's memory."""


class Outbox:
    """One turn's held progress and the task that sends it (run it in the turn's task
    group; :meth:`close` when the adapter's turn ended, cancel it when it was stopped)."""

    def __init__(self, send: Send, debounce: float) -> None:
        self.send = send
        self.debounce = debounce
        self.held: list[Held] = []
        self._wake = asyncio.Event()  # something is held
        self._flush = asyncio.Event()  # send it now: the turn ended, or the outbox is full
        self._taken = asyncio.Event()  # a batch was taken (room again)
        self._closed = False

    def add(self, kind: str, body: dict[str, Any]) -> None:
        """Hold an event (never blocks: the relay's answer is not waited for)."""
        plain = kind == "status" and "usage" not in body and isinstance(body.get("message"), dict)
        last = self.held[-1] if self.held else None
        if plain and last is not None and last.superseded_by_end:
            last.body = merge(last.body, body)
        else:
            self.held.append(Held(kind, body, plain))
        self._wake.set()
        if len(self.held) >= HOLD_LIMIT:
            self._flush.set()

    async def put(self, kind: str, body: dict[str, Any]) -> None:
        """:meth:`add`, then wait while the outbox is full (:data:`HOLD_LIMIT`)."""
        self.add(kind, body)
        while len(self.held) >= HOLD_LIMIT and not self._closed:
            self._taken.clear()
            await self._taken.wait()

    def close(self) -> None:
        """The turn ended: statuses still held are superseded; the rest goes at once."""
        self._closed = True
        self._flush.set()
        self._wake.set()

    async def run(self) -> None:
        """Send what is held when its window expires (at once when the turn ended or the
        outbox is full); return once the turn ended and everything kept is sent."""
        while True:
            await self._wake.wait()
            if self.debounce > 0 and not self._flush.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._flush.wait(), self.debounce)
            self._wake.clear()
            if not self._closed:
                self._flush.clear()
            batch, self.held = self.held, []
            self._taken.set()
            if self._closed:
                batch = [h for h in batch if not h.superseded_by_end]
            for held in batch:
                await self.send(held.kind, held.body)
            if self._closed and not self.held:
                return
