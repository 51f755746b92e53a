"""What every request handler of a relay replica shares.

The store is synchronous and is called from worker threads (``call``), so one slow
query never stalls the event loop that is holding long-polls and streams open.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from melchior.mellan.relay.auth import Credentials
from melchior.mellan.relay.batch import Batcher
from melchior.mellan.relay.caches.facts import DoorFacts
from melchior.mellan.relay.caches.fresh import FreshEvents
from melchior.mellan.relay.caches.limits import SendLimits
from melchior.mellan.relay.caches.memo import Memo
from melchior.mellan.relay.metrics import Metrics
from melchior.mellan.relay.notify import Notifier
from melchior.mellan.relay.store.base import Store, StoreUnavailable

if TYPE_CHECKING:
    from melchior.mellan.relay.caches.presence import Presence
    from melchior.mellan.relay.surfaces.a2a.grpc_binding import GrpcEndpoint
    from melchior.mellan.relay.watch import Watches
    from melchior.mellan.relay.workers.push import Pusher
    from melchior.mellan.relay.workers.wake import Waker

P = ParamSpec("P")
T = TypeVar("T")

STORE_THREADS = 40
"""Store calls running at once, per process (what anyio's default thread limiter allowed
per event loop before; a long-poll or a stream holds no thread while it waits)."""


class StorePool:
    """Threads for store calls: a call is queued at once, from the event loop, and its
    result comes back with one ``call_soon_threadsafe``. Nothing else: no limiter or
    cancel scope to pass on the loop (anyio's), no locks and semaphore per call
    (``ThreadPoolExecutor``'s). A thread is started when none waits, up to ``size``;
    threads are daemons, as a call still running when the process ends has nobody to
    answer (a commit is atomic either way)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], asyncio.Future[Any]]] = (
            queue.SimpleQueue()
        )
        self._waiting: list[None] = []  # one per thread about to wait for a job (atomic ops)
        self._threads = 0
        self._lock = threading.Lock()

    def submit(self, fn: Callable[[], T]) -> asyncio.Future[T]:
        """Queue ``fn``; a future of the running loop for its result."""
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        try:
            self._waiting.pop()  # a waiting thread will take it
        except IndexError:
            with self._lock:
                start = self._threads < self.size
                if start:
                    self._threads += 1
            if start:
                name = f"mellan-store-{self._threads}"
                threading.Thread(target=self._work, name=name, daemon=True).start()
        self._jobs.put((fn, future))
        return future

    def _work(self) -> None:
        first = True  # started for a job already queued: it takes one without a token
        while True:
            if not first:
                self._waiting.append(None)
            first = False
            fn, future = self._jobs.get()
            try:
                outcome: tuple[bool, Any] = (True, fn())
            except BaseException as exc:  # handed to the caller, whatever it is
                outcome = (False, exc)
            del fn
            with contextlib.suppress(RuntimeError):  # its loop closed: nobody to answer
                future.get_loop().call_soon_threadsafe(_settle, future, outcome)
            del future, outcome


def _settle(future: asyncio.Future[Any], outcome: tuple[bool, Any]) -> None:
    if future.done():
        return
    ok, value = outcome
    if ok:
        future.set_result(value)
    else:
        future.set_exception(value)


_STORE_POOL = StorePool(STORE_THREADS)
"""The threads :meth:`Relay.call` runs store calls on, one pool per process (a relay is one
replica per process; the tests' several replicas share it)."""


@dataclass
class Relay:
    store: Store
    notifier: Notifier
    public_url: str
    max_body: int = 16 * 1024 * 1024
    max_result: int = 8 * 1024 * 1024
    """Largest result (encoded JSON bytes) a receiver may complete a task with: a result is
    stored, read back and sent to every reader, so it is bounded below the body limit."""
    body_deadline: float = 30.0
    """Seconds a client has to deliver a request body once its headers are in."""
    poll_interval: float = 1.0
    """Seconds between store reads while a long-poll waits: the truth behind every wake-up."""
    sweep_interval: float = 5.0
    retain_days: float | None = None
    """Finished tasks older than this are deleted (:mod:`.retention`); None keeps them."""
    retention_interval: float = 3600.0
    retention_first: float = 30.0
    """Seconds from start to the first retention round, then between rounds."""
    """Seconds between lease sweeps (every replica sweeps; the store makes that safe)."""
    closing: bool = False
    """Set when the replica is shutting down: long-polls answer at their next store read
    instead of holding the graceful shutdown open until their ``wait`` runs out."""
    batcher: Batcher = field(init=False, repr=False)
    """Group commit of accepted sends; its consumer is run by the app's lifespan."""
    pusher: Pusher | None = field(default=None, repr=False)
    """The replica's push-notification deliverer (made and run by the app's lifespan
    unless one is given, e.g. with a test's resolver)."""
    waker: Waker | None = field(default=None, repr=False)
    """The replica's wake-up sender (made and run by the app's lifespan unless given)."""
    credentials: Credentials = field(init=False, repr=False)
    """Live credentials remembered for a moment (see :class:`~.auth.Credentials`)."""
    held: Memo[tuple[str, str, str], bool] = field(init=False, repr=False)
    """(workspace, receiving agent, task) seen to be that agent's task — by its claim or a
    check — so its reports skip the check (:func:`.receiver_api._as_receiver`). Never
    stale: a task's receiver does not change."""
    watches: Watches = field(init=False, repr=False)
    """One shared reader per watched task, for all its streams (:mod:`.a2a.watch`)."""
    fresh: FreshEvents = field(init=False, repr=False)
    """Events this replica just committed, handed to its own streams (:mod:`.fresh`)."""
    facts: DoorFacts = field(init=False, repr=False)
    """Agents, grants and routes as the door read them, remembered for a moment
    (:mod:`.facts`); whoever changes one on this replica calls ``facts.forget()``."""
    presence: Presence = field(init=False, repr=False)
    """Which receivers' sightings this replica stored, and when (see :mod:`.presence`)."""
    limits: SendLimits = field(default_factory=SendLimits, repr=False)
    """Send limits in force and the senders' token buckets (:mod:`.limits`)."""
    metrics: Metrics = field(default_factory=Metrics, repr=False)
    """This replica's counters and the cached database gauges (:mod:`.metrics`)."""
    metrics_token: str | None = field(default=None, repr=False)
    """A token that may read ``/metrics`` (besides owner credentials); None: owners only."""
    grpc: GrpcEndpoint | None = field(default=None, repr=False)
    """Where the A2A gRPC binding listens (started by the app's lifespan); None: off."""

    def __post_init__(self) -> None:
        from melchior.mellan.relay.caches.presence import Presence
        from melchior.mellan.relay.watch import Watches

        self.batcher = Batcher(self)
        self.credentials = Credentials()
        self.facts = DoorFacts()
        self.fresh = FreshEvents()
        self.watches = Watches(self.notifier, self.poll_interval, self.metrics)
        self.held = Memo(ttl=3600.0, size=65536)
        self.store.set_witness(self.fresh.note)
        self.presence = Presence()
        self.store.set_tally(self.metrics.tally)

    def queued(self, workspace: str, agent: str) -> None:
        """Work was queued for ``agent``: wake its receiver if it has a wake URL (never
        blocks; see :mod:`.wake`)."""
        if self.waker is not None:
            self.waker.poke(workspace, agent)

    async def call(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run a (blocking) store call in a worker thread; an unreachable database is
        counted (``mellan_database_errors_total``) on its way to the 503.

        The call is handed to its thread at once, in the caller's context (the request id
        its audit records carry). It was ``run_in_threadpool`` (anyio), which yields to the
        event loop twice before it queues the call — a checkpoint, then its limiter's — so
        every store call of a request waited behind all the ready work of the loop, twice,
        before it even began (docs/benchmarks.md, issue 25, the relay's own path). As
        there, a caller cancelled meanwhile is cancelled at once and its call runs on to
        its end in its thread (a commit is still followed by its wake-ups)."""
        context = contextvars.copy_context()
        job = _STORE_POOL.submit(functools.partial(context.run, fn, *args, **kwargs))
        try:
            return await job
        except StoreUnavailable:
            self.metrics.db_errors.inc()
            raise
