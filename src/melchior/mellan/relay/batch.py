"""Group commit for accepted sends: concurrent accepts share one ``enqueue_many`` commit.

A durable commit is the unit of cost on a real disk, and a relay under load accepts many
tasks at once. Accepts queue up here; one consumer (:meth:`Batcher.run`, owned by the
app's lifespan, never by whichever request came first) writes whatever is waiting in one
commit, then the next batch. Nobody waits longer than one commit for company, and a quiet
relay writes each accept alone at once. If a batch fails, its tasks are retried one by
one, so one bad task cannot sink the others.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from melchior.mellan.relay.store.base import NewTask, OverLimit, StoreUnavailable, Task

if TYPE_CHECKING:
    from melchior.mellan.relay.context import Relay

MAX_BATCH = 200

Result = tuple[Task, bool] | OverLimit
"""(task, created), or the cap that kept a new task out (checked in the same commit)."""


class Batcher:
    def __init__(self, relay: Relay) -> None:
        self._relay = relay
        self._pending: list[tuple[NewTask, asyncio.Future[Result]]] = []
        self._wake = asyncio.Event()
        self._running = False
        self._inflight: list[tuple[NewTask, asyncio.Future[Result]]] = []

    async def enqueue(self, task: NewTask) -> Result:
        """Store ``task`` with whatever else is waiting; its (task, created) once committed,
        or the :class:`OverLimit` that refused it."""
        if not self._running:
            raise RuntimeError("the accept batcher is not running (the app's lifespan runs it)")
        fut: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        self._pending.append((task, fut))
        self._wake.set()
        return await fut

    def start(self, owner: asyncio.TaskGroup) -> asyncio.Task[None]:
        """Run the consumer in ``owner`` (the app's lifespan); accepts are taken from now
        on, even before its first step runs."""
        self._running = True
        return owner.create_task(self.run(), name="mellan-accept-batcher")

    async def run(self) -> None:
        """Write batches until cancelled; on the way out, fail whatever still waits (the
        replica is stopping; nothing of theirs was written)."""
        self._running = True
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                while self._pending:
                    batch, self._pending = self._pending[:MAX_BATCH], self._pending[MAX_BATCH:]
                    self._inflight = batch
                    await self._write(batch)
                    self._inflight = []
        finally:
            self._running = False
            stopping = "the relay is stopping"
            # a batch being written when we were stopped may still commit in its thread
            cut = StoreUnavailable(f"{stopping} while storing this", unclear=True)
            for _, fut in self._inflight:
                if not fut.done():
                    fut.set_exception(cut)
            for _, fut in self._pending:
                if not fut.done():
                    fut.set_exception(StoreUnavailable(f"{stopping}; nothing was stored"))
            self._inflight, self._pending = [], []

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
            results = await self._relay.call(self._relay.store.admit, [t for t, _ in batch])
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
