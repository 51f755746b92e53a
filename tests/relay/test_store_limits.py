"""Send limits in the store (schema v8), on both backends: caps counted inside the
enqueue transaction (a refusal stores nothing but its ``quota.refused`` record, a resend
is never refused, two writers at the cap cannot both get in), limits stored per agent
and per workspace, and the request id in audit records."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from melchior.mellan.relay.requestid import current_id
from melchior.mellan.relay.store import migrations, open_store
from melchior.mellan.relay.store.base import (
    AuditFilter,
    Caps,
    NotFoundError,
    OverLimit,
    QuotaRefused,
    Record,
    Store,
    TaskState,
)
from melchior.mellan.relay.store.sqlite import SQLiteStore
from melchior.policy.send_limits import QUEUED, UNFINISHED, Overrides
from storekit import CALLER, RECEIVER, WS, db_url_fixture, new_task, seed, store_fixture  # noqa: F401

OTHER = "local/other"


def accept(n: int) -> Record:
    return Record(f"agent:{CALLER}", "task.accept", "granted", "ok", {"n": n})


def test_unfinished_cap_refuses_and_stores_nothing(store: Store) -> None:
    caps = Caps(max_unfinished_per_receiver=2, max_queued=100)
    got = store.admit([new_task(message_id=f"m{k}", caps=caps, accept=accept(k)) for k in range(3)])
    assert [type(g).__name__ for g in got] == ["tuple", "tuple", "OverLimit"]
    over = got[2]
    assert isinstance(over, OverLimit)
    assert (over.limit, over.count, over.allowed, over.retry_after) == (UNFINISHED, 2, 2, 5)
    assert len(store.list_tasks(WS)) == 2
    assert store.task_by_message(WS, CALLER, "m2") is None
    refused = store.audit_matching(WS, AuditFilter(action="quota.refused"))
    assert [(r.rule, r.allowed, r.detail["limit"], r.detail["n"]) for r in refused] == [
        (UNFINISHED, False, UNFINISHED, 2)
    ]
    # a resend of a stored message is never refused, even at the cap
    again = store.admit([new_task(message_id="m0", caps=caps)])
    assert isinstance(again[0], tuple)
    assert again[0][1] is False
    # finishing one frees a place
    lease = store.claim(WS, RECEIVER, "r")[0]
    assert store.complete(lease.task.id, lease.epoch, "{}").ok
    assert isinstance(store.admit([new_task(message_id="m2", caps=caps)])[0], tuple)
    # enqueue (without admit) says so by raising
    with pytest.raises(QuotaRefused) as exc:
        store.enqueue(new_task(message_id="m3", caps=caps))
    assert exc.value.over.limit == UNFINISHED


def test_queued_cap_counts_every_caller(store: Store) -> None:
    store.add_agent(WS, OTHER, "another caller", [])
    caps = Caps(max_unfinished_per_receiver=100, max_queued=3)
    store.admit([new_task(caps=caps) for _ in range(2)])
    got = store.admit([new_task(caller=OTHER, caps=caps) for _ in range(2)])
    assert isinstance(got[0], tuple)
    assert isinstance(got[1], OverLimit)
    assert got[1].limit == QUEUED
    # a leased task is no longer queued: the receiver working frees the queue
    store.claim(WS, RECEIVER, "r")
    assert isinstance(store.admit([new_task(caps=caps)])[0], tuple)
    assert sum(t.state is TaskState.QUEUED for t in store.list_tasks(WS)) == 3


def _send(
    s: Store, message_id: str, caps: Caps, barrier: threading.Barrier, out: list[object]
) -> None:
    barrier.wait()
    out.append(s.admit([new_task(message_id=message_id, caps=caps)])[0])


def test_two_writers_at_the_cap_one_refused(db_url: str) -> None:
    """Two stores (two replicas' connections) enqueue at once with one place left: the
    count is taken inside the transaction, so exactly one gets it, again and again."""
    first = open_store(db_url)
    second = open_store(db_url)
    try:
        seed(first)
        for round_ in range(8):
            caps = Caps(max_unfinished_per_receiver=round_ + 1, max_queued=1000)
            barrier = threading.Barrier(2)
            results: list[object] = []
            threads = [
                threading.Thread(target=_send, args=(s, f"r{round_}-{k}", caps, barrier, results))
                for k, s in enumerate((first, second))
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert sorted(type(r).__name__ for r in results) == ["OverLimit", "tuple"]
            assert len(first.list_tasks(WS, limit=100)) == round_ + 1
    finally:
        first.close()
        second.close()


def test_limits_stored_per_agent_and_workspace(store: Store) -> None:
    assert store.limit_overrides(WS) == {}
    rec = Record("owner:o", "limits.set", "owner", "changed")
    got = store.set_limits(WS, CALLER, Overrides(send_rate=2.5, burst=4), record=rec)
    assert got == Overrides(2.5, 4, None, None)
    got = store.set_limits(WS, CALLER, Overrides(max_queued=7))
    assert got == Overrides(2.5, 4, None, 7)
    store.set_limits(WS, "*", Overrides(max_unfinished_per_receiver=9))
    assert store.limit_overrides(WS) == {
        CALLER: Overrides(2.5, 4, None, 7),
        "*": Overrides(None, None, 9, None),
    }
    assert store.set_limits(WS, CALLER, Overrides(burst=1), reset=True) == Overrides(
        None, 1, None, None
    )
    assert store.set_limits(WS, CALLER, Overrides(), reset=True) == Overrides()
    with pytest.raises(NotFoundError):
        store.set_limits(WS, "nobody/here", Overrides(burst=1))
    assert [r.action for r in store.audit_matching(WS, AuditFilter(action="limits."))] == [
        "limits.set"
    ]


def test_request_id_in_audit_records(store: Store) -> None:
    token = current_id.set("req-123")
    try:
        rec = Record("owner:o", "limits.set", "owner", "changed")
        store.set_limits(WS, CALLER, Overrides(burst=3), record=rec)
        store.audit(WS, "owner:o", "x.refuse", "s", False, "r", "why")
        store.enqueue(new_task(accept=accept(1)))
        store.claim(WS, RECEIVER, "r", actor=f"agent:{RECEIVER}")
    finally:
        current_id.reset(token)
    store.audit(WS, "relay", "x.other", "s", True, "r", "no request")
    rows = store.audit_since(WS)
    by_action = {r.action: r.request_id for r in rows}
    assert by_action["limits.set"] == "req-123"
    assert by_action["x.refuse"] == "req-123"
    assert by_action["task.accept"] == "req-123"
    assert by_action["task.claim"] == "req-123"
    assert by_action["x.other"] is None


def test_v8_applies_on_a_v6_database(tmp_path: Path) -> None:
    """v8 depends on nothing v7 adds: a v6 database goes to the latest in one go."""
    s = SQLiteStore(tmp_path / "relay.db")
    try:
        assert s.migrate(target=6) == 6
        seed(s)
        assert s.migrate() == migrations.LATEST_SQLITE
        s.audit(WS, "relay", "new", "s", True, "r", "after v8")
        assert [r.request_id for r in s.audit_since(WS)] == [None]
        assert s.set_limits(WS, CALLER, Overrides(burst=2)) == Overrides(None, 2, None, None)
    finally:
        s.close()
