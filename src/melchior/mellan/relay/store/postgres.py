"""The relay's store on PostgreSQL: several relay replicas, one database.

Why it holds the queue rules with many replicas at once:
- claims select candidates ``FOR UPDATE SKIP LOCKED`` inside one ``UPDATE … FROM``
  statement, so concurrent claimers never wait on each other nor take the same row;
- the partial unique index ``task_session_slot`` makes a second live task of a bound
  session impossible even if the head-of-session rule ever raced; a claim that hits
  it (a commit-order race) is simply retried;
- every lease sum uses the server's clock, so replica clock skew cannot matter; queue
  statements read it with ``statement_timestamp()`` rather than ``now()`` (the
  *transaction's* start), so a task's stamps follow the order in which its changes
  became visible: a claim whose transaction began before the session head's completion
  committed, but whose claiming statement saw that commit, is stamped after it;
- the sweeper also uses ``SKIP LOCKED``: every replica may run it, none double-works.

Connections come from a small ``psycopg_pool`` pool; each method is one transaction.
A lost connection surfaces as :class:`StoreUnavailable` (the transaction rolled back
with the session), and the pool replaces the connection for the next call.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any, TypeVar

import psycopg
from psycopg import errors as pgerr
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool, PoolTimeout

from melchior.mellan.relay.notify import audit_topic, receiver_topic, task_topic
from melchior.mellan.relay.store import _common as C
from melchior.mellan.relay.store import migrations
from melchior.mellan.relay.store._queries import ReadQueries
from melchior.mellan.relay.store.base import (
    Agent,
    Capability,
    Conflict,
    CredentialKind,
    Grant,
    Lease,
    NewTask,
    NotFoundError,
    Outcome,
    StoreError,
    StoreUnavailable,
    Task,
    TaskEvent,
    TaskState,
)

T = TypeVar("T")
Row = dict[str, Any]
_MIGRATE_LOCK = 0x6D656C6C616E  # "mellan": one migrator at a time across replicas
_RETRIES = 8


@dataclass
class _Tx:
    """One open transaction: a cursor and the wake-ups to send once it commits."""

    cur: psycopg.Cursor[Row]
    topics: list[str] = field(default_factory=list)

    def one(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> Row | None:
        self.cur.execute(sql, params)
        return self.cur.fetchone()

    def all(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> list[Row]:
        self.cur.execute(sql, params)
        return self.cur.fetchall()

    def run(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> int:
        self.cur.execute(sql, params)
        return self.cur.rowcount


def _retryable(exc: BaseException) -> bool:
    """Serialization/deadlock aborts, and a claim racing on a session slot: try again."""
    if isinstance(exc, pgerr.TransactionRollback):
        return True
    return isinstance(exc, pgerr.UniqueViolation) and (
        exc.diag.constraint_name == "task_session_slot"
    )


class PostgresStore(ReadQueries):
    """:class:`~melchior.mellan.relay.store.base.Store` on PostgreSQL (psycopg 3, sync)."""

    P = "%s"  # the placeholder for the shared reads in ReadQueries
    NOW_SQL = "clock_timestamp()"  # the wall clock, not the transaction's start

    def __init__(
        self,
        url: str,
        *,
        min_size: int = 1,
        max_size: int = 8,
        timeout: float = 10.0,
        cancel_grace_seconds: float = 10.0,
        publish: Callable[[str], None] | None = None,
    ) -> None:
        self.url = url
        self.cancel_grace_ms = round(cancel_grace_seconds * 1000)
        self._publish = publish
        # Test and drill hook: called inside every write transaction just before COMMIT,
        # so a test can cut the connection at the worst moment.
        self.before_commit: Callable[[psycopg.Connection[Row]], None] | None = None
        self._pool: ConnectionPool[psycopg.Connection[Row]] = ConnectionPool(
            url,
            min_size=min_size,
            max_size=max_size,
            timeout=timeout,
            kwargs={"autocommit": True, "row_factory": dict_row, "connect_timeout": 5},
            open=True,
            name="mellan-store",
        )

    # -- plumbing ---------------------------------------------------------------------------
    def _lost(
        self, exc: BaseException, *, unclear: bool = False, backend: int | None = None
    ) -> StoreUnavailable:
        # Idle connections may have died with this one (server restart): have the pool
        # check them now rather than fail the next callers one by one.
        with suppress(Exception):  # the pool repairs itself later; this is a head start
            self._pool.check()
        what = str(exc).strip() or type(exc).__name__
        if unclear:
            return StoreUnavailable(
                f"postgresql: connection lost while committing ({what})",
                unclear=True,
                backend=backend,
            )
        return StoreUnavailable(f"postgresql: {what}")

    def _write(self, fn: Callable[[_Tx], T]) -> T:
        """Run ``fn`` in one transaction, retrying aborts that say "try again"; publish
        wake-ups only after COMMIT."""
        for attempt in range(_RETRIES):
            done = False  # fn ran to its end: from here a lost connection may have committed
            backend: int | None = None
            try:
                with self._pool.connection() as conn, conn.transaction(), conn.cursor() as cur:
                    backend = conn.info.backend_pid
                    tx = _Tx(cur)
                    result = fn(tx)
                    done = True
                    if self.before_commit is not None:
                        self.before_commit(conn)
            except (pgerr.TransactionRollback, pgerr.UniqueViolation) as exc:
                if _retryable(exc) and attempt + 1 < _RETRIES:
                    continue
                if _retryable(exc):
                    raise StoreUnavailable(f"postgresql: contention: {exc}") from exc
                raise
            except (psycopg.OperationalError, psycopg.InterfaceError, PoolTimeout) as exc:
                raise self._lost(exc, unclear=done, backend=backend) from exc
            C.publish_all(self._publish, tx.topics)
            return result
        raise AssertionError("unreachable")

    def settle(self, lost: StoreUnavailable, timeout: float = 5.0) -> bool:
        """An unclear commit is decided once the server process that ran it has gone: a
        backend that received COMMIT finishes it before it notices its client left. So wait
        for that process id to leave ``pg_stat_activity``; then a read tells the truth."""
        if not lost.unclear:
            return True
        if not isinstance(lost.backend, int):
            return False
        deadline = time.monotonic() + timeout
        while True:
            try:
                rows = self._read(
                    "SELECT 1 AS x FROM pg_stat_activity WHERE pid = %s", (lost.backend,)
                )
            except StoreUnavailable:
                return False
            if not rows:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)

    def _read(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> list[Row]:
        try:
            with self._pool.connection() as conn, conn.cursor() as cur:
                cur.execute(sql, params)
                return cur.fetchall()
        except (psycopg.OperationalError, psycopg.InterfaceError, PoolTimeout) as exc:
            raise self._lost(exc) from exc

    def _states_clause(self, states: Sequence[TaskState]) -> tuple[str, list[Any]]:
        """One array parameter, so the statement's text is the same whatever the set's size."""
        return " AND state = ANY(%s)", [[TaskState(s).value for s in states]]

    # -- lifecycle ----------------------------------------------------------------------------
    def migrate(self, target: int | None = None) -> int:
        goal = migrations.LATEST_POSTGRES if target is None else target

        def step(tx: _Tx) -> tuple[int, bool]:
            tx.run("SELECT pg_advisory_xact_lock(%s)", (_MIGRATE_LOCK,))
            tx.run(
                "CREATE TABLE IF NOT EXISTS schema_version (version integer PRIMARY KEY,"
                " applied_at timestamptz NOT NULL DEFAULT now())"
            )
            row = tx.one("SELECT COALESCE(MAX(version), 0) AS v FROM schema_version")
            current = int(row["v"]) if row else 0
            if current >= goal:
                return current, True
            for stmt in migrations.POSTGRES[current]:
                tx.run(stmt)
            tx.run("INSERT INTO schema_version (version) VALUES (%s)", (current + 1,))
            return current + 1, False

        while True:
            version, done = self._write(step)
            if done:
                return version

    def schema_version(self) -> int:
        rows = self._read("SELECT to_regclass('schema_version') IS NOT NULL AS present")
        if not rows[0]["present"]:
            return 0
        return int(self._read("SELECT COALESCE(MAX(version), 0) AS v FROM schema_version")[0]["v"])

    def close(self) -> None:
        self._pool.close()

    def now(self) -> str:
        return C.iso(self._read("SELECT clock_timestamp() AS now")[0]["now"])

    def set_publisher(self, publish: Callable[[str], None] | None) -> None:
        self._publish = publish

    # -- workspaces and credentials -----------------------------------------------------------
    def ensure_workspace(self, workspace: str) -> bool:
        return self._write(
            lambda tx: (
                tx.run(
                    "INSERT INTO workspace (name) VALUES (%s) ON CONFLICT DO NOTHING", (workspace,)
                )
                == 1
            )
        )

    @staticmethod
    def _need_workspace(tx: _Tx, workspace: str) -> None:
        if tx.one("SELECT 1 AS x FROM workspace WHERE name = %s", (workspace,)) is None:
            raise NotFoundError(f"unknown workspace {workspace!r}")

    @staticmethod
    def _need_agent(tx: _Tx, workspace: str, agent_id: str) -> None:
        if (
            tx.one("SELECT 1 AS x FROM agent WHERE workspace=%s AND id=%s", (workspace, agent_id))
            is None
        ):
            raise NotFoundError(f"unknown agent {agent_id!r}")

    def add_credential(
        self,
        workspace: str,
        kind: CredentialKind,
        subject: str,
        token_hash: str,
        expires_at: str | None = None,
    ) -> str:
        cid = C.new_id()

        def go(tx: _Tx) -> str:
            self._need_workspace(tx, workspace)
            try:
                tx.run(
                    "INSERT INTO credential (id, workspace, kind, subject, token_hash, expires_at)"
                    " VALUES (%s, %s, %s, %s, %s, %s)",
                    (
                        cid,
                        workspace,
                        CredentialKind(kind).value,
                        subject,
                        token_hash,
                        None if expires_at is None else C.parse_dt(expires_at),
                    ),
                )
            except pgerr.UniqueViolation as exc:
                raise Conflict("credential hash already stored") from exc
            return cid

        return self._write(go)

    def revoke_credential(self, workspace: str, credential_id: str) -> bool:
        return self._write(
            lambda tx: (
                tx.run(
                    "UPDATE credential SET revoked_at = now() WHERE workspace = %s AND id = %s"
                    " AND revoked_at IS NULL",
                    (workspace, credential_id),
                )
                == 1
            )
        )

    # -- agents and enrollment ----------------------------------------------------------------
    def add_agent(
        self, workspace: str, agent_id: str, description: str, capabilities: Sequence[Capability]
    ) -> Agent:
        def go(tx: _Tx) -> Agent:
            self._need_workspace(tx, workspace)
            try:
                row = tx.one(
                    "INSERT INTO agent (workspace, id, description, capabilities)"
                    " VALUES (%s, %s, %s, %s) RETURNING *",
                    (workspace, agent_id, description, C.caps_json(capabilities)),
                )
            except pgerr.UniqueViolation as exc:
                raise Conflict(f"agent {agent_id!r} already exists") from exc
            assert row is not None
            return C.agent_from_row(row)

        return self._write(go)

    def add_enrollment(
        self, workspace: str, agent_id: str, code_hash: str, expires_at: str
    ) -> None:
        def go(tx: _Tx) -> None:
            self._need_agent(tx, workspace, agent_id)
            try:
                tx.run(
                    "INSERT INTO enrollment (code_hash, workspace, agent_id, expires_at)"
                    " VALUES (%s, %s, %s, %s)",
                    (code_hash, workspace, agent_id, C.parse_dt(expires_at)),
                )
            except pgerr.UniqueViolation as exc:
                raise Conflict("enrollment code already stored") from exc

        self._write(go)

    def redeem_enrollment(self, code_hash: str) -> tuple[str, str] | None:
        row = self._write(
            lambda tx: tx.one(
                "UPDATE enrollment SET used_at = now() WHERE code_hash = %s AND used_at IS NULL"
                " AND expires_at > now() RETURNING workspace, agent_id",
                (code_hash,),
            )
        )
        return None if row is None else (row["workspace"], row["agent_id"])

    # -- grants -------------------------------------------------------------------------------
    def add_grant(
        self, workspace: str, caller: str, receiver: str, capabilities: Sequence[str]
    ) -> Grant:
        caps = list(dict.fromkeys(capabilities))

        def go(tx: _Tx) -> Grant:
            self._need_agent(tx, workspace, caller)
            self._need_agent(tx, workspace, receiver)
            row = tx.one(
                "INSERT INTO agent_grant (id, workspace, caller, receiver, capabilities)"
                " VALUES (%s, %s, %s, %s, %s) RETURNING *",
                (C.new_id(), workspace, caller, receiver, json.dumps(caps)),
            )
            assert row is not None
            return C.grant_from_row(row)

        return self._write(go)

    def revoke_grant(self, workspace: str, grant_id: str) -> bool:
        return self._write(
            lambda tx: (
                tx.run(
                    "UPDATE agent_grant SET revoked_at = now() WHERE workspace = %s AND id = %s"
                    " AND revoked_at IS NULL",
                    (workspace, grant_id),
                )
                == 1
            )
        )

    # -- audit --------------------------------------------------------------------------------
    def audit(
        self,
        workspace: str,
        actor: str,
        action: str,
        subject: str,
        allowed: bool,
        rule: str,
        reason: str,
        detail: dict[str, Any] | None = None,
    ) -> int:
        def go(tx: _Tx) -> int:
            tx.topics.append(audit_topic(workspace))
            return self._audit(tx, workspace, actor, action, subject, allowed, rule, reason, detail)

        return self._write(go)

    @staticmethod
    def _audit(
        tx: _Tx,
        workspace: str,
        actor: str,
        action: str,
        subject: str,
        allowed: bool,
        rule: str,
        reason: str,
        detail: dict[str, Any] | None = None,
    ) -> int:
        row = tx.one(
            "INSERT INTO audit (workspace, actor, action, subject, allowed, rule, reason, detail)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s, %s) RETURNING seq",
            (workspace, actor, action, subject, allowed, rule, reason, json.dumps(detail or {})),
        )
        assert row is not None
        return int(row["seq"])

    def _note(self, tx: _Tx, note: C.Note | None) -> None:
        """Write ``note`` in the open transaction: it commits with the change it records."""
        self._notes(tx, [note])

    @staticmethod
    def _notes(tx: _Tx, notes: Sequence[C.Note | None]) -> None:
        """Write several records in one multi-row INSERT: one round trip for a claim of
        50, not 50."""
        rows = [n for n in notes if n is not None]
        if not rows:
            return
        values = ", ".join(["(%s, %s, %s, %s, %s, %s, %s, %s)"] * len(rows))
        params: list[Any] = []
        for n in rows:
            params += [n.workspace, n.actor, n.action, n.subject, n.allowed, n.rule, n.reason,
                       json.dumps(n.detail)]  # fmt: skip
        tx.run(
            "INSERT INTO audit (workspace, actor, action, subject, allowed, rule, reason, detail)"
            f" VALUES {values}",
            params,
        )
        tx.topics += [audit_topic(w) for w in dict.fromkeys(n.workspace for n in rows)]

    # -- tasks: caller side -------------------------------------------------------------------
    def enqueue(self, task: NewTask) -> tuple[Task, bool]:
        return self.enqueue_many([task])[0]

    def enqueue_many(self, tasks: Sequence[NewTask]) -> list[tuple[Task, bool]]:
        if any(t.max_attempts < 1 for t in tasks):
            raise ValueError("max_attempts must be at least 1")
        if not tasks:
            return []

        def go(tx: _Tx) -> list[tuple[Task, bool]]:
            out = self._enqueue(tx, tasks)
            self._notes(
                tx,
                [C.accept_note(t, n.accept) for n, (t, new) in zip(tasks, out, strict=True) if new],
            )
            return out

        return self._write(go)

    @staticmethod
    def _enqueue(tx: _Tx, tasks: Sequence[NewTask]) -> list[tuple[Task, bool]]:
        """All inserts in one pipelined ``executemany`` (one round trip for the batch); a
        dedupe hit returns no row, and is answered with the task already stored."""
        tx.cur.executemany(
            "INSERT INTO task (id, workspace, caller, receiver, capability, context_id,"
            " state, payload, metadata, message_id, session_key, chain, hop, path,"
            " max_attempts) VALUES (%s, %s, %s, %s, %s, %s, 'queued', %s, %s, %s, %s, %s,"
            " %s, %s, %s) ON CONFLICT DO NOTHING RETURNING *",
            [
                (
                    C.new_id(),
                    t.workspace,
                    t.caller,
                    t.receiver,
                    t.capability,
                    t.context_id or C.new_id(),
                    t.payload,
                    t.metadata,
                    t.message_id,
                    t.session_key,
                    t.chain,
                    t.hop,
                    json.dumps(list(t.path)),
                    t.max_attempts,
                )
                for t in tasks
            ],
            returning=True,
        )
        inserted: list[Row | None] = []
        while True:
            inserted.append(tx.cur.fetchone())
            if not tx.cur.nextset():
                break
        out: list[tuple[Task, bool]] = []
        for task, row in zip(tasks, inserted, strict=True):
            if row is not None:
                tx.topics += [receiver_topic(task.workspace, task.receiver), task_topic(row["id"])]
                out.append((C.task_from_row(row), True))
                continue
            existing = tx.one(
                "SELECT * FROM task WHERE workspace = %s AND caller = %s AND message_id = %s",
                (task.workspace, task.caller, task.message_id),
            )
            if existing is None:
                raise StoreError("enqueue: insert suppressed without a duplicate")
            out.append((C.task_from_row(existing), False))
        return out

    def cancel(
        self, workspace: str, task_id: str, *, actor: str | None = None, rule: str = "caller"
    ) -> tuple[Task | None, Outcome]:
        def go(tx: _Tx) -> tuple[Task | None, Outcome]:
            if actor is None:
                return self._cancel(tx, workspace, task_id)
            before = tx.one(
                "SELECT state FROM task WHERE workspace = %s AND id = %s FOR UPDATE",
                (workspace, task_id),
            )  # locked: the state the cancel below acts on
            task, outcome = self._cancel(tx, workspace, task_id)
            if task is not None and before is not None:
                self._note(tx, C.cancel_note(actor, rule, before["state"], task, outcome))
            return task, outcome

        return self._write(go)

    def _cancel(self, tx: _Tx, workspace: str, task_id: str) -> tuple[Task | None, Outcome]:
        row = tx.one(
            "UPDATE task SET state = 'cancelled', updated_at = statement_timestamp(),"
            " finished_at = statement_timestamp(),"
            " lease_expires_at = CASE WHEN state = 'leased' THEN LEAST(lease_expires_at,"
            "   statement_timestamp() + %(grace)s * interval '1 millisecond') END,"
            " lease_owner = CASE WHEN state = 'leased' THEN lease_owner END"
            " WHERE workspace = %(ws)s AND id = %(id)s"
            "   AND state IN ('queued', 'leased', 'input_required') RETURNING *",
            {"grace": self.cancel_grace_ms, "ws": workspace, "id": task_id},
        )
        if row is not None:
            tx.topics += [receiver_topic(workspace, row["receiver"]), task_topic(task_id)]
            return C.task_from_row(row), Outcome.OK
        row = tx.one("SELECT * FROM task WHERE workspace = %s AND id = %s", (workspace, task_id))
        if row is None:
            return None, Outcome.NOT_FOUND
        task = C.task_from_row(row)
        dup = task.state is TaskState.CANCELLED
        return task, Outcome.DUPLICATE if dup else Outcome.LEASE_LOST

    def append_event(self, task_id: str, kind: str, body: str) -> TaskEvent:
        def go(tx: _Tx) -> TaskEvent:
            if tx.one("SELECT 1 AS x FROM task WHERE id = %s", (task_id,)) is None:
                raise NotFoundError(f"unknown task {task_id!r}")
            return self._event(tx, task_id, kind, body)

        return self._write(go)

    @staticmethod
    def _event(tx: _Tx, task_id: str, kind: str, body: str) -> TaskEvent:
        row = tx.one(
            "INSERT INTO task_event (task_id, kind, body) VALUES (%s, %s, %s) RETURNING *",
            (task_id, kind, body),
        )
        assert row is not None
        tx.topics.append(task_topic(task_id))
        return C.event_from_row(row)

    # -- tasks: receiver side -----------------------------------------------------------------
    def _settle_expired(self, tx: _Tx, workspace: str | None, receiver: str | None) -> int:
        """Expired holds: leased → queued (epoch bumped) or failed when attempts are spent;
        cancelled-in-grace → slot released. Rows another replica is settling are skipped."""
        where = "lease_expires_at <= statement_timestamp()"
        params: dict[str, Any] = {}
        if workspace is not None:
            where += " AND workspace = %(ws)s AND receiver = %(rcv)s"
            params = {"ws": workspace, "rcv": receiver}
        rows = tx.all(
            f"WITH exp AS MATERIALIZED (SELECT seq FROM task WHERE {where}"
            "   ORDER BY lease_expires_at LIMIT 500 FOR UPDATE SKIP LOCKED)"
            " UPDATE task t SET"
            " state = CASE WHEN t.state <> 'leased' THEN t.state"
            "   WHEN t.attempt >= t.max_attempts THEN 'failed' ELSE 'queued' END,"
            " lease_epoch = CASE WHEN t.state = 'leased' THEN t.lease_epoch + 1"
            "   ELSE t.lease_epoch END,"
            " error = CASE WHEN t.state = 'leased' THEN 'lease expired' ELSE t.error END,"
            " finished_at = CASE WHEN t.state = 'leased' AND t.attempt >= t.max_attempts"
            "   THEN statement_timestamp() ELSE t.finished_at END,"
            " run_after = CASE WHEN t.state = 'leased' THEN statement_timestamp()"
            "   ELSE t.run_after END,"
            " lease_owner = NULL, lease_expires_at = NULL, updated_at = statement_timestamp()"
            " FROM exp WHERE t.seq = exp.seq AND t.lease_expires_at <= statement_timestamp()"
            " RETURNING t.id, t.workspace, t.receiver, t.state, t.attempt, t.max_attempts",
            params,
        )
        for r in rows:
            tx.topics += [receiver_topic(r["workspace"], r["receiver"]), task_topic(r["id"])]
        self._notes(
            tx,
            [
                C.expiry_note(r["workspace"], r["id"], r["state"], r["attempt"], r["max_attempts"])
                for r in rows
            ],
        )
        return len(rows)

    def claim(
        self,
        workspace: str,
        receiver: str,
        owner: str,
        *,
        limit: int = 1,
        lease_seconds: float = 30.0,
        actor: str | None = None,
    ) -> list[Lease]:
        if limit < 1:
            return []

        def go(tx: _Tx) -> list[Lease]:
            self._settle_expired(tx, workspace, receiver)
            rows = tx.all(
                "WITH cand AS MATERIALIZED (SELECT t.seq FROM task t"
                "   WHERE t.workspace = %(ws)s AND t.receiver = %(rcv)s AND t.state = 'queued'"
                "     AND t.run_after <= statement_timestamp()"
                "     AND (t.session_key IS NULL OR ("
                "       NOT EXISTS (SELECT 1 FROM task o WHERE o.workspace = t.workspace"
                "         AND o.session_key = t.session_key AND o.state IN ('queued', 'leased')"
                "         AND o.seq < t.seq)"
                "       AND NOT EXISTS (SELECT 1 FROM task h WHERE h.workspace = t.workspace"
                "         AND h.session_key = t.session_key AND h.lease_expires_at IS NOT NULL)))"
                "   ORDER BY t.seq LIMIT %(n)s FOR UPDATE SKIP LOCKED)"
                " UPDATE task t SET state = 'leased', attempt = t.attempt + 1,"
                " lease_epoch = t.lease_epoch + 1, lease_owner = %(owner)s,"
                " leased_at = statement_timestamp(),"
                " lease_expires_at = statement_timestamp() + %(ttl)s * interval '1 millisecond',"
                " updated_at = statement_timestamp()"
                " FROM cand WHERE t.seq = cand.seq AND t.state = 'queued' RETURNING t.*",
                {
                    "owner": owner,
                    "ttl": round(lease_seconds * 1000),
                    "ws": workspace,
                    "rcv": receiver,
                    "n": limit,
                },
            )
            rows.sort(key=lambda r: int(r["seq"]))
            leases = []
            for r in rows:
                task = C.task_from_row(r)
                tx.topics.append(task_topic(task.id))
                leases.append(Lease(task, task.lease_epoch, C.iso(r["lease_expires_at"])))
            if actor is not None:
                self._notes(tx, [C.claim_note(actor, x.task, x.expires_at) for x in leases])
            return leases

        return self._write(go)

    def _why_not(
        self,
        tx: _Tx,
        task_id: str,
        epoch: int,
        done: tuple[str, ...],
        fence: C.Fenced | None = None,
    ) -> Outcome:
        """A fenced write matched nothing: say why (and audit it for ``fence``), and let a
        cancelled task's receiver free its session slot with any write that carries the
        right epoch."""
        row = tx.one(
            "SELECT workspace, receiver, state, lease_epoch, lease_expires_at FROM task"
            " WHERE id = %s FOR UPDATE",
            (task_id,),
        )
        outcome = self._refusal(tx, task_id, row, epoch, done)
        if fence is not None and row is not None:
            note = fence.note(
                row["workspace"], task_id, epoch, outcome, row["state"], row["lease_epoch"]
            )
            self._note(tx, note)
        return outcome

    @staticmethod
    def _refusal(
        tx: _Tx, task_id: str, row: Row | None, epoch: int, done: tuple[str, ...]
    ) -> Outcome:
        """The outcome of a fenced write that matched no live lease, given the task's row."""
        if row is None:
            return Outcome.NOT_FOUND
        if row["lease_epoch"] != epoch:
            return Outcome.LEASE_LOST
        if row["state"] in done:
            return Outcome.DUPLICATE
        if row["state"] == "cancelled" and row["lease_expires_at"] is not None:
            tx.run(
                "UPDATE task SET lease_expires_at = NULL, lease_owner = NULL,"
                " updated_at = statement_timestamp() WHERE id = %s",
                (task_id,),
            )
            tx.topics += [receiver_topic(row["workspace"], row["receiver"]), task_topic(task_id)]
        return Outcome.LEASE_LOST

    def renew(
        self,
        task_id: str,
        epoch: int,
        *,
        lease_seconds: float = 30.0,
        actor: str | None = None,
    ) -> Outcome:
        def go(tx: _Tx) -> Outcome:
            n = tx.run(
                "UPDATE task SET"
                " lease_expires_at = statement_timestamp() + %s * interval '1 millisecond'"
                " WHERE id = %s AND lease_epoch = %s AND state = 'leased'",
                (round(lease_seconds * 1000), task_id, epoch),
            )
            if n == 1:
                return Outcome.OK
            return self._not_live(tx, task_id, epoch, actor, "task.renew")

        return self._write(go)

    def _not_live(
        self, tx: _Tx, task_id: str, epoch: int, actor: str | None, action: str
    ) -> Outcome:
        """A renew/progress found no live lease: NOT_FOUND or LEASE_LOST, audited for
        ``actor``. Unlike :meth:`_why_not` it releases no cancelled slot: these writes
        do not say the receiver has stopped."""
        found = tx.one("SELECT workspace, state, lease_epoch FROM task WHERE id = %s", (task_id,))
        if found is None:
            return Outcome.NOT_FOUND
        if actor is not None:
            fence = C.Fenced(actor, action)
            note = fence.note(
                found["workspace"], task_id, epoch, Outcome.LEASE_LOST, found["state"],
                found["lease_epoch"],
            )  # fmt: skip
            self._note(tx, note)
        return Outcome.LEASE_LOST

    def progress(
        self, task_id: str, epoch: int, kind: str, body: str, *, actor: str | None = None
    ) -> Outcome:
        def go(tx: _Tx) -> Outcome:
            live = tx.one(
                "SELECT workspace FROM task WHERE id = %s AND lease_epoch = %s"
                " AND state = 'leased' FOR SHARE",
                (task_id, epoch),
            )
            if live is None:
                return self._not_live(tx, task_id, epoch, actor, "task.progress")
            self._event(tx, task_id, kind, body)
            if actor is not None:
                fence = C.Fenced(actor, "task.progress", {"kind": kind})
                self._note(tx, fence.note(live["workspace"], task_id, epoch, Outcome.OK))
            return Outcome.OK

        return self._write(go)

    def _complete_rows(
        self,
        tx: _Tx,
        items: Sequence[tuple[str, int, str]],
        state: str,
        actor: str | None = None,
    ) -> list[Outcome]:
        """One UPDATE for the whole batch, answering exactly as the items would be one by one:
        per task the first item whose epoch holds the lease wins; the rest are explained
        (duplicate, lease lost) afterwards."""
        rows = tx.all(
            "WITH v AS (SELECT * FROM unnest(%s::text[], %s::bigint[], %s::text[])"
            "   WITH ORDINALITY AS v(id, ep, res, n)),"
            " pick AS (SELECT DISTINCT ON (v.id) v.id, v.ep, v.res, v.n FROM v"
            "   JOIN task c ON c.id = v.id AND c.lease_epoch = v.ep AND c.state = 'leased'"
            "   ORDER BY v.id, v.n)"
            " UPDATE task t SET state = %s, result = pick.res, lease_owner = NULL,"
            " lease_expires_at = NULL, finished_at = statement_timestamp(),"
            " updated_at = statement_timestamp()"
            " FROM pick WHERE t.id = pick.id AND t.lease_epoch = pick.ep AND t.state = 'leased'"
            " RETURNING t.id, t.workspace, t.receiver, t.session_key, pick.n",
            (
                [i[0] for i in items],
                [i[1] for i in items],
                [i[2] for i in items],
                state,
            ),
        )
        winner = {int(r["n"]) - 1: r for r in rows}
        action = "task.input_required" if state == "input_required" else "task.complete"
        fence = None if actor is None else C.Fenced(actor, action)
        outcomes: list[Outcome] = []
        notes: list[C.Note | None] = []
        for k, (tid, ep, _) in enumerate(items):
            r = winner.get(k)
            if r is None:
                done = ("succeeded", "input_required")
                outcomes.append(self._why_not(tx, tid, ep, done, fence))
                continue
            outcomes.append(Outcome.OK)
            if fence is not None:
                notes.append(fence.note(r["workspace"], tid, ep, Outcome.OK))
            tx.topics.append(task_topic(tid))
            if r["session_key"] is not None:
                tx.topics.append(receiver_topic(r["workspace"], r["receiver"]))
        self._notes(tx, notes)
        return outcomes

    def complete(
        self,
        task_id: str,
        epoch: int,
        result: str,
        *,
        input_required: bool = False,
        actor: str | None = None,
    ) -> Outcome:
        state = "input_required" if input_required else "succeeded"
        item = [(task_id, epoch, result)]
        return self._write(lambda tx: self._complete_rows(tx, item, state, actor))[0]

    def complete_many(
        self, items: Sequence[tuple[str, int, str]], *, actor: str | None = None
    ) -> list[Outcome]:
        if not items:
            return []
        return self._write(lambda tx: self._complete_rows(tx, items, "succeeded", actor))

    def fail(
        self,
        task_id: str,
        epoch: int,
        error: str,
        *,
        retryable: bool = True,
        backoff_seconds: float = 1.0,
        actor: str | None = None,
    ) -> Outcome:
        fence = (
            None
            if actor is None
            else C.Fenced(actor, "task.fail", {"error": error, "retryable": retryable})
        )

        def go(tx: _Tx) -> Outcome:
            row = tx.one(
                "UPDATE task SET"
                " state = CASE WHEN %(retry)s AND attempt < max_attempts THEN 'queued'"
                "   ELSE 'failed' END,"
                " finished_at = CASE WHEN %(retry)s AND attempt < max_attempts THEN NULL"
                "   ELSE statement_timestamp() END,"
                " run_after = statement_timestamp() + %(backoff)s * interval '1 millisecond',"
                " error = %(err)s,"
                " lease_owner = NULL, lease_expires_at = NULL, updated_at = statement_timestamp()"
                " WHERE id = %(id)s AND lease_epoch = %(ep)s AND state = 'leased'"
                " RETURNING workspace, receiver",
                {
                    "retry": retryable,
                    "backoff": max(0, round(backoff_seconds * 1000)),
                    "err": error,
                    "id": task_id,
                    "ep": epoch,
                },
            )
            if row is None:
                return self._why_not(tx, task_id, epoch, ("queued", "failed"), fence)
            if fence is not None:
                self._note(tx, fence.note(row["workspace"], task_id, epoch, Outcome.OK))
            tx.topics += [receiver_topic(row["workspace"], row["receiver"]), task_topic(task_id)]
            return Outcome.OK

        return self._write(go)

    def ack_cancel(self, task_id: str, epoch: int, *, actor: str | None = None) -> Outcome:
        fence = None if actor is None else C.Fenced(actor, "task.cancel_ack")

        def go(tx: _Tx) -> Outcome:
            row = tx.one(
                "UPDATE task SET lease_expires_at = NULL, lease_owner = NULL,"
                " updated_at = statement_timestamp()"
                " WHERE id = %s AND lease_epoch = %s AND state = 'cancelled'"
                " AND lease_expires_at IS NOT NULL RETURNING workspace, receiver",
                (task_id, epoch),
            )
            if row is not None:
                tx.topics += [
                    receiver_topic(row["workspace"], row["receiver"]),
                    task_topic(task_id),
                ]
                if fence is not None:
                    self._note(tx, fence.note(row["workspace"], task_id, epoch, Outcome.OK))
                return Outcome.OK
            return self._why_not(tx, task_id, epoch, ("cancelled",), fence)

        return self._write(go)

    def sweep(self) -> int:
        return self._write(lambda tx: self._settle_expired(tx, None, None))

    # -- test hooks ---------------------------------------------------------------------------
    def expire_leases(self, task_ids: Sequence[str] | None = None) -> int:
        """Make leases (all, or these) expire now, without waiting out a TTL. For tests and
        drills; the next claim or sweep settles them exactly as a real expiry."""
        sql = (
            "UPDATE task SET lease_expires_at = statement_timestamp() - interval '1 millisecond'"
            " WHERE lease_expires_at IS NOT NULL"
        )
        if task_ids is None:
            return self._write(lambda tx: tx.run(sql))
        return self._write(lambda tx: tx.run(sql + " AND id = ANY(%s)", (list(task_ids),)))
