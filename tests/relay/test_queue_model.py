"""Random interleavings of enqueue/claim/renew/complete/fail/cancel/ack/expire/sweep,
checked step by step against a small executable model of the seven rules."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from melchior.mellan.relay.store.base import Capability, Outcome, Store
from storekit import RECEIVER, db_url_fixture, new_task, store_fixture  # noqa: F401

MAX_ATTEMPTS = 2


@dataclass
class M:
    """The model of one task."""

    id: str
    seq: int
    session: str | None
    state: str = "queued"
    epoch: int = 0
    attempt: int = 0
    held: bool = False  # holds a lease or a cancel grace (lease_expires_at set)
    expired: bool = False


class QueueMachine(RuleBasedStateMachine):
    def __init__(self, store: Store, counter: itertools.count[int]) -> None:
        super().__init__()
        self.s = store
        # Only the expire rule ends a hold here: a cancel's grace on the real clock would lapse
        # whenever a loaded machine makes an example slow, and the model could not know it.
        setattr(store, "cancel_grace_ms", 3_600_000)  # noqa: B010
        self.ws = f"m{next(counter)}"
        store.ensure_workspace(self.ws)
        for a in ("local/caller", RECEIVER):
            store.add_agent(self.ws, a, "", [Capability("incident.inspect")])
        self.tasks: list[M] = []

    # -- model helpers ------------------------------------------------------------------------
    def _settle(self) -> int:
        n = 0
        for t in self.tasks:
            if t.held and t.expired:
                n += 1
                if t.state == "leased":
                    t.epoch += 1
                    t.state = "failed" if t.attempt >= MAX_ATTEMPTS else "queued"
                t.held = t.expired = False
        return n

    def _runnable(self, t: M) -> bool:
        if t.state != "queued":
            return False
        if t.session is None:
            return True
        same = [o for o in self.tasks if o.session == t.session]
        earlier_open = any(o.seq < t.seq and o.state in ("queued", "leased") for o in same)
        return not earlier_open and not any(o.held for o in same)

    def _why_not(self, t: M, epoch: int, done: tuple[str, ...]) -> Outcome:
        if t.epoch != epoch:
            return Outcome.LEASE_LOST
        if t.state in done:
            return Outcome.DUPLICATE
        if t.state == "cancelled" and t.held:
            t.held = t.expired = False
        return Outcome.LEASE_LOST

    def _pick(self, i: int) -> M | None:
        return self.tasks[i % len(self.tasks)] if self.tasks else None

    # -- rules --------------------------------------------------------------------------------
    @rule(session=st.sampled_from([None, "a", "b"]))
    def enqueue(self, session: str | None) -> None:
        t, created = self.s.enqueue(
            new_task(workspace=self.ws, session_key=session, max_attempts=MAX_ATTEMPTS)
        )
        assert created
        self.tasks.append(M(t.id, len(self.tasks), session))

    @rule(n=st.integers(1, 3))
    def claim(self, n: int) -> None:
        got = self.s.claim(self.ws, RECEIVER, "r", limit=n, lease_seconds=600)
        self._settle()
        want = [t for t in self.tasks if self._runnable(t)]
        # only one task per session per batch: the later ones are not heads yet
        chosen: list[M] = []
        for t in want:
            if len(chosen) == n:
                break
            if t.session is not None and any(c.session == t.session for c in chosen):
                continue
            chosen.append(t)
        assert [x.task.id for x in got] == [t.id for t in chosen]
        for t, lease in zip(chosen, got, strict=True):
            t.state, t.attempt, t.epoch = "leased", t.attempt + 1, t.epoch + 1
            t.held, t.expired = True, False
            assert lease.epoch == t.epoch

    @rule(i=st.integers(0, 3), stale=st.booleans())
    def renew(self, i: int, stale: bool) -> None:
        t = self._pick(i)
        if t is None:
            return
        ep = t.epoch - 1 if stale else t.epoch
        out = self.s.renew(t.id, ep, lease_seconds=600).outcome
        if t.state == "leased" and t.epoch == ep:
            assert out is Outcome.OK
            t.expired = False
        else:
            assert out is Outcome.LEASE_LOST

    @rule(i=st.integers(0, 3), stale=st.booleans(), input_required=st.booleans())
    def complete(self, i: int, stale: bool, input_required: bool) -> None:
        t = self._pick(i)
        if t is None:
            return
        ep = t.epoch - 1 if stale else t.epoch
        out = self.s.complete(t.id, ep, "{}", input_required=input_required).outcome
        if t.state == "leased" and t.epoch == ep:
            assert out is Outcome.OK
            t.state = "input_required" if input_required else "succeeded"
            t.held = t.expired = False
        else:
            assert out is self._why_not(t, ep, ("succeeded", "input_required"))

    @rule(picks=st.lists(st.tuples(st.integers(0, 3), st.booleans()), min_size=1, max_size=4))
    def complete_many(self, picks: list[tuple[int, bool]]) -> None:
        if not self.tasks:
            return
        chosen = [(self.tasks[i % len(self.tasks)], stale) for i, stale in picks]
        items = [
            (t.id, t.epoch - 1 if stale else t.epoch, f'"{k}"')
            for k, (t, stale) in enumerate(chosen)
        ]
        outs = [v.outcome for v in self.s.complete_many(items)]
        want: list[Outcome] = []
        for (t, _), (_, ep, _) in zip(chosen, items, strict=True):  # sequential semantics
            if t.state == "leased" and t.epoch == ep:
                want.append(Outcome.OK)
                t.state, t.held, t.expired = "succeeded", False, False
            else:
                want.append(self._why_not(t, ep, ("succeeded", "input_required")))
        assert outs == want

    @rule(i=st.integers(0, 3), stale=st.booleans(), retryable=st.booleans())
    def fail(self, i: int, stale: bool, retryable: bool) -> None:
        t = self._pick(i)
        if t is None:
            return
        ep = t.epoch - 1 if stale else t.epoch
        out = self.s.fail(t.id, ep, "x", retryable=retryable, backoff_seconds=0).outcome
        if t.state == "leased" and t.epoch == ep:
            assert out is Outcome.OK
            t.state = "queued" if retryable and t.attempt < MAX_ATTEMPTS else "failed"
            t.held = t.expired = False
        else:
            assert out is self._why_not(t, ep, ("queued", "failed"))

    @rule(i=st.integers(0, 3))
    def cancel(self, i: int) -> None:
        t = self._pick(i)
        if t is None:
            return
        _, out = self.s.cancel(self.ws, t.id)
        if t.state in ("queued", "leased", "input_required"):
            assert out is Outcome.OK
            t.held = t.state == "leased"
            t.expired = t.expired and t.held
            t.state = "cancelled"
        else:
            assert out is (Outcome.DUPLICATE if t.state == "cancelled" else Outcome.LEASE_LOST)

    @rule(i=st.integers(0, 3))
    def ack_cancel(self, i: int) -> None:
        t = self._pick(i)
        if t is None:
            return
        out = self.s.ack_cancel(t.id, t.epoch).outcome
        if t.state == "cancelled" and t.held:
            assert out is Outcome.OK
            t.held = t.expired = False
        else:
            assert out is self._why_not(t, t.epoch, ("cancelled",))

    @rule(i=st.integers(0, 3))
    def expire(self, i: int) -> None:
        t = self._pick(i)
        if t is None:
            return
        getattr(self.s, "expire_leases")([t.id])  # noqa: B009
        if t.held:
            t.expired = True

    @rule()
    def sweep(self) -> None:
        # sweep is global; other workspaces of this store have nothing expired left
        assert self.s.sweep() == self._settle()

    def teardown(self) -> None:
        # Leave no hold behind at all: the next example's global sweep must find nothing of ours.
        held = [t.id for t in self.tasks if t.held]
        if held:
            getattr(self.s, "expire_leases")(held)  # noqa: B009
        self.s.sweep()

    @invariant()
    def matches_model(self) -> None:
        for t in self.tasks:
            got = self.s.get_task(self.ws, t.id)
            assert got is not None
            assert (got.state.value, got.lease_epoch, got.attempt) == (t.state, t.epoch, t.attempt)
            assert (got.lease_expires_at is not None) == t.held, (got, t)
            assert got.attempt <= MAX_ATTEMPTS


def test_queue_matches_model(store: Store, db_url: str) -> None:
    counter = itertools.count()
    examples = 60 if db_url.startswith("sqlite") else 25
    run_state_machine_as_test(
        lambda: QueueMachine(store, counter),
        settings=settings(max_examples=examples, stateful_step_count=30, deadline=None),
    )
