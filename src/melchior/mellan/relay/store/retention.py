"""Retention: finished tasks older than an age are deleted, in batches, audit kept.

A relay that runs for months would otherwise keep every task, event and turn for ever.
What goes: a task in a terminal state (succeeded, failed, cancelled) that finished before
the cut-off, with everything stored for it — its events, finished turns, the messageIds
that de-duplicate its sends, its push configs and their outbox rows. What stays: the
audit log (append-only by the schema's own triggers), which still says what happened to
the task, and every task that is queued, running or waiting for input, however old.

The rules kept here, once for both dialects:

- **In batches.** One transaction deletes at most ``limit`` tasks, oldest finished first,
  so a first purge of a year of tasks never holds locks for long; the caller loops.
- **One replica at a time.** Each batch first takes the store's retention lock (on
  PostgreSQL a transaction-level advisory lock, tried and not waited for; SQLite has one
  writer anyway); a replica that does not get it does nothing, and says so, rather than
  competing for the same rows.
- **Recorded.** Each batch that deleted something writes one audit record
  (``task.purge``, with the count and the age) in the transaction of the deletion.
- A messageId whose task was purged may be sent again and makes a new task: the
  idempotency window of a send is the retention period (docs/mellan-queue.md says so).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

from melchior.mellan.relay.store import _common as C
from melchior.mellan.relay.store.base import Purged, Record

T = TypeVar("T")

BATCH = 500
"""Tasks deleted per transaction, at most."""

TABLES = ("push_outbox", "push_config", "task_event", "task_turn", "task_message")
"""What is stored per task besides its row (each has an index leading with ``task_id``)."""


class RetentionTx(Protocol):
    """The statements retention needs, in a backend's dialect."""

    topics: list[str]

    def retention_lock(self) -> bool:
        """This transaction may purge: no other replica is purging now (never waits)."""
        ...

    def finished_before(self, workspace: str, age_ms: int, limit: int) -> list[str]:
        """Ids of up to ``limit`` terminal tasks of ``workspace`` that finished more than
        ``age_ms`` ago by the database clock, oldest finished first."""
        ...

    def delete_tasks(self, ids: Sequence[str], tables: Sequence[str]) -> int:
        """Delete the rows of ``ids`` from each of ``tables`` (by ``task_id``), then the
        tasks themselves; the number of tasks deleted."""
        ...


class Retention:
    """Mixin of :class:`~.queue.QueueStore`: deleting finished tasks past their age."""

    def _transact(self, fn: Callable[[Any], T]) -> T:
        raise NotImplementedError

    def _read(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> Sequence[Any]:
        raise NotImplementedError

    def workspaces(self) -> list[str]:
        return [r["name"] for r in self._read("SELECT name FROM workspace ORDER BY name")]

    @staticmethod
    def _notes(tx: Any, notes: Sequence[C.Note | None]) -> list[int]:
        raise NotImplementedError

    def purge_finished(
        self,
        workspace: str,
        age_seconds: float,
        *,
        limit: int = BATCH,
        record: Record | None = None,
    ) -> Purged:
        if age_seconds <= 0:
            raise ValueError("a retention age is a positive number of seconds")
        age_ms = int(age_seconds * 1000)

        def go(tx: RetentionTx) -> Purged:
            if not tx.retention_lock():
                return Purged(0, busy=True)
            ids = tx.finished_before(workspace, age_ms, limit)
            if not ids:
                return Purged(0)
            deleted = tx.delete_tasks(ids, TABLES)
            if record is not None:
                detail = {**record.detail, "tasks": deleted, "age_seconds": age_seconds}
                note = C.Note(
                    workspace, record.actor, record.action, record.subject or workspace,
                    True, record.rule, record.reason, detail,
                )  # fmt: skip
                self._notes(tx, [note])
            return Purged(deleted)

        return self._transact(go)
