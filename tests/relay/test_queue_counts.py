"""The send caps' counters (schema v10) against a recount of the task rows, after random
sequences of admit/claim/complete/fail/cancel/follow-up/lease expiry/retention and a
delete by hand, on both backends; and the caps decide as a recount would.

The counters are kept by triggers, so the property is about the schema, not the queue
code: whatever statement changed a task (an accept batch, a claim of several, a sweep,
a purge, an operator's DELETE), the counts a cap reads are the rows there are."""

from __future__ import annotations

import itertools
import sqlite3
import uuid
from collections import Counter

import psycopg
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from melchior.mellan.relay.store.base import (
    Capability,
    Caps,
    FollowUp,
    NewTask,
    OverLimit,
    Store,
    TaskState,
)
from melchior.policy.send_limits import QUEUED, UNFINISHED
from storekit import db_url_fixture, store_fixture  # noqa: F401

CALLERS = ("c1", "c2")
RECEIVERS = ("r1", "r2")
UNFINISHED_STATES = ("queued", "leased", "input_required")
CAPS = Caps(max_unfinished_per_receiver=3, max_queued=4)


class CountsMachine(RuleBasedStateMachine):
    def __init__(self, store: Store, url: str, counter: itertools.count[int]) -> None:
        super().__init__()
        self.s, self.url = store, url
        setattr(store, "cancel_grace_ms", 3_600_000)  # noqa: B010  (holds end by expire only)
        self.ws = f"k{next(counter)}"
        store.ensure_workspace(self.ws)
        for a in CALLERS + RECEIVERS:
            store.add_agent(self.ws, a, "", [Capability("x")])
        self.ids: list[str] = []
        self.leases: dict[str, int] = {}  # task id -> the epoch of its last lease

    # -- reading the database -------------------------------------------------------------------
    def _rows(self, sql: str) -> list[tuple[object, ...]]:
        if self.url.startswith("sqlite"):
            conn = sqlite3.connect(self.url.removeprefix("sqlite://"))
            try:
                return [tuple(r) for r in conn.execute(sql, (self.ws,))]
            finally:
                conn.close()
        with psycopg.connect(self.url, autocommit=True) as pg:
            return [tuple(r) for r in pg.execute(sql.replace("?", "%s"), (self.ws,))]

    def _recount(self) -> tuple[Counter[tuple[str, ...]], Counter[tuple[str, ...]]]:
        queued: Counter[tuple[str, ...]] = Counter()
        unfinished: Counter[tuple[str, ...]] = Counter()
        for receiver, caller, state in self._rows(
            "SELECT receiver, caller, state FROM task WHERE workspace = ?"
        ):
            if state == "queued":
                queued[(str(receiver),)] += 1
            if state in UNFINISHED_STATES:
                unfinished[(str(receiver), str(caller))] += 1
        return queued, unfinished

    def _counters(self) -> tuple[Counter[tuple[str, ...]], Counter[tuple[str, ...]]]:
        queued = Counter(
            {(str(r),): int(str(n)) for r, n in self._rows(
                "SELECT receiver, sum(n) FROM receiver_queued WHERE workspace = ?"
                " GROUP BY receiver")}
        )  # fmt: skip
        unfinished = Counter(
            {(str(r), str(c)): int(str(n)) for r, c, n in self._rows(
                "SELECT receiver, caller, sum(n) FROM caller_unfinished WHERE workspace = ?"
                " GROUP BY receiver, caller")}
        )  # fmt: skip
        return +queued, +unfinished  # zero counts dropped, as a recount has none

    def _pick(self, i: int) -> str | None:
        return self.ids[i % len(self.ids)] if self.ids else None

    # -- rules ------------------------------------------------------------------------------------
    @rule(
        batch=st.lists(
            st.tuples(st.sampled_from(CALLERS), st.sampled_from(RECEIVERS), st.booleans()),
            min_size=1,
            max_size=5,
        )
    )
    def admit(self, batch: list[tuple[str, str, bool]]) -> None:
        """Caps decide as a recount would: before the batch is stored, in input order, the
        unfinished cap first, each capped task taken counting for the next."""
        queued, unfinished = self._recount()
        want: list[str | None] = []
        for caller, receiver, capped in batch:
            if not capped:
                want.append(None)
            elif unfinished[(receiver, caller)] >= CAPS.max_unfinished_per_receiver:
                want.append(UNFINISHED)
            elif queued[(receiver,)] >= CAPS.max_queued:
                want.append(QUEUED)
            else:
                want.append(None)
                queued[(receiver,)] += 1
                unfinished[(receiver, caller)] += 1
        tasks = [
            NewTask(self.ws, c, r, "x", "{}", message_id=uuid.uuid4().hex,
                    caps=CAPS if capped else None)
            for c, r, capped in batch
        ]  # fmt: skip
        out = self.s.admit(tasks)
        got = [o.limit if isinstance(o, OverLimit) else None for o in out]
        assert got == want
        self.ids += [o[0].id for o in out if not isinstance(o, OverLimit)]

    @rule(receiver=st.sampled_from(RECEIVERS), n=st.integers(1, 3))
    def claim(self, receiver: str, n: int) -> None:
        for lease in self.s.claim(self.ws, receiver, "r", limit=n, lease_seconds=600):
            self.leases[lease.task.id] = lease.epoch

    @rule(i=st.integers(0, 7), input_required=st.booleans())
    def complete(self, i: int, input_required: bool) -> None:
        tid = self._pick(i)
        if tid in self.leases:
            self.s.complete(tid, self.leases[tid], "{}", input_required=input_required)

    @rule(picks=st.lists(st.integers(0, 7), min_size=1, max_size=4))
    def complete_many(self, picks: list[int]) -> None:
        items = [(t, self.leases[t], "{}") for t in map(self._pick, picks) if t in self.leases]
        self.s.complete_many(items)

    @rule(i=st.integers(0, 7), retryable=st.booleans())
    def fail(self, i: int, retryable: bool) -> None:
        tid = self._pick(i)
        if tid in self.leases:
            self.s.fail(tid, self.leases[tid], "x", retryable=retryable, backoff_seconds=0)

    @rule(i=st.integers(0, 7))
    def cancel(self, i: int) -> None:
        tid = self._pick(i)
        if tid is not None:
            self.s.cancel(self.ws, tid)

    @rule(i=st.integers(0, 7))
    def follow_up(self, i: int) -> None:
        tid = self._pick(i)
        task = None if tid is None else self.s.get_task(self.ws, tid)
        if task is None or task.state is not TaskState.INPUT_REQUIRED:
            return
        follow = FollowUp(self.ws, task.id, task.caller, uuid.uuid4().hex, "{}", task.chain, 0, ())
        went, _ = self.s.continue_task(follow)
        assert went is not None
        assert went.state is TaskState.QUEUED

    @rule(i=st.integers(0, 7))
    def expire_and_sweep(self, i: int) -> None:
        tid = self._pick(i)
        if tid is not None:
            getattr(self.s, "expire_leases")([tid])  # noqa: B009
            self.s.sweep()

    @rule()
    def purge(self) -> None:
        self.s.purge_finished(self.ws, 0.001)

    @rule(i=st.integers(0, 7))
    def delete_by_hand(self, i: int) -> None:
        """An operator's DELETE of any task, in any state: the counters follow it too."""
        tid = self._pick(i)
        if tid is None:
            return
        if self.url.startswith("sqlite"):
            conn = sqlite3.connect(self.url.removeprefix("sqlite://"), isolation_level=None)
            try:
                conn.execute("PRAGMA busy_timeout = 10000")
                conn.execute("DELETE FROM task WHERE id = ?", (tid,))
            finally:
                conn.close()
        else:
            with psycopg.connect(self.url, autocommit=True) as pg:
                pg.execute("DELETE FROM task WHERE id = %s", (tid,))

    def teardown(self) -> None:
        held = list(self.leases)
        if held:
            getattr(self.s, "expire_leases")(held)  # noqa: B009
        self.s.sweep()

    @invariant()
    def counters_are_a_recount(self) -> None:
        assert self._counters() == tuple(+c for c in self._recount())


def test_counters_equal_a_recount(store: Store, db_url: str) -> None:
    counter = itertools.count()
    examples = 40 if db_url.startswith("sqlite") else 20
    run_state_machine_as_test(
        lambda: CountsMachine(store, db_url, counter),
        settings=settings(max_examples=examples, stateful_step_count=25, deadline=None),
    )
