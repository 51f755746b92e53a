"""Events this replica just committed, handed to its own streams without a read.

A stream following a task wakes when the task's topic is published, then reads the store
for what changed: a thread hop and two queries, most of an event's trip from a receiver
to a caller when the event was written through the same replica (docs/benchmarks.md).
But then the store has just told this replica what it wrote (its *witness*, called after
COMMIT and before the wake-up), so the stream can take the events at once — only those
whose predecessor is the last event it has seen (:class:`~.store.base.Chained`), so
none is ever skipped or reordered — and yield them before it reads. It still reads after
every wake-up, for the task's state and for anything written through another replica:
nothing here is the truth, and an event missing here (never seen, evicted, too big) only
means the read delivers it, as before.

Bounded: at most :data:`PER_TASK` events for each of at most :data:`TASKS` tasks, and
:data:`BUDGET` bytes of bodies in all (the least recently written tasks go first); an
event bigger than :data:`BIGGEST` is not kept.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from melchior.mellan.relay.store.base import Chained, TaskEvent

PER_TASK = 64
TASKS = 1024
BUDGET = 4 * 1024 * 1024
BIGGEST = 256 * 1024


class FreshEvents:
    """Per task: predecessor seq → event. Written from worker threads (the witness), read
    on the event loop, hence the lock."""

    def __init__(self, per_task: int = PER_TASK, tasks: int = TASKS, budget: int = BUDGET) -> None:
        self.per_task = per_task
        self.tasks = tasks
        self.budget = budget
        self._lock = threading.Lock()
        self._by_task: dict[str, dict[int, TaskEvent]] = {}
        self._bytes = 0

    def note(self, written: Sequence[Chained]) -> None:
        """The store's witness: these events were just committed."""
        with self._lock:
            for prev, event in written:
                if len(event.body) > BIGGEST:
                    continue
                chain = self._by_task.pop(event.task_id, {})
                chain[prev] = event
                self._bytes += len(event.body)
                if len(chain) > self.per_task:
                    self._bytes -= len(chain.pop(next(iter(chain))).body)
                self._by_task[event.task_id] = chain  # the most recently written go last
                while self._by_task and (
                    len(self._by_task) > self.tasks or self._bytes > self.budget
                ):
                    oldest = self._by_task.pop(next(iter(self._by_task)))
                    self._bytes -= sum(len(e.body) for e in oldest.values())

    def after(self, task_id: str, seq: int) -> list[TaskEvent]:
        """The events that follow the task's event ``seq`` (0: its first), in order, as
        far as this replica knows them without a gap; [] when it knows none."""
        out: list[TaskEvent] = []
        with self._lock:
            chain = self._by_task.get(task_id)
            if not chain:
                return out
            while (event := chain.get(seq)) is not None:
                out.append(event)
                seq = event.seq
        return out
