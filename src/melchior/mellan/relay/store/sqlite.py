"""The relay's store on one SQLite file: zero setup, one machine.

Why it is safe with several threads and several processes on one file:
- WAL lets readers run beside the one writer; ``synchronous=FULL`` makes a commit
  survive power loss (in WAL, NORMAL may roll the last commits back), because a
  recorded success must stay recorded;
- every write opens with ``BEGIN IMMEDIATE``, taking the write lock up front, so a
  transaction never fails half-way on a lock upgrade; ``busy_timeout`` queues
  writers instead of failing them;
- each queue step (claim, complete, …) is a single ``UPDATE … RETURNING`` inside that
  transaction, so select-then-update races cannot exist;
- the clock for lease maths is read from SQLite inside the write transaction.

Connections come from a small per-store pool, one thread at a time each.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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

_NOW_MS = "SELECT CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER)"
# Primary result codes that mean "the database could not do it now", not "bad request".
_UNAVAILABLE_CODES = {5, 6, 10, 13, 14, 15, 26}  # BUSY LOCKED IOERR FULL CANTOPEN PROTOCOL NOTADB


@dataclass
class _Tx:
    """One open write transaction: its connection, the DB clock, and wake-ups to send."""

    conn: sqlite3.Connection
    now: int
    topics: list[str] = field(default_factory=list)

    def one(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> sqlite3.Row | None:
        row: sqlite3.Row | None = self.conn.execute(sql, params).fetchone()
        return row

    def all(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> list[sqlite3.Row]:
        return self.conn.execute(sql, params).fetchall()


_GROUP_MAX = 64  # calls per group commit at most, so one group cannot grow forever


@dataclass
class _Group:
    """One open group transaction on the writer connection."""

    conn: sqlite3.Connection
    members: int = 0
    done: threading.Event = field(default_factory=threading.Event)
    error: sqlite3.Error | None = None  # COMMIT failed: nobody's work was written
    poisoned: sqlite3.Error | None = None  # a member could not be undone alone


def _unavailable(exc: sqlite3.Error) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    if code is None:
        return isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc)
    return (int(code) & 0xFF) in _UNAVAILABLE_CODES


class SQLiteStore(ReadQueries):
    """:class:`~melchior.mellan.relay.store.base.Store` on a SQLite file."""

    P = "?"  # the placeholder for the shared reads in ReadQueries
    NOW_SQL = f"({_NOW_MS})"  # now as stored: integer ms since the epoch

    def __init__(
        self,
        path: str | Path,
        *,
        busy_timeout: float = 10.0,
        cancel_grace_seconds: float = 10.0,
        publish: Callable[[str], None] | None = None,
        group_commit: bool = True,
    ) -> None:
        self.path = str(path)
        self.busy_timeout = busy_timeout
        self.cancel_grace_ms = round(cancel_grace_seconds * 1000)
        self._publish = publish
        self._idle: list[sqlite3.Connection] = []
        self._all: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        self._closed = False
        # group commit (see _write_grouped)
        self.group_commit = group_commit
        self._wmutex = threading.Lock()
        self._wcount = threading.Lock()
        self._waiting = 0
        self._group: _Group | None = None
        self._wconn: sqlite3.Connection | None = None
        self.commits = 0  # write transactions committed by this object (for benches)

    # -- plumbing ---------------------------------------------------------------------------
    def _open(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self.path,
            timeout=self.busy_timeout,
            isolation_level=None,  # we issue BEGIN/COMMIT ourselves
            check_same_thread=False,  # the pool hands a connection to one thread at a time
        )
        conn.row_factory = sqlite3.Row
        conn.execute(f"PRAGMA busy_timeout = {round(self.busy_timeout * 1000)}")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = FULL")
        conn.execute("PRAGMA foreign_keys = ON")
        return conn

    @contextmanager
    def _conn(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            if self._closed:
                raise StoreError("store is closed")
            conn = self._idle.pop() if self._idle else None
        if conn is None:
            try:
                conn = self._open()
            except sqlite3.Error as exc:
                raise StoreUnavailable(f"sqlite: cannot open {self.path}: {exc}") from exc
            with self._lock:
                self._all.append(conn)
        try:
            yield conn
        except sqlite3.Error as exc:
            if conn.in_transaction:
                with suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
            if _unavailable(exc):
                raise StoreUnavailable(f"sqlite: {exc}") from exc
            raise
        finally:
            with self._lock:
                if self._closed:
                    conn.close()
                else:
                    self._idle.append(conn)

    @contextmanager
    def _write(self) -> Iterator[_Tx]:
        """A write transaction; wake-ups are published only after COMMIT."""
        if not self.group_commit:
            with self._write_alone() as tx:
                yield tx
            return
        with self._write_grouped() as tx:
            yield tx

    def _writer(self) -> sqlite3.Connection:
        """The connection group transactions run on (only ever under ``_wmutex``)."""
        if self._closed:
            raise StoreError("store is closed")
        if self._wconn is None:
            try:
                self._wconn = self._open()
            except sqlite3.Error as exc:
                raise StoreUnavailable(f"sqlite: cannot open {self.path}: {exc}") from exc
        return self._wconn

    @contextmanager
    def _write_grouped(self) -> Iterator[_Tx]:
        """Group commit: threads that arrive while a transaction is open join it, each in
        its own SAVEPOINT (a failing call undoes only itself), and the last one in commits
        for all — one fsync for the group. Every caller returns only after that COMMIT,
        so "answered" still means "durable"; if the COMMIT fails, every member raises
        StoreUnavailable and nothing of the group was written."""
        with self._wcount:
            self._waiting += 1
        self._wmutex.acquire()
        with self._wcount:
            self._waiting -= 1
        group = self._group
        failure: BaseException | None = None
        tx: _Tx | None = None
        try:
            if group is None:
                conn = self._writer()
                conn.execute("BEGIN IMMEDIATE")
                group = self._group = _Group(conn)
            conn = group.conn
            tx = _Tx(conn, int(conn.execute(_NOW_MS).fetchone()[0]))
            conn.execute("SAVEPOINT call")
        except BaseException as exc:
            if self._group is not None:  # others may wait on it: commit their work now
                self._finish_group(self._group)
            self._wmutex.release()
            if isinstance(exc, sqlite3.Error) and _unavailable(exc):
                raise StoreUnavailable(f"sqlite: {exc}") from exc
            raise
        try:
            yield tx
        except BaseException as exc:
            failure = exc
            try:
                conn.execute("ROLLBACK TO call")
                conn.execute("RELEASE call")
            except sqlite3.Error as undo:  # cannot isolate this call: fail the group
                group.poisoned = undo
        else:
            try:
                conn.execute("RELEASE call")
            except sqlite3.Error as exc:
                group.poisoned = exc
        group.members += 1
        with self._wcount:
            others_coming = self._waiting > 0
        if others_coming and group.members < _GROUP_MAX and group.poisoned is None:
            self._wmutex.release()  # the next one in joins this group and may commit it
            group.done.wait()
        else:
            try:
                self._finish_group(group)
            finally:
                self._wmutex.release()
        if group.error is not None:
            raise StoreUnavailable(f"sqlite: commit failed: {group.error}") from group.error
        if failure is not None:
            if isinstance(failure, sqlite3.Error) and _unavailable(failure):
                raise StoreUnavailable(f"sqlite: {failure}") from failure
            raise failure
        C.publish_all(self._publish, tx.topics)

    def _finish_group(self, group: _Group) -> None:
        """COMMIT (or, if a member could not be isolated, roll back) the open group and
        release everyone waiting on it. Called with ``_wmutex`` held."""
        self._group = None
        try:
            if group.poisoned is not None:
                raise group.poisoned
            group.conn.execute("COMMIT")
            self.commits += 1
        except sqlite3.Error as exc:
            group.error = exc
            with suppress(sqlite3.Error):
                if group.conn.in_transaction:
                    group.conn.execute("ROLLBACK")
        finally:
            group.done.set()

    @contextmanager
    def _write_alone(self) -> Iterator[_Tx]:
        """One ``BEGIN IMMEDIATE`` transaction per call."""
        with self._conn() as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                tx = _Tx(conn, int(conn.execute(_NOW_MS).fetchone()[0]))
                yield tx
                conn.execute("COMMIT")
                with self._lock:
                    self.commits += 1
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
        C.publish_all(self._publish, tx.topics)

    def settle(self, lost: StoreUnavailable, timeout: float = 5.0) -> bool:
        """Nothing to wait for: a SQLite COMMIT has happened or not by the time the call
        returns (there is no connection to lose between the two)."""
        return True

    def _read(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> list[sqlite3.Row]:
        with self._conn() as conn:
            return conn.execute(sql, params).fetchall()

    # -- lifecycle ----------------------------------------------------------------------------
    def migrate(self, target: int | None = None) -> int:
        """Apply versions up to ``target`` (default: latest) in one write transaction each."""
        goal = migrations.LATEST_SQLITE if target is None else target
        while True:
            with self._write() as tx:
                tx.conn.execute(
                    "CREATE TABLE IF NOT EXISTS schema_version"
                    " (version INTEGER PRIMARY KEY, applied_at INTEGER NOT NULL)"
                )
                row = tx.one("SELECT COALESCE(MAX(version), 0) FROM schema_version")
                current = int(row[0]) if row else 0
                if current >= goal:
                    return current
                for stmt in migrations.SQLITE[current]:
                    tx.conn.execute(stmt)
                tx.conn.execute(
                    "INSERT INTO schema_version (version, applied_at) VALUES (?, ?)",
                    (current + 1, tx.now),
                )

    def schema_version(self) -> int:
        rows = self._read(
            "SELECT name FROM sqlite_master WHERE type='table' AND name='schema_version'"
        )
        if not rows:
            return 0
        return int(self._read("SELECT COALESCE(MAX(version), 0) FROM schema_version")[0][0])

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
        with self._wmutex:
            group, self._group = self._group, None
            if group is not None:  # closed under a pending group: it did not commit
                group.error = sqlite3.OperationalError("store closed before commit")
                with suppress(sqlite3.Error):
                    group.conn.execute("ROLLBACK")
                group.done.set()
            if self._wconn is not None:
                self._wconn.close()
                self._wconn = None

    def now(self) -> str:
        return C.iso(int(self._read(_NOW_MS)[0][0]))

    def set_publisher(self, publish: Callable[[str], None] | None) -> None:
        self._publish = publish

    # -- workspaces and credentials -----------------------------------------------------------
    def ensure_workspace(self, workspace: str) -> bool:
        with self._write() as tx:
            cur = tx.conn.execute(
                "INSERT INTO workspace (name, created_at) VALUES (?, ?) ON CONFLICT DO NOTHING",
                (workspace, tx.now),
            )
            return cur.rowcount == 1

    def _need_workspace(self, tx: _Tx, workspace: str) -> None:
        if tx.one("SELECT 1 FROM workspace WHERE name = ?", (workspace,)) is None:
            raise NotFoundError(f"unknown workspace {workspace!r}")

    def add_credential(
        self,
        workspace: str,
        kind: CredentialKind,
        subject: str,
        token_hash: str,
        expires_at: str | None = None,
    ) -> str:
        cid = C.new_id()
        with self._write() as tx:
            self._need_workspace(tx, workspace)
            try:
                tx.conn.execute(
                    "INSERT INTO credential (id, workspace, kind, subject, token_hash,"
                    " created_at, expires_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (
                        cid,
                        workspace,
                        CredentialKind(kind).value,
                        subject,
                        token_hash,
                        tx.now,
                        None if expires_at is None else C.parse_ms(expires_at),
                    ),
                )
            except sqlite3.IntegrityError as exc:
                raise Conflict("credential hash already stored") from exc
        return cid

    def revoke_credential(self, workspace: str, credential_id: str) -> bool:
        with self._write() as tx:
            cur = tx.conn.execute(
                "UPDATE credential SET revoked_at = ? WHERE workspace = ? AND id = ?"
                " AND revoked_at IS NULL",
                (tx.now, workspace, credential_id),
            )
            return cur.rowcount == 1

    # -- agents and enrollment ----------------------------------------------------------------
    def add_agent(
        self, workspace: str, agent_id: str, description: str, capabilities: Sequence[Capability]
    ) -> Agent:
        with self._write() as tx:
            self._need_workspace(tx, workspace)
            try:
                tx.conn.execute(
                    "INSERT INTO agent (workspace, id, description, capabilities, created_at)"
                    " VALUES (?, ?, ?, ?, ?)",
                    (workspace, agent_id, description, C.caps_json(capabilities), tx.now),
                )
            except sqlite3.IntegrityError as exc:
                raise Conflict(f"agent {agent_id!r} already exists") from exc
            return Agent(workspace, agent_id, description, tuple(capabilities), C.iso(tx.now))

    def add_enrollment(
        self, workspace: str, agent_id: str, code_hash: str, expires_at: str
    ) -> None:
        with self._write() as tx:
            if (
                tx.one("SELECT 1 FROM agent WHERE workspace=? AND id=?", (workspace, agent_id))
                is None
            ):
                raise NotFoundError(f"unknown agent {agent_id!r}")
            try:
                tx.conn.execute(
                    "INSERT INTO enrollment (code_hash, workspace, agent_id, created_at,"
                    " expires_at) VALUES (?, ?, ?, ?, ?)",
                    (code_hash, workspace, agent_id, tx.now, C.parse_ms(expires_at)),
                )
            except sqlite3.IntegrityError as exc:
                raise Conflict("enrollment code already stored") from exc

    def redeem_enrollment(self, code_hash: str) -> tuple[str, str] | None:
        with self._write() as tx:
            row = tx.one(
                "UPDATE enrollment SET used_at = ? WHERE code_hash = ? AND used_at IS NULL"
                " AND expires_at > ? RETURNING workspace, agent_id",
                (tx.now, code_hash, tx.now),
            )
            return None if row is None else (row["workspace"], row["agent_id"])

    # -- grants -------------------------------------------------------------------------------
    def add_grant(
        self, workspace: str, caller: str, receiver: str, capabilities: Sequence[str]
    ) -> Grant:
        gid = C.new_id()
        caps = tuple(dict.fromkeys(capabilities))
        with self._write() as tx:
            for agent in (caller, receiver):
                if (
                    tx.one("SELECT 1 FROM agent WHERE workspace=? AND id=?", (workspace, agent))
                    is None
                ):
                    raise NotFoundError(f"unknown agent {agent!r}")
            tx.conn.execute(
                "INSERT INTO agent_grant (id, workspace, caller, receiver, capabilities,"
                " created_at) VALUES (?, ?, ?, ?, ?, ?)",
                (gid, workspace, caller, receiver, json.dumps(list(caps)), tx.now),
            )
            return Grant(gid, workspace, caller, receiver, caps, C.iso(tx.now))

    def revoke_grant(self, workspace: str, grant_id: str) -> bool:
        with self._write() as tx:
            cur = tx.conn.execute(
                "UPDATE agent_grant SET revoked_at = ? WHERE workspace = ? AND id = ?"
                " AND revoked_at IS NULL",
                (tx.now, workspace, grant_id),
            )
            return cur.rowcount == 1

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
        with self._write() as tx:
            tx.topics.append(audit_topic(workspace))
            return self._audit(tx, workspace, actor, action, subject, allowed, rule, reason, detail)

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
        cur = tx.conn.execute(
            "INSERT INTO audit (workspace, at, actor, action, subject, allowed, rule, reason,"
            " detail) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                workspace,
                tx.now,
                actor,
                action,
                subject,
                int(allowed),
                rule,
                reason,
                json.dumps(detail or {}),
            ),
        )
        return int(cur.lastrowid or 0)

    def _note(self, tx: _Tx, note: C.Note | None) -> None:
        """Write ``note`` in the open transaction: it commits with the change it records."""
        self._notes(tx, [note])

    @staticmethod
    def _notes(tx: _Tx, notes: Sequence[C.Note | None]) -> None:
        """Write several records with one prepared statement (a claim of 50 writes 50)."""
        rows = [
            (n.workspace, tx.now, n.actor, n.action, n.subject, int(n.allowed), n.rule,
             n.reason, json.dumps(n.detail))
            for n in notes
            if n is not None
        ]  # fmt: skip
        if not rows:
            return
        tx.conn.executemany(
            "INSERT INTO audit (workspace, at, actor, action, subject, allowed, rule, reason,"
            " detail) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            rows,
        )
        tx.topics += [audit_topic(w) for w in dict.fromkeys(r[0] for r in rows)]

    # -- tasks: caller side -------------------------------------------------------------------
    def enqueue(self, task: NewTask) -> tuple[Task, bool]:
        return self.enqueue_many([task])[0]

    def enqueue_many(self, tasks: Sequence[NewTask]) -> list[tuple[Task, bool]]:
        if any(t.max_attempts < 1 for t in tasks):
            raise ValueError("max_attempts must be at least 1")
        if not tasks:
            return []
        with self._write() as tx:
            out = [self._enqueue(tx, t) for t in tasks]
            self._notes(
                tx,
                [C.accept_note(t, n.accept) for n, (t, new) in zip(tasks, out, strict=True) if new],
            )
            return out

    def _enqueue(self, tx: _Tx, task: NewTask) -> tuple[Task, bool]:
        row = tx.one(
            "INSERT INTO task (id, workspace, caller, receiver, capability, context_id,"
            " state, payload, metadata, message_id, session_key, chain, hop, path,"
            " max_attempts, run_after, created_at, updated_at)"
            " VALUES (?, ?, ?, ?, ?, ?, 'queued', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
            " ON CONFLICT DO NOTHING RETURNING *",
            (
                C.new_id(),
                task.workspace,
                task.caller,
                task.receiver,
                task.capability,
                task.context_id or C.new_id(),
                task.payload,
                task.metadata,
                task.message_id,
                task.session_key,
                task.chain,
                task.hop,
                json.dumps(list(task.path)),
                task.max_attempts,
                tx.now,
                tx.now,
                tx.now,
            ),
        )
        if row is not None:
            tx.topics += [receiver_topic(task.workspace, task.receiver), task_topic(row["id"])]
            return C.task_from_row(row), True
        existing = tx.one(
            "SELECT * FROM task WHERE workspace = ? AND caller = ? AND message_id = ?",
            (task.workspace, task.caller, task.message_id),
        )
        if existing is None:  # only a dedupe hit can suppress the insert
            raise StoreError("enqueue: insert suppressed without a duplicate")
        return C.task_from_row(existing), False

    def cancel(
        self, workspace: str, task_id: str, *, actor: str | None = None, rule: str = "caller"
    ) -> tuple[Task | None, Outcome]:
        with self._write() as tx:
            if actor is None:
                return self._cancel(tx, workspace, task_id)
            before = tx.one(
                "SELECT state FROM task WHERE workspace = ? AND id = ?", (workspace, task_id)
            )  # under the write lock: the state the cancel below acts on
            task, outcome = self._cancel(tx, workspace, task_id)
            if task is not None and before is not None:
                self._note(tx, C.cancel_note(actor, rule, before["state"], task, outcome))
            return task, outcome

    def _cancel(self, tx: _Tx, workspace: str, task_id: str) -> tuple[Task | None, Outcome]:
        row = tx.one(
            "UPDATE task SET state = 'cancelled', updated_at = :now, finished_at = :now,"
            " lease_expires_at = CASE WHEN state = 'leased'"
            "   THEN MIN(lease_expires_at, :now + :grace) END,"
            " lease_owner = CASE WHEN state = 'leased' THEN lease_owner END"
            " WHERE workspace = :ws AND id = :id"
            "   AND state IN ('queued', 'leased', 'input_required') RETURNING *",
            {"now": tx.now, "grace": self.cancel_grace_ms, "ws": workspace, "id": task_id},
        )
        if row is not None:
            tx.topics += [receiver_topic(workspace, row["receiver"]), task_topic(task_id)]
            return C.task_from_row(row), Outcome.OK
        row = tx.one("SELECT * FROM task WHERE workspace = ? AND id = ?", (workspace, task_id))
        if row is None:
            return None, Outcome.NOT_FOUND
        task = C.task_from_row(row)
        dup = task.state is TaskState.CANCELLED
        return task, Outcome.DUPLICATE if dup else Outcome.LEASE_LOST

    def append_event(self, task_id: str, kind: str, body: str) -> TaskEvent:
        with self._write() as tx:
            if tx.one("SELECT 1 FROM task WHERE id = ?", (task_id,)) is None:
                raise NotFoundError(f"unknown task {task_id!r}")
            return self._event(tx, task_id, kind, body)

    @staticmethod
    def _event(tx: _Tx, task_id: str, kind: str, body: str) -> TaskEvent:
        row = tx.one(
            "INSERT INTO task_event (task_id, at, kind, body) VALUES (?, ?, ?, ?) RETURNING *",
            (task_id, tx.now, kind, body),
        )
        assert row is not None
        tx.topics.append(task_topic(task_id))
        return C.event_from_row(row)

    # -- tasks: receiver side -----------------------------------------------------------------
    def _settle_expired(self, tx: _Tx, workspace: str | None, receiver: str | None) -> int:
        """Expired holds: leased → queued (epoch bumped) or failed when attempts are spent;
        cancelled-in-grace → slot released. Lease losses are audited here, because only the
        store sees them happen."""
        where = "lease_expires_at IS NOT NULL AND lease_expires_at <= :now"
        params: dict[str, Any] = {"now": tx.now}
        if workspace is not None:
            where += " AND workspace = :ws AND receiver = :rcv"
            params |= {"ws": workspace, "rcv": receiver}
        rows = tx.all(
            "UPDATE task SET"
            " state = CASE WHEN state <> 'leased' THEN state"
            "   WHEN attempt >= max_attempts THEN 'failed' ELSE 'queued' END,"
            " lease_epoch = CASE WHEN state = 'leased' THEN lease_epoch + 1 ELSE lease_epoch END,"
            " error = CASE WHEN state = 'leased' THEN 'lease expired' ELSE error END,"
            " finished_at = CASE WHEN state = 'leased' AND attempt >= max_attempts"
            "   THEN :now ELSE finished_at END,"
            " run_after = CASE WHEN state = 'leased' THEN :now ELSE run_after END,"
            " lease_owner = NULL, lease_expires_at = NULL, updated_at = :now"
            f" WHERE seq IN (SELECT seq FROM task WHERE {where} LIMIT 500)"
            " RETURNING id, workspace, receiver, state, attempt, max_attempts, lease_epoch",
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
        with self._write() as tx:
            self._settle_expired(tx, workspace, receiver)
            rows = tx.all(
                "UPDATE task SET state = 'leased', attempt = attempt + 1,"
                " lease_epoch = lease_epoch + 1, lease_owner = :owner, leased_at = :now,"
                " lease_expires_at = :now + :ttl, updated_at = :now"
                " WHERE seq IN (SELECT t.seq FROM task t"
                "   WHERE t.workspace = :ws AND t.receiver = :rcv AND t.state = 'queued'"
                "     AND t.run_after <= :now"
                "     AND (t.session_key IS NULL OR ("
                "       NOT EXISTS (SELECT 1 FROM task o WHERE o.workspace = t.workspace"
                "         AND o.session_key = t.session_key AND o.state IN ('queued', 'leased')"
                "         AND o.seq < t.seq)"
                "       AND NOT EXISTS (SELECT 1 FROM task h WHERE h.workspace = t.workspace"
                "         AND h.session_key = t.session_key AND h.lease_expires_at IS NOT NULL)))"
                "   ORDER BY t.seq LIMIT :n)"
                " RETURNING *",
                {
                    "owner": owner,
                    "now": tx.now,
                    "ttl": round(lease_seconds * 1000),
                    "ws": workspace,
                    "rcv": receiver,
                    "n": limit,
                },
            )
            rows.sort(key=lambda r: r["seq"])
            leases = []
            for r in rows:
                task = C.task_from_row(r)
                tx.topics.append(task_topic(task.id))
                leases.append(Lease(task, task.lease_epoch, C.iso(r["lease_expires_at"])))
            if actor is not None:
                self._notes(tx, [C.claim_note(actor, x.task, x.expires_at) for x in leases])
            return leases

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
        row = tx.one("SELECT * FROM task WHERE id = ?", (task_id,))
        outcome = self._refusal(tx, row, epoch, done)
        if fence is not None and row is not None:
            note = fence.note(
                row["workspace"], task_id, epoch, outcome, row["state"], row["lease_epoch"]
            )
            self._note(tx, note)
        return outcome

    def _refusal(
        self, tx: _Tx, row: sqlite3.Row | None, epoch: int, done: tuple[str, ...]
    ) -> Outcome:
        """The outcome of a fenced write that matched no live lease, given the task's row."""
        if row is None:
            return Outcome.NOT_FOUND
        task_id = row["id"]
        if row["lease_epoch"] != epoch:
            return Outcome.LEASE_LOST
        if row["state"] in done:
            return Outcome.DUPLICATE
        if row["state"] == "cancelled" and row["lease_expires_at"] is not None:
            tx.conn.execute(
                "UPDATE task SET lease_expires_at = NULL, lease_owner = NULL, updated_at = ?"
                " WHERE id = ?",
                (tx.now, task_id),
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
        with self._write() as tx:
            row = tx.one(
                "UPDATE task SET lease_expires_at = :now + :ttl"
                " WHERE id = :id AND lease_epoch = :ep AND state = 'leased' RETURNING seq",
                {"now": tx.now, "ttl": round(lease_seconds * 1000), "id": task_id, "ep": epoch},
            )
            if row is not None:
                return Outcome.OK
            return self._not_live(tx, task_id, epoch, actor, "task.renew")

    def _not_live(
        self, tx: _Tx, task_id: str, epoch: int, actor: str | None, action: str
    ) -> Outcome:
        """A renew/progress found no live lease: NOT_FOUND or LEASE_LOST, audited for
        ``actor``. Unlike :meth:`_why_not` it releases no cancelled slot: these writes
        do not say the receiver has stopped."""
        found = tx.one("SELECT workspace, state, lease_epoch FROM task WHERE id = ?", (task_id,))
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
        with self._write() as tx:
            live = tx.one(
                "SELECT workspace FROM task WHERE id = ? AND lease_epoch = ? AND state = 'leased'",
                (task_id, epoch),
            )
            if live is None:
                return self._not_live(tx, task_id, epoch, actor, "task.progress")
            self._event(tx, task_id, kind, body)
            if actor is not None:
                fence = C.Fenced(actor, "task.progress", {"kind": kind})
                self._note(tx, fence.note(live["workspace"], task_id, epoch, Outcome.OK))
            return Outcome.OK

    def _complete(
        self,
        tx: _Tx,
        task_id: str,
        epoch: int,
        result: str,
        state: str,
        actor: str | None = None,
        pending: list[C.Note] | None = None,
    ) -> Outcome:
        """Record one success; with ``pending`` its audit record is appended there for the
        caller to write with the rest of a batch, else it is written now."""
        action = "task.input_required" if state == "input_required" else "task.complete"
        fence = None if actor is None else C.Fenced(actor, action)
        row = tx.one(
            "UPDATE task SET state = :st, result = :res, lease_owner = NULL,"
            " lease_expires_at = NULL, finished_at = :now, updated_at = :now"
            " WHERE id = :id AND lease_epoch = :ep AND state = 'leased'"
            " RETURNING workspace, receiver, session_key",
            {"st": state, "res": result, "now": tx.now, "id": task_id, "ep": epoch},
        )
        if row is None:
            return self._why_not(tx, task_id, epoch, ("succeeded", "input_required"), fence)
        note = None if fence is None else fence.note(row["workspace"], task_id, epoch, Outcome.OK)
        if pending is not None and note is not None:
            pending.append(note)
        else:
            self._note(tx, note)
        tx.topics.append(task_topic(task_id))
        if row["session_key"] is not None:  # the session's next task may be claimable now
            tx.topics.append(receiver_topic(row["workspace"], row["receiver"]))
        return Outcome.OK

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
        with self._write() as tx:
            return self._complete(tx, task_id, epoch, result, state, actor)

    def complete_many(
        self, items: Sequence[tuple[str, int, str]], *, actor: str | None = None
    ) -> list[Outcome]:
        if not items:
            return []
        with self._write() as tx:
            notes: list[C.Note] = []
            out = [
                self._complete(tx, tid, ep, res, "succeeded", actor, notes)
                for tid, ep, res in items
            ]
            self._notes(tx, notes)
            return out

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
        with self._write() as tx:
            row = tx.one(
                "UPDATE task SET"
                " state = CASE WHEN :retry AND attempt < max_attempts THEN 'queued'"
                "   ELSE 'failed' END,"
                " finished_at = CASE WHEN :retry AND attempt < max_attempts THEN NULL"
                "   ELSE :now END,"
                " run_after = :now + :backoff, error = :err, lease_owner = NULL,"
                " lease_expires_at = NULL, updated_at = :now"
                " WHERE id = :id AND lease_epoch = :ep AND state = 'leased'"
                " RETURNING workspace, receiver",
                {
                    "retry": int(retryable),
                    "now": tx.now,
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

    def ack_cancel(self, task_id: str, epoch: int, *, actor: str | None = None) -> Outcome:
        fence = None if actor is None else C.Fenced(actor, "task.cancel_ack")
        with self._write() as tx:
            row = tx.one(
                "UPDATE task SET lease_expires_at = NULL, lease_owner = NULL, updated_at = ?"
                " WHERE id = ? AND lease_epoch = ? AND state = 'cancelled'"
                " AND lease_expires_at IS NOT NULL RETURNING workspace, receiver",
                (tx.now, task_id, epoch),
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

    def sweep(self) -> int:
        with self._write() as tx:
            return self._settle_expired(tx, None, None)

    # -- test hooks ---------------------------------------------------------------------------
    def expire_leases(self, task_ids: Sequence[str] | None = None) -> int:
        """Make leases (all, or these) expire now, without waiting out a TTL. For tests and
        drills; the next claim or sweep settles them exactly as a real expiry."""
        with self._write() as tx:
            sql = "UPDATE task SET lease_expires_at = ? WHERE lease_expires_at IS NOT NULL"
            params: list[Any] = [tx.now - 1]
            if task_ids is not None:
                sql += f" AND id IN ({','.join('?' * len(task_ids))})"
                params += list(task_ids)
            return tx.conn.execute(sql, params).rowcount
