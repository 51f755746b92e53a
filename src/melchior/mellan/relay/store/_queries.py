"""Read-only queries that are the same on SQLite and PostgreSQL but for the placeholder.

The two backends wrote these lookups twice, differing only in ``?`` against ``%s``; a fix
to one (a filter, an ordering) could silently miss the other. They live here once, built
with the backend's placeholder ``P`` and run through its own ``_read``. The queue
statements whose SQL genuinely differs (claims, leases, group commit) stay in each
backend, where the queue rules are enforced.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from melchior.mellan.relay.store import _common as C
from melchior.mellan.relay.store.base import (
    Agent,
    AuditRecord,
    CredentialKind,
    Grant,
    Principal,
    SentMessage,
    Task,
    TaskEvent,
    TaskState,
    TaskTurn,
)


class ReadQueries:
    """Mixin for a store: the shared lookups, given ``P`` and ``_read``.

    ``P`` is a class attribute (a constant per backend), so no state is shared.
    """

    P: ClassVar[str]
    NOW_SQL: ClassVar[str]  # SQL for "now" in the backend's own timestamp encoding

    def _read(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> Sequence[Any]:
        """Run one read-only statement; each backend supplies its own."""
        raise NotImplementedError

    def _states_clause(self, states: Sequence[TaskState]) -> tuple[str, list[Any]]:
        """SQL and parameters for ``state`` in a non-empty set of states.

        A plain ``IN`` list works on both backends; PostgreSQL overrides it with
        ``= ANY(array)`` so the statement's text does not vary with the set's size.
        """
        marks = ", ".join([self.P] * len(states))
        return f" AND state IN ({marks})", [TaskState(s).value for s in states]

    def principal_for(self, token_hash: str) -> Principal | None:
        rows = self._read(
            f"SELECT id, workspace, kind, subject FROM credential WHERE token_hash = {self.P}"
            f" AND revoked_at IS NULL AND (expires_at IS NULL OR expires_at > {self.NOW_SQL})",
            (token_hash,),
        )
        if not rows:
            return None
        r = rows[0]
        return Principal(r["workspace"], CredentialKind(r["kind"]), r["subject"], r["id"])

    def get_agent(self, workspace: str, agent_id: str) -> Agent | None:
        p = self.P
        rows = self._read(
            f"SELECT * FROM agent WHERE workspace = {p} AND id = {p}", (workspace, agent_id)
        )
        return C.agent_from_row(rows[0]) if rows else None

    def list_agents(self, workspace: str) -> list[Agent]:
        rows = self._read(
            f"SELECT * FROM agent WHERE workspace = {self.P} ORDER BY id", (workspace,)
        )
        return [C.agent_from_row(r) for r in rows]

    def list_grants(
        self,
        workspace: str,
        *,
        caller: str | None = None,
        receiver: str | None = None,
        include_revoked: bool = False,
    ) -> list[Grant]:
        p = self.P
        sql = f"SELECT * FROM agent_grant WHERE workspace = {p}"
        params: list[Any] = [workspace]
        for col, val in (("caller", caller), ("receiver", receiver)):
            if val is not None:
                sql += f" AND {col} = {p}"
                params.append(val)
        if not include_revoked:
            sql += " AND revoked_at IS NULL"
        return [C.grant_from_row(r) for r in self._read(sql + " ORDER BY created_at, id", params)]

    def granted_capabilities(self, workspace: str, caller: str, receiver: str) -> set[str]:
        caps: set[str] = set()
        for g in self.list_grants(workspace, caller=caller, receiver=receiver):
            caps.update(g.capabilities)
        return caps

    def audit_since(
        self, workspace: str, after_seq: int = 0, limit: int = 100
    ) -> list[AuditRecord]:
        p = self.P
        rows = self._read(
            f"SELECT * FROM audit WHERE workspace = {p} AND seq > {p} ORDER BY seq LIMIT {p}",
            (workspace, after_seq, limit),
        )
        return [C.audit_from_row(r) for r in rows]

    def get_task(self, workspace: str, task_id: str) -> Task | None:
        p = self.P
        rows = self._read(
            f"SELECT * FROM task WHERE workspace = {p} AND id = {p}", (workspace, task_id)
        )
        return C.task_from_row(rows[0]) if rows else None

    def turns(self, task_id: str) -> list[TaskTurn]:
        rows = self._read(
            f"SELECT * FROM task_turn WHERE task_id = {self.P} ORDER BY turn", (task_id,)
        )
        return [C.turn_from_row(r) for r in rows]

    def sent_message(self, workspace: str, caller: str, message_id: str) -> SentMessage | None:
        p = self.P
        rows = self._read(
            "SELECT m.task_id, m.turn, CASE WHEN t.turn = m.turn THEN t.payload"
            "   ELSE (SELECT d.payload FROM task_turn d WHERE d.task_id = m.task_id"
            "         AND d.turn = m.turn) END AS payload"
            " FROM task_message m JOIN task t ON t.id = m.task_id"
            f" WHERE m.workspace = {p} AND m.caller = {p} AND m.message_id = {p}",
            (workspace, caller, message_id),
        )
        if not rows or rows[0]["payload"] is None:
            return None
        r = rows[0]
        return SentMessage(r["task_id"], int(r["turn"]), r["payload"])

    def task_by_message(self, workspace: str, caller: str, message_id: str) -> Task | None:
        p = self.P
        rows = self._read(
            f"SELECT * FROM task WHERE workspace = {p} AND caller = {p} AND message_id = {p}",
            (workspace, caller, message_id),
        )
        return C.task_from_row(rows[0]) if rows else None

    def list_tasks(
        self,
        workspace: str,
        *,
        caller: str | None = None,
        receiver: str | None = None,
        context_id: str | None = None,
        states: Sequence[TaskState] | None = None,
        after: str | None = None,
        limit: int = 50,
    ) -> list[Task]:
        p = self.P
        sql = f"SELECT * FROM task WHERE workspace = {p}"
        params: list[Any] = [workspace]
        for col, val in (("caller", caller), ("receiver", receiver), ("context_id", context_id)):
            if val is not None:
                sql += f" AND {col} = {p}"
                params.append(val)
        if states is not None:
            if not states:
                return []
            clause, values = self._states_clause(states)
            sql += clause
            params += values
        if after is not None:
            sql += (
                f" AND seq < COALESCE((SELECT seq FROM task WHERE workspace = {p} AND id = {p}), 0)"
            )
            params += [workspace, after]
        sql += f" ORDER BY seq DESC LIMIT {p}"
        params.append(limit)
        return [C.task_from_row(r) for r in self._read(sql, params)]

    def events_after(self, task_id: str, after_seq: int = 0) -> list[TaskEvent]:
        p = self.P
        rows = self._read(
            f"SELECT * FROM task_event WHERE task_id = {p} AND seq > {p} ORDER BY seq",
            (task_id, after_seq),
        )
        return [C.event_from_row(r) for r in rows]
