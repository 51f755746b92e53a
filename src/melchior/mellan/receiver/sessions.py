"""Which agent session a task's next turn continues, when its route binds none.

A route without a bound session starts each task fresh. When such a turn asks back
(``input_required``) the adapter says which session holds the conversation (a new
Claude Code session, a Codex thread, an A2A ``task:<id>``), and the caller's answer, the
task's next turn, should continue there rather than start over. This small file
remembers that, per task id, across receiver restarts; an entry is forgotten when the
task's turn ends any other way, and after :data:`KEEP_SECONDS` in any case.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from melchior.files import atomic_write

KEEP_SECONDS = 7 * 24 * 3600.0
MAX_ENTRIES = 10_000


class Sessions:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._map: dict[str, tuple[str, float]] = {}
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            raw = {}
        now = time.time()
        if isinstance(raw, dict):
            for tid, entry in raw.items():
                if (
                    isinstance(entry, list)
                    and len(entry) == 2
                    and isinstance(entry[0], str)
                    and isinstance(entry[1], int | float)
                    and now - entry[1] < KEEP_SECONDS
                ):
                    self._map[str(tid)] = (entry[0], float(entry[1]))

    def get(self, task_id: str) -> str | None:
        entry = self._map.get(task_id)
        return entry[0] if entry else None

    def _save(self) -> None:
        if len(self._map) > MAX_ENTRIES:
            keep = sorted(self._map.items(), key=lambda kv: kv[1][1])[-MAX_ENTRIES:]
            self._map = dict(keep)
        data = json.dumps({k: [v[0], v[1]] for k, v in self._map.items()})
        atomic_write(self.path, data.encode("utf-8"), make_parent=True)

    def put(self, task_id: str, session: str) -> None:
        """Remember ``session`` for ``task_id`` (blocking: call from a thread)."""
        with self._lock:
            self._map[task_id] = (session, time.time())
            self._save()

    def forget(self, task_id: str) -> None:
        with self._lock:
            if self._map.pop(task_id, None) is not None:
                self._save()
