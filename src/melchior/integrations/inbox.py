"""The bridge's inbox: messages waiting for the model, and which of them it has read.

A coding agent's model only reads between tool calls, so a message that reaches a
bridged session is *kept*, and the sender's receipt says ``queued``. It becomes
``delivered`` when the model is actually handed it: by a turn hook (``melchior hook``
prints it into the context), by the ``inbox`` tool, or by a channel notification the
operator enabled. The inbox remembers which message ids went which way, so a sender
following ``<id>@<message-id>`` with ``task`` learns the truth later.

:class:`Inbox` is one more :class:`~melchior.envelope.AsyncDelivery`: it stands where
``melchior serve``'s pipe harness stands (``Serve.harness``), so serve hands it a
:class:`~melchior.envelope.Message` and gets a :class:`~melchior.envelope.Receipt` back.
Everything is bounded: the number and bytes of waiting messages (a full inbox refuses,
saying so) and the delivery record.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Iterable
from typing import NamedTuple

from melchior.envelope import (
    DELIVERED,
    QUEUED,
    Message,
    Receipt,
    receipt,
    refused_receipt,
)
from melchior.policy.decision import refuse

MAX_WAITING = 256
"""Messages an inbox keeps for the model before it refuses more."""
MAX_WAITING_BYTES = 8 * 1024 * 1024
"""UTF-8 bytes of waiting text an inbox keeps before it refuses more."""
REMEMBERED = 4096
"""Message ids whose fate (queued or delivered) the inbox can still tell a sender."""

WAKING_SORTS = frozenset({"attention", "question", "answer"})
"""Sorts that may wake an agent mid-turn or at its turn's end; notes and reports wait
for the next turn (a report notification is deliberately non-interrupting)."""


class Entry(NamedTuple):
    """One waiting message and where it came from."""

    seq: int
    message: Message
    sender_id: str | None
    size: int
    received: float


class Fate(NamedTuple):
    """What became of a message a sender may ask about."""

    kind: str
    sender_id: str | None
    via: str | None = None
    at: float | None = None


Arrival = Callable[[Entry], Awaitable[bool]]
"""Called for each new message; True means it was handed to the model at once (a
channel notification), so it is delivered rather than kept."""


class Inbox:
    """Messages waiting for one bridged agent's model (an AsyncDelivery)."""

    def __init__(
        self,
        *,
        max_waiting: int = MAX_WAITING,
        max_bytes: int = MAX_WAITING_BYTES,
        remembered: int = REMEMBERED,
    ) -> None:
        self._waiting: deque[Entry] = deque()
        self._bytes = 0
        self._seq = 0
        self._fates: OrderedDict[str, Fate] = OrderedDict()
        self._max_waiting = max_waiting
        self._max_bytes = max_bytes
        self._remembered = remembered
        self._changed = asyncio.Condition()
        self.on_arrival: Arrival | None = None

    # -- the Delivery side ----------------------------------------------------------------

    async def deliver(self, message: Message) -> Receipt:
        """Keep ``message`` for the model: ``queued``, or ``delivered`` when the arrival
        hook handed it over at once; refused (with the reason) when the inbox is full."""
        size = len(message.text.encode("utf-8"))
        if len(self._waiting) >= self._max_waiting or self._bytes + size > self._max_bytes:
            return refused_receipt(
                refuse(
                    "inbox-full",
                    f"{message.recipient} has {len(self._waiting)} message(s) waiting for its "
                    "model to read them, as many as it keeps; try again after it has read "
                    "some (its status says how many wait)",
                ),
                message.message_id,
            )
        self._seq += 1
        sender = message.metadata.get("from") if message.metadata else None
        entry = Entry(self._seq, message, sender if isinstance(sender, str) else None, size,
                      time.time())  # fmt: skip
        if self.on_arrival is not None and await self.on_arrival(entry):
            self._remember(entry, DELIVERED, "channel")
            return receipt(DELIVERED, message.message_id, via="channel")
        self._waiting.append(entry)
        self._bytes += size
        self._remember(entry, QUEUED, None)
        async with self._changed:
            self._changed.notify_all()
        return receipt(QUEUED, message.message_id)

    # -- the model side -------------------------------------------------------------------

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def peek(self, sorts: Iterable[str] | None = None) -> list[Entry]:
        wanted = None if sorts is None else frozenset(sorts)
        return [e for e in self._waiting if wanted is None or e.message.sort in wanted]

    def take(self, entries: Iterable[Entry], via: str) -> list[Entry]:
        """Mark ``entries`` as handed to the model through ``via`` and drop them from the
        waiting list; returns those that were still waiting."""
        chosen = {e.seq for e in entries}
        taken = [e for e in self._waiting if e.seq in chosen]
        if not taken:
            return []
        self._waiting = deque(e for e in self._waiting if e.seq not in chosen)
        for e in taken:
            self._bytes -= e.size
            self._remember(e, DELIVERED, via)
        return taken

    async def wait(self, timeout: float) -> bool:  # noqa: ASYNC109 (True/False is the answer: woken or timed out)
        """Wait up to ``timeout`` seconds for a message to be waiting; True if one is."""
        if self._waiting:
            return True
        async with self._changed:
            try:
                await asyncio.wait_for(self._changed.wait_for(lambda: bool(self._waiting)), timeout)
            except TimeoutError:
                return False
        return True

    # -- what senders may learn -----------------------------------------------------------

    def fate(self, key: str) -> Fate | None:
        """What became of the message with id (or question handle) ``key``, if remembered."""
        return self._fates.get(key)

    def _remember(self, entry: Entry, kind: str, via: str | None) -> None:
        at = time.time() if kind == DELIVERED else None
        for key in _keys(entry.message):
            self._fates[key] = Fate(kind, entry.sender_id, via, at)
            self._fates.move_to_end(key)
        while len(self._fates) > self._remembered:
            self._fates.popitem(last=False)


def _keys(message: Message) -> list[str]:
    out = []
    if message.message_id:
        out.append(message.message_id)
    if message.about and message.sort == "question":
        out.append(message.about)
    return out
