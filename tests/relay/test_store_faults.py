"""Database faults: the store says StoreUnavailable, writes nothing half-way, recovers."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from melchior.mellan.relay.store.base import StoreUnavailable, TaskState
from melchior.mellan.relay.store.sqlite import SQLiteStore
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
    assert created
    assert [x.id for x in s.list_tasks(WS)] == [t.id]
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
    assert cur is not None
    assert cur.state is TaskState.LEASED
    s.close()


def test_sqlite_unopenable_path_is_unavailable(tmp_path: Path) -> None:
    s = SQLiteStore(tmp_path / "missing-dir" / "relay.db")
    with pytest.raises(StoreUnavailable):
        s.now()


# -- PostgreSQL: the connection dies ----------------------------------------------------------


def _kill(admin_url: str, pid: int) -> None:
    import psycopg

    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))


@pytest.mark.postgres
def test_pg_connection_lost_before_commit_writes_nothing_and_recovers(pg_url: str) -> None:
    import psycopg

    from melchior.mellan.relay.store.postgres import PostgresStore

    s = PostgresStore(pg_url)
    s.migrate()
    seed(s)
    t, _ = s.enqueue(new_task())
    kills: list[int] = []

    def cut(conn: psycopg.Connection[dict[str, object]]) -> None:
        kills.append(conn.info.backend_pid)
        _kill(pg_url, conn.info.backend_pid)

    try:
        s.before_commit = cut
        with pytest.raises(StoreUnavailable):
            s.claim(WS, RECEIVER, "a")  # the claim's UPDATE ran, its COMMIT cannot
        with pytest.raises(StoreUnavailable):
            s.enqueue(new_task(message_id="lost"))
        s.before_commit = None
        assert len(kills) == 2
        cur = s.get_task(WS, t.id)  # recovered on the next call; nothing half-written
        assert cur is not None
        assert cur.state is TaskState.QUEUED
        assert cur.attempt == 0
        assert cur.lease_epoch == 0
        assert [x.id for x in s.list_tasks(WS)] == [t.id]
        [lease] = s.claim(WS, RECEIVER, "a")
        assert lease.task.id == t.id
        assert lease.task.attempt == 1
    finally:
        s.close()


@pytest.mark.postgres
def test_pg_idle_connections_killed_between_calls(pg_url: str) -> None:
    import psycopg

    from melchior.mellan.relay.store.postgres import PostgresStore

    s = PostgresStore(pg_url)
    s.migrate()
    seed(s)
    dbname = pg_url.rsplit("/", 1)[1]
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = %s AND pid <> pg_backend_pid()",
            (dbname,),
        )
    try:
        failures = 0
        for _ in range(5):  # the first use of a dead connection fails clearly, then recovers
            try:
                s.enqueue(new_task())
                break
            except StoreUnavailable:
                failures += 1
        assert failures <= 2
        assert len(s.list_tasks(WS)) == 1
    finally:
        s.close()


def test_pg_unreachable_is_unavailable() -> None:
    from melchior.mellan.relay.store.postgres import PostgresStore

    s = PostgresStore("postgresql://postgres@127.0.0.1:1/none", timeout=0.5)
    try:
        with pytest.raises(StoreUnavailable):
            s.now()
    finally:
        s.close()
