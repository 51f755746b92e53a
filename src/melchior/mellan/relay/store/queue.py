"""The relay's queue and control plane, written once, above two SQL dialects.

River's split: the rules live here, in Python, once; each backend (:mod:`.sqlite`,
:mod:`.postgres`) gives a :class:`Tx` of *named statements* — one SQL statement (or one
batch) each, in its own dialect — and its own transactions, connection handling and
wake-up delivery, and nothing else. So a rule is changed in one place and the
conformance suite over both backends (``tests/storekit.py``, the model test) proves
both still keep it.

What lives here, and nowhere else:

- **Fencing outcomes.** What a fenced write that matched no live lease comes to
  (``NOT_FOUND``, ``DUPLICATE`` for the same epoch's repeat, ``LEASE_LOST`` otherwise),
  why (:func:`._common.lost_reason`), and that any write carrying a cancelled task's
  epoch releases its session slot.
- **Audit records** of queue and control-plane decisions, written in the transaction of
  the change they record (:class:`._common.Note`).
- **Which wake-ups to publish** after the commit: ``receiver_topic`` when work may have
  become claimable, ``task_topic`` on every task change and ``task_stop_topic`` when it
  reaches a state a blocking send stops at (not its creation: nobody waits
  on a task not yet made but the blocking send that made it, which holds the row and
  would only be woken to read it back), ``audit_topic`` when the log grew.
- **Validation** the SQL cannot express (a grant names two agents of the workspace, …).

Statements that need the database clock (lease expiries, ``run_after``) read it in the
dialect: SQLite inside the write transaction, PostgreSQL with ``statement_timestamp()``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from melchior.mellan.relay.store import _common as C
from melchior.mellan.relay.store._queries import ReadQueries
from melchior.mellan.relay.store.base import (
    Agent,
    Capability,
    Chained,
    Conflict,
    CredentialKind,
    FollowUp,
    Grant,
    Lease,
    NewTask,
    NotFoundError,
    Outcome,
    OverLimit,
    QuotaRefused,
    Record,
    StoreError,
    Task,
    TaskEvent,
    TaskState,
    Verdict,
)
from melchior.mellan.relay.store.outbox import PUSH_LIMIT, PushQueue, PushTx
from melchior.mellan.relay.store.retention import Retention, RetentionTx
from melchior.mellan.relay.store.routes import RouteQueue, RouteTx
from melchior.mellan.relay.store.sealed import KeyTx, SealedStore
from melchior.mellan.relay.topics import audit_topic, receiver_topic, task_stop_topic, task_topic
from melchior.policy.send_limits import QUEUED, UNFINISHED, Overrides, cap

T = TypeVar("T")
Row = C.RowLike

DONE_COMPLETE = ("succeeded", "input_required")
DONE_FAIL = ("queued", "failed")
DONE_CANCEL_ACK = ("cancelled",)
_SESSION_CLEANUP = 100  # sessions past their absolute expiry deleted per new session, at most


class Tx(PushTx, RetentionTx, RouteTx, KeyTx, Protocol):
    """One open write transaction: the named statements a backend provides.

    Each is one statement or one batch; none decides a rule. ``topics`` collects the
    wake-ups the queue asks for, published by the backend only after COMMIT.
    """

    topics: list[str]
    tallies: list[str]
    """What the transaction did, counted after COMMIT (:data:`TALLIES`)."""
    written: list[Chained]
    """The events it wrote, told to the witness after COMMIT (before the wake-ups)."""

    # -- control plane ------------------------------------------------------------------------
    def workspace_exists(self, workspace: str) -> bool: ...
    def insert_workspace(self, workspace: str) -> bool: ...
    def agent_exists(self, workspace: str, agent_id: str) -> bool: ...
    def insert_credential(
        self, cid: str, workspace: str, kind: str, subject: str, token_hash: str,
        expires_at: str | None,
    ) -> bool: ...  # fmt: skip
    def revoke_credential(self, workspace: str, credential_id: str) -> bool: ...
    def insert_agent(
        self, workspace: str, agent_id: str, description: str, capabilities: str
    ) -> Row | None: ...
    def insert_enrollment(
        self, code_hash: str, workspace: str, agent_id: str, expires_at: str
    ) -> bool: ...
    def redeem_enrollment(self, code_hash: str) -> Row | None: ...
    def insert_grant(
        self, gid: str, workspace: str, caller: str, receiver: str, capabilities: str
    ) -> Row: ...
    def revoke_grant(self, workspace: str, grant_id: str) -> bool: ...
    def insert_audit(self, notes: Sequence[C.Note]) -> list[int]: ...

    # -- tasks ----------------------------------------------------------------------------
    def insert_messages(self, rows: Sequence[tuple[str, str, str, str, int]]) -> list[bool]:
        """Ledger rows (workspace, caller, message id, task id, turn); False where the
        message id was already recorded for that caller."""
        ...

    def message_ref(self, workspace: str, caller: str, message_id: str) -> Row | None: ...
    def known_messages(self, keys: Sequence[tuple[str, str, str]]) -> set[tuple[str, str, str]]: ...
    def insert_tasks(self, tasks: Sequence[tuple[str, NewTask]]) -> Sequence[Row | None]: ...
    def archive_turn(self, task_id: str) -> None: ...
    def lock_receivers(self, keys: Sequence[tuple[str, str]]) -> None:
        """Serialize enqueues to these (workspace, receiver)s until COMMIT."""
        ...

    def count_unfinished(self, workspace: str, caller: str, receiver: str, upto: int) -> int:
        """The caller's unfinished tasks at the receiver, at most ``upto`` (a counter)."""
        ...

    def count_queued(self, workspace: str, receiver: str, upto: int) -> int:
        """The receiver's queued tasks, at most ``upto`` (a counter, not a scan)."""
        ...

    def upsert_limits(self, workspace: str, agent: str, values: Sequence[Any]) -> None: ...
    def delete_limits(self, workspace: str, agent: str) -> None: ...
    def limits_row(self, workspace: str, agent: str) -> Row | None: ...
    def next_turn(
        self, task_id: str, payload: str, chain: str, hop: int, path: str
    ) -> Row | None: ...
    def finished_turn(self, task_id: str, epoch: int) -> Row | None: ...
    def task_by_message(
        self, workspace: str, caller: str, message_id: str | None
    ) -> Row | None: ...
    def task_row(self, task_id: str, workspace: str | None = None) -> Row | None: ...
    def lock_task(self, task_id: str, workspace: str | None = None) -> Row | None: ...
    def cancel_task(self, workspace: str, task_id: str, grace_ms: int) -> Row | None: ...
    def insert_event(self, task_id: str, kind: str, body: str) -> Row:
        """The new event's row, with ``prev``: the seq of the task's event before it."""
        ...

    def settle_expired(self, workspace: str | None, receiver: str | None) -> Sequence[Row]: ...
    def claim(
        self, workspace: str, receiver: str, owner: str, limit: int, ttl_ms: int
    ) -> Sequence[Row]: ...
    def renew(self, task_id: str, epoch: int, ttl_ms: int) -> bool: ...
    def live_lease(self, task_id: str, epoch: int) -> Row | None: ...
    def complete(self, items: Sequence[tuple[str, int, str]], state: str) -> Mapping[int, Row]: ...
    def fail(
        self, task_id: str, epoch: int, error: str, retry: bool, backoff_ms: int
    ) -> Row | None: ...
    def ack_cancel(self, task_id: str, epoch: int) -> Row | None: ...
    def release_cancelled(self, task_id: str) -> None: ...
    def expire_leases(self, task_ids: Sequence[str] | None) -> int: ...

    # -- the dashboard --------------------------------------------------------------------
    def insert_session(
        self, id_hash: str, workspace: str, credential_id: str, idle_ms: int, max_ms: int
    ) -> None: ...
    def touch_session(self, id_hash: str, idle_ms: int, every_ms: int) -> bool: ...
    def delete_session(self, id_hash: str) -> Row | None: ...
    def delete_expired_sessions(self, limit: int) -> int: ...
    def expire_sessions(self, id_hashes: Sequence[str] | None) -> int: ...
    def revoke_enrollment(self, workspace: str, code_hash: str) -> Row | None: ...


TALLIES = (
    "accepted",
    "claimed",
    "completed:succeeded",
    "completed:input_required",
    "failed:requeued",
    "failed:failed",
    "cancelled",
    "lease_expired:requeued",
    "lease_expired:failed",
    "quota_refused:max-unfinished-per-receiver",
    "quota_refused:max-queued",
    "attempts:N",  # a turn finished (succeeded, input_required, failed) after N attempts
)
"""The names a store tallies, each once per task it concerns (the relay's counters)."""


class QueueStore(ReadQueries, PushQueue, Retention, RouteQueue, SealedStore):
    """:class:`~melchior.mellan.relay.store.base.Store` written once; a backend subclasses
    it with ``_transact`` (one write transaction around ``fn``), ``_read`` and its
    lifecycle (migrate, close, now, settle). ``tally``, when set, hears after each COMMIT
    what the transaction did (:data:`TALLIES`), so counters count committed work only."""

    cancel_grace_ms: int
    tally: Callable[[Sequence[str]], None] | None = None
    witness: Callable[[Sequence[Chained]], None] | None = None

    def set_tally(self, tally: Callable[[Sequence[str]], None] | None) -> None:
        self.tally = tally

    def set_witness(self, witness: Callable[[Sequence[Chained]], None] | None) -> None:
        self.witness = witness

    def _transact(self, fn: Callable[[Tx], T]) -> T:
        """Run ``fn`` in one write transaction; publish ``tx.topics`` after COMMIT."""
        raise NotImplementedError

    # -- audit ------------------------------------------------------------------------------
    @staticmethod
    def _notes(tx: Tx, notes: Sequence[C.Note | None]) -> list[int]:
        """Write the records in the open transaction: they commit with what they record."""
        rows = [n for n in notes if n is not None]
        if not rows:
            return []
        seqs = tx.insert_audit(rows)
        tx.topics += [audit_topic(w) for w in dict.fromkeys(n.workspace for n in rows)]
        return seqs

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
        note = C.Note(workspace, actor, action, subject, allowed, rule, reason, detail or {})
        return self._transact(lambda tx: self._notes(tx, [note])[0])

    # -- workspaces and credentials -------------------------------------------------------------
    def ensure_workspace(self, workspace: str) -> bool:
        return self._transact(lambda tx: tx.insert_workspace(workspace))

    def add_credential(
        self,
        workspace: str,
        kind: CredentialKind,
        subject: str,
        token_hash: str,
        expires_at: str | None = None,
        *,
        record: Record | None = None,
    ) -> str:
        cid = C.new_id()

        def go(tx: Tx) -> str:
            _need_workspace(tx, workspace)
            if not tx.insert_credential(
                cid, workspace, CredentialKind(kind).value, subject, token_hash, expires_at
            ):
                raise Conflict("credential hash already stored")
            self._notes(tx, [C.record_note(workspace, record, cid)])
            return cid

        return self._transact(go)

    def revoke_credential(
        self, workspace: str, credential_id: str, *, record: Record | None = None
    ) -> bool:
        def go(tx: Tx) -> bool:
            done = tx.revoke_credential(workspace, credential_id)
            if done:
                self._notes(tx, [C.record_note(workspace, record, credential_id)])
            return done

        return self._transact(go)

    # -- agents and enrollment --------------------------------------------------------------
    def add_agent(
        self,
        workspace: str,
        agent_id: str,
        description: str,
        capabilities: Sequence[Capability],
        *,
        record: Record | None = None,
    ) -> Agent:
        def go(tx: Tx) -> Agent:
            _need_workspace(tx, workspace)
            row = tx.insert_agent(workspace, agent_id, description, C.caps_json(capabilities))
            if row is None:
                raise Conflict(f"agent {agent_id!r} already exists")
            self._notes(tx, [C.record_note(workspace, record, agent_id)])
            return C.agent_from_row(row)

        return self._transact(go)

    def add_enrollment(
        self,
        workspace: str,
        agent_id: str,
        code_hash: str,
        expires_at: str,
        *,
        record: Record | None = None,
    ) -> None:
        def go(tx: Tx) -> None:
            _need_agent(tx, workspace, agent_id)
            if not tx.insert_enrollment(code_hash, workspace, agent_id, expires_at):
                raise Conflict("enrollment code already stored")
            self._notes(tx, [C.record_note(workspace, record, agent_id)])

        self._transact(go)

    def redeem_enrollment(self, code_hash: str) -> tuple[str, str] | None:
        row = self._transact(lambda tx: tx.redeem_enrollment(code_hash))
        return None if row is None else (row["workspace"], row["agent_id"])

    def join(
        self, code_hash: str, token_hash: str, *, reason: str = ""
    ) -> tuple[str, str, str] | None:
        """Redeem a one-time code and issue the agent's credential in *one* transaction
        (so a code is never used up without a credential to show for it), recording
        ``enrollment.redeem``. Returns (workspace, agent id, credential id) or None."""

        def go(tx: Tx) -> tuple[str, str, str] | None:
            row = tx.redeem_enrollment(code_hash)
            if row is None:
                return None
            workspace, agent_id = str(row["workspace"]), str(row["agent_id"])
            cid = C.new_id()
            if not tx.insert_credential(
                cid, workspace, CredentialKind.AGENT.value, agent_id, token_hash, None
            ):
                raise Conflict("credential hash already stored")
            note = C.Note(
                workspace, f"agent:{agent_id}", "enrollment.redeem", agent_id, True, "code",
                reason or f"{agent_id} joined with a one-time code; credential {cid} issued",
                {"credential_id": cid},
            )  # fmt: skip
            self._notes(tx, [note])
            return workspace, agent_id, cid

        return self._transact(go)

    # -- grants -------------------------------------------------------------------------------
    def add_grant(
        self,
        workspace: str,
        caller: str,
        receiver: str,
        capabilities: Sequence[str],
        *,
        record: Record | None = None,
        sealed: bool = False,
    ) -> Grant:
        caps = list(dict.fromkeys(capabilities))

        def go(tx: Tx) -> Grant:
            for agent in (caller, receiver):
                _need_agent(tx, workspace, agent)
            row = tx.insert_grant(C.new_id(), workspace, caller, receiver, C.json_list(caps))
            grant = C.grant_from_row(row)
            if sealed:  # store/sealed.py: every send on it must be sealed
                grant = self._seal_grant(tx, grant)
            self._notes(tx, [C.record_note(workspace, record, grant.id)])
            return grant

        return self._transact(go)

    def revoke_grant(self, workspace: str, grant_id: str, *, record: Record | None = None) -> bool:
        def go(tx: Tx) -> bool:
            done = tx.revoke_grant(workspace, grant_id)
            if done:
                self._notes(tx, [C.record_note(workspace, record, grant_id)])
            return done

        return self._transact(go)

    # -- send limits ------------------------------------------------------------------------
    def limit_overrides(self, workspace: str) -> dict[str, Overrides]:
        rows = self._read(f"SELECT * FROM agent_limits WHERE workspace = {self.P}", (workspace,))
        return {r["agent"]: C.overrides_from_row(r) for r in rows}

    def set_limits(
        self,
        workspace: str,
        agent: str,
        values: Overrides,
        *,
        reset: bool = False,
        record: Record | None = None,
    ) -> Overrides:
        def go(tx: Tx) -> Overrides:
            _need_workspace(tx, workspace)
            if agent != "*" and not tx.agent_exists(workspace, agent):
                raise NotFoundError(f"no agent {agent!r} in workspace {workspace!r}")
            if reset:
                tx.delete_limits(workspace, agent)
            if any(v is not None for v in values):
                tx.upsert_limits(workspace, agent, list(values))
            self._notes(tx, [C.record_note(workspace, record, agent)])
            row = tx.limits_row(workspace, agent)
            return Overrides() if row is None else C.overrides_from_row(row)

        return self._transact(go)

    # -- tasks: caller side -----------------------------------------------------------------
    def enqueue(self, task: NewTask) -> tuple[Task, bool]:
        return self.enqueue_many([task])[0]

    def enqueue_many(self, tasks: Sequence[NewTask]) -> list[tuple[Task, bool]]:
        out: list[tuple[Task, bool]] = []
        for item in self.admit(tasks):
            if isinstance(item, OverLimit):
                raise QuotaRefused(item)
            out.append(item)
        return out

    @staticmethod
    def _over_caps(tx: Tx, tasks: Sequence[NewTask]) -> dict[int, OverLimit]:
        """The new tasks of a batch that a cap refuses, counted in this transaction (with
        the receivers locked) and in input order, so a batch fills a cap exactly. The
        counts are read from counters the schema keeps with every task change (v10), so
        a send into a deep backlog costs what a send into an empty one does."""
        capped = [k for k, t in enumerate(tasks) if t.caps is not None]
        if not capped:
            return {}
        tx.lock_receivers([(tasks[k].workspace, tasks[k].receiver) for k in capped])
        unfinished: dict[tuple[str, str, str], int] = {}
        queued: dict[tuple[str, str], int] = {}
        over: dict[int, OverLimit] = {}
        known = tx.known_messages(
            [(tasks[k].workspace, tasks[k].caller, tasks[k].message_id or "")
             for k in capped if tasks[k].message_id is not None]
        )  # fmt: skip
        for k in capped:
            t, caps = tasks[k], tasks[k].caps
            assert caps is not None
            if t.message_id is not None and (t.workspace, t.caller, t.message_id) in known:
                continue  # a resend finds its task; it takes no new place
            ku, kq = (t.workspace, t.caller, t.receiver), (t.workspace, t.receiver)
            if ku not in unfinished:
                upto = caps.max_unfinished_per_receiver + 1
                unfinished[ku] = tx.count_unfinished(t.workspace, t.caller, t.receiver, upto)
            if kq not in queued:
                queued[kq] = tx.count_queued(t.workspace, t.receiver, caps.max_queued + 1)
            for limit, count, allowed in (
                (UNFINISHED, unfinished[ku], caps.max_unfinished_per_receiver),
                (QUEUED, queued[kq], caps.max_queued),
            ):
                decision, retry = cap(limit, count, allowed, t.receiver)
                if not decision:
                    over[k] = OverLimit(limit, count, allowed, decision.reason, retry)
                    break
            else:
                unfinished[ku] += 1
                queued[kq] += 1
        return over

    def admit(self, tasks: Sequence[NewTask]) -> list[tuple[Task, bool] | OverLimit]:
        if any(t.max_attempts < 1 for t in tasks):
            raise ValueError("max_attempts must be at least 1")
        if not tasks:
            return []

        def go(tx: Tx) -> list[tuple[Task, bool] | OverLimit]:
            over = self._over_caps(tx, tasks)
            taken = [k for k in range(len(tasks)) if k not in over]
            stored = self._store_tasks(tx, [tasks[k] for k in taken])
            placed: dict[int, tuple[Task, bool] | OverLimit] = {**over}
            placed.update(zip(taken, stored, strict=True))
            out = [placed[k] for k in range(len(tasks))]
            self._notes(tx, [C.over_note(tasks[k], o) for k, o in over.items()])
            tx.tallies += [f"quota_refused:{o.limit}" for o in over.values()]
            return out

        return self._transact(go)

    def _store_tasks(self, tx: Tx, tasks: Sequence[NewTask]) -> list[tuple[Task, bool]]:
        """Store new tasks (with their accept records) in the open transaction."""
        if not tasks:
            return []
        # Every caller message goes in the ledger first: a messageId already there (a
        # resend, or a reuse the door will name) stores no second task.
        ids = [t.id or C.new_id() for t in tasks]
        keyed = [k for k, t in enumerate(tasks) if t.message_id is not None]
        fresh = tx.insert_messages(
            [(tasks[k].workspace, tasks[k].caller, tasks[k].message_id or "", ids[k], 1)
             for k in keyed]
        )  # fmt: skip
        seen = {k for k, ok in zip(keyed, fresh, strict=True) if not ok}
        new = [k for k in range(len(tasks)) if k not in seen]
        rows = dict(zip(new, tx.insert_tasks([(ids[k], tasks[k]) for k in new]), strict=True))
        out: list[tuple[Task, bool]] = []
        for k, task in enumerate(tasks):
            row = rows.get(k)
            if row is not None:
                tx.topics.append(receiver_topic(task.workspace, task.receiver))
                if task.push is not None:
                    self._add_push(
                        tx, task.workspace, row["id"], task.caller, task.push,
                        PUSH_LIMIT, with_task=True,
                    )  # fmt: skip
                out.append((C.task_from_row(row), True))
                tx.tallies.append("accepted")
                continue
            ref = tx.message_ref(task.workspace, task.caller, task.message_id or "")
            existing = None if ref is None else tx.task_row(ref["task_id"])
            if existing is None:  # only a message already sent can suppress the insert
                raise StoreError("enqueue: insert suppressed without a duplicate")
            out.append((C.task_from_row(existing), False))
        self._notes(tx, C.accept_notes(tasks, out))
        return out

    def cancel(
        self, workspace: str, task_id: str, *, actor: str | None = None, rule: str = "caller"
    ) -> tuple[Task | None, Outcome]:
        def go(tx: Tx) -> tuple[Task | None, Outcome]:
            # locked: the state the cancel below acts on
            before = tx.lock_task(task_id, workspace) if actor is not None else None
            row = tx.cancel_task(workspace, task_id, self.cancel_grace_ms)
            if row is not None:
                tx.topics += [
                    receiver_topic(workspace, row["receiver"]), task_topic(task_id),
                    task_stop_topic(task_id),
                ]  # fmt: skip
                tx.tallies.append("cancelled")
                task, outcome = C.task_from_row(row), Outcome.OK
            else:
                row = tx.task_row(task_id, workspace)
                if row is None:
                    return None, Outcome.NOT_FOUND
                task = C.task_from_row(row)
                outcome = (
                    Outcome.DUPLICATE if task.state is TaskState.CANCELLED else Outcome.LEASE_LOST
                )
            if actor is not None and before is not None:
                self._notes(tx, [C.cancel_note(actor, rule, before["state"], task, outcome)])
            return task, outcome

        return self._transact(go)

    def continue_task(self, follow: FollowUp) -> tuple[Task | None, bool]:
        def go(tx: Tx) -> tuple[Task | None, bool]:
            row = tx.lock_task(follow.task_id, follow.workspace)
            if row is None:
                return None, False
            if row["state"] != TaskState.INPUT_REQUIRED.value:
                return C.task_from_row(row), False
            ledger = (follow.workspace, follow.caller, follow.message_id, follow.task_id)
            if not tx.insert_messages([(*ledger, int(row["turn"]) + 1)])[0]:
                return C.task_from_row(row), False
            if follow.push is not None:  # before the turn goes on: it hears of that too
                self._add_push(
                    tx, follow.workspace, follow.task_id, follow.caller, follow.push,
                    PUSH_LIMIT, with_task=False,
                )  # fmt: skip
            tx.archive_turn(follow.task_id)
            path = C.json_list(follow.path)
            went = tx.next_turn(follow.task_id, follow.payload, follow.chain, follow.hop, path)
            if went is None:
                raise StoreError("continue_task: a locked task waiting for input did not go on")
            task = C.task_from_row(went)
            tx.topics += [receiver_topic(task.workspace, task.receiver), task_topic(task.id)]
            self._notes(tx, [C.record_note(task.workspace, follow.record, task.id)])
            return task, True

        return self._transact(go)

    def append_event(self, task_id: str, kind: str, body: str) -> TaskEvent:
        def go(tx: Tx) -> TaskEvent:
            if tx.lock_task(task_id) is None:  # events of a task are written in turns
                raise NotFoundError(f"unknown task {task_id!r}")
            return self._event(tx, task_id, kind, body)

        return self._transact(go)

    @staticmethod
    def _event(tx: Tx, task_id: str, kind: str, body: str, note: C.Note | None = None) -> TaskEvent:
        """Store an event (and ``note``, its record) in the open transaction, which must
        hold the task's row (so ``prev`` is exact)."""
        row = tx.insert_event(task_id, kind, body)
        tx.topics.append(task_topic(task_id))
        QueueStore._notes(tx, [note])
        event = C.event_from_row(row)
        tx.written.append(Chained(int(row["prev"]), event))
        return event

    # -- tasks: receiver side -----------------------------------------------------------------
    def _settle(self, tx: Tx, workspace: str | None, receiver: str | None) -> int:
        """Expired holds: leased → queued (epoch bumped) or failed when attempts are spent;
        cancelled-in-grace → slot released. Lease losses are audited here, because only the
        store sees them happen."""
        rows = tx.settle_expired(workspace, receiver)
        for r in rows:
            tx.topics += [receiver_topic(r["workspace"], r["receiver"]), task_topic(r["id"])]
            if r["state"] == "failed":
                tx.topics.append(task_stop_topic(r["id"]))
                tx.tallies += ["lease_expired:failed", f"attempts:{r['attempt']}"]
            elif r["state"] == "queued":  # (a cancel's grace running out is no expiry)
                tx.tallies.append("lease_expired:requeued")
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

        def go(tx: Tx) -> list[Lease]:
            self._settle(tx, workspace, receiver)
            rows = sorted(
                tx.claim(workspace, receiver, owner, limit, round(lease_seconds * 1000)),
                key=lambda r: int(r["seq"]),
            )
            leases = []
            routes = self._routes_for(tx, workspace, receiver) if rows else {}
            for r in rows:
                task = C.task_from_row(r)
                tx.topics.append(task_topic(task.id))
                route = routes.get(task.capability)
                leases.append(Lease(task, task.lease_epoch, C.iso(r["lease_expires_at"]), route))
                tx.tallies.append("claimed")
            if actor is not None:
                self._notes(tx, [C.claim_note(actor, x.task, x.expires_at) for x in leases])
            return leases

        return self._transact(go)

    def _why_not(
        self,
        tx: Tx,
        task_id: str,
        epoch: int,
        done: tuple[str, ...],
        fence: C.FencedWrite | None = None,
    ) -> Verdict:
        """A fenced write matched nothing: say why (and audit it for ``fence``), and let a
        cancelled task's receiver free its session slot with any write that carries the
        right epoch (its ``ack_cancel``, or a late complete/fail: it has stopped)."""
        row = tx.lock_task(task_id)
        if row is None:
            return Verdict(Outcome.NOT_FOUND)
        past = tx.finished_turn(task_id, epoch) if int(row["turn"]) > 1 else None
        if (row["lease_epoch"] == epoch and row["state"] in done) or (
            past is not None and past["state"] in done
        ):
            verdict = Verdict(Outcome.DUPLICATE)
        else:
            if (
                row["lease_epoch"] == epoch
                and row["state"] == "cancelled"
                and row["lease_expires_at"] is not None
            ):
                tx.release_cancelled(task_id)
                tx.topics += [
                    receiver_topic(row["workspace"], row["receiver"]),
                    task_topic(task_id),
                ]
            verdict = _lost(row["state"], row["lease_epoch"], epoch)
        if fence is not None:
            self._notes(tx, [fence.note(row["workspace"], task_id, epoch, verdict)])
        return verdict

    def _not_live(
        self, tx: Tx, task_id: str, epoch: int, actor: str | None, action: str
    ) -> Verdict:
        """A renew/progress found no live lease: NOT_FOUND or LEASE_LOST, audited for
        ``actor``. Unlike :meth:`_why_not` it releases no cancelled slot: these writes
        do not say the receiver has stopped."""
        row = tx.task_row(task_id)
        if row is None:
            return Verdict(Outcome.NOT_FOUND)
        verdict = _lost(row["state"], row["lease_epoch"], epoch)
        if actor is not None:
            note = C.FencedWrite(actor, action).note(row["workspace"], task_id, epoch, verdict)
            self._notes(tx, [note])
        return verdict

    def renew(
        self,
        task_id: str,
        epoch: int,
        *,
        lease_seconds: float = 30.0,
        actor: str | None = None,
    ) -> Verdict:
        def go(tx: Tx) -> Verdict:
            if tx.renew(task_id, epoch, round(lease_seconds * 1000)):
                return Verdict(Outcome.OK)
            return self._not_live(tx, task_id, epoch, actor, "task.renew")

        return self._transact(go)

    def renew_many(
        self,
        items: Sequence[tuple[str, int]],
        *,
        lease_seconds: float = 30.0,
        actor: str | None = None,
    ) -> list[Verdict]:
        if not items:
            return []
        ttl = round(lease_seconds * 1000)

        def go(tx: Tx) -> list[Verdict]:
            return [
                Verdict(Outcome.OK)
                if tx.renew(task_id, epoch, ttl)
                else self._not_live(tx, task_id, epoch, actor, "task.renew")
                for task_id, epoch in items
            ]

        return self._transact(go)

    def progress(
        self, task_id: str, epoch: int, kind: str, body: str, *, actor: str | None = None
    ) -> Verdict:
        ok = Verdict(Outcome.OK)
        fence = None if actor is None else C.FencedWrite(actor, "task.progress", {"kind": kind})
        if self._event_at_once(task_id, epoch, kind, body, fence):
            return ok

        def go(tx: Tx) -> Verdict:
            live = tx.live_lease(task_id, epoch)
            if live is None:
                return self._not_live(tx, task_id, epoch, actor, "task.progress")
            note = None if fence is None else fence.note(live["workspace"], task_id, epoch, ok)
            self._event(tx, task_id, kind, body, note)
            return ok

        return self._transact(go)

    def _event_at_once(
        self, task_id: str, epoch: int, kind: str, body: str, fence: C.FencedWrite | None
    ) -> bool:
        """Write a progress event under the live lease ``epoch`` — with its record when
        ``fence`` is given — in one statement that is its own transaction, for a backend
        where each statement of a transaction is a round trip a stream waits for; then do
        what follows a commit (:func:`~._common.after_commit`). True: written. False: not
        written this way (the backend has no such statement, or the lease is not live),
        and :meth:`progress`'s transaction decides and explains, as for any backend."""
        return False

    def _complete(
        self,
        tx: Tx,
        items: Sequence[tuple[str, int, str]],
        state: str,
        actor: str | None = None,
    ) -> list[Verdict]:
        """Record successes, answering exactly as the items would be one by one: per task
        the first item whose epoch holds the lease wins; the rest are explained."""
        winners = tx.complete(items, state)
        action = "task.input_required" if state == "input_required" else "task.complete"
        fence = None if actor is None else C.FencedWrite(actor, action)
        verdicts: list[Verdict] = []
        notes: list[C.Note | None] = []
        for k, (tid, ep, _) in enumerate(items):
            r = winners.get(k)
            if r is None:
                verdicts.append(self._why_not(tx, tid, ep, DONE_COMPLETE, fence))
                continue
            ok = Verdict(Outcome.OK)
            verdicts.append(ok)
            tx.tallies += [f"completed:{state}", f"attempts:{r['attempt']}"]
            if fence is not None:
                notes.append(fence.note(r["workspace"], tid, ep, ok))
            tx.topics += [task_topic(tid), task_stop_topic(tid)]  # succeeded or asks for input
            if r["session_key"] is not None:  # the session's next task may be claimable now
                tx.topics.append(receiver_topic(r["workspace"], r["receiver"]))
        self._notes(tx, notes)
        return verdicts

    def complete(
        self,
        task_id: str,
        epoch: int,
        result: str,
        *,
        input_required: bool = False,
        actor: str | None = None,
    ) -> Verdict:
        state = "input_required" if input_required else "succeeded"
        item = [(task_id, epoch, result)]
        return self._transact(lambda tx: self._complete(tx, item, state, actor))[0]

    def complete_many(
        self, items: Sequence[tuple[str, int, str]], *, actor: str | None = None
    ) -> list[Verdict]:
        if not items:
            return []
        return self._transact(lambda tx: self._complete(tx, items, "succeeded", actor))

    def fail(
        self,
        task_id: str,
        epoch: int,
        error: str,
        *,
        retryable: bool = True,
        backoff_seconds: float = 1.0,
        actor: str | None = None,
    ) -> Verdict:
        fence = (
            None
            if actor is None
            else C.FencedWrite(actor, "task.fail", {"error": error, "retryable": retryable})
        )
        backoff = max(0, round(backoff_seconds * 1000))

        def go(tx: Tx) -> Verdict:
            row = tx.fail(task_id, epoch, error, retryable, backoff)
            if row is None:
                return self._why_not(tx, task_id, epoch, DONE_FAIL, fence)
            ok = Verdict(Outcome.OK)
            if fence is not None:
                self._notes(tx, [fence.note(row["workspace"], task_id, epoch, ok)])
            tx.topics += [receiver_topic(row["workspace"], row["receiver"]), task_topic(task_id)]
            if row["state"] == "failed":
                tx.topics.append(task_stop_topic(task_id))
                tx.tallies += ["failed:failed", f"attempts:{row['attempt']}"]
            else:
                tx.tallies.append("failed:requeued")
            return ok

        return self._transact(go)

    def ack_cancel(self, task_id: str, epoch: int, *, actor: str | None = None) -> Verdict:
        fence = None if actor is None else C.FencedWrite(actor, "task.cancel_ack")

        def go(tx: Tx) -> Verdict:
            row = tx.ack_cancel(task_id, epoch)
            if row is None:
                return self._why_not(tx, task_id, epoch, DONE_CANCEL_ACK, fence)
            tx.topics += [receiver_topic(row["workspace"], row["receiver"]), task_topic(task_id)]
            ok = Verdict(Outcome.OK)
            if fence is not None:
                self._notes(tx, [fence.note(row["workspace"], task_id, epoch, ok)])
            return ok

        return self._transact(go)

    def sweep(self) -> int:
        return self._transact(lambda tx: self._settle(tx, None, None))

    # -- the dashboard: owner sessions, enrollment codes ---------------------------------------
    def add_session(
        self,
        workspace: str,
        credential_id: str,
        id_hash: str,
        *,
        idle_seconds: float,
        max_seconds: float,
        record: Record | None = None,
    ) -> None:
        def go(tx: Tx) -> None:
            tx.delete_expired_sessions(_SESSION_CLEANUP)
            tx.insert_session(
                id_hash, workspace, credential_id, round(idle_seconds * 1000),
                round(max_seconds * 1000),
            )  # fmt: skip
            self._notes(tx, [C.record_note(workspace, record, credential_id)])

        self._transact(go)

    def touch_session(self, id_hash: str, *, idle_seconds: float, every: float = 30.0) -> bool:
        idle, gap = round(idle_seconds * 1000), round(every * 1000)
        return self._transact(lambda tx: tx.touch_session(id_hash, idle, gap))

    def end_session(self, id_hash: str, *, record: Record | None = None) -> bool:
        def go(tx: Tx) -> bool:
            row = tx.delete_session(id_hash)
            if row is None:
                return False
            self._notes(tx, [C.record_note(row["workspace"], record, row["credential_id"])])
            return True

        return self._transact(go)

    def revoke_enrollment(
        self, workspace: str, enrollment_id: str, *, record: Record | None = None
    ) -> bool:
        def go(tx: Tx) -> bool:
            row = tx.revoke_enrollment(workspace, enrollment_id)
            if row is None:
                return False
            self._notes(tx, [C.record_note(workspace, record, row["agent_id"])])
            return True

        return self._transact(go)

    # -- test hooks ---------------------------------------------------------------------------
    def expire_sessions(self, id_hashes: Sequence[str] | None = None) -> int:
        """Make dashboard sessions (all, or these) idle-expired now, without waiting."""
        return self._transact(lambda tx: tx.expire_sessions(id_hashes))

    def expire_leases(self, task_ids: Sequence[str] | None = None) -> int:
        """Make leases (all, or these) expire now, without waiting out a TTL. For tests and
        drills; the next claim or sweep settles them exactly as a real expiry."""
        return self._transact(lambda tx: tx.expire_leases(task_ids))


def _lost(state: str | None, lease_epoch: int | None, epoch: int) -> Verdict:
    reason, sentence = C.lost_reason(state, lease_epoch, epoch)
    return Verdict(Outcome.LEASE_LOST, reason, sentence)


def _need_workspace(tx: Tx, workspace: str) -> None:
    if not tx.workspace_exists(workspace):
        raise NotFoundError(f"unknown workspace {workspace!r}")


def _need_agent(tx: Tx, workspace: str, agent_id: str) -> None:
    if not tx.agent_exists(workspace, agent_id):
        raise NotFoundError(f"unknown agent {agent_id!r}")
