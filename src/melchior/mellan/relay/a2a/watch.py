"""Waiting for a task to change without missing the change.

The notifier is a latency hint; the store is the truth. A waiter is armed *before*
the store is read, so a publish that lands between the read and the wait still wakes
it, and every wait is bounded by ``poll`` so a lost hint (or another replica's write
without a cross-replica notifier) costs at most one poll interval.
"""

from __future__ import annotations

import asyncio
import contextlib

from melchior.mellan.relay.notify import Notifier

POLL_SECONDS = 1.0


class Waker:
    def __init__(self, notifier: Notifier, topic: str, poll: float = POLL_SECONDS) -> None:
        self._notifier = notifier
        self._topic = topic
        self._poll = poll
        self._waiter: asyncio.Future[bool] | None = None

    async def arm(self) -> None:
        """Start listening (at once: no loop pass); call before reading the store."""
        if self._waiter is None:
            self._waiter = self._notifier.listen(self._topic, self._poll)

    async def wait(self) -> None:
        """Until the topic is published or the poll interval passes."""
        await self.arm()
        assert self._waiter is not None
        try:
            await self._waiter
        finally:
            self._waiter = None

    def close(self) -> None:
        if self._waiter is not None:
            self._waiter.cancel()
            with contextlib.suppress(BaseException):
                self._waiter.exception()
            self._waiter = None
