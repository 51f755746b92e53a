"""A queue decision and its audit record commit together, on both backends.

Claims, completions, fails, cancels and lease losses made with ``actor=`` write their
audit records inside the transaction of the change itself. Proven two ways: on SQLite
by counting commits (a claim batch of ten is one commit, not eleven), and on both
backends by making the audit insert fail inside the database (a trigger): the decision
is then undone with it, so there is never a claim without its record. On PostgreSQL the
connection is also cut just before COMMIT: then neither the claim nor its record exists.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from melchior.mellan.relay.store import open_store
from melchior.mellan.relay.store.base import Outcome, Store, StoreUnavailable, TaskState
from melchior.mellan.relay.store.sqlite import SQLiteStore
from storekit import RECEIVER, WS, db_url_fixture, new_task, seed, store_fixture  # noqa: F401

ME = "agent:private/ops"


def _actions(s: Store) -> list[tuple[str, str, bool]]:
    return [(r.action, r.subject, r.allowed) for r in s.audit_since(WS, limit=10_000)]


def test_sqlite_claim_batch_with_its_records_is_one_commit(tmp_path: Path) -> None:
    s = SQLiteStore(tmp_path / "relay.db")
    s.migrate()
    seed(s)
    try:
        s.enqueue_many([new_task(message_id=f"m{i}") for i in range(12)])
        before = s.commits
        leases = s.claim(WS, RECEIVER, "w1", limit=10, actor=ME)
        assert len(leases) == 10
        assert s.commits == before + 1  # ten leases and ten records: one commit
        recs = s.audit_since(WS)
        assert [(r.action, r.subject, r.actor) for r in recs] == [
            ("task.claim", lease.task.id, ME) for lease in leases
        ]
        assert [r.detail["epoch"] for r in recs] == [lease.epoch for lease in leases]
        assert {r.detail["owner"] for r in recs} == {"w1"}

        one, two, three, four = leases[:4]
        steps = [
            lambda: s.complete(one.task.id, one.epoch, "{}", actor=ME).outcome,
            lambda: s.complete(one.task.id, one.epoch, "{}", actor=ME).outcome,  # duplicate
            lambda: s.fail(two.task.id, two.epoch, "boom", retryable=False, actor=ME).outcome,
            lambda: s.progress(three.task.id, three.epoch, "status", "{}", actor=ME).outcome,
            lambda: s.complete(three.task.id, three.epoch + 7, "{}", actor=ME).outcome,  # stale
            lambda: s.cancel(WS, four.task.id, actor="owner:alice", rule="owner"),
            lambda: s.renew(four.task.id, four.epoch, actor=ME).outcome,  # cancelled: lease lost
            lambda: s.ack_cancel(four.task.id, four.epoch, actor=ME).outcome,
            lambda: s.cancel(WS, one.task.id, actor="owner:alice", rule="owner"),  # finished
        ]
        for step in steps:
            before = s.commits
            step()
            assert s.commits == before + 1  # the change (if any) and its record together
        tail = [(r.action, r.subject, r.allowed, r.rule) for r in s.audit_since(WS, 10)]
        assert tail == [
            ("task.complete", one.task.id, True, "lease"),
            ("task.complete", one.task.id, True, "lease"),
            ("task.fail", two.task.id, True, "lease"),
            ("task.progress", three.task.id, True, "lease"),
            ("lease.lost", three.task.id, False, "stale-epoch"),
            ("task.cancel", four.task.id, True, "owner"),
            ("lease.lost", four.task.id, False, "cancelled"),
            ("task.cancel_ack", four.task.id, True, "lease"),
            ("task.cancel", one.task.id, False, "finished"),
        ]
        dup = s.audit_since(WS, 11)[0]
        assert dup.reason.endswith(": duplicate")
        cancel = s.audit_since(WS, 15)[0]
        assert cancel.reason == "cancelled while leased; the receiver's lease is revoked"
    finally:
        s.close()


def test_without_actor_nothing_is_recorded(store: Store) -> None:
    """The old signatures keep working and write no records (callers that audit by
    other means, benches)."""
    t, _ = store.enqueue(new_task())
    [lease] = store.claim(WS, RECEIVER, "w")
    assert store.complete(t.id, lease.epoch, "{}").outcome is Outcome.OK
    assert store.complete(t.id, lease.epoch + 1, "{}").outcome is Outcome.LEASE_LOST
    assert store.cancel(WS, t.id) == (store.get_task(WS, t.id), Outcome.LEASE_LOST)
    assert store.audit_since(WS) == []


@contextmanager
def _audit_insert_fails(db_url: str) -> Iterator[None]:
    """Make every INSERT INTO audit fail inside the database, by a trigger."""
    if db_url.startswith("sqlite://"):
        conn = sqlite3.connect(db_url.removeprefix("sqlite://"), isolation_level=None)
        conn.execute(
            "CREATE TRIGGER audit_fault BEFORE INSERT ON audit"
            " BEGIN SELECT RAISE(ABORT, 'audit fault'); END"
        )
        try:
            yield
        finally:
            conn.execute("DROP TRIGGER audit_fault")
            conn.close()
        return
    import psycopg

    with psycopg.connect(db_url, autocommit=True) as pg:
        pg.execute(
            "CREATE FUNCTION audit_fault() RETURNS trigger LANGUAGE plpgsql AS"
            " $$ BEGIN RAISE EXCEPTION 'audit fault'; END $$"
        )
        pg.execute(
            "CREATE TRIGGER audit_fault BEFORE INSERT ON audit"
            " FOR EACH ROW EXECUTE FUNCTION audit_fault()"
        )
        try:
            yield
        finally:
            pg.execute("DROP TRIGGER audit_fault ON audit")
            pg.execute("DROP FUNCTION audit_fault()")


def test_a_failing_audit_write_undoes_the_decision(db_url: str) -> None:
    s = open_store(db_url)
    seed(s)
    try:
        t1, _ = s.enqueue(new_task(message_id="a"))
        t2, _ = s.enqueue(new_task(message_id="b"))
        with _audit_insert_fails(db_url):
            with pytest.raises(Exception, match="audit fault"):
                s.claim(WS, RECEIVER, "w", limit=2, actor=ME)
            for t in (t1, t2):  # no claim without its record
                cur = s.get_task(WS, t.id)
                assert cur is not None
                assert cur.state is TaskState.QUEUED
                assert cur.attempt == 0
        leases = s.claim(WS, RECEIVER, "w", limit=2, actor=ME)
        assert [lease.task.attempt for lease in leases] == [1, 1]
        one, two = leases
        with _audit_insert_fails(db_url):
            with pytest.raises(Exception, match="audit fault"):
                s.complete(one.task.id, one.epoch, '{"r": 1}', actor=ME)
            with pytest.raises(Exception, match="audit fault"):
                s.fail(two.task.id, two.epoch, "x", retryable=False, actor=ME)
            with pytest.raises(Exception, match="audit fault"):
                s.cancel(WS, two.task.id, actor="owner:alice", rule="owner")
            for lease in leases:
                cur = s.get_task(WS, lease.task.id)
                assert cur is not None
                assert cur.state is TaskState.LEASED
                assert cur.result is None
        assert s.complete(one.task.id, one.epoch, '{"r": 1}', actor=ME).outcome is Outcome.OK
        assert [a for a, _, _ in _actions(s)] == ["task.claim", "task.claim", "task.complete"]
    finally:
        s.close()


@pytest.mark.postgres
def test_pg_connection_cut_before_commit_leaves_neither_claim_nor_record(pg_url: str) -> None:
    import psycopg

    from melchior.mellan.relay.store.postgres import PostgresStore

    s = PostgresStore(pg_url)
    s.migrate()
    seed(s)

    def cut(conn: psycopg.Connection[dict[str, object]]) -> None:
        with psycopg.connect(pg_url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (conn.info.backend_pid,))

    try:
        t, _ = s.enqueue(new_task())
        s.before_commit = cut
        with pytest.raises(StoreUnavailable):
            s.claim(WS, RECEIVER, "w", limit=5, actor=ME)  # UPDATE and INSERT ran; no COMMIT
        s.before_commit = None
        cur = s.get_task(WS, t.id)
        assert cur is not None
        assert cur.state is TaskState.QUEUED
        assert cur.attempt == 0
        assert s.audit_since(WS) == []  # no record of a claim that did not happen
        [lease] = s.claim(WS, RECEIVER, "w", actor=ME)
        assert _actions(s) == [("task.claim", t.id, True)]
        assert lease.task.attempt == 1
    finally:
        s.close()


def test_batched_claim_and_complete_many_record_every_item(store: Store) -> None:
    """The batch paths write their records in one statement; each item still gets its
    own record, worded as the single call would."""
    for i in range(3):
        store.enqueue(new_task(message_id=f"b{i}"))
    a, b, c = store.claim(WS, RECEIVER, "w", limit=3, actor=ME)
    out = [
        v.outcome
        for v in store.complete_many(
            [
                (a.task.id, a.epoch, "{}"),
                (a.task.id, a.epoch, "{}"),  # the same item twice: duplicate
                (b.task.id, b.epoch + 5, "{}"),  # stale epoch: lease lost
                (c.task.id, c.epoch, "{}"),
            ],
            actor=ME,
        )
    ]
    assert out == [Outcome.OK, Outcome.DUPLICATE, Outcome.LEASE_LOST, Outcome.OK]
    recs = store.audit_since(WS)
    assert sorted((r.action, r.subject, r.allowed) for r in recs) == sorted(
        [("task.claim", x.task.id, True) for x in (a, b, c)]
        + [("task.complete", a.task.id, True)] * 2
        + [("lease.lost", b.task.id, False), ("task.complete", c.task.id, True)]
    )
    assert {r.reason for r in recs if r.action == "task.complete"} == {
        f"task.complete under epoch {a.epoch}: ok",
        f"task.complete under epoch {a.epoch}: duplicate",
        f"task.complete under epoch {c.epoch}: ok",
    }


def test_the_audit_log_is_append_only_in_the_database(db_url: str) -> None:
    """Not only the store's API: the database itself refuses to change or drop a record."""
    s = open_store(db_url)
    seed(s)
    s.audit(WS, "owner:alice", "grant.add", "g1", True, "owner", "granted")
    s.close()
    changes = ("UPDATE audit SET allowed = NOT allowed", "DELETE FROM audit")
    if db_url.startswith("sqlite://"):
        conn = sqlite3.connect(db_url.removeprefix("sqlite://"), isolation_level=None)
        try:
            for sql in changes:
                with pytest.raises(sqlite3.Error, match="append-only"):
                    conn.execute(sql)
            assert conn.execute("SELECT count(*) FROM audit").fetchone()[0] == 1
        finally:
            conn.close()
        return
    import psycopg

    with psycopg.connect(db_url, autocommit=True) as pg:
        for sql in changes:
            with pytest.raises(psycopg.Error, match="append-only"):
                pg.execute(sql)
        row = pg.execute("SELECT count(*) FROM audit").fetchone()
        assert row is not None
        assert row[0] == 1
