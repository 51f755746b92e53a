"""A task's timeline: every recorded step, in order, from the store's own records.

Two sources, both written in the transaction of the change they describe: the audit
records about the task (accepted, claimed, completed, input asked, failed, canceled,
lease lost or expired, cancel acknowledged) and its stored progress events (status,
artifact and message bodies). Renewals are not recorded one by one (they are too
frequent to be decisions worth a record); a live lease that was renewed past the
expiry its claim recorded shows as one "renewed" step with the lease's current expiry.

A task is a sequence of turns: an answer to "input asked" starts the next turn of the
same task ("answered"). Each turn's message travels with the step that started it, and
each turn's result with the step that recorded it (finished turns are kept by the store).

Push notifications (A2A push configs) add one step per outbox row — the record, written
in the transaction of the change, that the change must be POSTed to a config's webhook —
at the time it was delivered or given up (with the last error), or as pending with the
tries so far: a caller asking "why did my webhook not hear about it?" has the answer.

Payloads are the stored JSON text, verbatim: the request with "accepted", an answer with
"answered", progress bodies with their events, a turn's result with the step that
recorded it. What the page shows of each is :func:`.sealed.shown`'s decision (``shown``):
the text as stored, or for a sealed task only that it is sealed, its size and its keys'
fingerprints.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from melchior.mellan.relay.store.base import (
    AuditRecord,
    PushAttempt,
    Task,
    TaskEvent,
    TaskState,
    TaskTurn,
)
from melchior.mellan.relay.surfaces.dashboard import sealed

# what each recorded action is called on the timeline, and its place among equal times
STEPS: dict[str, tuple[str, str, int]] = {
    "task.accept": ("accepted", "accepted", 0),
    "task.continue": ("answered", "accepted", 0),
    "task.claim": ("claimed", "claimed", 1),
    "task.input_required": ("input asked", "input", 4),
    "task.complete": ("completed", "completed", 4),
    "task.fail": ("failed", "failed", 4),
    "task.cancel": ("canceled", "canceled", 4),
    "task.cancel_ack": ("receiver stopped", "canceled", 5),
    "lease.lost": ("lease lost", "lease", 3),
    "lease.expired": ("lease expired", "lease", 3),
}


@dataclass(frozen=True)
class Step:
    at: str  # ISO time on the database clock; "" for the live lease's current standing
    title: str
    kind: str  # a class for the page: accepted, claimed, renewed, progress, input, …
    text: str
    who: str = ""
    allowed: bool = True
    body: str | None = None  # stored JSON text, verbatim
    body_label: str = ""
    rank: int = 2
    epoch: int | None = None  # the lease epoch a receiver's report was made under
    shown: sealed.Shown | None = None  # what the page shows of ``body`` (never it directly)


def _from_record(rec: AuditRecord) -> Step | None:
    if rec.action == "task.progress":
        return None  # the stored event (with its body) stands for it
    title, kind, rank = STEPS.get(rec.action, (rec.action, "other", 3))
    if rec.action == "task.cancel" and not rec.allowed:
        title, kind = "cancel refused", "refused"
    elif kind in ("completed", "input") and rec.reason.endswith(": duplicate"):
        title, kind = f"{title} (reported again)", "repeat"
    elif rec.action == "task.fail" and rec.detail.get("retryable"):
        title = "failed (retryable)"
    text = rec.reason
    if rec.action == "task.fail" and rec.detail.get("error"):
        text = f"{rec.reason}: {rec.detail['error']}"
    epoch = rec.detail.get("epoch")
    return Step(
        rec.at, title, kind, text, rec.actor, rec.allowed, rank=rank,
        epoch=epoch if isinstance(epoch, int) else None,
    )  # fmt: skip


def _from_event(ev: TaskEvent, turns: int) -> Step:
    where = f" (turn {ev.turn})" if turns > 1 else ""
    return Step(
        ev.at,
        f"progress: {ev.kind}{where}",
        "progress",
        f"the receiver reported a {ev.kind} event",
        body=ev.body,
        body_label=f"{ev.kind} body, as stored",
        rank=2,
    )


def _tries(n: int) -> str:
    return f"{n} {'try' if n == 1 else 'tries'}"


def _from_push(row: PushAttempt) -> Step:
    what = f"the change to {row.state.value} (turn {row.turn}) for push config {row.config_id}"
    error = f"; last error: {row.last_error}" if row.last_error else ""
    if row.delivered_at is not None:
        return Step(
            row.delivered_at, "push delivered", "push",
            f"{what} reached its webhook ({_tries(row.attempts)})", rank=7,
        )  # fmt: skip
    if row.gave_up_at is not None:
        return Step(
            row.gave_up_at, "push given up", "push-failed",
            f"{what} was given up after {_tries(row.attempts)}{error}", allowed=False, rank=7,
        )  # fmt: skip
    return Step(
        row.created_at, "push pending", "push",
        f"{what} waits for its webhook ({_tries(row.attempts)} so far{error})", rank=7,
    )  # fmt: skip


def steps(
    task: Task,
    records: Sequence[AuditRecord],
    events: Sequence[TaskEvent],
    turns: Sequence[TaskTurn] = (),
    pushes: Sequence[PushAttempt] = (),
) -> list[Step]:
    """The task's steps, oldest first; ``turns`` are its finished turns, if it went on;
    ``pushes`` its push notifications' outbox rows."""
    out = [s for s in (_from_record(r) for r in records) if s is not None]
    out += [_from_event(e, task.turn) for e in events]
    out += [_from_push(p) for p in pushes]
    out.sort(key=lambda s: (s.at, s.rank))
    finished = sorted(turns, key=lambda t: t.turn)
    # each turn's message travels with the step that started it: "accepted" (recorded by
    # the door, else the row's birth), then each "answered"
    starts = [i for i, s in enumerate(out) if s.kind == "accepted"]
    if not starts or out[starts[0]].title != "accepted":
        out.insert(0, Step(task.created_at, "accepted", "accepted", "stored by the relay", rank=0))
        starts = [i for i, s in enumerate(out) if s.kind == "accepted"]
    messages = [t.payload for t in finished] + [task.payload]
    if len(starts) < len(messages):  # a turn began without its record: date it by the last
        for t in finished[len(starts) - 1 :]:
            at = t.finished_at or task.updated_at
            said = f"the caller answered; turn {t.turn + 1} began"
            out.append(Step(at, "answered", "accepted", said, rank=6))
        out.sort(key=lambda s: (s.at, s.rank))
        starts = [i for i, s in enumerate(out) if s.kind == "accepted"]
    for n, (i, payload) in enumerate(zip(starts, messages, strict=False), start=1):
        label = "request message, as stored" if n == 1 else f"answer (turn {n}), as stored"
        out[i] = replace(out[i], body=payload, body_label=label)
    # each turn's result travels with the step that recorded it: the one made under the
    # lease epoch the store kept with that result
    results = {t.epoch: t.result for t in finished}
    if task.state in (TaskState.SUCCEEDED, TaskState.INPUT_REQUIRED):
        results[task.lease_epoch] = task.result
    for i, step in enumerate(out):
        result = results.get(step.epoch) if step.epoch is not None else None
        if step.kind in ("completed", "input") and result is not None:
            out[i] = replace(step, body=result, body_label="result, as stored")
    claims = [r for r in records if r.action == "task.claim"]
    if task.state is TaskState.LEASED and task.lease_expires_at and claims:
        claimed_until = str(claims[-1].detail.get("expires_at") or "")
        if task.lease_expires_at > claimed_until:
            out.append(
                Step(
                    "",
                    "renewed",
                    "renewed",
                    f"the receiver keeps renewing its lease (epoch {task.lease_epoch}); "
                    f"it now runs until {task.lease_expires_at}",
                    task.lease_owner or "",
                    rank=3,
                )
            )
    sealed_task = sealed.task_sealed([t.payload for t in finished] + [task.payload])
    return [
        replace(s, shown=sealed.shown(s.body, task_sealed=sealed_task)) if s.body is not None else s
        for s in out
    ]
