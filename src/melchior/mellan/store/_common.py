"""Row conversions and small helpers both backends share.

Kept apart from the backends so SQLite (integer milliseconds) and PostgreSQL
(``timestamptz``) hand callers the very same ISO-8601 strings and dataclasses.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterable
from contextlib import suppress
from datetime import UTC, datetime
from typing import Any, Protocol

from melchior.mellan.store.base import (
    Agent,
    AuditRecord,
    Capability,
    Grant,
    Task,
    TaskEvent,
    TaskState,
)


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


def caps_json(capabilities: Iterable[Capability]) -> str:
    return json.dumps([{"id": c.id, "description": c.description} for c in capabilities])


def caps_from_json(text: str) -> tuple[Capability, ...]:
    return tuple(Capability(c["id"], c.get("description", "")) for c in json.loads(text))


def agent_from_row(r: RowLike) -> Agent:
    return Agent(
        workspace=r["workspace"],
        id=r["id"],
        description=r["description"],
        capabilities=caps_from_json(r["capabilities"]),
        created_at=iso(r["created_at"]),
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
    )


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
    )


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
    )


def event_from_row(r: RowLike) -> TaskEvent:
    return TaskEvent(
        seq=r["seq"], task_id=r["task_id"], at=iso(r["at"]), kind=r["kind"], body=r["body"]
    )


def publish_all(publish: Callable[[str], None] | None, topics: Iterable[str]) -> None:
    """Fire after-commit wake-ups; a failing hint must never fail the committed call."""
    if publish is None:
        return
    for topic in dict.fromkeys(topics):  # de-duplicated, order kept
        with suppress(Exception):  # a wake-up is only a latency hint
            publish(topic)
