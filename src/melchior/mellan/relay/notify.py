"""Wake-ups between the parts of a relay: a latency hint, never the truth.

A receiver long-polling for work and a caller streaming a task wait on a topic;
whoever changes the store publishes it. A missed or duplicated wake-up costs only
latency, because every waiter re-reads the store when it wakes and also on a
timer. On one process an in-memory hub is enough; several replicas on PostgreSQL
use LISTEN/NOTIFY behind the same interface. The topics' names are :mod:`.topics`'s
(below the store, which publishes them), re-exported here for the waiters.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from typing import Protocol

from melchior.mellan.relay.topics import (
    PUSH_TOPIC,
    audit_topic,
    receiver_topic,
    task_stop_topic,
    task_topic,
)

__all__ = [
    "PUSH_TOPIC",
    "LocalNotifier",
    "Notifier",
    "audit_topic",
    "receiver_topic",
    "task_stop_topic",
    "task_topic",
]


class Notifier(Protocol):
    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def publish(self, topic: str) -> None:
        """Wake every waiter on ``topic`` (on every replica, for networked notifiers)."""
        ...

    def listen(self, topic: str, timeout: float) -> asyncio.Future[bool]:
        """A future that turns True when ``topic`` is published, or False once ``timeout``
        passes — listening from the moment it returns, so a caller can arm it, read the
        store, then await it without missing a publish in between (and without a loop
        pass to let a task register). Cancel it to stop listening."""
        ...

    async def wait(self, topic: str, timeout: float) -> bool:  # noqa: ASYNC109 (the answer is woken or not)
        """Wait until ``topic`` is published or ``timeout`` passes; True if woken."""
        ...


class LocalNotifier:
    """Wake-ups inside one process. Must be used from the event loop's thread, except
    ``publish`` which is safe from worker threads.

    A waiter is a bare future with a timer, not a task: a publish reaches the code
    waiting on it in one loop pass (a stream's event is that much sooner on its way)."""

    def __init__(self) -> None:
        self._waiters: dict[str, set[asyncio.Future[bool]]] = defaultdict(set)
        self._loop: asyncio.AbstractEventLoop | None = None

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()

    async def stop(self) -> None:
        for topic in list(self._waiters):
            self._wake(topic)

    def publish(self, topic: str) -> None:
        loop = self._loop
        if loop is None:
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            self._wake(topic)
        else:
            loop.call_soon_threadsafe(self._wake, topic)

    def _wake(self, topic: str) -> None:
        for fut in list(self._waiters.get(topic, ())):
            if not fut.done():
                fut.set_result(True)

    def listen(self, topic: str, timeout: float) -> asyncio.Future[bool]:
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
        fut: asyncio.Future[bool] = loop.create_future()
        waiters = self._waiters[topic]
        waiters.add(fut)
        timer = loop.call_later(timeout, _settle, fut)

        def gone(_: asyncio.Future[bool]) -> None:
            timer.cancel()
            waiters.discard(fut)
            if not waiters and self._waiters.get(topic) is waiters:
                del self._waiters[topic]

        fut.add_done_callback(gone)
        return fut

    async def wait(self, topic: str, timeout: float) -> bool:  # noqa: ASYNC109 (the answer is woken or not)
        return await self.listen(topic, timeout)


def _settle(fut: asyncio.Future[bool]) -> None:
    if not fut.done():
        fut.set_result(False)
