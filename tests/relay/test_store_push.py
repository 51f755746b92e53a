"""Push notifications in the store, on both backends: configs, the outbox the schema writes
in the transaction of every change, delivery order per config, leases and give-ups."""

from __future__ import annotations

import time

import pytest

from melchior.mellan.relay.notify import PUSH_TOPIC
from melchior.mellan.relay.store.base import (
    Conflict,
    FollowUp,
    NewPush,
    NotFoundError,
    PushMark,
    Record,
    Store,
    TaskState,
)
from storekit import CALLER, RECEIVER, WS, db_url_fixture, new_task, store_fixture  # noqa: F401

HOOK = NewPush(url="https://hooks.example/t", token="tok", auth_scheme="Bearer",
               auth_credentials="creds")  # fmt: skip


def lease_one(store: Store) -> tuple[str, int]:
    (lease,) = store.claim(WS, RECEIVER, "rx")
    return lease.task.id, lease.epoch


def test_a_config_made_with_its_task_reports_the_task_from_its_first_state(store: Store) -> None:
    task, created = store.enqueue(new_task(push=HOOK, message_id="m-1"))
    assert created
    (config,) = store.list_push_configs(WS, task.id)
    assert (config.url, config.token, config.auth_scheme, config.auth_credentials) == (
        HOOK.url, "tok", "Bearer", "creds",
    )  # fmt: skip
    assert config.caller == CALLER
    (row,) = store.push_attempts(task.id)
    assert (row.state, row.turn, row.upto_seq, row.config_id) == (
        TaskState.QUEUED, 1, 0, config.id,
    )  # fmt: skip
    # a resend of the same message stores neither a second task nor a second config
    again, created = store.enqueue(new_task(push=HOOK, message_id="m-1"))
    assert not created
    assert again.id == task.id
    assert len(store.list_push_configs(WS, task.id)) == 1


def test_every_change_of_a_task_with_a_config_writes_its_outbox_row(store: Store) -> None:
    task, _ = store.enqueue(new_task())
    assert store.push_attempts(task.id) == []  # no config: nothing written
    config = store.add_push_config(WS, task.id, CALLER, HOOK)
    assert store.push_attempts(task.id) == []  # nothing changed since it was made
    tid, epoch = lease_one(store)
    store.renew(tid, epoch)  # not a change of state: no row
    store.progress(tid, epoch, "status", '{"message": {"parts": [{"text": "half"}]}}')
    store.complete(tid, epoch, '{"message": {"parts": [{"text": "done"}]}}')
    rows = store.push_attempts(task.id)
    assert [(r.state, r.upto_seq > 0) for r in rows] == [
        (TaskState.LEASED, False), (TaskState.LEASED, True), (TaskState.SUCCEEDED, True),
    ]  # fmt: skip
    assert {r.config_id for r in rows} == {config.id}
    assert [r.id for r in rows] == sorted(r.id for r in rows)


def test_a_failed_change_writes_no_row(store: Store) -> None:
    task, _ = store.enqueue(new_task())
    store.add_push_config(WS, task.id, CALLER, HOOK)
    tid, epoch = lease_one(store)
    before = len(store.push_attempts(task.id))
    assert not store.complete(tid, epoch + 7, "{}").ok  # a stale epoch changes nothing
    assert len(store.push_attempts(task.id)) == before


def test_config_limits_replacement_and_deletion(store: Store) -> None:
    task, _ = store.enqueue(new_task())
    with pytest.raises(NotFoundError):
        store.add_push_config(WS, "no-such-task", CALLER, HOOK)
    with pytest.raises(NotFoundError):
        store.add_push_config("other-ws", task.id, CALLER, HOOK)
    made = [
        store.add_push_config(WS, task.id, CALLER, NewPush(url=f"https://h/{i}"), limit=3)
        for i in range(3)
    ]
    with pytest.raises(Conflict):
        store.add_push_config(WS, task.id, CALLER, NewPush(url="https://h/4"), limit=3)
    # the same id replaces its endpoint (not a fourth config)
    again = store.add_push_config(
        WS, task.id, CALLER, NewPush(url="https://h/new", id=made[0].id), limit=3
    )
    assert again.id == made[0].id
    got = store.get_push_config(WS, task.id, made[0].id)
    assert got is not None
    assert got.url == "https://h/new"
    assert [c.id for c in store.list_push_configs(WS, task.id)] == [c.id for c in made]
    record = Record("agent:x", "push.delete", "caller", "its own task")
    assert store.delete_push_config(WS, task.id, made[1].id, record=record)
    assert not store.delete_push_config(WS, task.id, made[1].id)
    assert store.get_push_config(WS, task.id, made[1].id) is None
    assert store.get_push_config("other-ws", task.id, made[0].id) is None
    audit = store.audit_since(WS, 0, 1000)
    assert any(r.action == "push.delete" and r.subject == task.id for r in audit)


def test_deliveries_go_in_order_per_config_and_configs_go_independently(store: Store) -> None:
    a, _ = store.enqueue(new_task(push=NewPush(url="https://a/")))
    b, _ = store.enqueue(new_task(push=NewPush(url="https://b/"), message_id="m-b"))
    tid, _ = lease_one(store)  # task a leased: a second row for a's config
    assert tid == a.id
    assert store.pushes_due()
    first = store.claim_pushes("d1", limit=10)
    # one row per config: a's first (not its second while the first is pending), and b's
    assert sorted((d.config.task_id, d.mark.state) for d in first) == sorted(
        [(a.id, TaskState.QUEUED), (b.id, TaskState.QUEUED)]
    )
    assert all(d.before is None and d.attempts == 0 and d.sent == 0 for d in first)
    assert store.claim_pushes("d2", limit=10) == []  # all leased or waiting their turn
    da = next(d for d in first if d.config.task_id == a.id)
    assert store.push_sent(da.id, "d1", 1)
    assert not store.push_sent(da.id, "d2", 1)  # not d2's row
    assert store.push_delivered(da.id, "d1")
    assert not store.push_delivered(da.id, "d1")  # once
    (nxt,) = store.claim_pushes("d2", limit=10)
    assert nxt.config.task_id == a.id
    assert nxt.mark == PushMark(TaskState.LEASED, 1, 0)
    assert nxt.before == PushMark(TaskState.QUEUED, 1, 0)  # what the row before reported
    assert nxt.secret.startswith("mps_")
    assert nxt.secret == store.push_secret(WS, CALLER)
    assert nxt.allow_private is False


def test_failures_retry_later_or_give_up_and_the_next_row_goes(store: Store) -> None:
    a, _ = store.enqueue(new_task(push=NewPush(url="https://a/")))
    lease_one(store)
    (d,) = store.claim_pushes("d1")
    assert store.push_failed(d.id, "d1", "HTTP 500", retry_in=3600)
    assert store.claim_pushes("d1") == []  # not due for an hour; the next row waits behind
    rows = store.push_attempts(a.id)
    assert rows[0].last_error == "HTTP 500"
    assert rows[0].attempts == 1
    assert rows[0].delivered_at is None
    assert rows[0].gave_up_at is None
    # give up on a row: the config's next row goes
    b, _ = store.enqueue(new_task(push=NewPush(url="https://b/"), message_id="m-b"))
    (db,) = store.claim_pushes("d1")
    assert db.config.task_id == b.id
    assert store.push_failed(db.id, "d1", "private-address", retry_in=None)
    assert not store.push_failed(db.id, "d1", "again", retry_in=None)
    (gone,) = store.push_attempts(b.id)
    assert gone.gave_up_at is not None


def test_a_row_handed_back_unsent_counts_no_attempt(store: Store) -> None:
    task, _ = store.enqueue(new_task(push=NewPush(url="https://a/")))
    (d,) = store.claim_pushes("d1")
    assert store.push_failed(d.id, "d1", "waiting: host busy", retry_in=0, counted=False)
    (again,) = store.claim_pushes("d1")
    assert (again.id, again.attempts) == (d.id, 0)
    assert store.push_delivered(again.id, "d1")
    (row,) = store.push_attempts(task.id)
    assert row.attempts == 1
    assert row.delivered_at is not None


def test_a_lapsed_lease_is_due_again_and_fences_the_old_holder(store: Store) -> None:
    store.enqueue(new_task(push=NewPush(url="https://a/")))
    (d,) = store.claim_pushes("d1", lease_seconds=0.05)
    time.sleep(0.1)
    (again,) = store.claim_pushes("d2")
    assert again.id == d.id
    assert again.attempts == 0  # a lapsed lease reported nothing: no attempt counted
    assert not store.push_delivered(d.id, "d1")  # d1 lost it
    assert store.push_delivered(d.id, "d2")
    assert not store.pushes_due()


def test_deleting_a_config_drops_its_pending_rows(store: Store) -> None:
    task, _ = store.enqueue(new_task(push=NewPush(url="https://a/", id="cfg")))
    assert store.pushes_due()
    assert store.delete_push_config(WS, task.id, "cfg")
    assert store.push_attempts(task.id) == []
    assert not store.pushes_due()


def test_an_answer_with_a_config_reports_the_next_turn(store: Store) -> None:
    task, _ = store.enqueue(new_task())
    tid, epoch = lease_one(store)
    store.complete(tid, epoch, '{"message": {"parts": [{"text": "which?"}]}}', input_required=True)
    follow = FollowUp(
        WS, task.id, CALLER, "m-2", '{"role":"ROLE_USER","parts":[{"text":"that"}]}',
        "chain", 1, (), push=NewPush(url="https://a/", id="cfg"),
    )  # fmt: skip
    went, moved = store.continue_task(follow)
    assert moved
    assert went is not None
    (config,) = store.list_push_configs(WS, task.id)
    assert config.id == "cfg"
    (row,) = store.push_attempts(task.id)
    assert (row.state, row.turn) == (TaskState.QUEUED, 2)
    (d,) = store.claim_pushes("d1")
    assert d.before == PushMark(TaskState.INPUT_REQUIRED, 1, 0)


def test_push_secrets_and_the_private_address_setting(store: Store) -> None:
    first = store.push_secret(WS, CALLER)
    assert first is not None
    assert store.push_secret(WS, CALLER) == first  # minted once
    record = Record("owner:o", "push.rotate_secret", "owner", "asked")
    rotated = store.push_secret(WS, CALLER, rotate=True, record=record)
    assert rotated not in (None, first)
    assert store.push_secret(WS, "no/such-agent") is None
    assert store.push_allow_private(WS) is False
    store.set_push_allow_private(WS, True, record=Record("owner:o", "push.settings", "o", "r"))
    assert store.push_allow_private(WS) is True
    with pytest.raises(NotFoundError):
        store.set_push_allow_private("no-such-ws", True)


def test_a_commit_with_outbox_rows_wakes_the_deliverer(db_url: str) -> None:
    from melchior.mellan.relay.store import open_store
    from storekit import seed

    topics: list[str] = []
    s = open_store(db_url, publish=topics.append)
    try:
        seed(s)
        s.enqueue(new_task(push=NewPush(url="https://a/")))
        assert PUSH_TOPIC in topics
    finally:
        s.close()


@pytest.mark.postgres
def test_a_config_deleted_while_a_report_is_written_drops_its_row_not_the_report(
    pg_url: str,
) -> None:
    """A config deleted by one transaction while another writes an event of its task: the
    event's trigger must skip the vanishing config, not fail the report on its foreign key."""
    import threading

    import psycopg

    from melchior.mellan.relay.store import open_store
    from storekit import seed

    db_url = pg_url  # SQLite has one writer at a time: the race cannot happen there
    s = open_store(db_url)
    try:
        seed(s)
        task, _ = s.enqueue(new_task())
        config = s.add_push_config(WS, task.id, CALLER, HOOK)
        tid, epoch = lease_one(s)
        with psycopg.connect(db_url) as deleter:
            deleter.execute("DELETE FROM push_config WHERE id = %s", (config.id,))  # not committed
            outcome: list[object] = []

            def report() -> None:
                try:
                    outcome.append(s.progress(tid, epoch, "status", '{"message": {}}'))
                except Exception as exc:  # the failure this test exists for
                    outcome.append(exc)

            writer = threading.Thread(target=report)
            writer.start()
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and writer.is_alive():
                waiting = deleter.execute(  # the report is blocked on the deleter's lock
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                    " AND datname = current_database() AND pid <> pg_backend_pid()"
                ).fetchone()
                if waiting and waiting[0]:
                    break
                time.sleep(0.02)
            deleter.commit()
            writer.join(30)
        (result,) = outcome
        assert not isinstance(result, Exception), result
        assert s.list_push_configs(WS, task.id) == []
        assert s.push_attempts(task.id) == []
    finally:
        s.close()
