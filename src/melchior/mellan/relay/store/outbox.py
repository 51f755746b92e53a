"""Push notifications in the store: a task's configs and the outbox of changes to deliver,
written once above the two dialects (as :mod:`.queue` is).

Who writes the outbox: the schema. Triggers (migrations v6) add one row per config of a
task whenever the task's state or turn changes or an event is stored for it, in the
transaction of that change. So no statement of the queue can change a task and forget to
tell its webhooks, and a change rolled back takes its rows with it.

What a row holds: the task as the change left it — state, turn, the last event's seq (a
:class:`~.base.PushMark`). Delivery says what changed between the row before it (or the
config's own mark, taken when it was made) and this one, reading the stored events and
turns, which never change once written. So a retry sends the same bytes.

The rules kept here:

- **Order per config.** A deliverer may lease a row only when every earlier row of the
  same config is delivered or given up, so a webhook hears of its task's changes in order
  even with deliverers on several replicas; rows of different configs go independently.
- **At least once, with a lease.** A leased row is its deliverer's until ``leased_until``;
  reports (``push_sent``, ``push_delivered``, ``push_failed``) are fenced by the owner
  name and count only while it holds the row, so a deliverer that stalled past its lease
  cannot overwrite the next one's progress. A row whose lease ran out is due again.
- **How many configs a task may have**, and that a config names a task of the workspace.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Protocol, TypeVar

from melchior.mellan.relay.store import _common as C
from melchior.mellan.relay.store.base import (
    Conflict,
    NewPush,
    NotFoundError,
    PushAttempt,
    PushConfig,
    PushDelivery,
    PushMark,
    Record,
    TaskState,
)
from melchior.mellan.relay.topics import PUSH_TOPIC

T = TypeVar("T")
Row = C.RowLike

PUSH_LIMIT = 10
"""Push configs per task, at most (A2A lets a caller add them one by one)."""


class PushTx(Protocol):
    """The named statements push notifications need, in a backend's dialect."""

    topics: list[str]

    def task_mark(self, workspace: str, task_id: str) -> Row | None:
        """The task's state, turn and last event seq (``seq``), the task row locked so no
        change of it can interleave with what the caller does next."""
        ...

    def push_config_count(self, task_id: str) -> int: ...

    def upsert_push_config(
        self, task_id: str, config_id: str, workspace: str, caller: str, push: NewPush,
        mark: Row | None,
    ) -> Row:  # fmt: skip
        """Insert, or replace the endpoint and authentication of, a config (a replaced
        config keeps its mark: its outbox goes on)."""
        ...

    def push_config_exists(self, task_id: str, config_id: str) -> bool: ...

    def outbox_now(self, task_id: str, config_id: str) -> None:
        """An outbox row for the task as it stands (a config made with its task)."""
        ...

    def delete_push_config(self, workspace: str, task_id: str, config_id: str) -> bool: ...

    def claim_pushes(self, owner: str, limit: int, lease_ms: int) -> Sequence[Row]:
        """Lease due rows, each the earliest undelivered row of its config, oldest due
        first. Attempts are counted when they are reported, not here."""
        ...

    def push_config_row(self, task_id: str, config_id: str) -> Row | None: ...

    def push_before(self, task_id: str, config_id: str, row_id: int) -> Row | None:
        """The config's row just before ``row_id`` (any status)."""
        ...

    def agent_push_secret(
        self, workspace: str, agent: str, fresh: str, replace: bool
    ) -> str | None:
        """The agent's push secret, set to ``fresh`` first if it has none (or ``replace``)."""
        ...

    def workspace_push_private(self, workspace: str) -> bool: ...

    def set_workspace_push_private(self, workspace: str, allowed: bool) -> bool: ...

    def push_sent(self, row_id: int, owner: str, sent: int) -> bool: ...

    def push_delivered(self, row_id: int, owner: str) -> bool: ...

    def push_failed(
        self, row_id: int, owner: str, error: str, retry_ms: int | None, counted: bool
    ) -> bool:
        """Release the lease: due again in ``retry_ms``, or given up (None); ``counted``:
        an attempt was made (a row handed back unsent is not one)."""
        ...


def _config(r: Row) -> PushConfig:
    return PushConfig(
        task_id=r["task_id"],
        id=r["id"],
        workspace=r["workspace"],
        caller=r["caller"],
        url=r["url"],
        token=r["token"],
        auth_scheme=r["auth_scheme"],
        auth_credentials=r["auth_credentials"],
        created_at=C.iso(r["created_at"]),
    )


def _mark(state: Any, turn: Any, seq: Any) -> PushMark | None:
    if state is None:
        return None
    return PushMark(TaskState(state), int(turn), int(seq))


def _attempt(r: Row) -> PushAttempt:
    return PushAttempt(
        id=int(r["id"]),
        config_id=r["config_id"],
        state=TaskState(r["state"]),
        turn=int(r["turn"]),
        upto_seq=int(r["upto_seq"]),
        created_at=C.iso(r["created_at"]),
        attempts=int(r["attempts"]),
        sent=int(r["sent"]),
        delivered_at=C.iso_or_none(r["delivered_at"]),
        gave_up_at=C.iso_or_none(r["gave_up_at"]),
        last_error=r["last_error"],
    )


def new_secret() -> str:
    return "mps_" + secrets.token_urlsafe(32)


class PushQueue:
    """Mixin of :class:`~.queue.QueueStore`: the push-notification half of the store."""

    P: ClassVar[str]
    NOW_SQL: ClassVar[str]

    def _transact(self, fn: Callable[[PushTx], T]) -> T:
        raise NotImplementedError

    def _read(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> Sequence[Any]:
        raise NotImplementedError

    @staticmethod
    def _notes(tx: Any, notes: Sequence[C.Note | None]) -> list[int]:
        raise NotImplementedError

    # -- configs ------------------------------------------------------------------------------
    def _add_push(
        self, tx: PushTx, workspace: str, task_id: str, caller: str, push: NewPush,
        limit: int, *, with_task: bool,
    ) -> PushConfig:  # fmt: skip
        """The one way a config is stored. ``with_task``: made in the transaction that
        created the task, so it has no mark and its first row is the task's first state."""
        mark = None if with_task else tx.task_mark(workspace, task_id)
        if mark is None and not with_task:
            raise NotFoundError(f"unknown task {task_id!r}")
        config_id = push.id or C.new_id()
        if not tx.push_config_exists(task_id, config_id) and (
            tx.push_config_count(task_id) >= limit
        ):
            raise Conflict(
                f"task {task_id} already has {limit} push notification configs; delete one first"
            )
        row = tx.upsert_push_config(task_id, config_id, workspace, caller, push, mark)
        if with_task:
            tx.outbox_now(task_id, config_id)
            tx.topics.append(PUSH_TOPIC)
        return _config(row)

    def add_push_config(
        self,
        workspace: str,
        task_id: str,
        caller: str,
        push: NewPush,
        *,
        limit: int = PUSH_LIMIT,
        record: Record | None = None,
    ) -> PushConfig:
        def go(tx: PushTx) -> PushConfig:
            config = self._add_push(tx, workspace, task_id, caller, push, limit, with_task=False)
            self._notes(tx, [C.record_note(workspace, record, task_id)])
            return config

        return self._transact(go)

    def get_push_config(self, workspace: str, task_id: str, config_id: str) -> PushConfig | None:
        p = self.P
        rows = self._read(
            f"SELECT * FROM push_config WHERE workspace = {p} AND task_id = {p} AND id = {p}",
            (workspace, task_id, config_id),
        )
        return _config(rows[0]) if rows else None

    def list_push_configs(self, workspace: str, task_id: str) -> list[PushConfig]:
        p = self.P
        rows = self._read(
            f"SELECT * FROM push_config WHERE workspace = {p} AND task_id = {p} ORDER BY n",
            (workspace, task_id),
        )
        return [_config(r) for r in rows]

    def delete_push_config(
        self, workspace: str, task_id: str, config_id: str, *, record: Record | None = None
    ) -> bool:
        def go(tx: PushTx) -> bool:
            gone = tx.delete_push_config(workspace, task_id, config_id)
            if gone:
                self._notes(tx, [C.record_note(workspace, record, task_id)])
            return gone

        return self._transact(go)

    # -- delivery -----------------------------------------------------------------------------
    def pushes_due(self) -> bool:
        rows = self._read(
            "SELECT 1 AS due FROM push_outbox WHERE delivered_at IS NULL AND gave_up_at IS NULL"
            f" AND due_at <= {self.NOW_SQL} LIMIT 1"
        )
        return bool(rows)

    def claim_pushes(
        self, owner: str, *, limit: int = 16, lease_seconds: float = 60.0
    ) -> list[PushDelivery]:
        if limit < 1:
            return []

        def go(tx: PushTx) -> list[PushDelivery]:
            out: list[PushDelivery] = []
            secrets_: dict[tuple[str, str], str | None] = {}
            private: dict[str, bool] = {}
            for r in tx.claim_pushes(owner, limit, round(lease_seconds * 1000)):
                c = tx.push_config_row(r["task_id"], r["config_id"])
                assert c is not None  # the outbox row would have gone with its config
                config = _config(c)
                key = (config.workspace, config.caller)
                if key not in secrets_:
                    secrets_[key] = tx.agent_push_secret(*key, new_secret(), False)
                if config.workspace not in private:
                    private[config.workspace] = tx.workspace_push_private(config.workspace)
                prev = tx.push_before(config.task_id, config.id, int(r["id"]))
                before = (
                    _mark(prev["state"], prev["turn"], prev["upto_seq"])
                    if prev is not None
                    else _mark(c["mark_state"], c["mark_turn"], c["mark_seq"])
                )
                mark = _mark(r["state"], r["turn"], r["upto_seq"])
                assert mark is not None
                out.append(
                    PushDelivery(
                        id=int(r["id"]),
                        config=config,
                        mark=mark,
                        before=before,
                        sent=int(r["sent"]),
                        attempts=int(r["attempts"]),
                        created_at=C.iso(r["created_at"]),
                        secret=secrets_[key] or "",
                        allow_private=private[config.workspace],
                    )
                )
            return out

        return self._transact(go)

    def push_sent(self, delivery_id: int, owner: str, sent: int) -> bool:
        def go(tx: PushTx) -> bool:
            return tx.push_sent(delivery_id, owner, sent)

        return self._transact(go)

    def push_delivered(self, delivery_id: int, owner: str) -> bool:
        def go(tx: PushTx) -> bool:
            done = tx.push_delivered(delivery_id, owner)
            if done:
                tx.topics.append(PUSH_TOPIC)  # the config's next row may be due now
            return done

        return self._transact(go)

    def push_failed(
        self,
        delivery_id: int,
        owner: str,
        error: str,
        *,
        retry_in: float | None,
        counted: bool = True,
    ) -> bool:
        retry_ms = None if retry_in is None else max(0, round(retry_in * 1000))

        def go(tx: PushTx) -> bool:
            done = tx.push_failed(delivery_id, owner, error[:1000], retry_ms, counted)
            if done and retry_ms is None:
                tx.topics.append(PUSH_TOPIC)
            return done

        return self._transact(go)

    def push_attempts(self, task_id: str) -> list[PushAttempt]:
        rows = self._read(
            f"SELECT * FROM push_outbox WHERE task_id = {self.P} ORDER BY id", (task_id,)
        )
        return [_attempt(r) for r in rows]

    # -- secrets and settings ---------------------------------------------------------------
    def push_secret(
        self, workspace: str, agent: str, *, rotate: bool = False, record: Record | None = None
    ) -> str | None:
        def go(tx: PushTx) -> str | None:
            secret = tx.agent_push_secret(workspace, agent, new_secret(), rotate)
            if secret is not None and rotate:
                self._notes(tx, [C.record_note(workspace, record, agent)])
            return secret

        return self._transact(go)

    def push_allow_private(self, workspace: str) -> bool:
        rows = self._read(
            f"SELECT push_allow_private FROM workspace WHERE name = {self.P}", (workspace,)
        )
        return bool(rows) and bool(rows[0]["push_allow_private"])

    def set_push_allow_private(
        self, workspace: str, allowed: bool, *, record: Record | None = None
    ) -> None:
        def go(tx: PushTx) -> None:
            if not tx.set_workspace_push_private(workspace, allowed):
                raise NotFoundError(f"unknown workspace {workspace!r}")
            self._notes(tx, [C.record_note(workspace, record, workspace)])

        self._transact(go)
