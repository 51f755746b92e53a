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
from typing import Any, ClassVar, TypeVar

import psycopg
from psycopg import errors as pgerr
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool, PoolTimeout

from melchior.mellan.relay.store import _common as C
from melchior.mellan.relay.store import migrations
from melchior.mellan.relay.store._statements import POSTGRES, SharedTx, Statements
from melchior.mellan.relay.store.base import (
    Chained,
    NewPush,
    NewRoute,
    NewTask,
    Outcome,
    StoreUnavailable,
    TaskState,
    Verdict,
)
from melchior.mellan.relay.store.queue import QueueStore, Tx
from melchior.mellan.relay.topics import audit_topic, task_topic

T = TypeVar("T")
Row = dict[str, Any]
_MIGRATE_LOCK = 0x6D656C6C616E  # "mellan": one migrator at a time across replicas
_RETRIES = 8


_MS = "* interval '1 millisecond'"
_NOW = "statement_timestamp()"  # the clock of *this statement*, see the module docstring


@dataclass
class _Tx(SharedTx):
    """One open transaction: a cursor, the wake-ups to send once it commits, and the
    queue's named statements in PostgreSQL's dialect (see
    :class:`~melchior.mellan.relay.store.queue.Tx`; the rules are all there)."""

    SQL: ClassVar[Statements] = POSTGRES
    cur: psycopg.Cursor[Row]
    topics: list[str] = field(default_factory=list)
    tallies: list[str] = field(default_factory=list)
    written: list[Chained] = field(default_factory=list)

    def one(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> Row | None:
        self.cur.execute(sql, params)
        return self.cur.fetchone()

    def all(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> list[Row]:
        self.cur.execute(sql, params)
        return self.cur.fetchall()

    def run(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> int:
        self.cur.execute(sql, params)
        return self.cur.rowcount

    # -- control plane --------------------------------------------------------------------
    def workspace_exists(self, workspace: str) -> bool:
        return self.one("SELECT 1 AS x FROM workspace WHERE name = %s", (workspace,)) is not None

    def insert_workspace(self, workspace: str) -> bool:
        sql = "INSERT INTO workspace (name) VALUES (%s) ON CONFLICT DO NOTHING"
        return self.run(sql, (workspace,)) == 1

    def agent_exists(self, workspace: str, agent_id: str) -> bool:
        sql = "SELECT 1 AS x FROM agent WHERE workspace = %s AND id = %s"
        return self.one(sql, (workspace, agent_id)) is not None

    def insert_credential(
        self, cid: str, workspace: str, kind: str, subject: str, token_hash: str,
        expires_at: str | None,
    ) -> bool:  # fmt: skip
        expires = None if expires_at is None else C.parse_dt(expires_at)
        return (
            self.run(
                "INSERT INTO credential (id, workspace, kind, subject, token_hash, expires_at)"
                " VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (token_hash) DO NOTHING",
                (cid, workspace, kind, subject, token_hash, expires),
            )
            == 1
        )

    def revoke_credential(self, workspace: str, credential_id: str) -> bool:
        return (
            self.run(
                "UPDATE credential SET revoked_at = now() WHERE workspace = %s AND id = %s"
                " AND revoked_at IS NULL",
                (workspace, credential_id),
            )
            == 1
        )

    def insert_agent(
        self, workspace: str, agent_id: str, description: str, capabilities: str
    ) -> Row | None:
        return self.one(
            "INSERT INTO agent (workspace, id, description, capabilities)"
            " VALUES (%s, %s, %s, %s) ON CONFLICT DO NOTHING RETURNING *",
            (workspace, agent_id, description, capabilities),
        )

    def insert_enrollment(
        self, code_hash: str, workspace: str, agent_id: str, expires_at: str
    ) -> bool:
        return (
            self.run(
                "INSERT INTO enrollment (code_hash, workspace, agent_id, expires_at)"
                " VALUES (%s, %s, %s, %s) ON CONFLICT DO NOTHING",
                (code_hash, workspace, agent_id, C.parse_dt(expires_at)),
            )
            == 1
        )

    def redeem_enrollment(self, code_hash: str) -> Row | None:
        return self.one(
            "UPDATE enrollment SET used_at = now() WHERE code_hash = %s AND used_at IS NULL"
            " AND expires_at > now() RETURNING workspace, agent_id",
            (code_hash,),
        )

    def insert_grant(
        self, gid: str, workspace: str, caller: str, receiver: str, capabilities: str
    ) -> Row:
        row = self.one(
            "INSERT INTO agent_grant (id, workspace, caller, receiver, capabilities)"
            " VALUES (%s, %s, %s, %s, %s) RETURNING *",
            (gid, workspace, caller, receiver, capabilities),
        )
        assert row is not None
        return row

    def revoke_grant(self, workspace: str, grant_id: str) -> bool:
        return (
            self.run(
                "UPDATE agent_grant SET revoked_at = now() WHERE workspace = %s AND id = %s"
                " AND revoked_at IS NULL",
                (workspace, grant_id),
            )
            == 1
        )

    def insert_audit(self, notes: Sequence[C.Note]) -> list[int]:
        """One ``INSERT … SELECT FROM unnest(…)``: one round trip for a claim of 50, and
        one statement text whatever the batch size, so the server plans it once per
        connection (prepared) instead of parsing 450 placeholders per call."""
        rows_in = [
            (n.workspace, n.actor, n.action, n.subject, n.allowed, n.rule, n.reason,
             json.dumps(n.detail), n.request_id)
            for n in notes
        ]  # fmt: skip
        cols = [list(c) for c in zip(*rows_in, strict=True)]
        rows = self.all(
            "INSERT INTO audit (workspace, actor, action, subject, allowed, rule, reason, detail,"
            " request_id) SELECT * FROM unnest(%s::text[], %s::text[], %s::text[], %s::text[],"
            " %s::boolean[], %s::text[], %s::text[], %s::text[], %s::text[]) RETURNING seq",
            cols,
        )
        return sorted(int(r["seq"]) for r in rows)

    # -- tasks --------------------------------------------------------------------------------
    def insert_messages(self, rows: Sequence[tuple[str, str, str, str, int]]) -> list[bool]:
        if not rows:
            return []
        self.cur.executemany(
            "INSERT INTO task_message (workspace, caller, message_id, task_id, turn)"
            " VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING RETURNING 1 AS x",
            rows,
            returning=True,
        )
        inserted: list[bool] = []
        while True:
            inserted.append(self.cur.fetchone() is not None)
            if not self.cur.nextset():
                break
        return inserted

    def known_messages(self, keys: Sequence[tuple[str, str, str]]) -> set[tuple[str, str, str]]:
        """Which (workspace, caller, message id)s the ledger already holds: one round trip."""
        if not keys:
            return set()
        rows = self.all(
            "SELECT m.workspace, m.caller, m.message_id FROM task_message m"
            " JOIN unnest(%s::text[], %s::text[], %s::text[]) AS k(w, c, id)"
            " ON m.workspace = k.w AND m.caller = k.c AND m.message_id = k.id",
            ([k[0] for k in keys], [k[1] for k in keys], [k[2] for k in keys]),
        )
        return {(r["workspace"], r["caller"], r["message_id"]) for r in rows}

    def insert_tasks(self, tasks: Sequence[tuple[str, NewTask]]) -> list[Row | None]:
        """All inserts in one pipelined ``executemany`` (one round trip for the batch); a
        dedupe hit returns no row."""
        if not tasks:
            return []
        rows = [
            (tid, t.workspace, t.caller, t.receiver, t.capability,
             t.context_id or C.new_id(), t.payload, t.metadata, t.message_id, t.session_key,
             t.chain, t.hop, json.dumps(list(t.path)), t.max_attempts)
            for tid, t in tasks
        ]  # fmt: skip
        self.cur.executemany(
            "INSERT INTO task (id, workspace, caller, receiver, capability, context_id,"
            " state, payload, metadata, message_id, session_key, chain, hop, path,"
            " max_attempts) VALUES (%s, %s, %s, %s, %s, %s, 'queued', %s, %s, %s, %s, %s,"
            " %s, %s, %s) ON CONFLICT DO NOTHING RETURNING *",
            rows,
            returning=True,
        )
        inserted: list[Row | None] = []
        while True:
            inserted.append(self.cur.fetchone())
            if not self.cur.nextset():
                break
        return inserted

    # -- send limits ----------------------------------------------------------------------
    def lock_receivers(self, keys: Sequence[tuple[str, str]]) -> None:
        """Take each receiver's transaction-scoped advisory lock, in one order (no
        deadlock between two batches): enqueues to one receiver count and insert one at a
        time across every replica, so two cannot both take the last place under a cap."""
        for workspace, receiver in sorted(set(keys)):
            self.run(
                "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
                (f"mellan-cap:{workspace}/{receiver}",),
            )

    def count_unfinished(self, workspace: str, caller: str, receiver: str, upto: int) -> int:
        """From the counter the schema keeps (v10), summed over its slots: no backlog read."""
        row = self.one(
            "SELECT COALESCE(sum(n), 0) AS n FROM caller_unfinished"
            " WHERE workspace = %s AND receiver = %s AND caller = %s",
            (workspace, receiver, caller),
        )
        return min(int(row["n"]) if row else 0, upto)

    def count_queued(self, workspace: str, receiver: str, upto: int) -> int:
        row = self.one(
            "SELECT COALESCE(sum(n), 0) AS n FROM receiver_queued"
            " WHERE workspace = %s AND receiver = %s",
            (workspace, receiver),
        )
        return min(int(row["n"]) if row else 0, upto)

    def upsert_limits(self, workspace: str, agent: str, values: Sequence[Any]) -> None:
        self.run(
            "INSERT INTO agent_limits (workspace, agent, send_rate, burst,"
            " max_unfinished_per_receiver, max_queued, updated_at)"
            " VALUES (%s, %s, %s, %s, %s, %s, now())"
            " ON CONFLICT (workspace, agent) DO UPDATE SET"
            " send_rate = COALESCE(excluded.send_rate, agent_limits.send_rate),"
            " burst = COALESCE(excluded.burst, agent_limits.burst),"
            " max_unfinished_per_receiver = COALESCE(excluded.max_unfinished_per_receiver,"
            " agent_limits.max_unfinished_per_receiver),"
            " max_queued = COALESCE(excluded.max_queued, agent_limits.max_queued),"
            " updated_at = excluded.updated_at",
            (workspace, agent, *values),
        )

    def next_turn(self, task_id: str, payload: str, chain: str, hop: int, path: str) -> Row | None:
        return self.one(
            "UPDATE task SET state = 'queued', turn = turn + 1, payload = %(payload)s,"
            " chain = %(chain)s, hop = %(hop)s, path = %(path)s, result = NULL, error = NULL,"
            f" attempt = 0, run_after = {_NOW}, finished_at = NULL, lease_owner = NULL,"
            f" lease_expires_at = NULL, updated_at = {_NOW}"
            " WHERE id = %(id)s AND state = 'input_required' RETURNING *",
            {"payload": payload, "chain": chain, "hop": hop, "path": path, "id": task_id},
        )

    def task_by_message(self, workspace: str, caller: str, message_id: str | None) -> Row | None:
        return self.one(
            "SELECT * FROM task WHERE workspace = %s AND caller = %s AND message_id = %s",
            (workspace, caller, message_id),
        )

    def task_row(self, task_id: str, workspace: str | None = None) -> Row | None:
        if workspace is None:
            return self.one("SELECT * FROM task WHERE id = %s", (task_id,))
        sql = "SELECT * FROM task WHERE workspace = %s AND id = %s"
        return self.one(sql, (workspace, task_id))

    def lock_task(self, task_id: str, workspace: str | None = None) -> Row | None:
        if workspace is None:
            return self.one("SELECT * FROM task WHERE id = %s FOR UPDATE", (task_id,))
        sql = "SELECT * FROM task WHERE workspace = %s AND id = %s FOR UPDATE"
        return self.one(sql, (workspace, task_id))

    def cancel_task(self, workspace: str, task_id: str, grace_ms: int) -> Row | None:
        return self.one(
            f"UPDATE task SET state = 'cancelled', updated_at = {_NOW}, finished_at = {_NOW},"
            " lease_expires_at = CASE WHEN state = 'leased' THEN LEAST(lease_expires_at,"
            f"   {_NOW} + %(grace)s {_MS}) END,"
            " lease_owner = CASE WHEN state = 'leased' THEN lease_owner END"
            " WHERE workspace = %(ws)s AND id = %(id)s"
            "   AND state IN ('queued', 'leased', 'input_required') RETURNING *",
            {"grace": grace_ms, "ws": workspace, "id": task_id},
        )

    def insert_event(self, task_id: str, kind: str, body: str) -> Row:
        row = self.one(
            "INSERT INTO task_event (task_id, kind, body, turn)"
            " SELECT %s, %s, %s, turn FROM task WHERE id = %s"
            " RETURNING *, (SELECT COALESCE(MAX(e.seq), 0) FROM task_event e"
            " WHERE e.task_id = task_event.task_id AND e.seq < task_event.seq) AS prev",
            (task_id, kind, body, task_id),
        )
        assert row is not None
        return row

    def settle_expired(self, workspace: str | None, receiver: str | None) -> list[Row]:
        """Rows another replica is settling are skipped (``SKIP LOCKED``)."""
        where = f"lease_expires_at <= {_NOW}"
        params: dict[str, Any] = {}
        if workspace is not None:
            where += " AND workspace = %(ws)s AND receiver = %(rcv)s"
            params = {"ws": workspace, "rcv": receiver}
        return self.all(
            f"WITH exp AS MATERIALIZED (SELECT seq FROM task WHERE {where}"
            "   ORDER BY lease_expires_at LIMIT 500 FOR UPDATE SKIP LOCKED)"
            " UPDATE task t SET"
            " state = CASE WHEN t.state <> 'leased' THEN t.state"
            "   WHEN t.attempt >= t.max_attempts THEN 'failed' ELSE 'queued' END,"
            " lease_epoch = CASE WHEN t.state = 'leased' THEN t.lease_epoch + 1"
            "   ELSE t.lease_epoch END,"
            " error = CASE WHEN t.state = 'leased' THEN 'lease expired' ELSE t.error END,"
            " finished_at = CASE WHEN t.state = 'leased' AND t.attempt >= t.max_attempts"
            f"   THEN {_NOW} ELSE t.finished_at END,"
            f" run_after = CASE WHEN t.state = 'leased' THEN {_NOW} ELSE t.run_after END,"
            f" lease_owner = NULL, lease_expires_at = NULL, updated_at = {_NOW}"
            f" FROM exp WHERE t.seq = exp.seq AND t.lease_expires_at <= {_NOW}"
            " RETURNING t.id, t.workspace, t.receiver, t.state, t.attempt, t.max_attempts",
            params,
        )

    def claim(
        self, workspace: str, receiver: str, owner: str, limit: int, ttl_ms: int
    ) -> list[Row]:
        """Candidates ``FOR UPDATE SKIP LOCKED`` inside one ``UPDATE … FROM``: concurrent
        claimers never wait on each other nor take the same row."""
        return self.all(
            "WITH cand AS MATERIALIZED (SELECT t.seq FROM task t"
            "   WHERE t.workspace = %(ws)s AND t.receiver = %(rcv)s AND t.state = 'queued'"
            f"     AND t.run_after <= {_NOW}"
            "     AND (t.session_key IS NULL OR ("
            "       NOT EXISTS (SELECT 1 FROM task o WHERE o.workspace = t.workspace"
            "         AND o.session_key = t.session_key AND o.state IN ('queued', 'leased')"
            "         AND o.seq < t.seq)"
            "       AND NOT EXISTS (SELECT 1 FROM task h WHERE h.workspace = t.workspace"
            "         AND h.session_key = t.session_key AND h.lease_expires_at IS NOT NULL)))"
            "   ORDER BY t.seq LIMIT %(n)s FOR UPDATE SKIP LOCKED)"
            " UPDATE task t SET state = 'leased', attempt = t.attempt + 1,"
            f" lease_epoch = t.lease_epoch + 1, lease_owner = %(owner)s, leased_at = {_NOW},"
            f" lease_expires_at = {_NOW} + %(ttl)s {_MS}, updated_at = {_NOW}"
            " FROM cand WHERE t.seq = cand.seq AND t.state = 'queued' RETURNING t.*",
            {"owner": owner, "ttl": ttl_ms, "ws": workspace, "rcv": receiver, "n": limit},
        )

    def renew(self, task_id: str, epoch: int, ttl_ms: int) -> bool:
        return (
            self.run(
                f"UPDATE task SET lease_expires_at = {_NOW} + %s {_MS}"
                " WHERE id = %s AND lease_epoch = %s AND state = 'leased'",
                (ttl_ms, task_id, epoch),
            )
            == 1
        )

    def live_lease(self, task_id: str, epoch: int) -> Row | None:
        """Locked for update, not share: two reports on one task (its events) take turns,
        so their events' seqs — and push outbox rows — commit in the order they were
        numbered, and a reader following ``seq`` never sees a later one before an earlier."""
        return self.one(
            "SELECT workspace FROM task WHERE id = %s AND lease_epoch = %s"
            " AND state = 'leased' FOR NO KEY UPDATE",
            (task_id, epoch),
        )

    def complete(self, items: Sequence[tuple[str, int, str]], state: str) -> dict[int, Row]:
        """One UPDATE for the whole batch: per task the first item whose epoch holds the
        lease wins (``DISTINCT ON`` in input order)."""
        rows = self.all(
            "WITH v AS (SELECT * FROM unnest(%s::text[], %s::bigint[], %s::text[])"
            "   WITH ORDINALITY AS v(id, ep, res, n)),"
            " pick AS (SELECT DISTINCT ON (v.id) v.id, v.ep, v.res, v.n FROM v"
            "   JOIN task c ON c.id = v.id AND c.lease_epoch = v.ep AND c.state = 'leased'"
            "   ORDER BY v.id, v.n)"
            " UPDATE task t SET state = %s, result = pick.res, lease_owner = NULL,"
            f" lease_expires_at = NULL, finished_at = {_NOW}, updated_at = {_NOW}"
            " FROM pick WHERE t.id = pick.id AND t.lease_epoch = pick.ep AND t.state = 'leased'"
            " RETURNING t.id, t.workspace, t.receiver, t.session_key, t.attempt, pick.n",
            ([i[0] for i in items], [i[1] for i in items], [i[2] for i in items], state),
        )
        return {int(r["n"]) - 1: r for r in rows}

    def fail(
        self, task_id: str, epoch: int, error: str, retry: bool, backoff_ms: int
    ) -> Row | None:
        return self.one(
            "UPDATE task SET"
            " state = CASE WHEN %(retry)s AND attempt < max_attempts THEN 'queued'"
            "   ELSE 'failed' END,"
            " finished_at = CASE WHEN %(retry)s AND attempt < max_attempts THEN NULL"
            f"   ELSE {_NOW} END,"
            f" run_after = {_NOW} + %(backoff)s {_MS}, error = %(err)s,"
            f" lease_owner = NULL, lease_expires_at = NULL, updated_at = {_NOW}"
            " WHERE id = %(id)s AND lease_epoch = %(ep)s AND state = 'leased'"
            " RETURNING workspace, receiver, state, attempt",
            {"retry": retry, "backoff": backoff_ms, "err": error, "id": task_id, "ep": epoch},
        )

    def ack_cancel(self, task_id: str, epoch: int) -> Row | None:
        return self.one(
            f"UPDATE task SET lease_expires_at = NULL, lease_owner = NULL, updated_at = {_NOW}"
            " WHERE id = %s AND lease_epoch = %s AND state = 'cancelled'"
            " AND lease_expires_at IS NOT NULL RETURNING workspace, receiver",
            (task_id, epoch),
        )

    def release_cancelled(self, task_id: str) -> None:
        self.run(
            f"UPDATE task SET lease_expires_at = NULL, lease_owner = NULL, updated_at = {_NOW}"
            " WHERE id = %s",
            (task_id,),
        )

    def expire_leases(self, task_ids: Sequence[str] | None) -> int:
        sql = (
            f"UPDATE task SET lease_expires_at = {_NOW} - interval '1 millisecond'"
            " WHERE lease_expires_at IS NOT NULL"
        )
        if task_ids is None:
            return self.run(sql)
        return self.run(sql + " AND id = ANY(%s)", (list(task_ids),))

    # -- the dashboard --------------------------------------------------------------------
    def insert_session(
        self, id_hash: str, workspace: str, credential_id: str, idle_ms: int, max_ms: int
    ) -> None:
        self.run(
            "INSERT INTO dashboard_session (id_hash, workspace, credential_id, created_at,"
            f" last_seen_at, idle_expires_at, expires_at) VALUES (%s, %s, %s, {_NOW}, {_NOW},"
            f" {_NOW} + %s {_MS}, {_NOW} + %s {_MS})",
            (id_hash, workspace, credential_id, min(idle_ms, max_ms), max_ms),
        )

    def touch_session(self, id_hash: str, idle_ms: int, every_ms: int) -> bool:
        return (
            self.run(
                f"UPDATE dashboard_session SET last_seen_at = {_NOW},"
                f" idle_expires_at = LEAST({_NOW} + %(idle)s {_MS}, expires_at)"
                f" WHERE id_hash = %(h)s AND last_seen_at <= {_NOW} - %(every)s {_MS}"
                f" AND idle_expires_at > {_NOW} AND expires_at > {_NOW}",
                {"idle": idle_ms, "h": id_hash, "every": every_ms},
            )
            == 1
        )

    def delete_expired_sessions(self, limit: int) -> int:
        return self.run(
            "DELETE FROM dashboard_session WHERE id_hash IN (SELECT id_hash FROM"
            f" dashboard_session WHERE expires_at <= {_NOW} LIMIT %s FOR UPDATE SKIP LOCKED)",
            (limit,),
        )

    def expire_sessions(self, id_hashes: Sequence[str] | None) -> int:
        sql = f"UPDATE dashboard_session SET idle_expires_at = {_NOW} - interval '1 millisecond'"
        if id_hashes is None:
            return self.run(sql)
        return self.run(sql + " WHERE id_hash = ANY(%s)", (list(id_hashes),))

    def revoke_enrollment(self, workspace: str, code_hash: str) -> Row | None:
        return self.one(
            f"UPDATE enrollment SET expires_at = {_NOW} WHERE workspace = %s AND code_hash = %s"
            f" AND used_at IS NULL AND expires_at > {_NOW} RETURNING agent_id",
            (workspace, code_hash),
        )

    # -- task routes, receivers, wake-ups (rules: store/routes.py) --------------------------
    def insert_route(self, route_id: str, route: NewRoute) -> Row:
        row = self.one(
            "INSERT INTO task_route (id, workspace, agent, capability, adapter, session, cwd,"
            " profile, options, state, proposed_at, proposed_by)"
            f" VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, 'pending', {_NOW}, %s) RETURNING *",
            (route_id, route.workspace, route.agent, route.capability, route.adapter,
             route.session, route.cwd, route.profile, route.options, route.proposed_by),
        )  # fmt: skip
        assert row is not None
        return row

    def route_row(self, workspace: str, route_id: str) -> Row | None:
        sql = "SELECT * FROM task_route WHERE workspace = %s AND id = %s FOR UPDATE"
        return self.one(sql, (workspace, route_id))

    def route_to(
        self, workspace: str, route_id: str, state: str, by: str, from_states: Sequence[str]
    ) -> Row | None:
        col = "approved" if state == "approved" else "revoked"
        return self.one(
            f"UPDATE task_route SET state = %s, {col}_at = {_NOW}, {col}_by = %s"
            " WHERE workspace = %s AND id = %s AND state = ANY(%s) RETURNING *",
            (state, by, workspace, route_id, list(from_states)),
        )

    def supersede_routes(
        self, workspace: str, agent: str, capability: str, keep: str, by: str
    ) -> list[Row]:
        return self.all(
            f"UPDATE task_route SET state = 'revoked', revoked_at = {_NOW}, revoked_by = %s"
            " WHERE workspace = %s AND agent = %s AND capability = %s AND state = 'approved'"
            " AND id <> %s RETURNING *",
            (by, workspace, agent, capability, keep),
        )

    def touch_receiver(self, workspace: str, agent: str, info: str | None) -> bool:
        return (
            self.run(
                f"UPDATE agent SET receiver_seen_at = {_NOW},"
                " receiver_info = COALESCE(%s, receiver_info) WHERE workspace = %s AND id = %s",
                (info, workspace, agent),
            )
            == 1
        )

    # -- push notifications (rules: store/outbox.py) ----------------------------------------
    def task_mark(self, workspace: str, task_id: str) -> Row | None:
        return self.one(
            "SELECT state, turn, (SELECT COALESCE(MAX(e.seq), 0) FROM task_event e"
            " WHERE e.task_id = t.id) AS seq FROM task t WHERE t.workspace = %s AND t.id = %s"
            " FOR NO KEY UPDATE",
            (workspace, task_id),
        )

    def push_config_exists(self, task_id: str, config_id: str) -> bool:
        sql = "SELECT 1 AS x FROM push_config WHERE task_id = %s AND id = %s"
        return self.one(sql, (task_id, config_id)) is not None

    def upsert_push_config(
        self, task_id: str, config_id: str, workspace: str, caller: str, push: NewPush,
        mark: C.RowLike | None,
    ) -> Row:  # fmt: skip
        row = self.one(
            "INSERT INTO push_config (task_id, id, workspace, caller, url, token, auth_scheme,"
            " auth_credentials, created_at, mark_state, mark_turn, mark_seq, n)"
            f" VALUES (%(task)s, %(id)s, %(ws)s, %(caller)s, %(url)s, %(token)s, %(scheme)s,"
            f" %(creds)s, {_NOW}, %(mstate)s, %(mturn)s, %(mseq)s,"
            " (SELECT COALESCE(MAX(n), 0) + 1 FROM push_config WHERE task_id = %(task)s))"
            " ON CONFLICT (task_id, id) DO UPDATE SET url = excluded.url, token = excluded.token,"
            " auth_scheme = excluded.auth_scheme, auth_credentials = excluded.auth_credentials"
            " RETURNING *",
            {
                "task": task_id, "id": config_id, "ws": workspace, "caller": caller,
                "url": push.url, "token": push.token, "scheme": push.auth_scheme,
                "creds": push.auth_credentials,
                "mstate": None if mark is None else mark["state"],
                "mturn": None if mark is None else mark["turn"],
                "mseq": None if mark is None else mark["seq"],
            },
        )  # fmt: skip
        assert row is not None
        return row

    def outbox_now(self, task_id: str, config_id: str) -> None:
        self.run(
            "INSERT INTO push_outbox (task_id, config_id, state, turn, upto_seq)"
            " SELECT t.id, %s, t.state, t.turn, (SELECT COALESCE(MAX(e.seq), 0)"
            " FROM task_event e WHERE e.task_id = t.id) FROM task t WHERE t.id = %s",
            (config_id, task_id),
        )

    def claim_pushes(self, owner: str, limit: int, lease_ms: int) -> list[Row]:
        """Candidates ``FOR UPDATE SKIP LOCKED``: deliverers on several replicas never wait
        on each other nor take the same row."""
        return self.all(
            "WITH cand AS MATERIALIZED (SELECT o.id FROM push_outbox o"
            "   WHERE o.delivered_at IS NULL AND o.gave_up_at IS NULL"
            f"    AND o.due_at <= {_NOW}"
            f"    AND (o.leased_until IS NULL OR o.leased_until <= {_NOW})"
            "     AND NOT EXISTS (SELECT 1 FROM push_outbox p WHERE p.task_id = o.task_id"
            "       AND p.config_id = o.config_id AND p.id < o.id"
            "       AND p.delivered_at IS NULL AND p.gave_up_at IS NULL)"
            "   ORDER BY o.due_at, o.id LIMIT %(n)s FOR UPDATE SKIP LOCKED)"
            f" UPDATE push_outbox o SET leased_by = %(owner)s,"
            f" leased_until = {_NOW} + %(ttl)s {_MS}"
            " FROM cand WHERE o.id = cand.id RETURNING o.*",
            {"owner": owner, "ttl": lease_ms, "n": limit},
        )

    def set_workspace_push_private(self, workspace: str, allowed: bool) -> bool:
        return self.run(POSTGRES.set_workspace_push_private, (allowed, workspace)) == 1

    def push_sent(self, row_id: int, owner: str, sent: int) -> bool:
        return (
            self.run(
                "UPDATE push_outbox SET sent = GREATEST(sent, %s) WHERE id = %s"
                f" AND leased_by = %s AND leased_until > {_NOW} AND delivered_at IS NULL",
                (sent, row_id, owner),
            )
            == 1
        )

    def push_delivered(self, row_id: int, owner: str) -> bool:
        return (
            self.run(
                f"UPDATE push_outbox SET delivered_at = {_NOW}, leased_by = NULL,"
                " attempts = attempts + 1, leased_until = NULL, last_error = NULL"
                " WHERE id = %s AND leased_by = %s"
                " AND delivered_at IS NULL AND gave_up_at IS NULL",
                (row_id, owner),
            )
            == 1
        )

    def push_failed(
        self, row_id: int, owner: str, error: str, retry_ms: int | None, counted: bool
    ) -> bool:
        return (
            self.run(
                "UPDATE push_outbox SET leased_by = NULL, leased_until = NULL,"
                " attempts = attempts + %(inc)s, last_error = %(err)s,"
                " due_at = CASE WHEN %(retry)s::bigint IS NULL THEN due_at"
                f"   ELSE {_NOW} + %(retry)s::bigint {_MS} END,"
                f" gave_up_at = CASE WHEN %(retry)s::bigint IS NULL THEN {_NOW} END"
                " WHERE id = %(id)s AND leased_by = %(owner)s AND delivered_at IS NULL"
                " AND gave_up_at IS NULL",
                {
                    "err": error,
                    "retry": retry_ms,
                    "id": row_id,
                    "owner": owner,
                    "inc": int(counted),
                },
            )
            == 1
        )

    # -- retention (see store/retention.py) ----------------------------------------------------
    def retention_lock(self) -> bool:
        row = self.one("SELECT pg_try_advisory_xact_lock(%s) AS got", (RETENTION_LOCK,))
        return bool(row and row["got"])

    def finished_before(self, workspace: str, age_ms: int, limit: int) -> list[str]:
        rows = self.all(
            "SELECT id FROM task WHERE workspace = %s AND finished_at IS NOT NULL"
            f" AND finished_at < {_NOW} - %s::bigint {_MS}"
            " AND state IN ('succeeded', 'failed', 'cancelled')"
            " ORDER BY finished_at LIMIT %s FOR UPDATE SKIP LOCKED",
            (workspace, age_ms, limit),
        )
        return [r["id"] for r in rows]

    def delete_tasks(self, ids: Sequence[str], tables: Sequence[str]) -> int:
        for table in tables:
            self.run(f"DELETE FROM {table} WHERE task_id = ANY(%s)", (list(ids),))
        return self.run("DELETE FROM task WHERE id = ANY(%s)", (list(ids),))


RETENTION_LOCK = 0x6D656C6C616E  # "mellan": the advisory lock key purges take turns on


def _retryable(exc: BaseException) -> bool:
    """Serialization/deadlock aborts, a claim racing on a session slot, and two approvals
    racing on one (agent, capability): try again (the retried approval supersedes)."""
    if isinstance(exc, pgerr.TransactionRollback):
        return True
    return isinstance(exc, pgerr.UniqueViolation) and (
        exc.diag.constraint_name in ("task_session_slot", "task_route_approved")
    )


class PostgresStore(QueueStore):
    """:class:`~melchior.mellan.relay.store.base.Store` on PostgreSQL (psycopg 3, sync)."""

    P = "%s"  # the placeholder for the shared reads in ReadQueries
    latest_schema = migrations.LATEST_POSTGRES
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
            C.after_commit(tx, self._publish, self.tally, self.witness)
            return result
        raise AssertionError("unreachable")

    def _event_at_once(
        self, task_id: str, epoch: int, kind: str, body: str, fence: C.FencedWrite | None
    ) -> bool:
        """One round trip instead of four (BEGIN, the lease, the event with its record,
        COMMIT): the schema's ``mellan_report_event`` (v9) in an implicit transaction.
        A failure the transaction path retries or explains sends the call there; a
        connection lost once the call was sent leaves the outcome unclear."""
        n = None if fence is None else fence.note("", task_id, epoch, Verdict(Outcome.OK))
        params = (task_id, epoch, kind, body) + (
            (None,) * 6
            if n is None
            else (n.actor, n.action, n.rule, n.reason, json.dumps(n.detail), n.request_id)
        )
        sent = False
        try:
            with self._pool.connection() as conn, conn.cursor() as cur:
                sent = True
                row = cur.execute(
                    "SELECT * FROM mellan_report_event(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                    params,
                ).fetchone()
        except (pgerr.TransactionRollback, pgerr.UniqueViolation):
            return False  # contention: the transaction path retries
        except (psycopg.OperationalError, psycopg.InterfaceError, PoolTimeout) as exc:
            raise self._lost(exc, unclear=sent) from exc
        if row is None:
            return False
        done = C.Effects(topics=[task_topic(task_id)])
        if n is not None:
            done.topics.append(audit_topic(row["workspace"]))
        done.written.append(Chained(int(row["prev"]), C.event_from_row(row)))
        C.after_commit(done, self._publish, self.tally, self.witness)
        return True

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

    def _bucket_sql(self, column: str) -> str:
        return f"floor(extract(epoch FROM ({column} - %s)) * 1000 / %s)::bigint"

    def _stamp(self, iso: str) -> Any:
        return C.parse_dt(iso)

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
            if current > migrations.LATEST_POSTGRES:
                raise migrations.SchemaTooNew(current, migrations.LATEST_POSTGRES)
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

    # -- the one hook the queue needs ---------------------------------------------------------
    def _transact(self, fn: Callable[[Tx], T]) -> T:
        return self._write(fn)
