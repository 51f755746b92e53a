"""Versioned schema migrations for both backends, applied at start.

Each backend has a tuple of versions; version N is ``<BACKEND>[N - 1]``, itself a
tuple of statements run in one transaction together with the bump of
``schema_version``. A released version is never edited: a schema change is a new
version appended at the end, so a database created by any earlier release upgrades
by replaying the versions it lacks (tested from v1).

Invariants the schema itself holds, whatever the SQL above it gets wrong:
- ``task_session_slot``: at most one task per (workspace, session_key) holds a lease
  or a cancel grace (``lease_expires_at IS NOT NULL``) — rule 3's hard edge;
- ``task_dedupe``: one task per (workspace, caller, message_id);
- the audit table refuses UPDATE, DELETE and (PostgreSQL) TRUNCATE: append-only;
- ``push_on_state`` / ``push_on_event``: every change of a task's state or turn, and
  every event stored for it, writes one ``push_outbox`` row per push config of that task,
  in the transaction of the change — no statement can change a task and forget a push
  (since v11 the state trigger runs only for a task flagged ``push``, which making its
  first config sets);
- ``task_route_approved``: at most one approved route per (workspace, agent, capability);
- ``task_counts_*``: ``receiver_queued`` and ``caller_unfinished`` (summed over their
  slots) equal a count of the task rows they stand for, whatever statement inserted,
  changed or deleted them — the send caps read them instead of the backlog (v10).
"""

from __future__ import annotations

_STATES = "'queued','leased','succeeded','input_required','failed','cancelled'"

_QUEUED = "state = 'queued'"
_UNFINISHED = "state IN ('queued','leased','input_required')"
"""What each send cap counts (policy/send_limits.py): a receiver's queued tasks, and a
caller's unfinished tasks at a receiver (queued, running or waiting for input)."""


def _sqlite_counts_trigger(
    name: str, event: str, row: str, dq: str, du: str, when: str = ""
) -> str:
    """One row trigger adding a changed task's deltas to both counters (0 changes none)."""
    return f"""CREATE TRIGGER {name} AFTER {event} ON task {when}
           BEGIN
             INSERT INTO receiver_queued (workspace, receiver, slot, n)
             SELECT {row}.workspace, {row}.receiver, 0, {dq} WHERE {dq} <> 0
             ON CONFLICT (workspace, receiver, slot) DO UPDATE SET n = n + excluded.n;
             INSERT INTO caller_unfinished (workspace, receiver, caller, slot, n)
             SELECT {row}.workspace, {row}.receiver, {row}.caller, 0, {du} WHERE {du} <> 0
             ON CONFLICT (workspace, receiver, caller, slot) DO UPDATE SET n = n + excluded.n;
           END"""


_NEW_Q, _NEW_U = f"(NEW.{_QUEUED})", f"(NEW.{_UNFINISHED})"
_OLD_Q, _OLD_U = f"(OLD.{_QUEUED})", f"(OLD.{_UNFINISHED})"

_SQLITE_COUNTS: tuple[str, ...] = (
    """CREATE TABLE receiver_queued (
        workspace TEXT NOT NULL,
        receiver TEXT NOT NULL,
        slot INTEGER NOT NULL,
        n INTEGER NOT NULL,
        PRIMARY KEY (workspace, receiver, slot)
    ) STRICT, WITHOUT ROWID""",
    """CREATE TABLE caller_unfinished (
        workspace TEXT NOT NULL,
        receiver TEXT NOT NULL,
        caller TEXT NOT NULL,
        slot INTEGER NOT NULL,
        n INTEGER NOT NULL,
        PRIMARY KEY (workspace, receiver, caller, slot)
    ) STRICT, WITHOUT ROWID""",
    f"""INSERT INTO receiver_queued (workspace, receiver, slot, n)
        SELECT workspace, receiver, 0, count(*) FROM task WHERE {_QUEUED}
        GROUP BY workspace, receiver""",
    f"""INSERT INTO caller_unfinished (workspace, receiver, caller, slot, n)
        SELECT workspace, receiver, caller, 0, count(*) FROM task WHERE {_UNFINISHED}
        GROUP BY workspace, receiver, caller""",
    _sqlite_counts_trigger("task_counts_insert", "INSERT", "NEW", _NEW_Q, _NEW_U),
    _sqlite_counts_trigger(
        "task_counts_state",
        "UPDATE OF state",
        "NEW",
        f"({_NEW_Q} - {_OLD_Q})",
        f"({_NEW_U} - {_OLD_U})",
        "WHEN NEW.state IS NOT OLD.state",
    ),
    _sqlite_counts_trigger("task_counts_delete", "DELETE", "OLD", f"(-{_OLD_Q})", f"(-{_OLD_U})"),
)

# SQLite: timestamps are INTEGER unix milliseconds read from the database's clock.
SQLITE: tuple[tuple[str, ...], ...] = (
    # v1 — first released schema
    (
        """CREATE TABLE workspace (
            name TEXT PRIMARY KEY,
            created_at INTEGER NOT NULL
        ) STRICT""",
        """CREATE TABLE credential (
            id TEXT PRIMARY KEY,
            workspace TEXT NOT NULL REFERENCES workspace(name),
            kind TEXT NOT NULL CHECK (kind IN ('owner','agent')),
            subject TEXT NOT NULL,
            token_hash TEXT NOT NULL UNIQUE,
            created_at INTEGER NOT NULL,
            expires_at INTEGER,
            revoked_at INTEGER
        ) STRICT""",
        """CREATE TABLE agent (
            workspace TEXT NOT NULL REFERENCES workspace(name),
            id TEXT NOT NULL,
            description TEXT NOT NULL,
            capabilities TEXT NOT NULL,
            created_at INTEGER NOT NULL,
            PRIMARY KEY (workspace, id)
        ) STRICT""",
        """CREATE TABLE enrollment (
            code_hash TEXT PRIMARY KEY,
            workspace TEXT NOT NULL,
            agent_id TEXT NOT NULL,
            created_at INTEGER NOT NULL,
            expires_at INTEGER NOT NULL,
            used_at INTEGER,
            FOREIGN KEY (workspace, agent_id) REFERENCES agent(workspace, id)
        ) STRICT""",
        """CREATE TABLE agent_grant (
            id TEXT PRIMARY KEY,
            workspace TEXT NOT NULL,
            caller TEXT NOT NULL,
            receiver TEXT NOT NULL,
            capabilities TEXT NOT NULL,
            created_at INTEGER NOT NULL,
            revoked_at INTEGER,
            FOREIGN KEY (workspace, caller) REFERENCES agent(workspace, id),
            FOREIGN KEY (workspace, receiver) REFERENCES agent(workspace, id)
        ) STRICT""",
        "CREATE INDEX agent_grant_route ON agent_grant (workspace, caller, receiver)",
        """CREATE TABLE audit (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            workspace TEXT NOT NULL,
            at INTEGER NOT NULL,
            actor TEXT NOT NULL,
            action TEXT NOT NULL,
            subject TEXT NOT NULL,
            allowed INTEGER NOT NULL,
            rule TEXT NOT NULL,
            reason TEXT NOT NULL,
            detail TEXT NOT NULL
        ) STRICT""",
        "CREATE INDEX audit_ws ON audit (workspace, seq)",
        """CREATE TRIGGER audit_no_update BEFORE UPDATE ON audit
           BEGIN SELECT RAISE(ABORT, 'audit is append-only'); END""",
        """CREATE TRIGGER audit_no_delete BEFORE DELETE ON audit
           BEGIN SELECT RAISE(ABORT, 'audit is append-only'); END""",
        f"""CREATE TABLE task (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            id TEXT NOT NULL UNIQUE,
            workspace TEXT NOT NULL,
            caller TEXT NOT NULL,
            receiver TEXT NOT NULL,
            capability TEXT NOT NULL,
            context_id TEXT NOT NULL,
            state TEXT NOT NULL CHECK (state IN ({_STATES})),
            payload TEXT NOT NULL,
            metadata TEXT NOT NULL,
            message_id TEXT,
            session_key TEXT,
            chain TEXT NOT NULL,
            hop INTEGER NOT NULL,
            path TEXT NOT NULL,
            attempt INTEGER NOT NULL DEFAULT 0,
            max_attempts INTEGER NOT NULL CHECK (max_attempts >= 1),
            lease_epoch INTEGER NOT NULL DEFAULT 0,
            lease_owner TEXT,
            leased_at INTEGER,
            lease_expires_at INTEGER,
            run_after INTEGER NOT NULL,
            result TEXT,
            error TEXT,
            created_at INTEGER NOT NULL,
            updated_at INTEGER NOT NULL,
            finished_at INTEGER,
            CHECK (attempt <= max_attempts)
        ) STRICT""",
        """CREATE UNIQUE INDEX task_dedupe ON task (workspace, caller, message_id)
           WHERE message_id IS NOT NULL""",
        """CREATE UNIQUE INDEX task_session_slot ON task (workspace, session_key)
           WHERE session_key IS NOT NULL AND lease_expires_at IS NOT NULL""",
        "CREATE INDEX task_ready ON task (workspace, receiver, seq) WHERE state = 'queued'",
        """CREATE INDEX task_session_open ON task (workspace, session_key, seq)
           WHERE session_key IS NOT NULL AND state IN ('queued','leased')""",
        """CREATE INDEX task_held ON task (workspace, receiver, lease_expires_at)
           WHERE lease_expires_at IS NOT NULL""",
        "CREATE INDEX task_expiry ON task (lease_expires_at) WHERE lease_expires_at IS NOT NULL",
        "CREATE INDEX task_ws ON task (workspace, seq)",
        "CREATE INDEX task_context ON task (workspace, context_id, seq)",
        """CREATE TABLE task_event (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            task_id TEXT NOT NULL,
            at INTEGER NOT NULL,
            kind TEXT NOT NULL,
            body TEXT NOT NULL
        ) STRICT""",
        "CREATE INDEX task_event_task ON task_event (task_id, seq)",
    ),
    # v2 — a caller lists its own tasks (A2A ListTasks) without scanning the workspace
    ("CREATE INDEX task_caller ON task (workspace, caller, seq)",),
    # v3 — kept in step with PostgreSQL's v3: SQLite has no TRUNCATE, and its DELETE
    # (with or without WHERE) is already refused by audit_no_delete
    ("SELECT 'v3: nothing to change on SQLite'",),
    # v4 — a task is a sequence of turns: the live turn stays in ``task`` (its number in
    # ``turn``), finished turns of a task that went on are kept in ``task_turn``, events
    # know their turn, and every caller message (of any turn) is in ``task_message``, the
    # ledger that makes a resend of one messageId find its task and turn
    (
        "ALTER TABLE task ADD COLUMN turn INTEGER NOT NULL DEFAULT 1",
        "ALTER TABLE task_event ADD COLUMN turn INTEGER NOT NULL DEFAULT 1",
        """CREATE TABLE task_turn (
            task_id TEXT NOT NULL,
            turn INTEGER NOT NULL,
            payload TEXT NOT NULL,
            state TEXT NOT NULL,
            result TEXT,
            error TEXT,
            epoch INTEGER NOT NULL,
            finished_at INTEGER,
            PRIMARY KEY (task_id, turn)
        ) STRICT""",
        "CREATE INDEX task_turn_epoch ON task_turn (task_id, epoch)",
        """CREATE TABLE task_message (
            workspace TEXT NOT NULL,
            caller TEXT NOT NULL,
            message_id TEXT NOT NULL,
            task_id TEXT NOT NULL,
            turn INTEGER NOT NULL,
            PRIMARY KEY (workspace, caller, message_id)
        ) STRICT""",
        "CREATE INDEX task_message_task ON task_message (task_id)",
        """INSERT INTO task_message (workspace, caller, message_id, task_id, turn)
           SELECT workspace, caller, message_id, id, 1 FROM task WHERE message_id IS NOT NULL""",
    ),
    # v5 — the dashboard: owner sessions (stored by the hash of their cookie's id), and the
    # indexes its pages read by (a task's audit trail, activity over a time window)
    (
        """CREATE TABLE dashboard_session (
            id_hash TEXT PRIMARY KEY,
            workspace TEXT NOT NULL REFERENCES workspace(name),
            credential_id TEXT NOT NULL REFERENCES credential(id),
            created_at INTEGER NOT NULL,
            last_seen_at INTEGER NOT NULL,
            idle_expires_at INTEGER NOT NULL,
            expires_at INTEGER NOT NULL
        ) STRICT""",
        "CREATE INDEX dashboard_session_expiry ON dashboard_session (expires_at)",
        "CREATE INDEX audit_subject ON audit (workspace, subject, seq)",
        "CREATE INDEX task_created ON task (workspace, created_at)",
        """CREATE INDEX task_finished ON task (workspace, finished_at)
           WHERE finished_at IS NOT NULL""",
        "CREATE INDEX task_open ON task (workspace, created_at) WHERE finished_at IS NULL",
    ),
    # v6 — push notifications (A2A push configs): a task's configs, and the outbox of
    # changes to deliver. The outbox is written by triggers, so that every change of a
    # task with a config — whatever statement makes it — has its row in the same
    # transaction; a row records the task as the change left it (state, turn, the last
    # event), which is all the delivery needs to say what changed; ``n`` orders a task's
    # configs as they were made. Agents get the secret
    # their pushes are signed with; a workspace may allow deliveries to private addresses.
    (
        "ALTER TABLE workspace ADD COLUMN push_allow_private INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE agent ADD COLUMN push_secret TEXT",
        """CREATE TABLE push_config (
            task_id TEXT NOT NULL,
            id TEXT NOT NULL,
            workspace TEXT NOT NULL,
            caller TEXT NOT NULL,
            url TEXT NOT NULL,
            token TEXT,
            auth_scheme TEXT,
            auth_credentials TEXT,
            created_at INTEGER NOT NULL,
            mark_state TEXT,
            mark_turn INTEGER,
            mark_seq INTEGER,
            n INTEGER NOT NULL,
            PRIMARY KEY (task_id, id)
        ) STRICT""",
        """CREATE TABLE push_outbox (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            task_id TEXT NOT NULL,
            config_id TEXT NOT NULL,
            state TEXT NOT NULL,
            turn INTEGER NOT NULL,
            upto_seq INTEGER NOT NULL,
            created_at INTEGER NOT NULL,
            due_at INTEGER NOT NULL,
            attempts INTEGER NOT NULL DEFAULT 0,
            sent INTEGER NOT NULL DEFAULT 0,
            leased_by TEXT,
            leased_until INTEGER,
            delivered_at INTEGER,
            gave_up_at INTEGER,
            last_error TEXT,
            FOREIGN KEY (task_id, config_id) REFERENCES push_config (task_id, id)
                ON DELETE CASCADE
        ) STRICT""",
        "CREATE INDEX push_outbox_config ON push_outbox (task_id, config_id, id)",
        """CREATE INDEX push_outbox_due ON push_outbox (due_at)
           WHERE delivered_at IS NULL AND gave_up_at IS NULL""",
        """CREATE TRIGGER push_on_state AFTER UPDATE OF state, turn ON task
           WHEN NEW.state IS NOT OLD.state OR NEW.turn IS NOT OLD.turn
           BEGIN
             INSERT INTO push_outbox (task_id, config_id, state, turn, upto_seq, created_at,
                                      due_at)
             SELECT NEW.id, c.id, NEW.state, NEW.turn,
                    (SELECT COALESCE(MAX(e.seq), 0) FROM task_event e WHERE e.task_id = NEW.id),
                    NEW.updated_at, NEW.updated_at
             FROM push_config c WHERE c.task_id = NEW.id;
           END""",
        """CREATE TRIGGER push_on_event AFTER INSERT ON task_event
           BEGIN
             INSERT INTO push_outbox (task_id, config_id, state, turn, upto_seq, created_at,
                                      due_at)
             SELECT NEW.task_id, c.id, t.state, t.turn, NEW.seq, NEW.at, NEW.at
             FROM push_config c JOIN task t ON t.id = c.task_id
             WHERE c.task_id = NEW.task_id;
           END""",
    ),
    # v7 — task routes: how a receiving agent runs a capability (adapter, bound session,
    # working directory, unattended profile, options), proposed by the agent and approved
    # or revoked by the owner; the partial unique index keeps one approved route per
    # (agent, capability) whatever the SQL above gets wrong. Agents get their receiver's
    # last sighting (the claim is the heartbeat) and an optional signed wake-up webhook.
    (
        """CREATE TABLE task_route (
            id TEXT PRIMARY KEY,
            workspace TEXT NOT NULL,
            agent TEXT NOT NULL,
            capability TEXT NOT NULL,
            adapter TEXT NOT NULL,
            session TEXT,
            cwd TEXT,
            profile TEXT,
            options TEXT NOT NULL,
            state TEXT NOT NULL CHECK (state IN ('pending','approved','revoked')),
            proposed_at INTEGER NOT NULL,
            proposed_by TEXT NOT NULL,
            approved_at INTEGER,
            approved_by TEXT,
            revoked_at INTEGER,
            revoked_by TEXT,
            FOREIGN KEY (workspace, agent) REFERENCES agent(workspace, id)
        ) STRICT""",
        """CREATE UNIQUE INDEX task_route_approved ON task_route (workspace, agent, capability)
           WHERE state = 'approved'""",
        "CREATE INDEX task_route_ws ON task_route (workspace, proposed_at)",
        "CREATE INDEX task_route_agent ON task_route (workspace, agent, state)",
        "ALTER TABLE agent ADD COLUMN receiver_seen_at INTEGER",
        "ALTER TABLE agent ADD COLUMN receiver_info TEXT",
        "ALTER TABLE agent ADD COLUMN wake_url TEXT",
        "ALTER TABLE agent ADD COLUMN wake_secret TEXT",
    ),
    # v8 — operations: the request id in every audit record (which request made the
    # decision), per-agent send limits and workspace defaults (agent '*'), and an index
    # the enqueue transaction counts a caller's unfinished tasks at a receiver by
    (
        "ALTER TABLE audit ADD COLUMN request_id TEXT",
        """CREATE TABLE agent_limits (
            workspace TEXT NOT NULL REFERENCES workspace(name),
            agent TEXT NOT NULL,
            send_rate REAL,
            burst INTEGER,
            max_unfinished_per_receiver INTEGER,
            max_queued INTEGER,
            updated_at INTEGER NOT NULL,
            PRIMARY KEY (workspace, agent)
        ) STRICT""",
        """CREATE INDEX task_unfinished ON task (workspace, receiver, caller)
           WHERE state IN ('queued','leased','input_required')""",
    ),
    # v9 — nothing for SQLite: PostgreSQL's v9 is a function that writes a progress event
    # in one statement, saving round trips SQLite (in-process) does not pay
    (),
    # v10 — the send caps read counters, not the backlog: counting a receiver's queue (or
    # a caller's unfinished tasks at it) cost what the queue was deep, on every capped
    # enqueue. Row triggers keep the counts with every change of a task's state, insert
    # and delete (retention), in the transaction of the change; one row per key (SQLite
    # has one writer: no contention to spread). Backfilled from the rows there are.
    _SQLITE_COUNTS,
    # v11 — a task's push trigger costs nothing unless the task has a push config: the
    # flag ``push`` is set when its first config is made (by a trigger on push_config,
    # whatever statement makes one), and push_on_state fires only WHEN it is set. A
    # config deleted leaves the flag set: the trigger then finds no config, as before.
    (
        "ALTER TABLE task ADD COLUMN push INTEGER NOT NULL DEFAULT 0",
        "UPDATE task SET push = 1 WHERE id IN (SELECT task_id FROM push_config)",
        """CREATE TRIGGER push_mark AFTER INSERT ON push_config
           BEGIN
             UPDATE task SET push = 1 WHERE id = NEW.task_id AND push = 0;
           END""",
        "DROP TRIGGER push_on_state",
        """CREATE TRIGGER push_on_state AFTER UPDATE OF state, turn ON task
           WHEN NEW.push AND (NEW.state IS NOT OLD.state OR NEW.turn IS NOT OLD.turn)
           BEGIN
             INSERT INTO push_outbox (task_id, config_id, state, turn, upto_seq, created_at,
                                      due_at)
             SELECT NEW.id, c.id, NEW.state, NEW.turn,
                    (SELECT COALESCE(MAX(e.seq), 0) FROM task_event e WHERE e.task_id = NEW.id),
                    NEW.updated_at, NEW.updated_at
             FROM push_config c WHERE c.task_id = NEW.id;
           END""",
    ),
    # v12 — sealed tasks: each agent's public key, bound to the agent, and grants that
    # require sealing (store/sealed.py)
    (
        """CREATE TABLE agent_key (
            workspace TEXT NOT NULL,
            agent TEXT NOT NULL,
            public_key TEXT NOT NULL,
            fingerprint TEXT NOT NULL,
            registered_at INTEGER NOT NULL,
            PRIMARY KEY (workspace, agent),
            FOREIGN KEY (workspace, agent) REFERENCES agent(workspace, id)
        ) STRICT""",
        # a grant may require its sends to be sealed (mellan grant add … --sealed)
        "ALTER TABLE agent_grant ADD COLUMN sealed INTEGER NOT NULL DEFAULT 0",
    ),
)

COUNT_SLOTS = 8
"""Rows per counter key on PostgreSQL: a transaction adds its deltas to the row of slot
``mod(pg_backend_pid(), COUNT_SLOTS)``, so concurrent claims of one receiver from different
connections rarely wait on one row (a count is the sum of its slots)."""

_PG_DELTAS = {
    "insert": (
        "REFERENCING NEW TABLE AS new_rows",
        f"SELECT workspace, receiver, caller, ({_QUEUED})::int AS dq,"
        f" ({_UNFINISHED})::int AS du FROM new_rows",
    ),
    "delete": (
        "REFERENCING OLD TABLE AS old_rows",
        f"SELECT workspace, receiver, caller, -({_QUEUED})::int AS dq,"
        f" -({_UNFINISHED})::int AS du FROM old_rows",
    ),
    "update": (
        "REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows",
        f"SELECT n.workspace, n.receiver, n.caller,"
        f" (n.{_QUEUED})::int - (o.{_QUEUED})::int AS dq,"
        f" (n.{_UNFINISHED})::int - (o.{_UNFINISHED})::int AS du"
        " FROM new_rows n JOIN old_rows o ON o.seq = n.seq WHERE n.state <> o.state",
    ),
}
"""Per event, the transition tables a statement trigger reads and the signed change of
each task it touched (a task's workspace, receiver and caller never change)."""


def _pg_counts(event: str) -> tuple[str, str]:
    """A statement trigger's function and the trigger: a whole claim of 50 (or an accept
    batch, or a retention sweep) adds its grouped deltas in one statement, keys in one
    order (no deadlock between two statements over several keys)."""
    referencing, deltas = _PG_DELTAS[event]
    slot = f"mod(pg_backend_pid(), {COUNT_SLOTS})"
    function = f"""CREATE FUNCTION task_counts_{event}() RETURNS trigger LANGUAGE plpgsql AS $$
           BEGIN
             WITH d AS ({deltas}),
             q AS (INSERT INTO receiver_queued AS c (workspace, receiver, slot, n)
                   SELECT workspace, receiver, {slot}, sum(dq) FROM d
                   GROUP BY workspace, receiver HAVING sum(dq) <> 0
                   ORDER BY workspace, receiver
                   ON CONFLICT (workspace, receiver, slot) DO UPDATE SET n = c.n + excluded.n)
             INSERT INTO caller_unfinished AS c (workspace, receiver, caller, slot, n)
             SELECT workspace, receiver, caller, {slot}, sum(du) FROM d
             GROUP BY workspace, receiver, caller HAVING sum(du) <> 0
             ORDER BY workspace, receiver, caller
             ON CONFLICT (workspace, receiver, caller, slot) DO UPDATE SET n = c.n + excluded.n;
             RETURN NULL;
           END $$"""
    trigger = f"""CREATE TRIGGER task_counts_{event} AFTER {event.upper()} ON task
           {referencing} FOR EACH STATEMENT EXECUTE FUNCTION task_counts_{event}()"""
    return function, trigger


_PG_COUNTS: tuple[str, ...] = (
    # no task changes between the backfill and the triggers: writers wait for the commit
    "LOCK TABLE task IN SHARE ROW EXCLUSIVE MODE",
    """CREATE TABLE receiver_queued (
        workspace text NOT NULL,
        receiver text NOT NULL,
        slot smallint NOT NULL,
        n bigint NOT NULL,
        PRIMARY KEY (workspace, receiver, slot)
    ) WITH (fillfactor = 50)""",
    """CREATE TABLE caller_unfinished (
        workspace text NOT NULL,
        receiver text NOT NULL,
        caller text NOT NULL,
        slot smallint NOT NULL,
        n bigint NOT NULL,
        PRIMARY KEY (workspace, receiver, caller, slot)
    ) WITH (fillfactor = 50)""",
    f"""INSERT INTO receiver_queued (workspace, receiver, slot, n)
        SELECT workspace, receiver, 0, count(*) FROM task WHERE {_QUEUED}
        GROUP BY workspace, receiver""",
    f"""INSERT INTO caller_unfinished (workspace, receiver, caller, slot, n)
        SELECT workspace, receiver, caller, 0, count(*) FROM task WHERE {_UNFINISHED}
        GROUP BY workspace, receiver, caller""",
    *_pg_counts("insert"),
    *_pg_counts("update"),
    *_pg_counts("delete"),
)

# PostgreSQL: timestamptz from the server clock; payloads as text so they come back
# byte-for-byte (jsonb would re-serialise them).
POSTGRES: tuple[tuple[str, ...], ...] = (
    # v1 — first released schema
    (
        """CREATE TABLE workspace (
            name text PRIMARY KEY,
            created_at timestamptz NOT NULL DEFAULT now()
        )""",
        """CREATE TABLE credential (
            id text PRIMARY KEY,
            workspace text NOT NULL REFERENCES workspace(name),
            kind text NOT NULL CHECK (kind IN ('owner','agent')),
            subject text NOT NULL,
            token_hash text NOT NULL UNIQUE,
            created_at timestamptz NOT NULL DEFAULT now(),
            expires_at timestamptz,
            revoked_at timestamptz
        )""",
        """CREATE TABLE agent (
            workspace text NOT NULL REFERENCES workspace(name),
            id text NOT NULL,
            description text NOT NULL,
            capabilities text NOT NULL,
            created_at timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (workspace, id)
        )""",
        """CREATE TABLE enrollment (
            code_hash text PRIMARY KEY,
            workspace text NOT NULL,
            agent_id text NOT NULL,
            created_at timestamptz NOT NULL DEFAULT now(),
            expires_at timestamptz NOT NULL,
            used_at timestamptz,
            FOREIGN KEY (workspace, agent_id) REFERENCES agent(workspace, id)
        )""",
        """CREATE TABLE agent_grant (
            id text PRIMARY KEY,
            workspace text NOT NULL,
            caller text NOT NULL,
            receiver text NOT NULL,
            capabilities text NOT NULL,
            created_at timestamptz NOT NULL DEFAULT now(),
            revoked_at timestamptz,
            FOREIGN KEY (workspace, caller) REFERENCES agent(workspace, id),
            FOREIGN KEY (workspace, receiver) REFERENCES agent(workspace, id)
        )""",
        "CREATE INDEX agent_grant_route ON agent_grant (workspace, caller, receiver)",
        """CREATE TABLE audit (
            seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            workspace text NOT NULL,
            at timestamptz NOT NULL DEFAULT clock_timestamp(),
            actor text NOT NULL,
            action text NOT NULL,
            subject text NOT NULL,
            allowed boolean NOT NULL,
            rule text NOT NULL,
            reason text NOT NULL,
            detail text NOT NULL
        )""",
        "CREATE INDEX audit_ws ON audit (workspace, seq)",
        """CREATE FUNCTION audit_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
           BEGIN RAISE EXCEPTION 'audit is append-only'; END $$""",
        """CREATE TRIGGER audit_append_only BEFORE UPDATE OR DELETE ON audit
           FOR EACH ROW EXECUTE FUNCTION audit_append_only()""",
        f"""CREATE TABLE task (
            seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            id text NOT NULL UNIQUE,
            workspace text NOT NULL,
            caller text NOT NULL,
            receiver text NOT NULL,
            capability text NOT NULL,
            context_id text NOT NULL,
            state text NOT NULL CHECK (state IN ({_STATES})),
            payload text NOT NULL,
            metadata text NOT NULL,
            message_id text,
            session_key text,
            chain text NOT NULL,
            hop integer NOT NULL,
            path text NOT NULL,
            attempt integer NOT NULL DEFAULT 0,
            max_attempts integer NOT NULL CHECK (max_attempts >= 1),
            lease_epoch bigint NOT NULL DEFAULT 0,
            lease_owner text,
            leased_at timestamptz,
            lease_expires_at timestamptz,
            run_after timestamptz NOT NULL DEFAULT now(),
            result text,
            error text,
            created_at timestamptz NOT NULL DEFAULT now(),
            updated_at timestamptz NOT NULL DEFAULT now(),
            finished_at timestamptz,
            CHECK (attempt <= max_attempts)
        )""",
        """CREATE UNIQUE INDEX task_dedupe ON task (workspace, caller, message_id)
           WHERE message_id IS NOT NULL""",
        """CREATE UNIQUE INDEX task_session_slot ON task (workspace, session_key)
           WHERE session_key IS NOT NULL AND lease_expires_at IS NOT NULL""",
        "CREATE INDEX task_ready ON task (workspace, receiver, seq) WHERE state = 'queued'",
        """CREATE INDEX task_session_open ON task (workspace, session_key, seq)
           WHERE session_key IS NOT NULL AND state IN ('queued','leased')""",
        """CREATE INDEX task_held ON task (workspace, receiver, lease_expires_at)
           WHERE lease_expires_at IS NOT NULL""",
        "CREATE INDEX task_expiry ON task (lease_expires_at) WHERE lease_expires_at IS NOT NULL",
        "CREATE INDEX task_ws ON task (workspace, seq)",
        "CREATE INDEX task_context ON task (workspace, context_id, seq)",
        """CREATE TABLE task_event (
            seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            task_id text NOT NULL,
            at timestamptz NOT NULL DEFAULT clock_timestamp(),
            kind text NOT NULL,
            body text NOT NULL
        )""",
        "CREATE INDEX task_event_task ON task_event (task_id, seq)",
    ),
    # v2 — a caller lists its own tasks (A2A ListTasks) without scanning the workspace;
    # leave room in each page so lease updates stay HOT (no index churn per claim/renew)
    (
        "CREATE INDEX task_caller ON task (workspace, caller, seq)",
        "ALTER TABLE task SET (fillfactor = 80)",
    ),
    # v3 — TRUNCATE, which skips row triggers, is refused too: the log stays append-only
    (
        """CREATE TRIGGER audit_no_truncate BEFORE TRUNCATE ON audit
           FOR EACH STATEMENT EXECUTE FUNCTION audit_append_only()""",
    ),
    # v4 — a task is a sequence of turns (see the SQLite v4 for the why)
    (
        "ALTER TABLE task ADD COLUMN turn integer NOT NULL DEFAULT 1",
        "ALTER TABLE task_event ADD COLUMN turn integer NOT NULL DEFAULT 1",
        """CREATE TABLE task_turn (
            task_id text NOT NULL,
            turn integer NOT NULL,
            payload text NOT NULL,
            state text NOT NULL,
            result text,
            error text,
            epoch bigint NOT NULL,
            finished_at timestamptz,
            PRIMARY KEY (task_id, turn)
        )""",
        "CREATE INDEX task_turn_epoch ON task_turn (task_id, epoch)",
        """CREATE TABLE task_message (
            workspace text NOT NULL,
            caller text NOT NULL,
            message_id text NOT NULL,
            task_id text NOT NULL,
            turn integer NOT NULL,
            PRIMARY KEY (workspace, caller, message_id)
        )""",
        "CREATE INDEX task_message_task ON task_message (task_id)",
        """INSERT INTO task_message (workspace, caller, message_id, task_id, turn)
           SELECT workspace, caller, message_id, id, 1 FROM task WHERE message_id IS NOT NULL""",
    ),
    # v5 — the dashboard: owner sessions (stored by the hash of their cookie's id), and the
    # indexes its pages read by (a task's audit trail, activity over a time window)
    (
        """CREATE TABLE dashboard_session (
            id_hash text PRIMARY KEY,
            workspace text NOT NULL REFERENCES workspace(name),
            credential_id text NOT NULL REFERENCES credential(id),
            created_at timestamptz NOT NULL DEFAULT now(),
            last_seen_at timestamptz NOT NULL DEFAULT now(),
            idle_expires_at timestamptz NOT NULL,
            expires_at timestamptz NOT NULL
        )""",
        "CREATE INDEX dashboard_session_expiry ON dashboard_session (expires_at)",
        "CREATE INDEX audit_subject ON audit (workspace, subject, seq)",
        "CREATE INDEX task_created ON task (workspace, created_at)",
        """CREATE INDEX task_finished ON task (workspace, finished_at)
           WHERE finished_at IS NOT NULL""",
        "CREATE INDEX task_open ON task (workspace, created_at) WHERE finished_at IS NULL",
    ),
    # v6 — push notifications (see the SQLite v6 for the why)
    (
        "ALTER TABLE workspace ADD COLUMN push_allow_private boolean NOT NULL DEFAULT false",
        "ALTER TABLE agent ADD COLUMN push_secret text",
        """CREATE TABLE push_config (
            task_id text NOT NULL,
            id text NOT NULL,
            workspace text NOT NULL,
            caller text NOT NULL,
            url text NOT NULL,
            token text,
            auth_scheme text,
            auth_credentials text,
            created_at timestamptz NOT NULL DEFAULT now(),
            mark_state text,
            mark_turn integer,
            mark_seq bigint,
            n integer NOT NULL,
            PRIMARY KEY (task_id, id)
        )""",
        """CREATE TABLE push_outbox (
            id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            task_id text NOT NULL,
            config_id text NOT NULL,
            state text NOT NULL,
            turn integer NOT NULL,
            upto_seq bigint NOT NULL,
            created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
            due_at timestamptz NOT NULL DEFAULT clock_timestamp(),
            attempts integer NOT NULL DEFAULT 0,
            sent integer NOT NULL DEFAULT 0,
            leased_by text,
            leased_until timestamptz,
            delivered_at timestamptz,
            gave_up_at timestamptz,
            last_error text,
            FOREIGN KEY (task_id, config_id) REFERENCES push_config (task_id, id)
                ON DELETE CASCADE
        )""",
        "CREATE INDEX push_outbox_config ON push_outbox (task_id, config_id, id)",
        """CREATE INDEX push_outbox_due ON push_outbox (due_at)
           WHERE delivered_at IS NULL AND gave_up_at IS NULL""",
        """CREATE FUNCTION push_on_state() RETURNS trigger LANGUAGE plpgsql AS $$
           BEGIN
             INSERT INTO push_outbox (task_id, config_id, state, turn, upto_seq)
             SELECT NEW.id, c.id, NEW.state, NEW.turn,
                    (SELECT COALESCE(MAX(e.seq), 0) FROM task_event e WHERE e.task_id = NEW.id)
             FROM push_config c WHERE c.task_id = NEW.id
             FOR KEY SHARE OF c;
             RETURN NULL;
           END $$""",
        """CREATE TRIGGER push_on_state AFTER UPDATE OF state, turn ON task FOR EACH ROW
           WHEN (NEW.state IS DISTINCT FROM OLD.state OR NEW.turn IS DISTINCT FROM OLD.turn)
           EXECUTE FUNCTION push_on_state()""",
        """CREATE FUNCTION push_on_event() RETURNS trigger LANGUAGE plpgsql AS $$
           BEGIN
             INSERT INTO push_outbox (task_id, config_id, state, turn, upto_seq)
             SELECT NEW.task_id, c.id, t.state, t.turn, NEW.seq
             FROM push_config c JOIN task t ON t.id = c.task_id
             WHERE c.task_id = NEW.task_id
             FOR KEY SHARE OF c;
             RETURN NULL;
           END $$""",
        """CREATE TRIGGER push_on_event AFTER INSERT ON task_event FOR EACH ROW
           EXECUTE FUNCTION push_on_event()""",
    ),
    # v7 — task routes, receivers' last sighting, wake-ups (see the SQLite v7 for the why)
    (
        """CREATE TABLE task_route (
            id text PRIMARY KEY,
            workspace text NOT NULL,
            agent text NOT NULL,
            capability text NOT NULL,
            adapter text NOT NULL,
            session text,
            cwd text,
            profile text,
            options text NOT NULL,
            state text NOT NULL CHECK (state IN ('pending','approved','revoked')),
            proposed_at timestamptz NOT NULL DEFAULT now(),
            proposed_by text NOT NULL,
            approved_at timestamptz,
            approved_by text,
            revoked_at timestamptz,
            revoked_by text,
            FOREIGN KEY (workspace, agent) REFERENCES agent(workspace, id)
        )""",
        """CREATE UNIQUE INDEX task_route_approved ON task_route (workspace, agent, capability)
           WHERE state = 'approved'""",
        "CREATE INDEX task_route_ws ON task_route (workspace, proposed_at)",
        "CREATE INDEX task_route_agent ON task_route (workspace, agent, state)",
        "ALTER TABLE agent ADD COLUMN receiver_seen_at timestamptz",
        "ALTER TABLE agent ADD COLUMN receiver_info text",
        "ALTER TABLE agent ADD COLUMN wake_url text",
        "ALTER TABLE agent ADD COLUMN wake_secret text",
    ),
    # v8 — operations (see the SQLite v8 for the why)
    (
        "ALTER TABLE audit ADD COLUMN request_id text",
        """CREATE TABLE agent_limits (
            workspace text NOT NULL REFERENCES workspace(name),
            agent text NOT NULL,
            send_rate double precision,
            burst integer,
            max_unfinished_per_receiver integer,
            max_queued integer,
            updated_at timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (workspace, agent)
        )""",
        """CREATE INDEX task_unfinished ON task (workspace, receiver, caller)
           WHERE state IN ('queued','leased','input_required')""",
    ),
    # v9 — a progress report in one statement: each statement of a transaction is a round
    # trip, and a stream waits for this commit. The function takes the task's row (live
    # lease, this epoch) and only then inserts — each statement of a volatile function
    # reads afresh, so ``prev`` is exact as in the transaction it replaces — and records
    # the audit line; no row back: the caller's transaction decides and explains.
    (
        """CREATE FUNCTION mellan_report_event(
            p_task text, p_epoch bigint, p_kind text, p_body text, p_actor text,
            p_action text, p_rule text, p_reason text, p_detail text, p_request_id text)
        RETURNS TABLE (seq bigint, task_id text, at timestamptz, kind text, body text,
                       turn integer, prev bigint, workspace text)
        LANGUAGE plpgsql VOLATILE AS $$
        DECLARE
            ws text;
        BEGIN
            SELECT t.workspace INTO ws FROM task t
             WHERE t.id = p_task AND t.lease_epoch = p_epoch AND t.state = 'leased'
               FOR NO KEY UPDATE;
            IF NOT FOUND THEN
                RETURN;
            END IF;
            RETURN QUERY
                INSERT INTO task_event AS e (task_id, kind, body, turn)
                SELECT p_task, p_kind, p_body, t.turn FROM task t WHERE t.id = p_task
                RETURNING e.seq, e.task_id, e.at, e.kind, e.body, e.turn,
                    (SELECT COALESCE(MAX(x.seq), 0) FROM task_event x
                      WHERE x.task_id = e.task_id AND x.seq < e.seq), ws;
            IF p_actor IS NOT NULL THEN
                INSERT INTO audit (workspace, actor, action, subject, allowed, rule, reason,
                                   detail, request_id)
                VALUES (ws, p_actor, p_action, p_task, true, p_rule, p_reason, p_detail,
                        p_request_id);
            END IF;
        END $$""",
    ),
    # v10 — the send caps read counters, not the backlog (see the SQLite v10 for the why):
    # statement triggers with transition tables, striped over COUNT_SLOTS rows per key
    _PG_COUNTS,
    # v11 — push_on_state only for a task with a push config (see the SQLite v11)
    (
        "ALTER TABLE task ADD COLUMN push boolean NOT NULL DEFAULT false",
        "UPDATE task SET push = true WHERE id IN (SELECT task_id FROM push_config)",
        """CREATE FUNCTION push_mark() RETURNS trigger LANGUAGE plpgsql AS $$
           BEGIN
             UPDATE task SET push = true WHERE id = NEW.task_id AND NOT push;
             RETURN NULL;
           END $$""",
        """CREATE TRIGGER push_mark AFTER INSERT ON push_config FOR EACH ROW
           EXECUTE FUNCTION push_mark()""",
        "DROP TRIGGER push_on_state ON task",
        """CREATE TRIGGER push_on_state AFTER UPDATE OF state, turn ON task FOR EACH ROW
           WHEN (NEW.push AND (NEW.state IS DISTINCT FROM OLD.state
                               OR NEW.turn IS DISTINCT FROM OLD.turn))
           EXECUTE FUNCTION push_on_state()""",
    ),
    # v12 — sealed tasks: each agent's public key (see the SQLite v12)
    (
        """CREATE TABLE agent_key (
            workspace text NOT NULL,
            agent text NOT NULL,
            public_key text NOT NULL,
            fingerprint text NOT NULL,
            registered_at timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (workspace, agent),
            FOREIGN KEY (workspace, agent) REFERENCES agent(workspace, id)
        )""",
        "ALTER TABLE agent_grant ADD COLUMN sealed boolean NOT NULL DEFAULT false",
    ),
)

LATEST_SQLITE = len(SQLITE)
LATEST_POSTGRES = len(POSTGRES)


class SchemaTooNew(RuntimeError):
    """The database was upgraded by a newer mellan than this one.

    An old replica must not run on it: it would read and write tables whose rules it does
    not know (e.g. a column a newer trigger relies on), so it refuses before serving."""

    def __init__(self, found: int, known: int) -> None:
        super().__init__(
            f"the database schema is at version {found}, newer than this mellan knows "
            f"(version {known}): a newer relay upgraded it. Upgrade this replica to the "
            "newer mellan (schema upgrades only move forward; see 'Schema upgrades' in "
            "docs/operations.md)"
        )
        self.found = found
        self.known = known
