"""What a relay replica reports at ``GET /metrics``, in the Prometheus text format (0.0.4).

Two kinds of numbers, kept apart on purpose:

- **Counters and histograms of this process** (accepts, claims, completions, failures,
  lease expiries, cancellations, quota refusals, request latency, wake-ups, database
  errors): each replica counts what *it* did, from its start. With several replicas,
  sum them in Prometheus (``sum without (instance) (rate(mellan_tasks_claimed_total[5m]))``).
  Queue counts come from the store's tallies after each COMMIT (:data:`.store.queue.TALLIES`),
  so a rolled-back transaction counts nothing.
- **Gauges of the database** (tasks by state, queue depth and oldest queued task per
  receiving agent): the same on every replica, read at scrape time in a worker thread
  and cached for :attr:`Metrics.cache_seconds`, so scrapes never scan on every request
  and a burst of scrapers costs one query.

Labels are bounded: routes are templates (``/api/receiver/tasks/{task_id}/renew``), never
raw paths; A2A requests are labelled by binding and operation; agents appear only in
the per-receiver gauges, which are as many as the workspace has agents.

Written here rather than with ``prometheus_client``: the relay needs a dozen series and
one text rendering, and the tests read it with ``prometheus_client``'s own parser.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from melchior.mellan.relay.store.base import Store

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
GC_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
ATTEMPT_BUCKETS = (1, 2, 3, 5, 10)

Labels = tuple[tuple[str, str], ...]


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(labels: Labels, extra: tuple[str, str] | None = None) -> str:
    items = list(labels) + ([extra] if extra else [])
    if not items:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in items) + "}"


def _num(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if float(value).is_integer():
        return str(int(value))
    return repr(float(value))


class Counter:
    kind, suffix = "counter", "_total"  # Prometheus names a counter's sample NAME_total

    def __init__(self, name: str, help_: str) -> None:
        self.name, self.help = name, help_
        self._values: dict[Labels, float] = {}
        self._lock = threading.Lock()

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        key = tuple(sorted(labels.items()))
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + amount

    def value(self, **labels: str) -> float:
        return self._values.get(tuple(sorted(labels.items())), 0.0)

    def render(self) -> Iterable[str]:
        yield f"# HELP {self.name} {self.help}"
        yield f"# TYPE {self.name} {self.kind}"
        with self._lock:
            items = sorted(self._values.items())
        for labels, value in items:
            yield f"{self.name}{self.suffix}{_labels(labels)} {_num(value)}"


class Gauge(Counter):
    """A number of this process that goes up and down (live streams, shared readers)."""

    kind, suffix = "gauge", ""


class Histogram:
    def __init__(self, name: str, help_: str, buckets: Sequence[float]) -> None:
        self.name, self.help = name, help_
        self.buckets = tuple(buckets)
        self._series: dict[Labels, list[float]] = {}  # per bucket counts, then sum, count
        self._lock = threading.Lock()

    def observe(self, value: float, **labels: str) -> None:
        key = tuple(sorted(labels.items()))
        with self._lock:
            row = self._series.setdefault(key, [0.0] * (len(self.buckets) + 2))
            for k, bound in enumerate(self.buckets):
                if value <= bound:
                    row[k] += 1
            row[-2] += value
            row[-1] += 1

    def render(self) -> Iterable[str]:
        yield f"# HELP {self.name} {self.help}"
        yield f"# TYPE {self.name} histogram"
        with self._lock:
            items = sorted((k, list(v)) for k, v in self._series.items())
        for labels, row in items:
            for bound, count in zip(self.buckets, row, strict=False):
                le = ("le", repr(float(bound)))  # "1.0", as Prometheus clients write it
                yield f"{self.name}_bucket{_labels(labels, le)} {_num(count)}"
            yield f"{self.name}_bucket{_labels(labels, ('le', '+Inf'))} {_num(row[-1])}"
            yield f"{self.name}_sum{_labels(labels)} {_num(row[-2])}"
            yield f"{self.name}_count{_labels(labels)} {_num(row[-1])}"


class GcPauses(Histogram):
    """How long the cycle collector stopped this process, per generation (0, 1, 2): each
    pass stops every thread, the event loop's too (:mod:`.server.gcpolicy` says why the
    relay tunes it). Written from the collector's own callback, so without the lock: a
    callback that took it could wait forever on a thread that holds it and allocated
    (which is what starts a pass). The collector runs one pass at a time, so the rows,
    made here once, have one writer; a scrape copies them under the lock as it renders."""

    def __init__(self) -> None:
        super().__init__(
            "mellan_gc_pause_seconds",
            "Garbage-collector passes by generation and how long each stopped the process.",
            GC_BUCKETS,
        )
        self._rows = [[0.0] * (len(self.buckets) + 2) for _ in range(3)]
        for generation, row in enumerate(self._rows):
            self._series[(("generation", str(generation)),)] = row
        self._started = 0.0

    def callback(self, phase: str, info: dict[str, int]) -> None:
        """For ``gc.callbacks``."""
        if phase == "start":
            self._started = time.perf_counter()
            return
        seconds = time.perf_counter() - self._started
        row = self._rows[info["generation"]]
        for k, bound in enumerate(self.buckets):
            if seconds <= bound:
                row[k] += 1
        row[-2] += seconds
        row[-1] += 1


@dataclass(frozen=True)
class Gauges:
    """What the database says at one moment (:meth:`Store.queue_gauges`)."""

    by_state: dict[tuple[str, str], int]  # (workspace, state) → tasks
    queued: dict[tuple[str, str], int]  # (workspace, receiver) → queued tasks
    oldest: dict[tuple[str, str], float]  # (workspace, receiver) → age in seconds
    online: dict[str, int] = field(default_factory=dict)  # workspace → receivers online


def receivers_online(store: Store) -> dict[str, int]:
    """Receivers online per workspace, by the one rule the agents API and the dashboard
    use (:func:`melchior.policy.presence.receiver_online`, from the stored sightings every
    replica writes), so every replica and every page report the same number."""
    from melchior.mellan.relay.caches.presence import view

    now = store.now()
    out: dict[str, int] = {}
    for workspace in store.workspaces():
        seen = [a for a in store.list_agents(workspace) if a.receiver_seen_at is not None]
        online = sum(1 for a in seen if view(a, now)["online"])
        if online:
            out[workspace] = online
    return out


class Metrics:
    """The replica's counters, and the database gauges read at most every
    ``cache_seconds``."""

    def __init__(self, *, cache_seconds: float = 10.0, clock: Callable[[], float] = time.monotonic):
        self.cache_seconds = cache_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._gauges: tuple[float, Gauges] | None = None
        c = Counter
        self.accepted = c("mellan_tasks_accepted", "New tasks stored (sends accepted).")
        self.claimed = c("mellan_tasks_claimed", "Leases handed to receivers (attempts started).")
        self.completed = c(
            "mellan_tasks_completed",
            "Turns completed by receivers, by outcome (succeeded, input_required).",
        )
        self.failed = c(
            "mellan_tasks_failed",
            "Failures reported by receivers, by what followed (requeued, failed).",
        )
        self.expired = c(
            "mellan_lease_expiries",
            "Leases that expired unreported, by what followed (requeued, failed).",
        )
        self.cancelled = c("mellan_tasks_cancelled", "Tasks cancelled by owners or callers.")
        self.refused = c(
            "mellan_quota_refusals",
            "Sends refused by a send limit (send-rate, max-unfinished-per-receiver, max-queued).",
        )
        self.wakeups = c(
            "mellan_receiver_wakeups",
            "Store reads of waiting long-polls, by what woke them (notify, poll).",
        )
        self.pickups = c(
            "mellan_claim_pickups",
            "Leases found by long-polls, by how (immediate, notify, poll).",
        )
        self.db_errors = c(
            "mellan_database_errors",
            "Store calls that could not reach the database or commit (answered 503).",
        )
        self.stream_reads = c(
            "mellan_stream_reads",
            "Store reads made for streams (A2A task streams: kind=a2a, dashboard live task"
            " views: kind=ui) by the shared reader of each watched task: one per wake-up or"
            " poll interval, however many streams follow the task.",
        )
        self.stream_readers = Gauge(
            "mellan_stream_readers", "Shared task readers running on this replica, by kind."
        )
        self.stream_followers = Gauge(
            "mellan_stream_followers", "Streams following a shared task reader, by kind."
        )
        self.requests = Histogram(
            "mellan_request_duration_seconds",
            "Time to the response's first byte, by route template, method and status.",
            LATENCY_BUCKETS,
        )
        self.gc_pauses = GcPauses()
        self.attempts = Histogram(
            "mellan_task_attempts",
            "Attempts a task's turn took when it finished (succeeded, input_required, failed).",
            ATTEMPT_BUCKETS,
        )

    # -- fed by the store (after COMMIT) and the surfaces -------------------------------------
    def tally(self, names: Sequence[str]) -> None:
        """The store's tallies of one committed transaction (:data:`.store.queue.TALLIES`)."""
        for name in names:
            kind, _, detail = name.partition(":")
            if kind == "accepted":
                self.accepted.inc()
            elif kind == "claimed":
                self.claimed.inc()
            elif kind == "completed":
                self.completed.inc(outcome=detail)
            elif kind == "failed":
                self.failed.inc(then=detail)
            elif kind == "lease_expired":
                self.expired.inc(then=detail)
            elif kind == "cancelled":
                self.cancelled.inc()
            elif kind == "quota_refused":
                self.refused.inc(limit=detail)
            elif kind == "attempts":
                self.attempts.observe(float(detail))

    # -- the scrape ----------------------------------------------------------------------------
    def gauges(self, store: Store) -> Gauges:
        """The database gauges, read afresh at most every ``cache_seconds`` (worker thread)."""
        now = self._clock()
        with self._lock:
            cached = self._gauges
        if cached is not None and now - cached[0] < self.cache_seconds:
            return cached[1]
        by_state, queued, oldest = store.queue_gauges()
        fresh = Gauges(by_state, queued, oldest, receivers_online(store))
        with self._lock:
            self._gauges = (now, fresh)
        return fresh

    def render(self, gauges: Gauges) -> str:
        lines: list[str] = []
        lines += _gauge(
            "mellan_tasks",
            "Tasks in the database by workspace and state (read at scrape, cached).",
            {(("state", s), ("workspace", w)): float(n) for (w, s), n in gauges.by_state.items()},
        )
        lines += _gauge(
            "mellan_queue_depth",
            "Tasks queued for each receiving agent (read at scrape, cached).",
            {(("agent", a), ("workspace", w)): float(n) for (w, a), n in gauges.queued.items()},
        )
        lines += _gauge(
            "mellan_queue_oldest_age_seconds",
            "Age of the oldest queued task of each receiving agent (read at scrape, cached).",
            {(("agent", a), ("workspace", w)): age for (w, a), age in gauges.oldest.items()},
        )
        lines += _gauge(
            "mellan_receivers_online",
            "Receiving agents whose receiver is online, as GET /api/agents says it"
            " (read at scrape, cached).",
            {(("workspace", w),): float(n) for w, n in gauges.online.items()},
        )
        for metric in (
            self.accepted, self.claimed, self.completed, self.failed, self.expired,
            self.cancelled, self.refused, self.wakeups, self.pickups, self.db_errors,
            self.stream_reads, self.stream_readers, self.stream_followers,
            self.attempts, self.requests, self.gc_pauses,
        ):  # fmt: skip
            lines += metric.render()
        return "\n".join(lines) + "\n"


def _gauge(name: str, help_: str, values: dict[Labels, float]) -> list[str]:
    out = [f"# HELP {name} {help_}", f"# TYPE {name} gauge"]
    out += [f"{name}{_labels(k)} {_num(v)}" for k, v in sorted(values.items())]
    return out
