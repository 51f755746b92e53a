"""The seven queue rules (ARCHITECTURE §5), one or more tests each, on both backends,
plus the store-side faults of issue 4 (stale epochs, duplicates, expiry, cancel)."""

from __future__ import annotations

import pytest

from melchior.mellan.relay.store.base import FollowUp, Outcome, Store, TaskState
from storekit import RECEIVER, WS, db_url_fixture, new_task, store_fixture, wait_db_clock_past  # noqa: F401


def expire(store: Store, *ids: str) -> None:
    """Expire leases through the store's drill hook (no waiting on any clock)."""
    hook = getattr(store, "expire_leases")  # noqa: B009 - a backend hook, not in the Protocol
    hook(list(ids) if ids else None)


# -- rule 1: at most one valid lease per task; the epoch fences every write ------------------


def test_rule1_claim_is_exclusive(store: Store) -> None:
    t, _ = store.enqueue(new_task())
    [a] = store.claim(WS, RECEIVER, "a")
    assert store.claim(WS, RECEIVER, "b") == []
    assert a.task.id == t.id
    assert a.epoch == 1
    assert a.task.state is TaskState.LEASED
    assert a.task.lease_owner == "a"
    assert a.expires_at.endswith("Z")


def test_rule1_stale_epoch_renew_complete_fail_rejected(store: Store) -> None:
    t, _ = store.enqueue(new_task())
    [old] = store.claim(WS, RECEIVER, "zombie")
    expire(store, t.id)
    [new] = store.claim(WS, RECEIVER, "fresh")  # reclaimed: epoch bumped
    assert new.task.id == t.id
    assert new.epoch > old.epoch
    assert store.renew(t.id, old.epoch).outcome is Outcome.LEASE_LOST
    assert store.progress(t.id, old.epoch, "status", "{}").outcome is Outcome.LEASE_LOST
    assert store.complete(t.id, old.epoch, '{"zombie": true}').outcome is Outcome.LEASE_LOST
    assert store.fail(t.id, old.epoch, "zombie").outcome is Outcome.LEASE_LOST
    cur = store.get_task(WS, t.id)
    assert cur is not None
    assert cur.state is TaskState.LEASED
    assert cur.lease_owner == "fresh"
    assert store.renew(t.id, new.epoch).outcome is Outcome.OK
    assert store.complete(t.id, new.epoch, '{"ok": 1}').outcome is Outcome.OK
    done = store.get_task(WS, t.id)
    assert done is not None
    assert done.result == '{"ok": 1}'
    assert store.renew("missing", 1).outcome is Outcome.NOT_FOUND
    assert store.complete("missing", 1, "{}").outcome is Outcome.NOT_FOUND
    assert store.fail("missing", 1, "x").outcome is Outcome.NOT_FOUND


def test_rule1_lease_expiry_is_audited(store: Store) -> None:
    t, _ = store.enqueue(new_task())
    store.claim(WS, RECEIVER, "a")
    expire(store, t.id)
    assert store.sweep() == 1
    recs = [r for r in store.audit_since(WS) if r.action == "lease.expired"]
    assert [r.subject for r in recs] == [t.id]


# -- rule 2: the attempt is counted at claim; expiry past max_attempts → failed -------------


def test_rule2_attempt_counted_at_claim_and_bounded(store: Store) -> None:
    t, _ = store.enqueue(new_task(max_attempts=2))
    [l1] = store.claim(WS, RECEIVER, "a")
    assert l1.task.attempt == 1
    expire(store, t.id)
    [l2] = store.claim(WS, RECEIVER, "a")
    assert l2.task.attempt == 2
    expire(store, t.id)
    assert store.claim(WS, RECEIVER, "a") == []  # expiry with attempts spent → failed
    cur = store.get_task(WS, t.id)
    assert cur is not None
    assert cur.state is TaskState.FAILED
    assert cur.attempt == 2
    assert cur.error == "lease expired"
    assert cur.lease_expires_at is None


def test_rule2_expiry_on_db_clock_with_tiny_lease(store: Store) -> None:
    t, _ = store.enqueue(new_task(max_attempts=3))
    [lease] = store.claim(WS, RECEIVER, "a", lease_seconds=0.05)
    wait_db_clock_past(store, lease.expires_at)
    assert store.sweep() == 1
    cur = store.get_task(WS, t.id)
    assert cur is not None
    assert cur.state is TaskState.QUEUED
    assert cur.lease_epoch == 2
    [again] = store.claim(WS, RECEIVER, "b")
    assert again.task.attempt == 2


def test_rule2_fail_retries_with_backoff_then_fails(store: Store) -> None:
    t, _ = store.enqueue(new_task(max_attempts=2))
    [l1] = store.claim(WS, RECEIVER, "a")
    assert store.fail(t.id, l1.epoch, "boom", backoff_seconds=3600).outcome is Outcome.OK
    cur = store.get_task(WS, t.id)
    assert cur is not None
    assert cur.state is TaskState.QUEUED
    assert cur.error == "boom"
    assert store.claim(WS, RECEIVER, "a") == []  # backing off
    t2, _ = store.enqueue(new_task(max_attempts=2))
    [l2] = store.claim(WS, RECEIVER, "a")
    assert l2.task.id == t2.id
    assert store.fail(t2.id, l2.epoch, "x", backoff_seconds=0).outcome is Outcome.OK
    [l3] = store.claim(WS, RECEIVER, "a")
    assert l3.task.id == t2.id
    assert l3.task.attempt == 2
    assert store.fail(t2.id, l3.epoch, "again", backoff_seconds=0).outcome is Outcome.OK
    final = store.get_task(WS, t2.id)
    assert final is not None
    assert final.state is TaskState.FAILED
    assert final.attempt == 2


def test_rule2_non_retryable_fail_is_final(store: Store) -> None:
    t, _ = store.enqueue(new_task(max_attempts=5))
    [lease] = store.claim(WS, RECEIVER, "a")
    assert store.fail(t.id, lease.epoch, "bad input", retryable=False).outcome is Outcome.OK
    assert store.fail(t.id, lease.epoch, "bad input", retryable=False).outcome is Outcome.DUPLICATE
    cur = store.get_task(WS, t.id)
    assert cur is not None
    assert cur.state is TaskState.FAILED
    assert cur.attempt == 1


# -- rule 3: a session's tasks run one at a time, in order ---------------------------------


def test_rule3_session_serialised_in_order(store: Store) -> None:
    s = [store.enqueue(new_task(session_key="sess"))[0] for _ in range(3)]
    free, _ = store.enqueue(new_task())
    got = store.claim(WS, RECEIVER, "a", limit=10)
    assert {x.task.id for x in got} == {s[0].id, free.id}  # only the session head + free
    assert store.claim(WS, RECEIVER, "b", limit=10) == []
    head = next(x for x in got if x.task.id == s[0].id)
    assert store.complete(s[0].id, head.epoch, "{}").outcome is Outcome.OK
    [nxt] = store.claim(WS, RECEIVER, "b", limit=10)
    assert nxt.task.id == s[1].id


def test_rule3_retrying_head_blocks_its_session(store: Store) -> None:
    s0, _ = store.enqueue(new_task(session_key="sess"))
    s1, _ = store.enqueue(new_task(session_key="sess"))
    [lease] = store.claim(WS, RECEIVER, "a")
    store.fail(s0.id, lease.epoch, "later", backoff_seconds=3600)
    assert store.claim(WS, RECEIVER, "a", limit=5) == []  # s1 must not overtake s0
    expire(store)  # no-op: nothing is leased
    cur = store.get_task(WS, s1.id)
    assert cur is not None
    assert cur.state is TaskState.QUEUED


def test_rule3_expired_head_reclaimed_before_successor(store: Store) -> None:
    s0, _ = store.enqueue(new_task(session_key="sess"))
    s1, _ = store.enqueue(new_task(session_key="sess"))
    store.claim(WS, RECEIVER, "a")
    expire(store, s0.id)
    [again] = store.claim(WS, RECEIVER, "b", limit=5)
    assert again.task.id == s0.id
    assert again.task.attempt == 2
    del s1


def test_rule3_sessions_are_per_workspace_keyed(store: Store) -> None:
    a, _ = store.enqueue(new_task(session_key="s1"))
    b, _ = store.enqueue(new_task(session_key="s2"))
    got = store.claim(WS, RECEIVER, "x", limit=5)
    assert {g.task.id for g in got} == {a.id, b.id}


# -- rule 4: a recorded success is final ------------------------------------------------------


def test_rule4_success_never_rerun(store: Store) -> None:
    t, _ = store.enqueue(new_task())
    [lease] = store.claim(WS, RECEIVER, "a")
    assert store.complete(t.id, lease.epoch, '{"r": 1}').outcome is Outcome.OK
    expire(store)
    assert store.sweep() == 0
    assert store.claim(WS, RECEIVER, "b") == []
    assert store.fail(t.id, lease.epoch, "late").outcome is Outcome.LEASE_LOST
    assert store.renew(t.id, lease.epoch).outcome is Outcome.LEASE_LOST
    cur = store.get_task(WS, t.id)
    assert cur is not None
    assert cur.state is TaskState.SUCCEEDED
    assert cur.result == '{"r": 1}'
    assert cur.lease_expires_at is None
    assert cur.lease_owner is None


def test_rule4_expired_but_unreclaimed_lease_may_still_complete(store: Store) -> None:
    t, _ = store.enqueue(new_task())
    [lease] = store.claim(WS, RECEIVER, "a")
    expire(store, t.id)  # expired, but nobody has taken it over: epoch unchanged
    assert store.complete(t.id, lease.epoch, "{}").outcome is Outcome.OK
    assert store.sweep() == 0


def test_input_required_is_recorded(store: Store) -> None:
    t, _ = store.enqueue(new_task())
    [lease] = store.claim(WS, RECEIVER, "a")
    assert (
        store.complete(t.id, lease.epoch, '{"q": "?"}', input_required=True).outcome is Outcome.OK
    )
    cur = store.get_task(WS, t.id)
    assert cur is not None
    assert cur.state is TaskState.INPUT_REQUIRED
    assert store.complete(t.id, lease.epoch, "{}", input_required=True).outcome is Outcome.DUPLICATE


# -- rule 5: complete is idempotent -----------------------------------------------------------


def test_rule5_duplicate_completion(store: Store) -> None:
    t, _ = store.enqueue(new_task())
    [lease] = store.claim(WS, RECEIVER, "a")
    assert store.complete(t.id, lease.epoch, '{"first": 1}').outcome is Outcome.OK
    assert store.complete(t.id, lease.epoch, '{"first": 1}').outcome is Outcome.DUPLICATE
    assert store.complete(t.id, lease.epoch, '{"second": 2}').outcome is Outcome.DUPLICATE
    assert store.complete(t.id, lease.epoch + 1, "{}").outcome is Outcome.LEASE_LOST
    cur = store.get_task(WS, t.id)
    assert cur is not None
    assert cur.result == '{"first": 1}'


def test_rule5_complete_many_batches_with_per_item_outcomes(store: Store) -> None:
    ts = [store.enqueue(new_task())[0] for _ in range(4)]
    leases = store.claim(WS, RECEIVER, "a", limit=4)
    assert [x.task.id for x in leases] == [t.id for t in ts]  # claim order is queue order
    items = [(x.task.id, x.epoch, f'{{"i": {i}}}') for i, x in enumerate(leases[:3])]
    items.append((leases[0].task.id, leases[0].epoch, "{}"))  # duplicate inside the batch
    items.append((leases[3].task.id, leases[3].epoch + 7, "{}"))  # stale
    items.append(("missing", 1, "{}"))
    assert [v.outcome for v in store.complete_many(items)] == [
        Outcome.OK,
        Outcome.OK,
        Outcome.OK,
        Outcome.DUPLICATE,
        Outcome.LEASE_LOST,
        Outcome.NOT_FOUND,
    ]
    assert [v.outcome for v in store.complete_many([])] == []
    first = store.get_task(WS, leases[0].task.id)
    assert first is not None
    assert first.result == '{"i": 0}'
    # a stale item before the right one for the same task does not hide it
    t5, _ = store.enqueue(new_task())
    [l5] = store.claim(WS, RECEIVER, "a")
    assert [
        v.outcome
        for v in store.complete_many(
            [(t5.id, l5.epoch - 1, '{"stale": 1}'), (t5.id, l5.epoch, '{"ok": 1}')]
        )
    ] == [Outcome.LEASE_LOST, Outcome.OK]
    got5 = store.get_task(WS, t5.id)
    assert got5 is not None
    assert got5.result == '{"ok": 1}'


# -- rule 6: cancel revokes the lease ---------------------------------------------------------


def test_rule6_cancel_queued(store: Store) -> None:
    t, _ = store.enqueue(new_task())
    got, outcome = store.cancel(WS, t.id)
    assert outcome is Outcome.OK
    assert got is not None
    assert got.state is TaskState.CANCELLED
    assert store.claim(WS, RECEIVER, "a") == []
    _, again = store.cancel(WS, t.id)
    assert again is Outcome.DUPLICATE
    assert store.cancel(WS, "missing") == (None, Outcome.NOT_FOUND)
    assert store.cancel("other", t.id) == (None, Outcome.NOT_FOUND)


def test_rule6_cancel_leased_revokes_and_holds_session_until_ack(store: Store) -> None:
    s0, _ = store.enqueue(new_task(session_key="sess"))
    s1, _ = store.enqueue(new_task(session_key="sess"))
    [lease] = store.claim(WS, RECEIVER, "a")
    got, outcome = store.cancel(WS, s0.id)
    assert outcome is Outcome.OK
    assert got is not None
    assert got.state is TaskState.CANCELLED
    assert store.renew(s0.id, lease.epoch).outcome is Outcome.LEASE_LOST  # receiver learns here
    assert store.progress(s0.id, lease.epoch, "status", "{}").outcome is Outcome.LEASE_LOST
    assert store.claim(WS, RECEIVER, "b") == []  # still stopping: s1 must wait
    assert store.ack_cancel(s0.id, lease.epoch + 1).outcome is Outcome.LEASE_LOST
    assert store.ack_cancel(s0.id, lease.epoch).outcome is Outcome.OK
    assert store.ack_cancel(s0.id, lease.epoch).outcome is Outcome.DUPLICATE
    [nxt] = store.claim(WS, RECEIVER, "b")
    assert nxt.task.id == s1.id
    final = store.get_task(WS, s0.id)
    assert final is not None
    assert final.state is TaskState.CANCELLED


def test_rule6_complete_after_cancel_is_lease_lost_and_frees_slot(store: Store) -> None:
    s0, _ = store.enqueue(new_task(session_key="sess"))
    s1, _ = store.enqueue(new_task(session_key="sess"))
    [lease] = store.claim(WS, RECEIVER, "a")
    store.cancel(WS, s0.id)
    assert store.complete(s0.id, lease.epoch, "{}").outcome is Outcome.LEASE_LOST
    [nxt] = store.claim(WS, RECEIVER, "b")
    assert nxt.task.id == s1.id


def test_rule6_cancel_grace_runs_out(store: Store) -> None:
    s0, _ = store.enqueue(new_task(session_key="sess"))
    s1, _ = store.enqueue(new_task(session_key="sess"))
    store.claim(WS, RECEIVER, "a")
    store.cancel(WS, s0.id)
    expire(store, s0.id)  # the receiver never acknowledged
    [nxt] = store.claim(WS, RECEIVER, "b")
    assert nxt.task.id == s1.id
    cur = store.get_task(WS, s0.id)
    assert cur is not None
    assert cur.state is TaskState.CANCELLED
    assert cur.attempt == 1


def test_rule6_cancel_terminal_refused(store: Store) -> None:
    t, _ = store.enqueue(new_task())
    [lease] = store.claim(WS, RECEIVER, "a")
    store.complete(t.id, lease.epoch, "{}")
    got, outcome = store.cancel(WS, t.id)
    assert outcome is Outcome.LEASE_LOST
    assert got is not None
    assert got.state is TaskState.SUCCEEDED


# -- rule 7: lease maths on the database clock ------------------------------------------------


def test_rule7_lease_expiry_stamped_by_db_clock(store: Store) -> None:
    before = store.now()
    store.enqueue(new_task())
    [lease] = store.claim(WS, RECEIVER, "a", lease_seconds=600)
    after = store.now()
    assert before < lease.expires_at
    # expires 600 s after a DB instant between before and after
    from datetime import datetime

    exp = datetime.fromisoformat(lease.expires_at)
    assert (exp - datetime.fromisoformat(before)).total_seconds() >= 599
    assert (exp - datetime.fromisoformat(after)).total_seconds() <= 600.001
    assert store.renew(lease.task.id, lease.epoch, lease_seconds=1200).outcome is Outcome.OK
    cur = store.get_task(WS, lease.task.id)
    assert cur is not None
    assert cur.lease_expires_at is not None
    assert cur.lease_expires_at > lease.expires_at


def test_rule7_renew_extends_past_expiry(store: Store) -> None:
    t, _ = store.enqueue(new_task())
    [lease] = store.claim(WS, RECEIVER, "a", lease_seconds=0.05)
    assert store.renew(t.id, lease.epoch, lease_seconds=600).outcome is Outcome.OK
    wait_db_clock_past(store, lease.expires_at)
    assert store.sweep() == 0  # renewed: not expired
    assert store.claim(WS, RECEIVER, "b") == []


@pytest.mark.parametrize("limit", [1, 3])
def test_claim_limit(store: Store, limit: int) -> None:
    for _ in range(5):
        store.enqueue(new_task())
    assert len(store.claim(WS, RECEIVER, "a", limit=limit)) == limit
    assert store.claim(WS, RECEIVER, "a", limit=0) == []
    assert store.claim(WS, "someone/else", "a", limit=5) == []


# -- a task is a sequence of turns --------------------------------------------------------------


def _follow(task_id: str, mid: str, text: str = "the blue one") -> FollowUp:
    return FollowUp(
        workspace=WS,
        task_id=task_id,
        caller=new_task().caller,
        message_id=mid,
        payload=f'{{"text": "{text}"}}',
        chain="c",
        hop=2,
        path=("a", "b"),
    )


def test_turns_an_answer_continues_the_same_task_each_turn_fenced(store: Store) -> None:
    t, _ = store.enqueue(new_task(message_id="m1"))
    [first] = store.claim(WS, RECEIVER, "a")
    store.progress(t.id, first.epoch, "status", '{"n": 1}')
    assert store.complete(t.id, first.epoch, '{"q": "which?"}', input_required=True).ok
    went, moved = store.continue_task(_follow(t.id, "m2"))
    assert moved
    assert went is not None
    assert (went.id, went.turn, went.state) == (t.id, 2, TaskState.QUEUED)
    assert (went.attempt, went.result, went.hop) == (0, None, 2)
    assert went.payload == '{"text": "the blue one"}'
    [second] = store.claim(WS, RECEIVER, "a")
    assert second.task.id == t.id
    assert second.epoch > first.epoch  # the first turn's holder stays fenced out
    # a late report of turn 1 (already recorded) is a duplicate; its renew is a lost lease
    assert store.complete(t.id, first.epoch, '{"q": "which?"}', input_required=True).outcome is (
        Outcome.DUPLICATE
    )
    assert store.renew(t.id, first.epoch).outcome is Outcome.LEASE_LOST
    store.progress(t.id, second.epoch, "status", '{"n": 2}')
    assert store.complete(t.id, second.epoch, '{"a": "done"}').ok
    [past] = store.turns(t.id)
    assert (past.turn, past.state, past.result, past.epoch) == (
        1, TaskState.INPUT_REQUIRED, '{"q": "which?"}', first.epoch
    )  # fmt: skip
    assert [e.turn for e in store.events_after(t.id)] == [1, 2]
    final = store.get_task(WS, t.id)
    assert final is not None
    assert (final.state, final.turn, final.result) == (TaskState.SUCCEEDED, 2, '{"a": "done"}')


def test_turns_only_a_task_waiting_for_input_goes_on_and_each_message_once(store: Store) -> None:
    t, _ = store.enqueue(new_task(message_id="m1"))
    went, moved = store.continue_task(_follow(t.id, "m2"))
    assert not moved  # still queued: it asked nothing
    assert went is not None
    assert went.turn == 1
    assert store.continue_task(_follow("no-such-task", "m3")) == (None, False)
    [lease] = store.claim(WS, RECEIVER, "a")
    store.complete(t.id, lease.epoch, "{}", input_required=True)
    went, moved = store.continue_task(_follow(t.id, "m1"))  # turn 1's messageId: taken
    assert not moved
    assert store.get_task(WS, t.id).state is TaskState.INPUT_REQUIRED  # type: ignore[union-attr]
    assert store.continue_task(_follow(t.id, "m2"))[1]
    sent = store.sent_message(WS, new_task().caller, "m2")
    assert sent is not None
    assert (sent.task_id, sent.turn, sent.payload) == (t.id, 2, '{"text": "the blue one"}')
    first = store.sent_message(WS, new_task().caller, "m1")
    assert first is not None
    assert (first.turn, first.payload) == (1, new_task().payload)  # kept with its turn
