"""What the receiver is doing, for people: a status file and plain lines on the terminal.

A running receiver keeps ``state.json`` in its state directory up to date (written
atomically, so ``mellan receiver status`` reads the old state or the new one, never
half): at once when a task starts or ends, other changes at most twice a second. In
the foreground it also prints one plain line per event — a task taken, its progress,
how it ended and whether the relay acknowledged it — which is also what the systemd
journal keeps when it runs as a service.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from melchior.files import atomic_write

PROGRESS_CHARS = 200


def _stamp(at: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))


def short(text: str, limit: int = PROGRESS_CHARS) -> str:
    one = " ".join(text.split())
    return one if len(one) <= limit else one[: limit - 1] + "…"


@dataclass
class Running:
    task_id: str
    capability: str
    adapter: str
    turn: int
    attempt: int
    started: float
    last_progress: str = ""
    last_progress_at: float | None = None


@dataclass
class Board:
    """The receiver's live state; ``dirty`` tells the writer there is something to save,
    ``urgent`` that it is a task starting or ending — what ``mellan receiver status`` is
    asked first — written at once rather than at the writer's next half second (a
    caller's ``send --wait`` returns in milliseconds, and a status read right after it
    showed the finished task still running)."""

    path: Path
    agent: str
    relay: str
    out: TextIO | None = None
    started: float = field(default_factory=time.time)
    running: dict[str, Running] = field(default_factory=dict)
    reporting: int = 0
    claiming: bool = False
    stopped: str | None = None
    done: int = 0
    dirty: bool = True
    urgent: bool = False
    on_urgent: Callable[[], None] | None = None
    """Told when ``urgent`` is set (the writer waits on it instead of ticking)."""

    def _urge(self) -> None:
        self.dirty = self.urgent = True
        if self.on_urgent is not None:
            self.on_urgent()

    def say(self, line: str) -> None:
        """One plain line on the terminal (and the journal)."""
        if self.out is not None:
            stamp = time.strftime("%H:%M:%S")
            try:
                print(f"{stamp} {line}", file=self.out, flush=True)
            except (OSError, ValueError):  # the terminal or journal went away: keep working
                self.out = None

    def start(self, r: Running) -> None:
        self.running[r.task_id] = r
        self._urge()

    def progress(self, task_id: str, text: str) -> None:
        r = self.running.get(task_id)
        if r is not None:
            r.last_progress = short(text)
            r.last_progress_at = time.time()
            self.dirty = True

    def finish(self, task_id: str) -> None:
        if self.running.pop(task_id, None) is not None:
            self.done += 1
        self._urge()

    def view(self) -> dict[str, Any]:
        now = time.time()
        return {
            "pid": os.getpid(),
            "agent": self.agent,
            "relay": self.relay,
            "started_at": _stamp(self.started),
            "updated_at": _stamp(now),
            "claiming": self.claiming,
            "stopped": self.stopped,
            "finished": self.done,
            "reports_pending": self.reporting,
            "running": [
                {
                    "task": r.task_id,
                    "capability": r.capability,
                    "adapter": r.adapter,
                    "turn": r.turn,
                    "attempt": r.attempt,
                    "started_at": _stamp(r.started),
                    "seconds": round(now - r.started, 1),
                    "last_progress": r.last_progress,
                    "last_progress_at": _stamp(r.last_progress_at) if r.last_progress_at else None,
                }
                for r in self.running.values()
            ],
        }

    def save(self) -> None:
        """Write the state file (blocking: fsync; call it from a thread)."""
        self.dirty = self.urgent = False
        data = json.dumps(self.view(), ensure_ascii=False, indent=2) + "\n"
        atomic_write(self.path, data.encode("utf-8"), make_parent=True)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def read(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    return data if isinstance(data, dict) else None


def _since(stamp: Any, fallback: float) -> float:
    """Seconds since an ISO stamp of the state file (the file may be a while old)."""
    import calendar

    try:
        return max(
            0.0, time.time() - calendar.timegm(time.strptime(str(stamp), "%Y-%m-%dT%H:%M:%SZ"))
        )
    except ValueError:
        return fallback


def _ago(seconds: float) -> str:
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


def render(state: dict[str, Any], is_alive: bool, out: TextIO = sys.stdout) -> None:
    """The status as plain text: whether it runs, then one line per running task."""
    from melchior.mellan.table import table

    if not is_alive:
        head = (
            f"receiver for {state.get('agent')} is not running "
            f"(last seen {state.get('updated_at')})"
        )
    elif state.get("stopped"):
        head = f"receiver for {state.get('agent')} is stopping: {state['stopped']}"
    else:
        head = (
            f"receiver for {state.get('agent')} running (pid {state.get('pid')}, since "
            f"{state.get('started_at')}), {state.get('finished', 0)} task(s) finished, "
            f"{state.get('reports_pending', 0)} report(s) pending"
        )
    print(head, file=out)
    running = state.get("running") or []
    if is_alive and running:
        rows = [
            [
                r.get("task"),
                r.get("capability"),
                r.get("adapter"),
                r.get("turn"),
                _ago(_since(r.get("started_at"), float(r.get("seconds") or 0))),
                r.get("last_progress") or "",
            ]
            for r in running
        ]
        print(
            table(["task", "capability", "adapter", "turn", "running", "last progress"], rows),
            file=out,
        )
    elif is_alive:
        print("no task running", file=out)
