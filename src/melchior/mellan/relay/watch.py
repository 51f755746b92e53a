"""Waiting for a task to change without missing the change.

The notifier is a latency hint; the store is the truth. A waiter is armed *before*
the store is read, so a publish that lands between the read and the wait still wakes
it, and every wait is bounded by ``poll`` so a lost hint (or another replica's write
without a cross-replica notifier) costs at most one poll interval.

Streams do not run that loop each: a task's streams on one replica (A2A streams and the
dashboard's live task views) follow one :class:`Shared` reader (:class:`Watches`), so a
stream costs memory, not store reads. A follower keeps no queue, only the version of the
reader's value it last took — a queue bounded at one, always the newest: a follower that
falls behind (its client reads slowly) catches up in one step on the reader's latest view,
which holds every event so far, so it still gets each event in order and the terminal
state last, and nobody waits for it. The reader stops on a final value (a terminal or
vanished task), on an error (which its followers raise), or when its last follower leaves.

A publish does not wake every follower in one pass of the event loop: 1,000 streams of a
task each writing a frame in one pass hold the loop (and every other request) for the
whole burst. Waiting followers are woken :data:`WAKE_BATCH` at a time, one batch per
loop pass (:meth:`Watches.wake`), so other work runs between batches; a follower woken
later just takes a newer value. What a follower builds from a value is the caller's, but
a value may carry a memo so followers at the same place share one build (the A2A
streams' :class:`~melchior.mellan.relay.surfaces.a2a.tasks.Watched` does).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator, Callable, Coroutine, Hashable, Iterable
from typing import Any, Generic, TypeVar

from melchior.mellan.relay.metrics import Metrics
from melchior.mellan.relay.notify import Notifier

POLL_SECONDS = 1.0

WAKE_BATCH = 200
"""Followers woken per event-loop pass after a publish (:meth:`Watches.wake`): each
writes a frame when woken, so this bounds the stream work done between two looks at the
sockets (a ``/healthz`` in between waits for one batch, not for every stream)."""


class Waker:
    def __init__(self, notifier: Notifier, topic: str, poll: float = POLL_SECONDS) -> None:
        self._notifier = notifier
        self._topic = topic
        self._poll = poll
        self._waiter: asyncio.Future[bool] | None = None

    @property
    def topic(self) -> str:
        return self._topic

    async def arm(self) -> None:
        """Start listening (at once: no loop pass); call before reading the store."""
        self.arm_now()

    def arm_now(self) -> None:
        """:meth:`arm` from code that is not a coroutine (a callback run before a commit)."""
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


# -- one reader per watched thing, shared by its followers ---------------------------------------

T = TypeVar("T")

Step = Callable[[T | None], AsyncIterator[T]]
"""One look at the store: given the last value published (None the first time), yield each
new value to publish, in order — nothing when nothing changed. The first look must yield."""


class Shared(Generic[T]):
    """The one reader of one key on this replica (see :class:`Watches`).

    It runs the armed-before-read loop of :class:`Waker` once for all its followers and
    publishes each new value with a version number. It never waits for a follower: a
    follower holds no queue, only the version it last took, so however slow it is it costs
    one integer and can never hold the reader (or the followers behind it) back."""

    def __init__(self, watches: Watches, key: Hashable, topic: str, step: Step[T],
                 final: Callable[[T], bool]) -> None:  # fmt: skip
        self.key = key
        self.topic = topic
        self.value: T | None = None
        self.version = 0
        self.error: BaseException | None = None
        self.ended = False
        self.dropped = False
        self.followers = 0
        self._watches = watches
        self._step = step
        self._final = final
        self._changed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiting: dict[asyncio.Future[None], None] = {}
        """Followers waiting for the next publish (:meth:`Follower.wait`), in order, woken
        in batches by :meth:`Watches.wake`; one that stops waiting (timed out, gone)
        takes itself out, so an idle task's list never grows with keepalives."""
        self.task: asyncio.Task[None] | None = None

    def _publish(self) -> None:
        changed, self._changed = self._changed, asyncio.get_running_loop().create_future()
        changed.set_result(None)
        if self.waiting:
            waiting, self.waiting = self.waiting, {}
            self._watches.wake(waiting)

    async def run(self) -> None:
        waker = Waker(self._watches.notifier, self.topic, self._watches.poll)
        try:
            while True:
                await waker.arm()  # before the read: a change during it wakes the next look
                async for value in self._step(self.value):
                    self.value, self.version = value, self.version + 1
                    self._publish()
                if self.value is None:
                    raise RuntimeError(f"the first look at {self.key!r} found nothing")
                if self._final(self.value):
                    return
                await waker.wait()
        except Exception as exc:  # the followers raise it; the reader ends
            self.error = exc
        finally:
            waker.close()
            self.ended = True
            self._publish()
            self._watches._ended(self)

    def changed(self) -> asyncio.Future[None]:
        return self._changed


class Follower(Generic[T]):
    """One stream's hold on a :class:`Shared` reader: the latest value and whether there
    is a newer one. Also has :class:`Waker`'s ``arm``/``wait``/``close``, so a loop written
    for a waker (the dashboard's) can follow a shared reader unchanged."""

    def __init__(self, watches: Watches, shared: Shared[T]) -> None:
        self._watches = watches
        self._shared = shared
        self.taken = 0
        self._closed = False

    @property
    def ended(self) -> bool:
        """The reader is gone and this follower has taken all it published."""
        return self._shared.ended and self.taken >= self._shared.version

    def latest(self) -> T:
        """The reader's newest value (everything it published before, folded in); raises
        what ended the reader, if something went wrong."""
        shared = self._shared
        if shared.error is not None:
            raise shared.error
        if shared.value is None:  # stopped before its first look (the replica shuts down)
            raise RuntimeError("the task's reader stopped before it read the task")
        self.taken = shared.version
        return shared.value

    def fresh(self) -> bool:
        s = self._shared
        return s.version > self.taken or s.error is not None

    async def arm(self) -> None:
        """Until the reader's first value is in (a no-op after that)."""
        while self._shared.version == 0 and not self._shared.ended:
            await asyncio.wait([self._shared.changed()])

    async def wait(self, timeout: float | None = None) -> bool:  # noqa: ASYNC109 (woken or not)
        """Until the reader publishes something this follower has not taken (True), or
        ``timeout`` passes (False: the stream may say it is alive); one poll interval by
        default. A follower may wait longer than the poll interval — the reader polls for
        it — so an idle stream wakes only as often as it must send a keepalive. Woken in
        a batch (:data:`WAKE_BATCH`), possibly a loop pass or a few after the publish.

        One future and one timer per wait, no ``asyncio.wait``: this runs once per event
        per stream, 10,000 times a tick at 10,000 streams."""
        if self.fresh():
            return True
        timeout = self._watches.poll if timeout is None else timeout
        if self._shared.ended:  # shut down under us: no spin, the caller ends or waits
            await asyncio.sleep(timeout)
            return self.fresh()
        loop = asyncio.get_running_loop()
        woken: asyncio.Future[None] = loop.create_future()
        waiting = self._shared.waiting
        waiting[woken] = None
        timer = loop.call_later(timeout, _settle, woken)
        try:
            await woken
        finally:
            timer.cancel()
            waiting.pop(woken, None)  # still there if the timer (or a cancel) ended it
        return self.fresh()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._watches._leave(self._shared)


def _settle(woken: asyncio.Future[None]) -> None:
    if not woken.done():
        woken.set_result(None)


class Watches:
    """This replica's shared readers, one per key (a task, for A2A streams and for the
    dashboard's live task view): N streams on one task cost one store read per change
    (and per poll interval), not N. A reader lives while it has followers: the first one
    starts it, the last one to leave cancels it. It runs in the lifespan's task group when
    :meth:`start` was given one (so it is awaited on the way out), else as a task this
    object keeps and :meth:`stop` cancels and awaits."""

    def __init__(self, notifier: Notifier, poll: float, metrics: Metrics) -> None:
        self.notifier = notifier
        self.poll = poll
        self._metrics = metrics
        self._shared: dict[Hashable, Shared[Any]] = {}
        self._group: asyncio.TaskGroup | None = None
        self._loose: set[asyncio.Task[None]] = set()
        self._to_wake: deque[asyncio.Future[None]] = deque()
        self._waking = False

    def wake(self, waiting: Iterable[asyncio.Future[None]]) -> None:
        """Wake these waiting followers, :data:`WAKE_BATCH` per loop pass: a callback
        that wakes one batch and, if more are left, schedules itself for the next pass
        (after the loop has looked at its sockets). All readers share the one queue, so
        ten tasks ticking at once still wake one batch per pass."""
        self._to_wake.extend(waiting)
        if not self._waking:
            self._waking = True
            asyncio.get_running_loop().call_soon(self._wake_batch)

    def _wake_batch(self) -> None:
        queue = self._to_wake
        for _ in range(min(WAKE_BATCH, len(queue))):
            _settle(queue.popleft())  # a follower that left (cancelled) is skipped
        if queue:
            asyncio.get_running_loop().call_soon(self._wake_batch)
        else:
            self._waking = False

    def start(self, group: asyncio.TaskGroup) -> None:
        self._group = group

    def readers(self) -> int:
        return len(self._shared)

    def follow(self, key: Hashable, topic: str, step: Step[T],
               final: Callable[[T], bool]) -> Follower[T]:  # fmt: skip
        """Join the reader of ``key`` (woken by ``topic``), starting it if there is none."""
        shared: Shared[T] | None = self._shared.get(key)
        if shared is None or shared.ended:
            shared = Shared(self, key, topic, step, final)
            self._shared[key] = shared
            shared.task = self._spawn(shared.run(), f"mellan-watch-{topic}")
            self._count(shared, readers=1)
        shared.followers += 1
        self._count(shared, followers=1)
        return Follower(self, shared)

    def _spawn(self, job: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        if self._group is not None:
            with contextlib.suppress(RuntimeError):  # the group is closing: run it loose
                return self._group.create_task(job, name=name)
        task = asyncio.get_running_loop().create_task(job, name=name)
        self._loose.add(task)
        task.add_done_callback(self._loose.discard)
        return task

    def _count(self, shared: Shared[Any], *, readers: int = 0, followers: int = 0) -> None:
        kind = str(shared.key[0]) if isinstance(shared.key, tuple) else "other"
        if readers:
            self._metrics.stream_readers.inc(readers, kind=kind)
        if followers:
            self._metrics.stream_followers.inc(followers, kind=kind)

    def _leave(self, shared: Shared[Any]) -> None:
        shared.followers -= 1
        self._count(shared, followers=-1)
        if shared.followers == 0 and shared.task is not None and not shared.task.done():
            shared.task.cancel()
            # Dropped now, not in the reader's ``finally``: the next follower starts afresh,
            # and a reader cancelled before its first step never runs that ``finally``.
            self._ended(shared)

    def _ended(self, shared: Shared[Any]) -> None:
        """Forget a reader (once, whoever comes first: its end or its last follower)."""
        if shared.dropped:
            return
        shared.dropped = True
        if self._shared.get(shared.key) is shared:
            del self._shared[shared.key]
        self._count(shared, readers=-1)

    def stop(self) -> None:
        """Cancel every reader (the lifespan's task group, or :meth:`aclose`, awaits them)."""
        for shared in list(self._shared.values()):
            if shared.task is not None:
                shared.task.cancel()

    async def aclose(self) -> None:
        self.stop()
        if self._loose:
            await asyncio.gather(*self._loose, return_exceptions=True)
