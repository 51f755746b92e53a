"""A task's big stored result, read in pieces and, once finished, read once.

Why pieces: a result is one TEXT column. Fetched whole, the database driver turns its 15
MiB into one Python ``str`` in one C call (sqlite3's column fetch, psycopg's text
loader) while holding the GIL, and the relay's event loop waits for it even though the
read runs on a worker thread. Read as ``substr(result, i, PIECE)`` slices instead, the
database does the slicing (outside the GIL), and each slice is a short conversion.
``substr`` counts characters on both SQLite and PostgreSQL, so a slice never cuts a
multi-byte character and the statements are the same on both. The first slice is read
with the row, one character longer than a piece: all of a small result, or the sign
that there is more (no ``length()``, which would make the database count the characters
of all 15 MiB on every read).

Why the cache: a finished turn's result never changes (``complete`` writes it once, under
the live lease epoch; a later turn or a cancel changes the row's turn, epoch or
``updated_at``). So a result read once is kept, keyed by all of those, within a bounded
budget of characters; three clients polling one 15 MiB answer then cost one read, not
one each. The same ``str`` object is handed out on every hit, which lets the A2A views
keep what they derived from it (:mod:`melchior.mellan.relay.surfaces.a2a.views`).
"""

from __future__ import annotations

import threading
from collections import Counter, OrderedDict
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, NamedTuple

PIECE = 1 << 20
"""Characters of a result read per statement; results up to this come with the row."""

CACHE_CHARS = 64 << 20
"""Characters of finished results a store keeps in memory, at most (least recently read
dropped first); a result bigger than this is never kept."""


class Key(NamedTuple):
    """What identifies one recorded result of a task: any write that could change the
    result changes one of these."""

    task_id: str
    turn: int
    epoch: int
    updated_at: Any  # the row's own value (integer ms on SQLite, a timestamp on PostgreSQL)


def key_of(row: Mapping[str, Any]) -> Key:
    """The :class:`Key` of a task row as read (a mapping of its columns)."""
    return Key(row["id"], row["turn"], row["lease_epoch"], row["updated_at"])


class TextCache:
    """A bounded, thread-safe LRU of finished results by :class:`Key` (store reads run on
    worker threads)."""

    def __init__(self, budget: int = CACHE_CHARS) -> None:
        self.budget = budget
        self._texts: OrderedDict[Key, str] = OrderedDict()
        self._tasks: Counter[str] = Counter()  # entries per task id
        self._gates: dict[Key, threading.Lock] = {}
        self._chars = 0
        self._lock = threading.Lock()

    @contextmanager
    def one_reader(self, key: Key) -> Iterator[None]:
        """Readers of one result not yet kept go one at a time: the first reads it from
        the database, the others then find it kept. Three clients that ask at once for a
        finished 15 MiB answer cause one read of it, not three at the same moment."""
        with self._lock:
            gate = self._gates.setdefault(key, threading.Lock())
        try:
            with gate:
                yield
        finally:
            with self._lock:
                if self._gates.get(key) is gate and not gate.locked():
                    del self._gates[key]

    def holds(self, task_id: str) -> bool:
        """Whether a result of ``task_id`` is kept (of some turn, epoch and write: a read
        then looks the row's own key up)."""
        return task_id in self._tasks

    def get(self, key: Key) -> str | None:
        with self._lock:
            text = self._texts.get(key)
            if text is not None:
                self._texts.move_to_end(key)
            return text

    def put(self, key: Key, text: str) -> str:
        """Keep ``text``; the text kept for ``key`` is returned: an earlier one when two
        reads raced (both read it), so both hand out one object."""
        if len(text) > self.budget:
            return text
        with self._lock:
            kept = self._texts.get(key)
            if kept is not None:
                return kept
            self._texts[key] = text
            self._tasks[key.task_id] += 1
            self._chars += len(text)
            while self._chars > self.budget:
                gone, old = self._texts.popitem(last=False)
                self._chars -= len(old)
                self._tasks[gone.task_id] -= 1
                if not self._tasks[gone.task_id]:
                    del self._tasks[gone.task_id]
            return text

    @property
    def chars(self) -> int:
        """Characters held now (for tests and benches)."""
        return self._chars
