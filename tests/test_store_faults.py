"""Database faults: the store says StoreUnavailable, writes nothing half-way, recovers."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from melchior.mellan.store.base import StoreUnavailable, TaskState
from melchior.mellan.store.sqlite import SQLiteStore
from storekit import RECEIVER, WS, new_task, seed


def test_sqlite_lock_held_elsewhere_is_unavailable_then_recovers(tmp_path: Path) -> None:
    db = tmp_path / "relay.db"
    s = SQLiteStore(db, busy_timeout=0.05)
    s.migrate()
    seed(s)
    other = sqlite3.connect(db, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another process holds the write lock
    try:
        with pytest.raises(StoreUnavailable):
            s.enqueue(new_task(message_id="m1"))
        assert s.list_tasks(WS) == []  # reads still work beside a writer; nothing written
    finally:
        other.execute("ROLLBACK")
        other.close()
    t, created = s.enqueue(new_task(message_id="m1"))
    assert created and [x.id for x in s.list_tasks(WS)] == [t.id]
    s.close()


def test_sqlite_failure_mid_transaction_writes_nothing(tmp_path: Path) -> None:
    """A batch that dies half-way (here: a bad row after good ones) leaves no trace."""
    s = SQLiteStore(tmp_path / "relay.db")
    s.migrate()
    seed(s)
    t, _ = s.enqueue(new_task())
    [lease] = s.claim(WS, RECEIVER, "a")
    with pytest.raises(sqlite3.Error):
        # binding a non-SQL value makes the second statement fail inside the transaction
        s.complete_many([(t.id, lease.epoch, "{}"), ("x", 1, object())])  # type: ignore[list-item]
    cur = s.get_task(WS, t.id)
    assert cur is not None and cur.state is TaskState.LEASED
    s.close()


def test_sqlite_unopenable_path_is_unavailable(tmp_path: Path) -> None:
    s = SQLiteStore(tmp_path / "missing-dir" / "relay.db")
    with pytest.raises(StoreUnavailable):
        s.now()
