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
from typing import Any, ClassVar, TypeVar

from melchior.mellan.relay.store import _common as C
from melchior.mellan.relay.store import migrations
from melchior.mellan.relay.store._statements import SQLITE, SharedTx, Statements
from melchior.mellan.relay.store.base import (
    Chained,
    NewPush,
    NewRoute,
    NewTask,
    StoreError,
    StoreUnavailable,
)
from melchior.mellan.relay.store.queue import QueueStore, Tx

T = TypeVar("T")
_NOW_MS = "SELECT CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER)"
# Primary result codes that mean "the database could not do it now", not "bad request".
_UNAVAILABLE_CODES = {5, 6, 10, 13, 14, 15, 26}  # BUSY LOCKED IOERR FULL CANTOPEN PROTOCOL NOTADB


@dataclass
class _Tx(SharedTx):
    """One open write transaction: its connection, the DB clock read inside it, the
    wake-ups to send after COMMIT, and the queue's named statements in SQLite's dialect
    (see :class:`~melchior.mellan.relay.store.queue.Tx`; the rules are all there)."""

    SQL: ClassVar[Statements] = SQLITE
    conn: sqlite3.Connection
    now: int
    grace_ms: int = 0
    topics: list[str] = field(default_factory=list)
    tallies: list[str] = field(default_factory=list)
    written: list[Chained] = field(default_factory=list)

    def one(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> sqlite3.Row | None:
        row: sqlite3.Row | None = self.conn.execute(sql, params).fetchone()
        return row

    def all(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> list[sqlite3.Row]:
        return self.conn.execute(sql, params).fetchall()

    def run(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> int:
        return self.conn.execute(sql, params).rowcount

    # -- control plane --------------------------------------------------------------------
    def workspace_exists(self, workspace: str) -> bool:
        return self.one("SELECT 1 FROM workspace WHERE name = ?", (workspace,)) is not None

    def insert_workspace(self, workspace: str) -> bool:
        sql = "INSERT INTO workspace (name, created_at) VALUES (?, ?) ON CONFLICT DO NOTHING"
        return self.run(sql, (workspace, self.now)) == 1

    def agent_exists(self, workspace: str, agent_id: str) -> bool:
        sql = "SELECT 1 FROM agent WHERE workspace = ? AND id = ?"
        return self.one(sql, (workspace, agent_id)) is not None

    def insert_credential(
        self, cid: str, workspace: str, kind: str, subject: str, token_hash: str,
        expires_at: str | None,
    ) -> bool:  # fmt: skip
        expires = None if expires_at is None else C.parse_ms(expires_at)
        return (
            self.run(
                "INSERT INTO credential (id, workspace, kind, subject, token_hash, created_at,"
                " expires_at) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (token_hash) DO NOTHING",
                (cid, workspace, kind, subject, token_hash, self.now, expires),
            )
            == 1
        )

    def revoke_credential(self, workspace: str, credential_id: str) -> bool:
        return (
            self.run(
                "UPDATE credential SET revoked_at = ? WHERE workspace = ? AND id = ?"
                " AND revoked_at IS NULL",
                (self.now, workspace, credential_id),
            )
            == 1
        )

    def insert_agent(
        self, workspace: str, agent_id: str, description: str, capabilities: str
    ) -> sqlite3.Row | None:
        return self.one(
            "INSERT INTO agent (workspace, id, description, capabilities, created_at)"
            " VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING RETURNING *",
            (workspace, agent_id, description, capabilities, self.now),
        )

    def insert_enrollment(
        self, code_hash: str, workspace: str, agent_id: str, expires_at: str
    ) -> bool:
        return (
            self.run(
                "INSERT INTO enrollment (code_hash, workspace, agent_id, created_at, expires_at)"
                " VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                (code_hash, workspace, agent_id, self.now, C.parse_ms(expires_at)),
            )
            == 1
        )

    def redeem_enrollment(self, code_hash: str) -> sqlite3.Row | None:
        return self.one(
            "UPDATE enrollment SET used_at = ? WHERE code_hash = ? AND used_at IS NULL"
            " AND expires_at > ? RETURNING workspace, agent_id",
            (self.now, code_hash, self.now),
        )

    def insert_grant(
        self, gid: str, workspace: str, caller: str, receiver: str, capabilities: str
    ) -> sqlite3.Row:
        row = self.one(
            "INSERT INTO agent_grant (id, workspace, caller, receiver, capabilities,"
            " created_at) VALUES (?, ?, ?, ?, ?, ?) RETURNING *",
            (gid, workspace, caller, receiver, capabilities, self.now),
        )
        assert row is not None
        return row

    def revoke_grant(self, workspace: str, grant_id: str) -> bool:
        return (
            self.run(
                "UPDATE agent_grant SET revoked_at = ? WHERE workspace = ? AND id = ?"
                " AND revoked_at IS NULL",
                (self.now, workspace, grant_id),
            )
            == 1
        )

    def insert_audit(self, notes: Sequence[C.Note]) -> list[int]:
        """One prepared statement, one row each (a claim of 50 writes 50)."""
        seqs = []
        for n in notes:
            row = self.one(
                "INSERT INTO audit (workspace, at, actor, action, subject, allowed, rule,"
                " reason, detail, request_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING seq",
                (n.workspace, self.now, n.actor, n.action, n.subject, int(n.allowed), n.rule,
                 n.reason, json.dumps(n.detail), n.request_id),
            )  # fmt: skip
            assert row is not None
            seqs.append(int(row[0]))
        return seqs

    # -- tasks --------------------------------------------------------------------------------
    def insert_messages(self, rows: Sequence[tuple[str, str, str, str, int]]) -> list[bool]:
        return [
            self.run(
                "INSERT INTO task_message (workspace, caller, message_id, task_id, turn)"
                " VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                row,
            )
            == 1
            for row in rows
        ]

    def known_messages(self, keys: Sequence[tuple[str, str, str]]) -> set[tuple[str, str, str]]:
        """Which (workspace, caller, message id)s the ledger already holds (in-process
        reads: one prepared statement each is as cheap as one query here)."""
        return {k for k in keys if self.message_ref(*k) is not None}

    def insert_tasks(self, tasks: Sequence[tuple[str, NewTask]]) -> list[sqlite3.Row | None]:
        """One prepared INSERT per task; a dedupe hit inserts nothing and answers None."""
        rows: list[sqlite3.Row | None] = []
        for tid, t in tasks:
            values = (
                tid, t.workspace, t.caller, t.receiver, t.capability,
                t.context_id or C.new_id(), t.payload, t.metadata, t.message_id,
                t.session_key, t.chain, t.hop, json.dumps(list(t.path)), t.max_attempts,
                self.now, self.now, self.now,
            )  # fmt: skip
            rows.append(
                self.one(
                    "INSERT INTO task (id, workspace, caller, receiver, capability, context_id,"
                    " state, payload, metadata, message_id, session_key, chain, hop, path,"
                    " max_attempts, run_after, created_at, updated_at)"
                    " VALUES (?, ?, ?, ?, ?, ?, 'queued', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
                    " ON CONFLICT DO NOTHING RETURNING *",
                    values,
                )
            )
        return rows

    # -- send limits ----------------------------------------------------------------------
    def lock_receivers(self, keys: Sequence[tuple[str, str]]) -> None:
        """Nothing to take: BEGIN IMMEDIATE already made this the only writer."""

    def count_unfinished(self, workspace: str, caller: str, receiver: str, upto: int) -> int:
        """From the counter the schema keeps (v10): no backlog read."""
        row = self.one(
            "SELECT COALESCE(sum(n), 0) FROM caller_unfinished"
            " WHERE workspace = ? AND receiver = ? AND caller = ?",
            (workspace, receiver, caller),
        )
        return min(int(row[0]) if row else 0, upto)

    def count_queued(self, workspace: str, receiver: str, upto: int) -> int:
        row = self.one(
            "SELECT COALESCE(sum(n), 0) FROM receiver_queued WHERE workspace = ? AND receiver = ?",
            (workspace, receiver),
        )
        return min(int(row[0]) if row else 0, upto)

    def upsert_limits(self, workspace: str, agent: str, values: Sequence[Any]) -> None:
        self.run(
            "INSERT INTO agent_limits (workspace, agent, send_rate, burst,"
            " max_unfinished_per_receiver, max_queued, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (workspace, agent) DO UPDATE SET"
            " send_rate = COALESCE(excluded.send_rate, send_rate),"
            " burst = COALESCE(excluded.burst, burst),"
            " max_unfinished_per_receiver = COALESCE(excluded.max_unfinished_per_receiver,"
            " max_unfinished_per_receiver),"
            " max_queued = COALESCE(excluded.max_queued, max_queued),"
            " updated_at = excluded.updated_at",
            (workspace, agent, *values, self.now),
        )

    def next_turn(
        self, task_id: str, payload: str, chain: str, hop: int, path: str
    ) -> sqlite3.Row | None:
        return self.one(
            "UPDATE task SET state = 'queued', turn = turn + 1, payload = :payload,"
            " chain = :chain, hop = :hop, path = :path, result = NULL, error = NULL,"
            " attempt = 0, run_after = :now, finished_at = NULL, lease_owner = NULL,"
            " lease_expires_at = NULL, updated_at = :now"
            " WHERE id = :id AND state = 'input_required' RETURNING *",
            {"payload": payload, "chain": chain, "hop": hop, "path": path, "now": self.now,
             "id": task_id},
        )  # fmt: skip

    def task_by_message(
        self, workspace: str, caller: str, message_id: str | None
    ) -> sqlite3.Row | None:
        return self.one(
            "SELECT * FROM task WHERE workspace = ? AND caller = ? AND message_id = ?",
            (workspace, caller, message_id),
        )

    def task_row(self, task_id: str, workspace: str | None = None) -> sqlite3.Row | None:
        if workspace is None:
            return self.one("SELECT * FROM task WHERE id = ?", (task_id,))
        return self.one("SELECT * FROM task WHERE workspace = ? AND id = ?", (workspace, task_id))

    def lock_task(self, task_id: str, workspace: str | None = None) -> sqlite3.Row | None:
        """Every write transaction holds SQLite's one write lock: a read is already locked."""
        return self.task_row(task_id, workspace)

    def cancel_task(self, workspace: str, task_id: str, grace_ms: int) -> sqlite3.Row | None:
        return self.one(
            "UPDATE task SET state = 'cancelled', updated_at = :now, finished_at = :now,"
            " lease_expires_at = CASE WHEN state = 'leased'"
            "   THEN MIN(lease_expires_at, :now + :grace) END,"
            " lease_owner = CASE WHEN state = 'leased' THEN lease_owner END"
            " WHERE workspace = :ws AND id = :id"
            "   AND state IN ('queued', 'leased', 'input_required') RETURNING *",
            {"now": self.now, "grace": grace_ms, "ws": workspace, "id": task_id},
        )

    def insert_event(self, task_id: str, kind: str, body: str) -> sqlite3.Row:
        row = self.one(
            "INSERT INTO task_event (task_id, at, kind, body, turn)"
            " SELECT ?, ?, ?, ?, turn FROM task WHERE id = ?"
            " RETURNING *, (SELECT COALESCE(MAX(e.seq), 0) FROM task_event e"
            " WHERE e.task_id = task_event.task_id AND e.seq < task_event.seq) AS prev",
            (task_id, self.now, kind, body, task_id),
        )
        assert row is not None
        return row

    def settle_expired(self, workspace: str | None, receiver: str | None) -> list[sqlite3.Row]:
        where = "lease_expires_at IS NOT NULL AND lease_expires_at <= :now"
        params: dict[str, Any] = {"now": self.now}
        if workspace is not None:
            where += " AND workspace = :ws AND receiver = :rcv"
            params |= {"ws": workspace, "rcv": receiver}
        return self.all(
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

    def claim(
        self, workspace: str, receiver: str, owner: str, limit: int, ttl_ms: int
    ) -> list[sqlite3.Row]:
        return self.all(
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
            {"owner": owner, "now": self.now, "ttl": ttl_ms, "ws": workspace, "rcv": receiver,
             "n": limit},
        )  # fmt: skip

    def renew(self, task_id: str, epoch: int, ttl_ms: int) -> bool:
        return (
            self.run(
                "UPDATE task SET lease_expires_at = :now + :ttl"
                " WHERE id = :id AND lease_epoch = :ep AND state = 'leased'",
                {"now": self.now, "ttl": ttl_ms, "id": task_id, "ep": epoch},
            )
            == 1
        )

    def live_lease(self, task_id: str, epoch: int) -> sqlite3.Row | None:
        return self.one(
            "SELECT workspace FROM task WHERE id = ? AND lease_epoch = ? AND state = 'leased'",
            (task_id, epoch),
        )

    def complete(self, items: Sequence[tuple[str, int, str]], state: str) -> dict[int, sqlite3.Row]:
        """One prepared UPDATE per item, in order: the first whose epoch holds wins."""
        winners: dict[int, sqlite3.Row] = {}
        for k, (task_id, epoch, result) in enumerate(items):
            row = self.one(
                "UPDATE task SET state = :st, result = :res, lease_owner = NULL,"
                " lease_expires_at = NULL, finished_at = :now, updated_at = :now"
                " WHERE id = :id AND lease_epoch = :ep AND state = 'leased'"
                " RETURNING workspace, receiver, session_key, attempt",
                {"st": state, "res": result, "now": self.now, "id": task_id, "ep": epoch},
            )
            if row is not None:
                winners[k] = row
        return winners

    def fail(
        self, task_id: str, epoch: int, error: str, retry: bool, backoff_ms: int
    ) -> sqlite3.Row | None:
        return self.one(
            "UPDATE task SET"
            " state = CASE WHEN :retry AND attempt < max_attempts THEN 'queued'"
            "   ELSE 'failed' END,"
            " finished_at = CASE WHEN :retry AND attempt < max_attempts THEN NULL"
            "   ELSE :now END,"
            " run_after = :now + :backoff, error = :err, lease_owner = NULL,"
            " lease_expires_at = NULL, updated_at = :now"
            " WHERE id = :id AND lease_epoch = :ep AND state = 'leased'"
            " RETURNING workspace, receiver, state, attempt",
            {"retry": int(retry), "now": self.now, "backoff": backoff_ms, "err": error,
             "id": task_id, "ep": epoch},
        )  # fmt: skip

    def ack_cancel(self, task_id: str, epoch: int) -> sqlite3.Row | None:
        return self.one(
            "UPDATE task SET lease_expires_at = NULL, lease_owner = NULL, updated_at = ?"
            " WHERE id = ? AND lease_epoch = ? AND state = 'cancelled'"
            " AND lease_expires_at IS NOT NULL RETURNING workspace, receiver",
            (self.now, task_id, epoch),
        )

    def release_cancelled(self, task_id: str) -> None:
        self.run(
            "UPDATE task SET lease_expires_at = NULL, lease_owner = NULL, updated_at = ?"
            " WHERE id = ?",
            (self.now, task_id),
        )

    def expire_leases(self, task_ids: Sequence[str] | None) -> int:
        sql = "UPDATE task SET lease_expires_at = ? WHERE lease_expires_at IS NOT NULL"
        params: list[Any] = [self.now - 1]
        if task_ids is not None:
            sql += f" AND id IN ({','.join('?' * len(task_ids))})"
            params += list(task_ids)
        return self.run(sql, params)

    # -- the dashboard --------------------------------------------------------------------
    def insert_session(
        self, id_hash: str, workspace: str, credential_id: str, idle_ms: int, max_ms: int
    ) -> None:
        self.run(
            "INSERT INTO dashboard_session (id_hash, workspace, credential_id, created_at,"
            " last_seen_at, idle_expires_at, expires_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (id_hash, workspace, credential_id, self.now, self.now,
             self.now + min(idle_ms, max_ms), self.now + max_ms),
        )  # fmt: skip

    def touch_session(self, id_hash: str, idle_ms: int, every_ms: int) -> bool:
        return (
            self.run(
                "UPDATE dashboard_session SET last_seen_at = :now,"
                " idle_expires_at = MIN(:now + :idle, expires_at)"
                " WHERE id_hash = :h AND last_seen_at <= :now - :every"
                " AND idle_expires_at > :now AND expires_at > :now",
                {"now": self.now, "idle": idle_ms, "h": id_hash, "every": every_ms},
            )
            == 1
        )

    def delete_expired_sessions(self, limit: int) -> int:
        return self.run(
            "DELETE FROM dashboard_session WHERE id_hash IN (SELECT id_hash FROM"
            " dashboard_session WHERE expires_at <= ? LIMIT ?)",
            (self.now, limit),
        )

    def expire_sessions(self, id_hashes: Sequence[str] | None) -> int:
        sql = "UPDATE dashboard_session SET idle_expires_at = ?"
        params: list[Any] = [self.now - 1]
        if id_hashes is not None:
            sql += f" WHERE id_hash IN ({','.join('?' * len(id_hashes))})"
            params += list(id_hashes)
        return self.run(sql, params)

    def revoke_enrollment(self, workspace: str, code_hash: str) -> sqlite3.Row | None:
        return self.one(
            "UPDATE enrollment SET expires_at = :now WHERE workspace = :ws AND code_hash = :h"
            " AND used_at IS NULL AND expires_at > :now RETURNING agent_id",
            {"now": self.now, "ws": workspace, "h": code_hash},
        )

    # -- task routes, receivers, wake-ups (rules: store/routes.py) --------------------------
    def insert_route(self, route_id: str, route: NewRoute) -> sqlite3.Row:
        row = self.one(
            "INSERT INTO task_route (id, workspace, agent, capability, adapter, session, cwd,"
            " profile, options, state, proposed_at, proposed_by)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 'pending', ?, ?) RETURNING *",
            (route_id, route.workspace, route.agent, route.capability, route.adapter,
             route.session, route.cwd, route.profile, route.options, self.now,
             route.proposed_by),
        )  # fmt: skip
        assert row is not None
        return row

    def route_row(self, workspace: str, route_id: str) -> sqlite3.Row | None:
        sql = "SELECT * FROM task_route WHERE workspace = ? AND id = ?"
        return self.one(sql, (workspace, route_id))

    def route_to(
        self, workspace: str, route_id: str, state: str, by: str, from_states: Sequence[str]
    ) -> sqlite3.Row | None:
        col = "approved" if state == "approved" else "revoked"
        marks = ", ".join("?" * len(from_states))
        return self.one(
            f"UPDATE task_route SET state = ?, {col}_at = ?, {col}_by = ?"
            f" WHERE workspace = ? AND id = ? AND state IN ({marks}) RETURNING *",
            (state, self.now, by, workspace, route_id, *from_states),
        )

    def supersede_routes(
        self, workspace: str, agent: str, capability: str, keep: str, by: str
    ) -> list[sqlite3.Row]:
        return self.all(
            "UPDATE task_route SET state = 'revoked', revoked_at = ?, revoked_by = ?"
            " WHERE workspace = ? AND agent = ? AND capability = ? AND state = 'approved'"
            " AND id <> ? RETURNING *",
            (self.now, by, workspace, agent, capability, keep),
        )

    def touch_receiver(self, workspace: str, agent: str, info: str | None) -> bool:
        return (
            self.run(
                "UPDATE agent SET receiver_seen_at = ?,"
                " receiver_info = COALESCE(?, receiver_info) WHERE workspace = ? AND id = ?",
                (self.now, info, workspace, agent),
            )
            == 1
        )

    # -- push notifications (rules: store/outbox.py) ----------------------------------------
    def task_mark(self, workspace: str, task_id: str) -> sqlite3.Row | None:
        return self.one(
            "SELECT state, turn, (SELECT COALESCE(MAX(e.seq), 0) FROM task_event e"
            " WHERE e.task_id = t.id) AS seq FROM task t WHERE t.workspace = ? AND t.id = ?",
            (workspace, task_id),
        )

    def push_config_exists(self, task_id: str, config_id: str) -> bool:
        sql = "SELECT 1 FROM push_config WHERE task_id = ? AND id = ?"
        return self.one(sql, (task_id, config_id)) is not None

    def upsert_push_config(
        self, task_id: str, config_id: str, workspace: str, caller: str, push: NewPush,
        mark: C.RowLike | None,
    ) -> sqlite3.Row:  # fmt: skip
        row = self.one(
            "INSERT INTO push_config (task_id, id, workspace, caller, url, token, auth_scheme,"
            " auth_credentials, created_at, mark_state, mark_turn, mark_seq, n)"
            " VALUES (:task, :id, :ws, :caller, :url, :token, :scheme, :creds, :now,"
            " :mstate, :mturn, :mseq,"
            " (SELECT COALESCE(MAX(n), 0) + 1 FROM push_config WHERE task_id = :task))"
            " ON CONFLICT (task_id, id) DO UPDATE SET url = excluded.url, token = excluded.token,"
            " auth_scheme = excluded.auth_scheme, auth_credentials = excluded.auth_credentials"
            " RETURNING *",
            {
                "task": task_id, "id": config_id, "ws": workspace, "caller": caller,
                "url": push.url, "token": push.token, "scheme": push.auth_scheme,
                "creds": push.auth_credentials, "now": self.now,
                "mstate": None if mark is None else mark["state"],
                "mturn": None if mark is None else mark["turn"],
                "mseq": None if mark is None else mark["seq"],
            },
        )  # fmt: skip
        assert row is not None
        return row

    def outbox_now(self, task_id: str, config_id: str) -> None:
        self.run(
            "INSERT INTO push_outbox (task_id, config_id, state, turn, upto_seq, created_at,"
            " due_at) SELECT t.id, ?, t.state, t.turn, (SELECT COALESCE(MAX(e.seq), 0)"
            " FROM task_event e WHERE e.task_id = t.id), ?, ? FROM task t WHERE t.id = ?",
            (config_id, self.now, self.now, task_id),
        )

    def claim_pushes(self, owner: str, limit: int, lease_ms: int) -> list[sqlite3.Row]:
        return self.all(
            "UPDATE push_outbox SET leased_by = :owner, leased_until = :now + :ttl"
            " WHERE id IN (SELECT o.id FROM push_outbox o"
            "   WHERE o.delivered_at IS NULL AND o.gave_up_at IS NULL AND o.due_at <= :now"
            "     AND (o.leased_until IS NULL OR o.leased_until <= :now)"
            "     AND NOT EXISTS (SELECT 1 FROM push_outbox p WHERE p.task_id = o.task_id"
            "       AND p.config_id = o.config_id AND p.id < o.id"
            "       AND p.delivered_at IS NULL AND p.gave_up_at IS NULL)"
            "   ORDER BY o.due_at, o.id LIMIT :n)"
            " RETURNING *",
            {"owner": owner, "now": self.now, "ttl": lease_ms, "n": limit},
        )

    def set_workspace_push_private(self, workspace: str, allowed: bool) -> bool:
        return self.run(SQLITE.set_workspace_push_private, (int(allowed), workspace)) == 1

    def push_sent(self, row_id: int, owner: str, sent: int) -> bool:
        return (
            self.run(
                "UPDATE push_outbox SET sent = MAX(sent, :sent) WHERE id = :id"
                " AND leased_by = :owner AND leased_until > :now AND delivered_at IS NULL",
                {"sent": sent, "id": row_id, "owner": owner, "now": self.now},
            )
            == 1
        )

    def push_delivered(self, row_id: int, owner: str) -> bool:
        return (
            self.run(
                "UPDATE push_outbox SET delivered_at = :now, leased_by = NULL,"
                " attempts = attempts + 1, leased_until = NULL, last_error = NULL"
                " WHERE id = :id AND leased_by = :owner"
                " AND delivered_at IS NULL AND gave_up_at IS NULL",
                {"id": row_id, "owner": owner, "now": self.now},
            )
            == 1
        )

    def push_failed(
        self, row_id: int, owner: str, error: str, retry_ms: int | None, counted: bool
    ) -> bool:
        return (
            self.run(
                "UPDATE push_outbox SET leased_by = NULL, leased_until = NULL,"
                " attempts = attempts + :inc, last_error = :err,"
                " due_at = CASE WHEN :retry IS NULL THEN due_at"
                "   ELSE :now + :retry END,"
                " gave_up_at = CASE WHEN :retry IS NULL THEN :now END"
                " WHERE id = :id AND leased_by = :owner AND delivered_at IS NULL"
                " AND gave_up_at IS NULL",
                {
                    "err": error,
                    "retry": retry_ms,
                    "now": self.now,
                    "id": row_id,
                    "owner": owner,
                    "inc": int(counted),
                },
            )
            == 1
        )

    # -- retention (see store/retention.py) ----------------------------------------------------
    def retention_lock(self) -> bool:
        return True  # one writer at a time: this transaction is the only one

    def finished_before(self, workspace: str, age_ms: int, limit: int) -> list[str]:
        rows = self.all(
            "SELECT id FROM task WHERE workspace = ? AND finished_at IS NOT NULL"
            " AND finished_at < ? AND state IN ('succeeded', 'failed', 'cancelled')"
            " ORDER BY finished_at LIMIT ?",
            (workspace, self.now - age_ms, limit),
        )
        return [r["id"] for r in rows]

    def delete_tasks(self, ids: Sequence[str], tables: Sequence[str]) -> int:
        marks = ", ".join("?" * len(ids))
        for table in tables:
            self.run(f"DELETE FROM {table} WHERE task_id IN ({marks})", list(ids))
        return self.run(f"DELETE FROM task WHERE id IN ({marks})", list(ids))


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


class SQLiteStore(QueueStore):
    """:class:`~melchior.mellan.relay.store.base.Store` on a SQLite file."""

    P = "?"  # the placeholder for the shared reads in ReadQueries
    latest_schema = migrations.LATEST_SQLITE
    NOW_SQL = f"({_NOW_MS})"  # now as stored: integer ms since the epoch

    def _bucket_sql(self, column: str) -> str:
        return f"(({column} - ?) / ?)"  # integer ms: integer division is the bucket

    def _stamp(self, iso: str) -> Any:
        return C.parse_ms(iso)

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
        C.after_commit(tx, self._publish, self.tally, self.witness)

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
        C.after_commit(tx, self._publish, self.tally, self.witness)

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
                if current > migrations.LATEST_SQLITE:
                    raise migrations.SchemaTooNew(current, migrations.LATEST_SQLITE)
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

    # -- the one hook the queue needs ---------------------------------------------------------
    def _transact(self, fn: Callable[[Tx], T]) -> T:
        with self._write() as tx:
            tx.grace_ms = self.cancel_grace_ms
            return fn(tx)
