"""SQLite group commit: calls that arrive while a transaction is open share its COMMIT,
each isolated in its own savepoint, and none answers before the COMMIT."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from melchior.mellan.relay.store._common import Note
from melchior.mellan.relay.store.base import Outcome, TaskState
from melchior.mellan.relay.store.sqlite import SQLiteStore
from storekit import RECEIVER, WS, new_task, seed


def _store(tmp_path: Path, group_commit: bool = True) -> SQLiteStore:
    s = SQLiteStore(tmp_path / "relay.db", group_commit=group_commit)
    s.migrate()
    seed(s)
    return s


def _until(pred: object, what: str) -> None:
    import time

    for _ in range(20_000):  # bounded by tries, not by a clock threshold
        if pred():  # type: ignore[operator]
            return
        time.sleep(0.001)
    raise AssertionError(f"never: {what}")


def test_joined_call_failing_is_undone_alone_and_group_commits_once(tmp_path: Path) -> None:
    s = _store(tmp_path)
    before = s.commits
    a_inside = threading.Event()
    results: dict[str, object] = {}

    def a() -> None:
        with s._write() as tx:
            tx.insert_audit([Note(WS, "relay", "a", "x", True, "r", "from a")])
            a_inside.set()
            _until(lambda: s._waiting > 0, "b waits to join")  # b is queued on the mutex
        results["a"] = "ok"

    def b() -> None:
        assert a_inside.wait(60), "a never got inside its transaction"
        try:
            with s._write() as tx:
                tx.insert_audit([Note(WS, "relay", "b", "x", True, "r", "from b")])
                raise RuntimeError("b fails after writing")
        except RuntimeError as exc:
            results["b"] = exc

    ta, tb = threading.Thread(target=a), threading.Thread(target=b)
    ta.start()
    tb.start()
    ta.join()
    tb.join()
    assert results["a"] == "ok"
    assert isinstance(results["b"], RuntimeError)
    assert [r.action for r in s.audit_since(WS)] == ["a"]  # b's write undone, a's kept
    assert s.commits - before == 1  # one COMMIT for both
    s.close()


def test_many_threads_share_commits(tmp_path: Path) -> None:
    s = _store(tmp_path)
    before = s.commits
    n_threads, per = 8, 40
    barrier = threading.Barrier(n_threads)

    def work() -> None:
        barrier.wait()
        for _ in range(per):
            s.enqueue(new_task())

    threads = [threading.Thread(target=work) for _ in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(s.list_tasks(WS, limit=1000)) == n_threads * per
    assert s.commits - before <= n_threads * per  # never more than one per call
    s.close()


@pytest.mark.parametrize("group_commit", [True, False])
def test_queue_behaves_the_same_either_way(tmp_path: Path, group_commit: bool) -> None:
    s = _store(tmp_path, group_commit)
    t, _ = s.enqueue(new_task())
    [lease] = s.claim(WS, RECEIVER, "r")
    assert s.complete(t.id, lease.epoch, "{}").outcome is Outcome.OK
    assert s.complete(t.id, lease.epoch, "{}").outcome is Outcome.DUPLICATE
    cur = s.get_task(WS, t.id)
    assert cur is not None
    assert cur.state is TaskState.SUCCEEDED
    s.close()
