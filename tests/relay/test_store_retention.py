"""Retention on both backends: finished tasks past their age are deleted in batches with
everything stored for them; unfinished tasks and the audit log stay; on PostgreSQL one
replica purges at a time."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from melchior.mellan.relay.store.base import (
    AuditFilter,
    FollowUp,
    NewPush,
    Record,
    Store,
    Task,
    TaskState,
)
from storekit import (  # noqa: F401
    CALLER,
    DAY,
    RECEIVER,
    WS,
    backdate_in,
    db_url_fixture,
    new_task,
    store_fixture,
)

PURGE = Record("system:retention", "task.purge", "retention", "finished before the cut-off")


@pytest.fixture(name="backdate")
def backdate_fixture(db_url: str) -> Callable[[str, float], None]:
    return lambda task_id, days: backdate_in(db_url, task_id, days)


def finished(store: Store, how: str, message_id: str) -> Task:
    """A task brought to ``how`` (succeeded, failed, cancelled, input_required) through the
    queue, with an event, a push config and its outbox rows on the way."""
    task, _ = store.enqueue(new_task(message_id=message_id, push=NewPush(url="https://a/")))
    store.audit(WS, "owner:o", "task.note", task.id, True, "test", "a record about it")
    if how == "cancelled":
        store.cancel(WS, task.id)
        return task
    (lease,) = store.claim(WS, RECEIVER, "rx")
    store.progress(task.id, lease.epoch, "status", '{"message": {"parts": []}}')
    if how == "succeeded":
        store.complete(task.id, lease.epoch, '{"message": {"parts": [{"text": "ok"}]}}')
    elif how == "failed":
        store.fail(task.id, lease.epoch, "broken", retryable=False)
    elif how == "input_required":
        store.complete(task.id, lease.epoch, '{"message": {}}', input_required=True)
    return task


def stored(store: Store, task: Task) -> dict[str, object]:
    return {
        "task": store.get_task(WS, task.id) is not None,
        "events": len(store.events_after(task.id)),
        "configs": len(store.list_push_configs(WS, task.id)),
        "outbox": len(store.push_attempts(task.id)),
        "turns": len(store.turns(task.id)),
        "message": store.sent_message(WS, CALLER, f"m-{task.id}") is not None,
    }


def test_old_finished_tasks_go_with_all_they_stored_and_the_rest_stays(
    store: Store, backdate: Callable[[str, float], None]
) -> None:
    old = {how: finished(store, how, f"m-{how}") for how in ("succeeded", "failed", "cancelled")}
    asking = finished(store, "input_required", "m-asking")
    answered = finished(store, "input_required", "m-answered-later")
    recent = finished(store, "succeeded", "m-recent")
    queued, _ = store.enqueue(new_task(message_id="m-queued"))
    for task in [*old.values(), asking, answered]:
        backdate(task.id, 40)
    # an old question answered since: its task is queued again, and stays
    follow = FollowUp(WS, answered.id, CALLER, "m-answer", '{"parts":[]}', "c", 1, ())
    assert store.continue_task(follow)[1]
    before = {t.id: len(store.audit_matching(WS, AuditFilter(subject=t.id), limit=100))
              for t in old.values()}  # fmt: skip
    assert all(before.values())

    result = store.purge_finished(WS, 30 * DAY, record=PURGE)

    assert (result.deleted, result.busy) == (3, False)
    for task in old.values():
        assert store.get_task(WS, task.id) is None
        assert store.events_after(task.id) == []
        assert store.list_push_configs(WS, task.id) == []
        assert store.push_attempts(task.id) == []
        assert store.turns(task.id) == []
        # the audit log still tells what happened to it
        kept = store.audit_matching(WS, AuditFilter(subject=task.id), limit=100)
        assert len(kept) == before[task.id]
    for task in (asking, answered, recent, queued):
        assert store.get_task(WS, task.id) is not None, task
    assert store.events_after(asking.id)
    (purge,) = store.audit_matching(WS, AuditFilter(action="task.purge"), limit=10)
    assert purge.detail["tasks"] == 3
    assert purge.actor == "system:retention"
    # the messageId of a purged task is free again: a resend is a new task
    again, created = store.enqueue(new_task(message_id="m-succeeded"))
    assert created
    assert again.id != old["succeeded"].id
    assert store.purge_finished(WS, 30 * DAY).deleted == 0


def test_purges_go_in_batches_oldest_first(
    store: Store, backdate: Callable[[str, float], None]
) -> None:
    tasks = [finished(store, "succeeded", f"m-{n}") for n in range(7)]
    for n, task in enumerate(tasks):
        backdate(task.id, 100 - n)  # the first is the oldest
    sizes = [store.purge_finished(WS, DAY, limit=3).deleted for _ in range(4)]
    assert sizes == [3, 3, 1, 0]
    gone_first = [t.id for t in tasks[:3]]
    assert all(store.get_task(WS, t) is None for t in gone_first)


def test_only_terminal_tasks_of_the_workspace_and_a_positive_age(
    store: Store, backdate: Callable[[str, float], None]
) -> None:
    task = finished(store, "succeeded", "m-1")
    backdate(task.id, 10)
    assert store.purge_finished("another-workspace", DAY).deleted == 0
    assert store.get_task(WS, task.id) is not None
    with pytest.raises(ValueError, match="positive"):
        store.purge_finished(WS, 0)


@pytest.mark.postgres
def test_one_replica_purges_at_a_time(pg_url: str) -> None:
    import psycopg

    from melchior.mellan.relay.store import open_store
    from melchior.mellan.relay.store.postgres import RETENTION_LOCK
    from storekit import seed

    s = open_store(pg_url)
    try:
        seed(s)
        task = finished(s, "succeeded", "m-1")
        backdate_in(pg_url, task.id, 10)
        with psycopg.connect(pg_url) as other:  # another replica, mid-purge
            other.execute("SELECT pg_advisory_xact_lock(%s)", (RETENTION_LOCK,))
            busy = s.purge_finished(WS, DAY)
            assert (busy.deleted, busy.busy) == (0, True)
            assert s.get_task(WS, task.id) is not None
        assert s.purge_finished(WS, DAY).deleted == 1  # its transaction ended: our turn
    finally:
        s.close()


def test_a_follow_up_of_a_purged_task_is_refused_as_unknown(
    store: Store, backdate: Callable[[str, float], None]
) -> None:
    task = finished(store, "input_required", "m-1")
    (lease,) = store.claim(WS, RECEIVER, "rx") or (None,)
    assert lease is None  # nothing else queued
    done = finished(store, "succeeded", "m-2")
    backdate(done.id, 10)
    assert store.purge_finished(WS, DAY).deleted == 1
    follow = FollowUp(WS, done.id, CALLER, "m-3", '{"parts":[]}', "c", 1, ())
    went, moved = store.continue_task(follow)
    assert (went, moved) == (None, False)
    assert store.get_task(WS, task.id) is not None
    assert TaskState.INPUT_REQUIRED is store.get_task(WS, task.id).state  # type: ignore[union-attr]
