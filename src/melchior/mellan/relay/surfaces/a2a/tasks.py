"""The A2A operations on one task, once, for both bindings: send (blocking or
streaming), get, cancel, subscribe.

A send passes the door first (:mod:`.admission`: authorize, store, record). Then the
receiver claims the task whenever it is online; until then it stays queued. Blocking
sends and streams watch the task through stored state and stored events, so any replica
can serve them and a reconnecting client loses nothing.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import AsyncIterator, Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from melchior.mellan.relay.context import Relay
from melchior.mellan.relay.notify import task_stop_topic, task_topic
from melchior.mellan.relay.store.base import (
    Outcome,
    Store,
    Task,
    TaskEvent,
    TaskState,
    TaskTurn,
)
from melchior.mellan.relay.surfaces.a2a import admission, sse, views
from melchior.mellan.relay.surfaces.a2a.access import Caller
from melchior.mellan.relay.surfaces.a2a.errors import (
    TaskNotCancelable,
    TaskNotFound,
    UnsupportedOperation,
)
from melchior.mellan.relay.surfaces.a2a.requests import SendRequest
from melchior.mellan.relay.watch import Follower, Step, Waker

MAX_BLOCK_SECONDS = 600.0
"""A blocking SendMessage returns the task as it is after this long, so a destination
that stays offline cannot hold a connection forever; the caller then polls or
subscribes. Documented in docs/a2a.md."""


class Seen(NamedTuple):
    task: Task
    events: list[TaskEvent]
    turns: list[TaskTurn]


def _read(store: Store, workspace: str, task_id: str, after: int) -> Seen | None:
    """The task row first, then its events (and finished turns, for a task that went on):
    every event written before the row's state is then included, so a terminal row never
    hides an event that preceded it."""
    task = store.get_task(workspace, task_id)
    if task is None:
        return None
    events = store.events_after(task_id, after)
    if events and task.state is TaskState.QUEUED:
        # Events follow a claim, so this row was read before the claim: told as it is,
        # a stream would say the events, then "submitted". The row again, after them,
        # and what was written since (a row that ended meanwhile hides no event).
        again = store.get_task(workspace, task_id)
        if again is not None:
            task = again
            events += store.events_after(task_id, events[-1].seq)
    turns = store.turns(task_id) if task.turn > 1 else []
    return Seen(task, events, turns)


def _view(seen: Seen, history_length: int | None = None) -> dict[str, Any]:
    return views.task_view(seen.task, seen.events, history_length=history_length, turns=seen.turns)


INLINE_VIEW = 64 * 1024
"""Stored text (payloads, results, event bodies) up to which a task's view is built on the
event loop; above it, on a worker thread: a view of a 15 MiB result is parsed JSON of
15 MiB, which would stall every other request for a second."""


def stored_size(seen: Seen) -> int:
    """How much stored JSON text a view of ``seen`` parses."""
    task = seen.task
    size = len(task.payload) + len(task.result or "") + len(task.error or "")
    size += sum(len(ev.body or "") for ev in seen.events)
    return size + sum(len(t.payload) + len(t.result or "") for t in seen.turns)


async def view_of(relay: Relay, seen: Seen, history_length: int | None = None) -> dict[str, Any]:
    """:func:`_view`, off the event loop when the task is big (:data:`INLINE_VIEW`)."""
    if stored_size(seen) <= INLINE_VIEW:
        return _view(seen, history_length)
    return await relay.call(_view, seen, history_length)


async def get_visible(relay: Relay, caller: Caller, task_id: str) -> Seen:
    seen = await relay.call(_read, relay.store, caller.target.workspace, task_id, 0)
    caller.visible(seen.task if seen else None, task_id)
    assert seen is not None
    return seen


async def answer(relay: Relay, seen: Seen, history_length: int | None) -> dict[str, Any]:
    """The ``SendMessageResponse``: the task, or — when the agent answered with a message
    and no task of its own (a direct reply) — that message. Built off the event loop when
    the task is big (:func:`view_of`), as GetTask's is."""
    if stored_size(seen) > INLINE_VIEW:
        return await relay.call(_answer, seen, history_length)
    return _answer(seen, history_length)


def _answer(seen: Seen, history_length: int | None) -> dict[str, Any]:
    direct = views.direct_reply(seen.task)
    if direct is not None:
        return {"message": direct}
    return {"task": _view(seen, history_length)}


async def send_blocking(
    relay: Relay,
    caller: Caller,
    req: SendRequest,
    disconnected: Callable[[], Any] | None = None,
) -> dict[str, Any]:
    """SendMessage: accept, then — unless ``returnImmediately`` — wait until the task ends
    or is interrupted (or :data:`MAX_BLOCK_SECONDS`, or the caller leaves) and answer with
    it. A new task is listened for from before its commit (``admission.accept``'s
    ``listen``), so the row the accept returned is its state until a wake-up says
    otherwise: the first look costs no thread hop and no read — which ran beside the
    receiver's claim of the same task, on the path the caller waits for (docs/benchmarks.md,
    issue 25, the relay's own path). It waits on the task's stop topic
    (:func:`~melchior.mellan.relay.topics.task_stop_topic`), not on every change: the
    claim and progress that cannot end the wait wake nothing here."""
    early: list[Waker] = []

    def listen(task_id: str) -> None:
        waker = Waker(relay.notifier, task_stop_topic(task_id), relay.poll_interval)
        waker.arm_now()
        early.append(waker)

    try:
        task, fresh = await admission.accept(
            relay, caller, req, None if req.return_immediately else listen
        )
    except BaseException:
        for w in early:
            w.close()
        raise
    if req.return_immediately:
        if fresh:  # stored just now: no events, no earlier turns, nothing to read back
            return await answer(relay, Seen(task, [], []), req.history_length)
        seen = await relay.call(_read, relay.store, task.workspace, task.id, 0)
        return await answer(relay, seen or Seen(task, [], []), req.history_length)
    deadline = time.monotonic() + MAX_BLOCK_SECONDS
    topic = task_stop_topic(task.id)
    waker = next((w for w in early if w.topic == topic), None)
    for w in early:
        if w is not waker:
            w.close()
    # Listened for since before its commit and stored just now: the row is the state.
    known: Seen | None = Seen(task, [], []) if fresh and waker is not None else None
    if waker is None:
        waker = Waker(relay.notifier, topic, relay.poll_interval)
    try:
        while True:
            seen = known
            known = None
            if seen is None:
                await waker.arm()
                seen = await relay.call(_read, relay.store, task.workspace, task.id, 0)
            if seen is None:  # vanished (retention); report what was accepted
                return {"task": views.task_view(task, history_length=req.history_length)}
            if views.ends_stream(seen.task.state) or time.monotonic() >= deadline:
                return await answer(relay, seen, req.history_length)
            if disconnected is not None and await disconnected():
                return await answer(relay, seen, req.history_length)
            await waker.wait()
    finally:
        waker.close()


@dataclass(frozen=True)
class Watched:
    """What a task's shared reader knows: the task row as last read (None: it is gone),
    every event of the task so far in order, and its finished turns.

    ``memo`` is this value's, for its followers: what a stream at some place sends on
    taking this value (:func:`advance`), and the snapshot a new stream starts with, built
    and encoded once for all the streams at that place rather than once per stream."""

    task: Task | None
    events: list[TaskEvent]
    turns: list[TaskTurn]
    read_at: int | None = None
    """The last event's seq when ``task`` was read (None: the last of ``events``); events
    past it were handed to the reader after that read, so they are newer than the row."""
    memo: dict[Hashable, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def last_seq(self) -> int:
        return self.events[-1].seq if self.events else 0

    @property
    def row_seq(self) -> int:
        return self.last_seq if self.read_at is None else self.read_at

    def after(self, seq: int) -> list[TaskEvent]:
        return self.events[bisect.bisect_right(self.events, seq, key=lambda e: e.seq) :]


class Place(NamedTuple):
    """Where one stream of a task is: the last event, state and turn it sent and the
    artifacts it has named. Streams at the same place that take the same reader value send
    the same updates, so :func:`advance` builds them once per place; a stream that fell
    behind is at a place of its own until it has caught up, then shares again."""

    seq: int
    state: TaskState
    turn: int
    artifacts: frozenset[str]


Updates = tuple[sse.Encoded, ...]


def advance(now: Watched, at: Place) -> tuple[Updates, Place]:
    """The updates a stream at ``at`` sends on taking ``now`` (every event it missed, in
    order, then the state if it changed) and where it is after them — memoized in
    ``now.memo`` by place: the second stream there gets the very same objects (and their
    JSON bytes, :class:`~.sse.Encoded`), and the place returned is the same object too,
    so the next lookup compares by identity."""
    hit: tuple[Updates, Place] | None = now.memo.get(at)
    if hit is None:
        hit = now.memo[at] = _advance(now, at)
    return hit


def _advance(now: Watched, at: Place) -> tuple[Updates, Place]:
    """In the order things happened: the events the task row was read after, a change of
    state the row shows, then the events written after the row was read (handed to the
    reader before it read the row again). A turn's events follow its claim (a lease
    holder writes them), so a stream that has not said the turn is working says so just
    before the turn's first event, where a reader learnt of both in one look."""
    assert now.task is not None
    current, fresh = now.task, now.after(at.seq)
    cut = bisect.bisect_right(fresh, now.row_seq, key=lambda e: e.seq)
    state, turn = at.state, at.turn
    out: list[dict[str, Any]] = []
    named = set(at.artifacts)

    def tell(events: list[TaskEvent]) -> None:
        nonlocal state, turn
        if events and (state is not TaskState.LEASED or turn != events[0].turn):
            out.append(views.working_update(current, events[0]))
            state, turn = TaskState.LEASED, events[0].turn
        told = views.event_updates(current, events)
        named.update(u["artifactUpdate"]["artifact"]["artifactId"] for u in told
                     if "artifactUpdate" in u)  # fmt: skip
        out.extend(told)

    tell(fresh[:cut])
    # A stream already past the row's read took this row before (a reader's row changes
    # only with a read): its state is not news, whatever the stream said since.
    if at.seq <= now.row_seq and (current.state is not state or current.turn != turn):
        out.extend(views.state_updates(current, fresh[:cut], named))
        state, turn = current.state, current.turn
    tell(fresh[cut:])
    artifacts = at.artifacts if len(named) == len(at.artifacts) else frozenset(named)
    place = Place(fresh[-1].seq if fresh else at.seq, state, turn, artifacts)
    return tuple(sse.Encoded(u) for u in out), place


async def opening(
    relay: Relay, first: Watched, history_length: int | None
) -> tuple[sse.Encoded, Place]:
    """A new stream's first update (the Task) and its place, shared by every stream that
    opens on the same reader value with the same ``historyLength`` (a thousand clients
    subscribing at once build one view, not a thousand)."""
    key = ("opening", history_length)
    hit: tuple[sse.Encoded, Place] | None = first.memo.get(key)
    if hit is not None:
        return hit
    assert first.task is not None
    seen = Seen(first.task, first.events, first.turns)
    view = sse.Encoded({"task": await view_of(relay, seen, history_length)})
    named = frozenset(
        a["artifactId"] for a in views.artifacts_of(seen.task, seen.events, seen.turns)
    )
    hit = first.memo.setdefault(
        key, (view, Place(first.last_seq, seen.task.state, seen.task.turn, named))
    )
    return hit


def _over(watched: Watched) -> bool:
    """Nothing more will happen: the reader stops (its followers end on the value)."""
    return watched.task is None or watched.task.state.terminal


def _look(relay: Relay, task: Task) -> Step[Watched]:
    """The shared reader's look at one task: the whole task the first time, then the
    events this replica just committed (:mod:`~melchior.mellan.relay.caches.fresh`, published at
    once, before the read) and what the store holds after the last event seen."""

    async def look(prev: Watched | None) -> AsyncIterator[Watched]:
        if prev is None:
            relay.metrics.stream_reads.inc(kind="a2a")
            seen = await relay.call(_read, relay.store, task.workspace, task.id, 0)
            yield Watched(None, [], []) if seen is None else Watched(*seen)
            return
        handed = relay.fresh.after(task.id, prev.last_seq)
        if handed:
            prev = Watched(prev.task, [*prev.events, *handed], prev.turns, prev.row_seq)
            yield prev
        relay.metrics.stream_reads.inc(kind="a2a")
        seen = await relay.call(_read, relay.store, task.workspace, task.id, prev.last_seq)
        if seen is None:
            yield Watched(None, prev.events, prev.turns)
        elif seen.events or seen.task != prev.task or seen.turns != prev.turns:
            yield Watched(seen.task, [*prev.events, *seen.events], seen.turns)

    return look


def watch(relay: Relay, task: Task) -> Follower[Watched]:
    """Follow the task's one shared reader on this replica (see :class:`~.watch.Watches`)."""
    return relay.watches.follow(("a2a", task.id), task_topic(task.id), _look(relay, task), _over)


async def follow(
    relay: Relay,
    task: Task,
    *,
    history_length: int | None = None,
    until_terminal: bool = False,
) -> AsyncIterator[dict[str, Any]]:
    """``StreamResponse`` objects for one task: the Task snapshot first, then stored events
    and state changes as they happen. A send's stream ends at a terminal or interrupted
    state; a subscription (``until_terminal``) stays open through input-required turns
    until the task ends. The last event always carries the state the stream ended in.
    While the task is quiet it yields :data:`~.sse.QUIET` every keepalive interval, for
    the stream's keepalives (the shared reader, not the stream, polls the store).

    The store is read by the task's shared reader, not by each stream: a stream keeps only
    where it is (last event, state, turn, artifacts sent) and, each time it looks, takes
    what the reader holds past that. A stream that fell behind (a client reading slowly)
    so catches up in one step on the reader's latest view — every event it missed, in
    order, then the state now — and never holds the reader or the other streams up.

    What it yields is shared: the streams at the same place get the same
    :class:`~.sse.Encoded` objects (:func:`advance`), dicts to every binding, whose JSON
    bytes are encoded once. Read them; never change them."""

    def over(state: TaskState) -> bool:
        return state.terminal if until_terminal else views.ends_stream(state)

    follower = watch(relay, task)
    # A stream holds no task row of its own (the one it was opened with was read for it:
    # a copy of every payload per stream), nor the reader value it opened on.
    del task
    try:
        await follower.arm()
        first = follower.latest()
        if first.task is None:
            return
        snapshot, place = await opening(relay, first, history_length)
        del first
        yield snapshot
        del snapshot
        while not over(place.state):
            if not await follower.wait(sse.KEEPALIVE_SECONDS):
                if follower.ended:  # the reader was stopped (shutdown): end the stream
                    return
                yield sse.QUIET  # nothing new this poll interval: the stream is alive
                continue
            now = follower.latest()
            if now.task is None:
                return
            updates, place = advance(now, place)
            del now  # a stream that waits holds its place only, no reader value
            if not updates:
                yield sse.QUIET
            for i in range(len(updates)):
                yield updates[i]
            del updates
    finally:
        follower.close()


async def send_streaming(
    relay: Relay, caller: Caller, req: SendRequest
) -> AsyncIterator[dict[str, Any]]:
    """Accept first (errors surface before the stream opens), then follow the task."""
    task, _ = await admission.accept(relay, caller, req)
    return follow(relay, task, history_length=req.history_length)


async def subscribe(relay: Relay, caller: Caller, task_id: str) -> AsyncIterator[dict[str, Any]]:
    task = (await get_visible(relay, caller, task_id)).task
    if task.state.terminal:
        raise UnsupportedOperation(
            f"task {task.id} is {views.A2A_STATE[task.state]}; there is nothing left to "
            "subscribe to. Use GetTask.",
            metadata={"taskId": task.id},
        )
    return follow(relay, task, until_terminal=True)


async def get(
    relay: Relay, caller: Caller, task_id: str, history_length: int | None
) -> dict[str, Any]:
    return await view_of(relay, await get_visible(relay, caller, task_id), history_length)


def _cancel(store: Store, caller: Caller, task_id: str) -> Seen:
    task = caller.visible(store.get_task(caller.target.workspace, task_id), task_id)
    # The store records the decision (won or refused) in the cancel's own transaction.
    after, outcome = store.cancel(task.workspace, task.id, actor=caller.actor, rule="caller")
    if outcome is Outcome.NOT_FOUND or after is None:
        raise TaskNotFound(metadata={"taskId": task_id})
    if outcome is Outcome.LEASE_LOST:
        raise TaskNotCancelable(
            f"task {task_id} is already {views.A2A_STATE[after.state]}",
            metadata={"taskId": task_id, "state": views.A2A_STATE[after.state]},
        )
    return Seen(
        after, store.events_after(task.id, 0), store.turns(task.id) if after.turn > 1 else []
    )


async def cancel(relay: Relay, caller: Caller, task_id: str) -> dict[str, Any]:
    return await view_of(relay, await relay.call(_cancel, relay.store, caller, task_id))
