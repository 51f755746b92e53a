"""Read-only queries that are the same on SQLite and PostgreSQL but for the placeholder.

The two backends wrote these lookups twice, differing only in ``?`` against ``%s``; a fix
to one (a filter, an ordering) could silently miss the other. They live here once, built
with the backend's placeholder ``P`` and run through its own ``_read``. Writes that are
alike but for the placeholder are :mod:`._statements`'. The queue statements whose SQL
genuinely differs (claims, leases, group commit) stay in each backend, where the queue
rules are enforced.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from melchior.mellan.relay.store import _common as C
from melchior.mellan.relay.store.base import (
    Activity,
    Agent,
    AuditFilter,
    AuditRecord,
    CredentialInfo,
    CredentialKind,
    Enrollment,
    Grant,
    Principal,
    SentMessage,
    Session,
    Task,
    TaskEvent,
    TaskState,
    TaskTurn,
)

FINISHED_STATES = ("succeeded", "input_required", "failed", "cancelled")
"""The states a finished task can be in (``finished_at`` set), as activity counts them."""


def _like_prefix(text: str) -> str:
    """``text`` as a LIKE pattern matching it as a prefix, its wildcards escaped (``\\``)."""
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


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
        agent: str | None = None,
        capability: str | None = None,
    ) -> list[Task]:
        p = self.P
        sql = f"SELECT * FROM task WHERE workspace = {p}"
        params: list[Any] = [workspace]
        for col, val in (
            ("caller", caller),
            ("receiver", receiver),
            ("context_id", context_id),
            ("capability", capability),
        ):
            if val is not None:
                sql += f" AND {col} = {p}"
                params.append(val)
        if agent is not None:
            sql += f" AND (caller = {p} OR receiver = {p})"
            params += [agent, agent]
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

    # -- metrics ------------------------------------------------------------------------------
    def queue_gauges(
        self,
    ) -> tuple[
        dict[tuple[str, str], int], dict[tuple[str, str], int], dict[tuple[str, str], float]
    ]:
        """Tasks by (workspace, state); queued tasks and the oldest one's age in seconds by
        (workspace, receiver) — two grouped reads, for a metrics scrape (cached above)."""
        now = C.parse_ms(self.now())
        states = self._read(
            "SELECT workspace, state, count(*) AS n FROM task GROUP BY workspace, state"
        )
        queued = self._read(
            "SELECT workspace, receiver, count(*) AS n, min(created_at) AS oldest FROM task"
            " WHERE state = 'queued' GROUP BY workspace, receiver"
        )
        return (
            {(r["workspace"], r["state"]): int(r["n"]) for r in states},
            {(r["workspace"], r["receiver"]): int(r["n"]) for r in queued},
            {
                (r["workspace"], r["receiver"]): max(
                    0.0, (now - C.parse_ms(C.iso(r["oldest"]))) / 1000
                )
                for r in queued
            },
        )

    # -- the dashboard ------------------------------------------------------------------------
    def _bucket_sql(self, column: str) -> str:
        """SQL for the bucket index of ``column`` given two parameters: the window's start
        (as :meth:`_stamp` gives it) and the bucket's width in milliseconds."""
        raise NotImplementedError

    def _stamp(self, iso: str) -> Any:
        """An ISO timestamp as this backend binds it as a parameter."""
        raise NotImplementedError

    def now(self) -> str:
        """The database clock (each backend has its own)."""
        raise NotImplementedError

    def session_for(self, id_hash: str) -> Session | None:
        now = self.NOW_SQL
        rows = self._read(
            "SELECT s.workspace, s.credential_id, s.created_at, s.last_seen_at,"
            " s.idle_expires_at, s.expires_at, c.kind, c.subject,"
            f" (c.revoked_at IS NULL AND (c.expires_at IS NULL OR c.expires_at > {now}))"
            f" AS credential_live, {now} AS now"
            " FROM dashboard_session s JOIN credential c ON c.id = s.credential_id"
            f" WHERE s.id_hash = {self.P}",
            (id_hash,),
        )
        if not rows:
            return None
        r = rows[0]
        principal = Principal(
            r["workspace"], CredentialKind(r["kind"]), r["subject"], r["credential_id"]
        )
        return Session(
            principal=principal,
            created_at=C.iso(r["created_at"]),
            last_seen_at=C.iso(r["last_seen_at"]),
            idle_expires_at=C.iso(r["idle_expires_at"]),
            expires_at=C.iso(r["expires_at"]),
            now=C.iso(r["now"]),
            credential_live=bool(r["credential_live"]),
        )

    def list_credentials(self, workspace: str) -> list[CredentialInfo]:
        rows = self._read(
            "SELECT id, workspace, kind, subject, created_at, expires_at, revoked_at"
            f" FROM credential WHERE workspace = {self.P} ORDER BY created_at, id",
            (workspace,),
        )
        return [
            CredentialInfo(
                r["id"],
                r["workspace"],
                CredentialKind(r["kind"]),
                r["subject"],
                C.iso(r["created_at"]),
                C.iso_or_none(r["expires_at"]),
                C.iso_or_none(r["revoked_at"]),
            )
            for r in rows
        ]

    def list_enrollments(self, workspace: str) -> list[Enrollment]:
        rows = self._read(
            "SELECT code_hash, workspace, agent_id, created_at, expires_at FROM enrollment"
            f" WHERE workspace = {self.P} AND used_at IS NULL AND expires_at > {self.NOW_SQL}"
            " ORDER BY created_at, code_hash",
            (workspace,),
        )
        return [
            Enrollment(
                r["code_hash"],
                r["workspace"],
                r["agent_id"],
                C.iso(r["created_at"]),
                C.iso(r["expires_at"]),
            )
            for r in rows
        ]

    def audit_matching(
        self,
        workspace: str,
        match: AuditFilter,
        *,
        after: int = 0,
        before: int | None = None,
        limit: int = 100,
        newest_first: bool = True,
    ) -> list[AuditRecord]:
        p = self.P
        sql = f"SELECT * FROM audit WHERE workspace = {p} AND seq > {p}"
        params: list[Any] = [workspace, after]
        if before is not None:
            sql += f" AND seq < {p}"
            params.append(before)
        for col, val in (("actor", match.actor), ("subject", match.subject)):
            if val is not None:
                sql += f" AND {col} = {p}"
                params.append(val)
        if match.action is not None:
            if match.action.endswith((".", "*")):
                sql += f" AND action LIKE {p} ESCAPE '\\'"
                params.append(_like_prefix(match.action.rstrip("*")))
            else:
                sql += f" AND action = {p}"
                params.append(match.action)
        if match.allowed is not None:
            sql += f" AND allowed = {p}"
            params.append(match.allowed)
        sql += f" ORDER BY seq {'DESC' if newest_first else 'ASC'} LIMIT {p}"
        params.append(limit)
        return [C.audit_from_row(r) for r in self._read(sql, params)]

    def task_activity(self, workspace: str, bucket_seconds: int, buckets: int) -> Activity:
        """Three reads over indexes bounded by the window (``task_created``,
        ``task_finished``) and the open tasks (``task_open``); the depth is derived."""
        p = self.P
        width = bucket_seconds * 1000
        end = self.now()
        end_ms = C.parse_ms(end)
        start = C.iso(end_ms - width * buckets)
        since = self._stamp(start)
        accepted = [0] * buckets
        finished = {state: [0] * buckets for state in FINISHED_STATES}
        created = self._bucket_sql("created_at")
        for r in self._read(
            f"SELECT {created} AS b, count(*) AS n FROM task"
            f" WHERE workspace = {p} AND created_at >= {p} GROUP BY 1",
            (since, width, workspace, since),
        ):
            if int(r["b"]) >= 0:  # at or past the end (written since): the last bucket
                accepted[min(int(r["b"]), buckets - 1)] += int(r["n"])
        done = self._bucket_sql("finished_at")
        for r in self._read(
            f"SELECT {done} AS b, state, count(*) AS n FROM task"
            f" WHERE workspace = {p} AND finished_at >= {p} AND finished_at IS NOT NULL"
            " GROUP BY 1, 2",
            (since, width, workspace, since),
        ):
            column = finished.get(r["state"])
            if column is not None and int(r["b"]) >= 0:
                column[min(int(r["b"]), buckets - 1)] += int(r["n"])
        rows = self._read(
            f"SELECT count(*) AS n FROM task WHERE workspace = {p} AND finished_at IS NULL",
            (workspace,),
        )
        return Activity(
            start=start,
            end=end,
            bucket_seconds=bucket_seconds,
            accepted=tuple(accepted),
            finished={k: tuple(v) for k, v in finished.items()},
            open_now=int(rows[0]["n"]),
        )
