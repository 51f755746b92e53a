"""What one push delivery says: the ``StreamResponse`` objects for one outbox row.

A row records the task as one change left it (a :class:`~...store.base.PushMark`); the
delivery says what happened between the row before it and this one, exactly as a stream
following the task would have said it (:func:`views.event_updates`, then
:func:`views.state_updates`): the events stored in between, and — if the state or turn
moved — the artifacts the turn's result carries and the new status. Everything read is
immutable once written (events, finished turns, a recorded result), so rendering a row
again, on a retry or on another replica, gives the same JSON.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from melchior.mellan.relay.store.base import PushMark, Task, TaskEvent, TaskTurn
from melchior.mellan.relay.surfaces.a2a import views


def as_of(task: Task, turns: Sequence[TaskTurn], mark: PushMark, at: str) -> Task:
    """The task as ``mark`` saw it: its state, its turn (with that turn's message and
    recorded outcome, for a turn the task has since left), stamped ``at``."""
    if mark.turn == task.turn:
        return dataclasses.replace(task, state=mark.state, updated_at=at)
    for turn in turns:
        if turn.turn == mark.turn:
            return dataclasses.replace(
                task, state=mark.state, turn=turn.turn, payload=turn.payload,
                result=turn.result, error=turn.error, updated_at=at,
            )  # fmt: skip
    # a turn not archived: a mark taken before its outcome was recorded (queued, leased)
    return dataclasses.replace(
        task, state=mark.state, turn=mark.turn, result=None, error=None, updated_at=at
    )


def messages(
    task: Task,
    turns: Sequence[TaskTurn],
    events: Sequence[TaskEvent],
    before: PushMark | None,
    mark: PushMark,
    at: str,
) -> list[dict[str, Any]]:
    """The ``StreamResponse`` objects that take a reader from ``before`` (None: nothing
    heard yet) to ``mark``; ``events`` are all the task's events (any beyond ``mark`` are
    ignored)."""
    lo = 0 if before is None else before.seq
    upto = [e for e in events if e.seq <= mark.seq]
    fresh = [e for e in upto if e.seq > lo]
    then = as_of(task, turns, mark, at)
    out = views.event_updates(then, fresh)
    if before is None or (before.state, before.turn) != (mark.state, mark.turn):
        seen = views.streamed_artifact_ids(then, upto)
        out += views.state_updates(then, [e for e in upto if e.turn == mark.turn], seen)
    return out
