"""A replica's view of the send limits: the values in force, and the senders' buckets.

The limits themselves are stored (schema v8: workspace defaults under agent ``'*'`` and
per-agent overrides, changed by owners with ``mellan agent limits``) and read here at
most every :attr:`SendLimits.ttl` seconds per workspace, so a send costs no extra
query; a change made on this replica is seen at once, on another within the ttl.

The rate (a token bucket per calling agent, :func:`melchior.policy.send_limits.take`)
is kept in this process: each replica refills its own buckets, so behind a balancer
spreading one caller over N replicas the caller may reach N times its rate. The caps
are not kept here: they are counted in the enqueue transaction, exact across replicas.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from melchior.mellan.relay.store.base import Store
from melchior.policy.send_limits import DEFAULTS, Bucket, Limits, Overrides, Take, effective, take

WORKSPACE_DEFAULTS = "*"
"""The agent id under which a workspace's defaults are stored."""

MAX_BUCKETS = 100_000
"""Buckets kept per replica; the least recently used goes first (it refills full anyway
after ``burst / rate`` seconds, so forgetting an idle one changes nothing)."""


class SendLimits:
    def __init__(
        self,
        base: Limits = DEFAULTS,
        *,
        ttl: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.base = base
        self.ttl = ttl
        self._clock = clock
        self._lock = threading.Lock()
        self._stored: dict[str, tuple[float, dict[str, Overrides]]] = {}
        self._buckets: OrderedDict[tuple[str, str], Bucket] = OrderedDict()

    def overrides(self, store: Store, workspace: str) -> dict[str, Overrides]:
        """The workspace's stored limits, read at most every ttl (a worker-thread call)."""
        now = self._clock()
        hit = self.remembered(workspace)
        if hit is not None:
            return hit
        stored = store.limit_overrides(workspace)
        with self._lock:
            self._stored[workspace] = (now, stored)
        return stored

    def for_agent(self, store: Store, workspace: str, agent: str) -> Limits:
        return self.of(self.overrides(store, workspace), agent)

    def of(self, stored: dict[str, Overrides], agent: str) -> Limits:
        """``agent``'s limits in force, given its workspace's stored ones."""
        none = Overrides()
        return effective(stored.get(WORKSPACE_DEFAULTS, none), stored.get(agent, none), self.base)

    def remembered(self, workspace: str) -> dict[str, Overrides] | None:
        """The workspace's stored limits if read within the ttl, else None (then read them
        with :meth:`overrides` in a worker thread) — so the door needs no thread when they
        are fresh."""
        with self._lock:
            hit = self._stored.get(workspace)
        if hit is not None and self._clock() - hit[0] < self.ttl:
            return hit[1]
        return None

    def forget(self, workspace: str) -> None:
        """Read the workspace's limits afresh at the next send (they just changed)."""
        with self._lock:
            self._stored.pop(workspace, None)

    def take(self, workspace: str, agent: str, limits: Limits) -> Take:
        """One send's token from ``agent``'s bucket."""
        key = (workspace, agent)
        with self._lock:
            got = take(self._buckets.get(key), self._clock(), limits.send_rate, limits.burst)
            self._buckets[key] = got.bucket
            self._buckets.move_to_end(key)
            while len(self._buckets) > MAX_BUCKETS:
                self._buckets.popitem(last=False)
        return got
