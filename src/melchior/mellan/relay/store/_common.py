"""Row conversions and small helpers both backends share.

Kept apart from the backends so SQLite (integer milliseconds) and PostgreSQL
(``timestamptz``) hand callers the very same ISO-8601 strings and dataclasses.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterable, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from melchior.mellan.relay.requestid import current as current_request_id
from melchior.mellan.relay.store.base import (
    Agent,
    AuditRecord,
    Capability,
    Chained,
    Grant,
    NewTask,
    Outcome,
    OverLimit,
    Record,
    Task,
    TaskEvent,
    TaskState,
    TaskTurn,
    Verdict,
)
from melchior.mellan.relay.topics import PUSH_TOPIC
from melchior.policy.send_limits import Overrides


class RowLike(Protocol):
    """A row by column name: ``sqlite3.Row`` and psycopg's ``dict_row`` both fit."""

    def __getitem__(self, key: str, /) -> Any: ...


# Timestamps as they come out of a row: int ms (SQLite), datetime (PostgreSQL) or NULL.
Stamp = int | datetime | None


def iso(value: int | datetime) -> str:
    """One textual form for every timestamp the store hands out: UTC, milliseconds, ``Z``."""
    dt = datetime.fromtimestamp(value / 1000, UTC) if isinstance(value, int) else value
    return dt.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def iso_or_none(value: Stamp) -> str | None:
    return None if value is None else iso(value)


def parse_ms(text: str) -> int:
    """ISO-8601 (``Z`` or offset; naive means UTC) → unix milliseconds."""
    dt = datetime.fromisoformat(text)
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return round(dt.timestamp() * 1000)


def parse_dt(text: str) -> datetime:
    dt = datetime.fromisoformat(text)
    return dt if dt.tzinfo is not None else dt.replace(tzinfo=UTC)


def new_id() -> str:
    return str(uuid.uuid4())


def json_list(items: Iterable[str]) -> str:
    return json.dumps(list(items))


def caps_json(capabilities: Iterable[Capability]) -> str:
    return json.dumps([{"id": c.id, "description": c.description} for c in capabilities])


def caps_from_json(text: str) -> tuple[Capability, ...]:
    return tuple(Capability(c["id"], c.get("description", "")) for c in json.loads(text))


def column(r: RowLike, name: str) -> Any:
    """``r[name]``, or None when the row has no such column (a database read before the
    migration that added it, e.g. while upgrading)."""
    try:
        return r[name]
    except (KeyError, IndexError):
        return None


def agent_from_row(r: RowLike) -> Agent:
    return Agent(
        workspace=r["workspace"],
        id=r["id"],
        description=r["description"],
        capabilities=caps_from_json(r["capabilities"]),
        created_at=iso(r["created_at"]),
        receiver_seen_at=iso_or_none(column(r, "receiver_seen_at")),
        receiver_info=column(r, "receiver_info"),
        wake_url=column(r, "wake_url"),
    )


def grant_from_row(r: RowLike) -> Grant:
    return Grant(
        id=r["id"],
        workspace=r["workspace"],
        caller=r["caller"],
        receiver=r["receiver"],
        capabilities=tuple(json.loads(r["capabilities"])),
        created_at=iso(r["created_at"]),
        revoked_at=iso_or_none(r["revoked_at"]),
        sealed=_sealed(r),
    )


def _sealed(r: RowLike) -> bool:
    """A grant's ``sealed`` (schema v10); False on a database not yet upgraded past it."""
    try:
        return bool(r["sealed"])
    except (KeyError, IndexError):
        return False


def audit_from_row(r: RowLike) -> AuditRecord:
    return AuditRecord(
        seq=r["seq"],
        workspace=r["workspace"],
        at=iso(r["at"]),
        actor=r["actor"],
        action=r["action"],
        subject=r["subject"],
        allowed=bool(r["allowed"]),
        rule=r["rule"],
        reason=r["reason"],
        detail=json.loads(r["detail"]),
        request_id=_column(r, "request_id"),
    )


def _column(r: RowLike, name: str) -> Any:
    """A column a row may lack (one added by a later schema version)."""
    try:
        return r[name]
    except (IndexError, KeyError):
        return None


def task_from_row(r: RowLike) -> Task:
    return Task(
        id=r["id"],
        workspace=r["workspace"],
        caller=r["caller"],
        receiver=r["receiver"],
        capability=r["capability"],
        context_id=r["context_id"],
        state=TaskState(r["state"]),
        payload=r["payload"],
        metadata=r["metadata"],
        message_id=r["message_id"],
        session_key=r["session_key"],
        chain=r["chain"],
        hop=r["hop"],
        path=tuple(json.loads(r["path"])),
        attempt=r["attempt"],
        max_attempts=r["max_attempts"],
        lease_epoch=r["lease_epoch"],
        lease_owner=r["lease_owner"],
        lease_expires_at=iso_or_none(r["lease_expires_at"]),
        result=r["result"],
        error=r["error"],
        created_at=iso(r["created_at"]),
        updated_at=iso(r["updated_at"]),
        turn=r["turn"],
    )


def event_from_row(r: RowLike) -> TaskEvent:
    return TaskEvent(
        seq=r["seq"],
        task_id=r["task_id"],
        at=iso(r["at"]),
        kind=r["kind"],
        body=r["body"],
        turn=r["turn"],
    )


def turn_from_row(r: RowLike) -> TaskTurn:
    return TaskTurn(
        task_id=r["task_id"],
        turn=r["turn"],
        payload=r["payload"],
        state=TaskState(r["state"]),
        result=r["result"],
        error=r["error"],
        epoch=r["epoch"],
        finished_at=iso_or_none(r["finished_at"]),
    )


class Committed(Protocol):
    topics: list[str]
    tallies: list[str]
    written: list[Chained]


@dataclass
class Effects:
    """What a write made outside a queue transaction asks for after it commits."""

    topics: list[str] = field(default_factory=list)
    tallies: list[str] = field(default_factory=list)
    written: list[Chained] = field(default_factory=list)


def after_commit(
    tx: Committed,
    publish: Callable[[str], None] | None,
    tally: Callable[[Sequence[str]], None] | None,
    witness: Callable[[Sequence[Chained]], None] | None,
) -> None:
    """What a store does once a transaction committed, in this order: tell the witness
    the events written (so a stream woken next finds them handed over), publish the
    wake-ups, count. None of it may fail the committed call."""
    if witness is not None and tx.written:
        with suppress(Exception):
            witness(tx.written)
    publish_all(publish, tx.topics)
    tally_all(tally, tx.tallies)


def publish_all(publish: Callable[[str], None] | None, topics: Iterable[str]) -> None:
    """Fire after-commit wake-ups; a failing hint must never fail the committed call."""
    if publish is None:
        return
    topics = list(topics)
    if any(t.startswith("task:") for t in topics):
        topics.append(PUSH_TOPIC)  # a task changed: its push configs may have rows to send
    for topic in dict.fromkeys(topics):  # de-duplicated, order kept
        with suppress(Exception):  # a wake-up is only a latency hint
            publish(topic)


def tally_all(tally: Callable[[Sequence[str]], None] | None, names: Sequence[str]) -> None:
    """Count what a committed transaction did (after COMMIT, like the wake-ups): a
    relay's metrics; a failing counter must never fail the committed call."""
    if tally is None or not names:
        return
    with suppress(Exception):
        tally(names)


# -- audit records written inside the queue change's own transaction ----------------------------


@dataclass(frozen=True)
class Note:
    """One audit record, built here so both backends word their records alike and the
    backend only has to insert it in the transaction of the change it records."""

    workspace: str
    actor: str
    action: str
    subject: str
    allowed: bool
    rule: str
    reason: str
    detail: dict[str, Any] = field(default_factory=dict)
    request_id: str | None = field(default_factory=current_request_id)


def record_note(workspace: str, record: Record | None, created: str) -> Note | None:
    """The audit record of an allowed change the caller decided; its subject is the
    record's own, or the id of what the change ``created``."""
    if record is None:
        return None
    return Note(
        workspace, record.actor, record.action, record.subject or created, True, record.rule,
        record.reason, dict(record.detail), record.request_id,
    )  # fmt: skip


def accept_note(task: Task, accept: Record | None) -> Note | None:
    """The ``task.accept`` record of a task just created, if the door gave its decision."""
    return record_note(task.workspace, accept, task.id)


def accept_notes(
    asked: Sequence[NewTask], stored: Sequence[tuple[Task, bool]]
) -> list[Note | None]:
    """The ``task.accept`` records of an enqueue batch: one per task created now (a dedupe
    hit was recorded when it was first stored)."""
    return [
        accept_note(task, new.accept)
        for new, (task, created) in zip(asked, stored, strict=True)
        if created
    ]


def claim_note(actor: str, task: Task, expires_at: str) -> Note:
    return Note(
        task.workspace,
        actor,
        "task.claim",
        task.id,
        True,
        "lease",
        f"{task.receiver} leased attempt {task.attempt} of {task.max_attempts}",
        {"epoch": task.lease_epoch, "expires_at": expires_at, "owner": task.lease_owner},
    )


def lost_reason(state: str | None, lease_epoch: int | None, epoch: int) -> tuple[str, str]:
    """Why a fenced write with ``epoch`` was refused, as (short reason, sentence), from the
    task's ``state`` and ``lease_epoch`` (None for both: the task does not exist)."""
    if state is None or lease_epoch is None:
        return "finished", "the task no longer exists"
    if state == "cancelled":
        return "cancelled", "the task was cancelled; stop work on it and discard its result"
    if lease_epoch != epoch:
        return (
            "stale-epoch",
            f"epoch {epoch} is stale: the task was leased again (current epoch "
            f"{lease_epoch}); another attempt owns it now",
        )
    if state != "leased":
        return "finished", f"the task is already {state}; nothing more is accepted"
    return "expired", "the lease expired before this request arrived; renew sooner"


@dataclass(frozen=True)
class FencedWrite:
    """A fenced receiver write being made on behalf of ``actor``: enough to audit it."""

    actor: str
    action: str  # "task.complete", "task.renew", ...
    detail: dict[str, Any] = field(default_factory=dict)

    def note(self, workspace: str, task_id: str, epoch: int, verdict: Verdict) -> Note | None:
        """The record for ``verdict``, or None when there is nothing to record: an unknown
        task, or a renewal that held (too frequent to be a decision worth a line)."""
        outcome = verdict.outcome
        if outcome is Outcome.NOT_FOUND:
            return None
        if outcome is Outcome.LEASE_LOST:
            return Note(
                workspace,
                self.actor,
                "lease.lost",
                task_id,
                False,
                verdict.reason,
                f"{self.action} refused: {verdict.sentence}",
                {"epoch": epoch, "attempted": self.action},
            )
        if self.action == "task.renew":
            return None
        return Note(
            workspace,
            self.actor,
            self.action,
            task_id,
            True,
            "lease",
            f"{self.action} under epoch {epoch}: {outcome.value}",
            {"epoch": epoch, **self.detail},
        )


def expiry_note(
    workspace: str, task_id: str, state: str, attempt: int, max_attempts: int
) -> Note | None:
    """The record of a lease the relay settled after it expired: queued again, or failed
    with its attempts spent. A cancelled task's grace running out is no decision: None."""
    if state == "cancelled":
        return None
    outcome = "attempts spent, failed" if state == "failed" else "queued again"
    return Note(
        workspace, "relay", "lease.expired", task_id, True, "queue.lease",
        f"lease expired; {outcome}", {"attempt": attempt, "max_attempts": max_attempts},
    )  # fmt: skip


def cancel_note(actor: str, rule: str, was: str, task: Task, outcome: Outcome) -> Note | None:
    """The record of a cancel decided in the store: won (allowed under ``rule``), refused
    because the task already finished, or None for a repeat of a cancel already recorded."""
    if outcome is Outcome.OK:
        revoked = "; the receiver's lease is revoked" if was == "leased" else ""
        return Note(
            task.workspace, actor, "task.cancel", task.id, True, rule,
            f"cancelled while {was}{revoked}",
        )  # fmt: skip
    if outcome is Outcome.LEASE_LOST:
        return Note(
            task.workspace, actor, "task.cancel", task.id, False, "finished",
            f"the task is already {task.state.value}; only queued or running tasks cancel",
        )  # fmt: skip
    return None


# -- send limits ---------------------------------------------------------------------------------


def overrides_from_row(r: RowLike) -> Overrides:
    rate = r["send_rate"]
    return Overrides(
        None if rate is None else float(rate),
        r["burst"],
        r["max_unfinished_per_receiver"],
        r["max_queued"],
    )


def over_note(task: NewTask, over: OverLimit) -> Note:
    """The ``quota.refused`` record of a new task a cap kept out: by its would-be caller,
    about the receiver, naming the limit (rule), with the numbers."""
    accept = task.accept
    detail = dict(accept.detail) if accept else {}
    detail.update(
        limit=over.limit, count=over.count, allowed=over.allowed, retry_after=over.retry_after
    )
    return Note(
        task.workspace,
        accept.actor if accept else f"agent:{task.caller}",
        "quota.refused",
        f"{task.workspace}/{task.receiver}",
        False,
        over.limit,
        over.reason,
        detail,
        accept.request_id if accept else current_request_id(),
    )
