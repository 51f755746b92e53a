"""What every request handler of a relay replica shares.

The store is synchronous and is called from worker threads (``call``), so one slow
query never stalls the event loop that is holding long-polls and streams open.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ParamSpec, TypeVar

from starlette.concurrency import run_in_threadpool

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
        counted (``mellan_database_errors_total``) on its way to the 503."""
        try:
            return await run_in_threadpool(fn, *args, **kwargs)
        except StoreUnavailable:
            self.metrics.db_errors.inc()
            raise
