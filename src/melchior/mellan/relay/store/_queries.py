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
from melchior.mellan.relay.store import bigtext
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


TASK_COLUMNS = (
    "id, workspace, caller, receiver, capability, context_id, state, payload, metadata,"
    " message_id, session_key, chain, hop, path, attempt, max_attempts, lease_epoch,"
    " lease_owner, lease_expires_at, error, created_at, updated_at, turn"
)
"""Every column of ``task`` a :class:`Task` is built from but ``result``, which
:meth:`ReadQueries.get_task` reads in pieces when it is big (:mod:`.bigtext`)."""

READ_TRIES = 5
"""Times :meth:`ReadQueries.get_task` starts over when the row changed between its pieces
(a turn went on, a cancel), before it reads the row in one statement instead."""


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
        """The task; a result over :data:`~.bigtext.PIECE` characters is read in pieces,
        and a finished one kept (:mod:`.bigtext` says why). A task with a kept result is
        read without its result column (the database does not load it either)."""
        p, piece = self.P, bigtext.PIECE
        where = f" FROM task WHERE workspace = {p} AND id = {p}"
        for _ in range(READ_TRIES):
            if self._texts.holds(task_id):
                rows = self._read(f"SELECT {TASK_COLUMNS}" + where, (workspace, task_id))
                if not rows:
                    return None
                row = dict(rows[0])
                text = self._texts.get(bigtext.key_of(row))
                if text is not None:
                    row["result"] = text
                    return C.task_from_row(row)
            # The result's head, one character past a piece: all of a small result, and
            # for a big one its first piece and the sign that there is more.
            rows = self._read(
                f"SELECT {TASK_COLUMNS}, substr(result, 1, {p}) AS result" + where,
                (piece + 1, workspace, task_id),
            )
            if not rows:
                return None
            row = dict(rows[0])
            head = row["result"]
            if head is None or len(head) <= piece:
                return C.task_from_row(row)
            key = bigtext.key_of(row)
            with self._texts.one_reader(key):
                text = self._texts.get(key) or self._result_pieces(key, head)
            if text is not None:
                row["result"] = text
                return C.task_from_row(row)
        rows = self._read("SELECT *" + where, (workspace, task_id))
        return C.task_from_row(rows[0]) if rows else None

    @property
    def _texts(self) -> bigtext.TextCache:
        """This store's cache of finished big results (made on first use: a mixin has no
        ``__init__`` of its own)."""
        cache: bigtext.TextCache | None = self.__dict__.get("_bigtexts")
        if cache is None:
            cache = self.__dict__.setdefault("_bigtexts", bigtext.TextCache())
        return cache

    def _result_pieces(self, key: bigtext.Key, head: str) -> str | None:
        """The result of the row ``key`` names, its ``head`` read already, the rest a
        :data:`~.bigtext.PIECE` of characters per statement until a short piece; None when
        the row changed in between (the caller reads again). Every result read here is of
        a finished turn (only ``complete`` writes one), so it is kept in the cache."""
        p, piece = self.P, bigtext.PIECE
        pieces = [head]
        start = len(head) + 1
        while True:
            rows = self._read(
                f"SELECT substr(result, {p}, {p}) AS piece FROM task WHERE id = {p}"
                f" AND turn = {p} AND lease_epoch = {p} AND updated_at = {p}",
                (start, piece, key.task_id, key.turn, key.epoch, key.updated_at),
            )
            if not rows or rows[0]["piece"] is None:
                return None
            pieces.append(rows[0]["piece"])
            if len(rows[0]["piece"]) < piece:
                break
            start += piece
        return self._texts.put(key, "".join(pieces))

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

    def _task_filter(
        self,
        workspace: str,
        *,
        caller: str | None,
        receiver: str | None,
        context_id: str | None,
        states: Sequence[TaskState] | None,
        agent: str | None,
        capability: str | None,
        updated_after: str | None,
    ) -> tuple[str, list[Any]] | None:
        """The ``WHERE`` of a task listing and of its count, once for both; None when
        nothing can match (an empty set of states)."""
        p = self.P
        sql = f" FROM task WHERE workspace = {p}"
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
                return None
            clause, values = self._states_clause(states)
            sql += clause
            params += values
        if updated_after is not None:
            sql += f" AND updated_at > {p}"
            params.append(self._stamp(updated_after))
        return sql, params

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
        updated_after: str | None = None,
    ) -> list[Task]:
        """Newest first. Each row's result is read as :meth:`get_task` reads one: a big
        one in pieces (or from the cache), never in one conversion."""
        p, piece = self.P, bigtext.PIECE
        where = self._task_filter(
            workspace, caller=caller, receiver=receiver, context_id=context_id, states=states,
            agent=agent, capability=capability, updated_after=updated_after,
        )  # fmt: skip
        if where is None:
            return []
        sql, params = where
        if after is not None:
            sql += (
                f" AND seq < COALESCE((SELECT seq FROM task WHERE workspace = {p} AND id = {p}), 0)"
            )
            params += [workspace, after]
        sql += f" ORDER BY seq DESC LIMIT {p}"
        rows = self._read(
            f"SELECT {TASK_COLUMNS}, substr(result, 1, {p}) AS result" + sql,
            [piece + 1, *params, limit],
        )
        out = []
        for r in rows:
            row = dict(r)
            head = row["result"]
            if head is not None and len(head) > piece:
                key = bigtext.key_of(row)
                with self._texts.one_reader(key):
                    text = self._texts.get(key) or self._result_pieces(key, head)
                if text is None:  # the row changed between its pieces: read it as get does
                    task = self.get_task(workspace, row["id"])
                    if task is not None:
                        out.append(task)
                    continue
                row["result"] = text
            out.append(C.task_from_row(row))
        return out

    def count_tasks(
        self,
        workspace: str,
        *,
        caller: str | None = None,
        receiver: str | None = None,
        context_id: str | None = None,
        states: Sequence[TaskState] | None = None,
        agent: str | None = None,
        capability: str | None = None,
        updated_after: str | None = None,
    ) -> int:
        where = self._task_filter(
            workspace, caller=caller, receiver=receiver, context_id=context_id, states=states,
            agent=agent, capability=capability, updated_after=updated_after,
        )  # fmt: skip
        if where is None:
            return 0
        sql, params = where
        return int(self._read("SELECT count(*) AS n" + sql, params)[0]["n"])

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
