"""A task's timeline: every recorded step, in order, from the store's own records.

Two sources, both written in the transaction of the change they describe: the audit
records about the task (accepted, claimed, completed, input asked, failed, canceled,
lease lost or expired, cancel acknowledged) and its stored progress events (status,
artifact and message bodies). Renewals are not recorded one by one (they are too
frequent to be decisions worth a record); a live lease that was renewed past the
expiry its claim recorded shows as one "renewed" step with the lease's current expiry.

Payloads are the stored JSON text, verbatim: the request with "accepted", progress
bodies with their events, the result with the step that recorded it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from melchior.mellan.relay.store.base import AuditRecord, Task, TaskEvent, TaskState

# what each recorded action is called on the timeline, and its place among equal times
STEPS: dict[str, tuple[str, str, int]] = {
    "task.accept": ("accepted", "accepted", 0),
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


def _from_record(rec: AuditRecord) -> Step | None:
    if rec.action == "task.progress":
        return None  # the stored event (with its body) stands for it
    title, kind, rank = STEPS.get(rec.action, (rec.action, "other", 3))
    if rec.action == "task.cancel" and not rec.allowed:
        title, kind = "cancel refused", "refused"
    elif rec.action == "task.fail" and rec.detail.get("retryable"):
        title = "failed (retryable)"
    text = rec.reason
    if rec.action == "task.fail" and rec.detail.get("error"):
        text = f"{rec.reason}: {rec.detail['error']}"
    return Step(rec.at, title, kind, text, rec.actor, rec.allowed, rank=rank)


def _from_event(ev: TaskEvent) -> Step:
    return Step(
        ev.at,
        f"progress: {ev.kind}",
        "progress",
        f"the receiver reported a {ev.kind} event",
        body=ev.body,
        body_label=f"{ev.kind} body, as stored",
        rank=2,
    )


def steps(task: Task, records: Sequence[AuditRecord], events: Sequence[TaskEvent]) -> list[Step]:
    """The task's steps, oldest first."""
    out = [s for s in (_from_record(r) for r in records) if s is not None]
    out += [_from_event(e) for e in events]
    out.sort(key=lambda s: (s.at, s.rank))
    # the request travels with "accepted" (recorded by the door, else the row's birth)
    accepted = next((i for i, s in enumerate(out) if s.kind == "accepted"), None)
    label = "request message, as stored"
    if accepted is None:
        first = Step(task.created_at, "accepted", "accepted", "stored by the relay", rank=0)
        out.insert(0, replace(first, body=task.payload, body_label=label))
    else:
        out[accepted] = replace(out[accepted], body=task.payload, body_label=label)
    # the result travels with the last step that recorded one
    if task.result is not None:
        last = max((i for i, s in enumerate(out) if s.kind in ("completed", "input")), default=None)
        if last is not None:
            out[last] = replace(out[last], body=task.result, body_label="result, as stored")
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
    return out
