"""Group commit for accepted sends: concurrent accepts share one ``enqueue_many`` commit.

A durable commit is the unit of cost on a real disk, and a relay under load accepts many
tasks at once. The first accept is written alone; every accept that arrives while a
commit is in flight waits for the next one, which writes them together. Nobody waits
longer than one commit for company, and a quiet relay behaves exactly as before. If a
batch fails, its tasks are retried one by one, so one bad task cannot sink the others.
"""

from __future__ import annotations

import asyncio

from melchior.mellan.relay.context import Relay
from melchior.mellan.relay.store.base import NewTask, StoreUnavailable, Task

MAX_BATCH = 200

Result = tuple[Task, bool]


class Batcher:
    def __init__(self, relay: Relay) -> None:
        self._relay = relay
        self._pending: list[tuple[NewTask, asyncio.Future[Result]]] = []
        self._draining = False
        self._drainer: asyncio.Future[None] | None = None

    async def enqueue(self, task: NewTask) -> Result:
        fut: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        self._pending.append((task, fut))
        if not self._draining:
            self._draining = True
            self._drainer = asyncio.ensure_future(self._drain())
        return await fut

    async def _drain(self) -> None:
        try:
            while self._pending:
                batch, self._pending = self._pending[:MAX_BATCH], self._pending[MAX_BATCH:]
                await self._write(batch)
        finally:
            self._draining = False

    async def _write(
        self,
        batch: list[tuple[NewTask, asyncio.Future[Result]]],
        lost: StoreUnavailable | None = None,
    ) -> None:
        """Write ``batch``; after a failure retry its items one by one, so one bad task
        cannot sink the others. ``lost``: an earlier attempt lost its connection at COMMIT
        and may have stored them, so a failure now must not be reported as "nothing
        stored": that unclear loss is what the caller gets, for the door to settle."""
        try:
            results = await self._relay.call(self._relay.store.enqueue_many, [t for t, _ in batch])
        except Exception as exc:
            failure: BaseException = exc
            if isinstance(exc, StoreUnavailable) and exc.unclear:
                lost = exc
            if lost is not None and isinstance(exc, StoreUnavailable):
                failure = lost
            if len(batch) == 1:
                if not batch[0][1].done():
                    batch[0][1].set_exception(failure)
                return
            for item in batch:  # find the one that fails; the others still go in
                await self._write([item], lost)
            return
        for (_, fut), result in zip(batch, results, strict=True):
            if not fut.done():
                fut.set_result(result)


ATTRIBUTE = "_a2a_batcher"


def batcher(relay: Relay) -> Batcher:
    """The relay's batcher (kept on the relay object: one per replica and event loop)."""
    found = getattr(relay, ATTRIBUTE, None)
    if not isinstance(found, Batcher):
        found = Batcher(relay)
        setattr(relay, ATTRIBUTE, found)
    return found
