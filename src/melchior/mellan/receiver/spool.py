"""The local spool: a finished turn's report, on disk before the relay hears of it.

Execution and completion delivery have separate boundaries (seed 002): once the work of
a turn is done, its result is written here — atomically, the file and its directory
fsynced — and only then reported. Reporting retries until the relay acknowledges it,
across receiver restarts (a receiver reports every spooled entry before it claims new
work), and a spooled success is never run again: if the same turn of the same task is
leased to this receiver again (its lease ran out while the relay was unreachable), the
spooled result is reported under the new lease instead.

One file per (task, turn): ``<sha256(task id)[:32]>.<turn>.json``. The task id comes
from the relay, so it is hashed, never used as a path. An entry whose lease was lost
without the task finishing (``expired``, ``stale-epoch``) is *parked*: no longer
reported, but kept for :data:`PARK_SECONDS` in case the task comes back here.

Blocking I/O (fsync): the receiver calls these methods through ``asyncio.to_thread``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from melchior.files import atomic_write

PARK_SECONDS = 7 * 24 * 3600.0
"""How long a parked entry is kept in case its task is leased here again."""

REUSABLE = ("complete", "final-fail")
"""Entries that stand for work that must not run again. A retryable failure is not one
of them: if its task comes back, running it again is the point."""


@dataclass(frozen=True)
class Report:
    """A finished turn's report: ``verb`` complete or fail, ``body`` as the API takes it
    (with the epoch of the lease it was run under)."""

    task_id: str
    turn: int
    epoch: int
    verb: str
    body: dict[str, Any]
    spooled_at: float
    session: str | None = None
    parked: bool = False

    @property
    def kind(self) -> str:
        """``complete``, ``final-fail`` (not retryable) or ``retry-fail``."""
        if self.verb == "complete":
            return "complete"
        return "retry-fail" if self.body.get("retryable", True) else "final-fail"

    def under(self, epoch: int) -> Report:
        """The same report, for the lease ``epoch`` (the task came back to us)."""
        return replace(self, epoch=epoch, body={**self.body, "epoch": epoch}, parked=False)


def key_of(task_id: str, turn: int) -> str:
    digest = hashlib.sha256(task_id.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    return f"{digest}.{int(turn)}"


class GroupSync:
    """One directory fsync for every rename that landed while the last one ran.

    A spooled file is durable once its own bytes are fsynced *and* the directory entry
    that names it is: the second is one fsync of the directory, and it covers every
    rename done before it began. So concurrent turns share it (group commit, as the
    relay's store does with its transactions): a caller whose rename came while a sync
    was running waits for the next one, which one of the waiters runs for all of them.
    No caller returns before a sync that *began* after its rename has ended — the
    "fsynced before reported" rule holds for each result, at a fraction of the syncs.
    """

    def __init__(self, sync: Callable[[], None]) -> None:
        self._sync = sync
        self._cond = threading.Condition()
        self._begun = 0  # syncs started
        self._ended = 0  # syncs finished (successfully or not)
        self._running = False
        self._failed: dict[int, OSError] = {}

    def __call__(self) -> None:
        """Return once a sync that began after this call has ended (or raise its error)."""
        with self._cond:
            want = self._begun + 1  # a sync running now may have begun before our rename
            while self._ended < want:
                if self._running:
                    self._cond.wait()
                    continue
                self._running = True
                self._begun += 1
                mine = self._begun
                error: OSError | None = None
                self._cond.release()
                try:
                    self._sync()
                except OSError as exc:
                    error = exc
                finally:
                    self._cond.acquire()
                    self._running = False
                    self._ended = mine
                    if error is not None:
                        self._failed[mine] = error
                    self._failed.pop(mine - 8, None)  # only the latest few are asked for
                    self._cond.notify_all()
            error = self._failed.get(want)
        if error is not None:
            raise error


class Spool:
    """The directory of spooled reports."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._sync_dir = GroupSync(self._fsync_dir)

    def _path(self, task_id: str, turn: int) -> Path:
        return self.root / f"{key_of(task_id, turn)}.json"

    def _fsync_dir(self) -> None:
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def put(self, report: Report) -> None:
        """Write ``report`` durably: after this returns, a power cut does not lose it.

        The file is fsynced on its own; the directory's fsync is shared with the turns
        that ended at the same time (:class:`GroupSync`)."""
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        data = json.dumps(asdict(report), ensure_ascii=False).encode("utf-8")
        atomic_write(self._path(report.task_id, report.turn), data)
        self._sync_dir()

    def get(self, task_id: str, turn: int) -> Report | None:
        return self._read(self._path(task_id, turn))

    def _read(self, path: Path) -> Report | None:
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
            return Report(**raw)
        except FileNotFoundError:
            return None
        except (OSError, ValueError, TypeError):
            # a file we did not write whole (atomic writes make this a foreign file)
            return None

    def drop(self, report: Report) -> None:
        """Forget an entry the relay has settled. Not fsynced: a removal a power cut
        undoes brings back an entry whose report the relay answers as already recorded
        (duplicate, or lease lost because the task finished), and it is dropped again —
        a report repeated, never work run again."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._path(report.task_id, report.turn))

    def park(self, report: Report) -> None:
        self.put(replace(report, parked=True))

    def entries(self) -> list[Report]:
        """Every readable entry, oldest first."""
        if not self.root.is_dir():
            return []
        found = []
        for path in self.root.glob("*.json"):
            report = self._read(path)
            if report is not None:
                found.append(report)
        return sorted(found, key=lambda r: r.spooled_at)

    def pending(self) -> list[Report]:
        """Entries still to report, oldest first."""
        return [r for r in self.entries() if not r.parked]

    def collect(self, now: float | None = None) -> int:
        """Forget parked entries older than :data:`PARK_SECONDS`; how many went."""
        now = time.time() if now is None else now
        gone = 0
        for report in self.entries():
            if report.parked and now - report.spooled_at > PARK_SECONDS:
                self.drop(report)
                gone += 1
        return gone
