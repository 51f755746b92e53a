"""Operating the relay: ``mellan relay backup`` under load restored into a relay that
serves every task, ``mellan relay migrate`` from SQLite to PostgreSQL keeping every row
(push outbox and audit included, triggers held off), the table list checked against the
schema, and old replicas refusing a newer schema."""

from __future__ import annotations

import sqlite3
import subprocess
import threading
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from conftest import PG_ADMIN_URL
from melchior.mellan.client.receiver import ReceiverClient
from melchior.mellan.relay.auth import hash_token
from melchior.mellan.relay.store import migrations, open_store
from melchior.mellan.relay.store.base import (
    Capability,
    CredentialKind,
    FollowUp,
    NewPush,
    NewRoute,
    NewTask,
    Record,
    Store,
)
from melchior.mellan.relay.store.migrations import SchemaTooNew
from melchior.mellan.relay.store.transfer import TABLES
from melchior.policy.send_limits import Overrides
from relay_proc import MELLAN, relay_env, setup_pair, start_relay
from storekit import db_url_fixture

__all__ = ["db_url_fixture"]

WS = "default"


def mellan(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [MELLAN, "relay", *args], capture_output=True, text=True, timeout=300, env=relay_env(home)
    )


# -- the table list is the schema's ---------------------------------------------------------


def schema_tables(url: str) -> set[str]:
    store = open_store(url)
    store.close()
    if url.startswith("postgresql"):
        with psycopg.connect(url) as c:
            rows = c.execute(
                "SELECT table_name FROM information_schema.tables "
                "WHERE table_schema = current_schema() AND table_type = 'BASE TABLE'"
            ).fetchall()
    else:
        with sqlite3.connect(url.removeprefix("sqlite://")) as c:
            rows = c.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
            ).fetchall()
    return {r[0] for r in rows} - {"schema_version"}


def test_migrate_copies_every_table_of_the_schema(db_url: str) -> None:
    """A new table in migrations.py must be added to transfer.TABLES, or this fails."""
    assert schema_tables(db_url) == set(TABLES)
    assert len(TABLES) == len(set(TABLES))


# -- old replicas refuse a newer schema -------------------------------------------------------


def test_an_old_replica_refuses_a_newer_schema(db_url: str, tmp_path: Path) -> None:
    store = open_store(db_url)
    latest = migrations.LATEST_POSTGRES if db_url.startswith("postgres") else (
        migrations.LATEST_SQLITE)  # fmt: skip
    store.close()
    newer = latest + 1
    if db_url.startswith("postgres"):
        with psycopg.connect(db_url) as c:
            c.execute("INSERT INTO schema_version (version) VALUES (%s)", (newer,))
    else:
        with sqlite3.connect(db_url.removeprefix("sqlite://")) as c:
            c.execute("INSERT INTO schema_version VALUES (?, 0)", (newer,))
    with pytest.raises(SchemaTooNew) as err:
        open_store(db_url)
    assert err.value.found == newer
    assert err.value.known == latest
    out = mellan(tmp_path, "--database", db_url, "--port", "0")
    assert out.returncode == 1
    assert f"schema is at version {newer}, newer than this mellan knows (version {latest})" in (
        out.stderr
    )
    assert "Upgrade this replica" in out.stderr


# -- backup ---------------------------------------------------------------------------------


def test_backup_refuses_postgresql_pointing_at_pg_dump(tmp_path: Path) -> None:
    out = mellan(tmp_path, "backup", str(tmp_path / "x.db"), "--database",
                 "postgresql://u:pw@db.invalid/mellan")  # fmt: skip
    assert out.returncode == 1
    assert "PostgreSQL" in out.stderr
    assert "pg_dump" in out.stderr
    assert "pw" not in out.stderr
    out = mellan(tmp_path, "backup", str(tmp_path / "x.db"), "--database",
                 f"sqlite://{tmp_path / 'none.db'}")  # fmt: skip
    assert out.returncode == 1
    assert "no database at" in out.stderr


def test_backup_under_load_restores_into_a_relay_serving_every_task(tmp_path: Path) -> None:
    db = tmp_path / "relay.db"
    relay = start_relay(f"sqlite://{db}", tmp_path)
    accepted: list[str] = []
    stop = threading.Event()
    errors: list[str] = []
    try:
        caller, receiver = setup_pair(relay)

        def load() -> None:
            n = 0
            with httpx.Client(base_url=relay.url, timeout=30, headers={
                    "authorization": f"Bearer {caller}", "A2A-Version": "1.0"}) as c:  # fmt: skip
                while not stop.is_set():
                    n += 1
                    body = {"message": {"messageId": f"m{n}", "role": "ROLE_USER",
                                        "parts": [{"text": f"task {n}"}]},
                            "metadata": {"capability": "incident.inspect"},
                            "configuration": {"returnImmediately": True}}  # fmt: skip
                    r = c.post("/a2a/default/private/ops/message:send", json=body)
                    if r.status_code != 200:
                        errors.append(r.text)
                        return
                    accepted.append(r.json()["task"]["id"])

        worker = threading.Thread(target=load)
        worker.start()
        while len(accepted) < 50 and worker.is_alive():
            stop.wait(0.01)
        before = list(accepted)  # acknowledged before the backup began: must be in it
        target = tmp_path / "backup" / "relay-copy.db"
        target.parent.mkdir()
        out = mellan(tmp_path, "backup", str(target), "--database", f"sqlite://{db}")
        during = len(accepted)
        stop.set()
        worker.join(60)
        assert not errors, errors
        assert out.returncode == 0, out.stderr
        assert "100%" in out.stderr
        assert "consistent" in out.stderr
        assert during > len(before)  # the load did run while the copy was taken (or after)
        assert target.stat().st_mode & 0o077 == 0
    finally:
        stop.set()
        relay.stop()
    # the copy is a database on its own: a relay on it serves every task it holds
    home = tmp_path / "restored"
    restored = start_relay(f"sqlite://{target}", home, token_file=relay.token_file)
    try:
        in_copy: set[str] = set()
        with restored.owner() as c:
            after = None
            while True:
                page = c.get("/api/tasks", params={"limit": 100, "after": after}).json()
                in_copy |= {t["id"] for t in page["tasks"]}
                if not (after := page["next"]):
                    break
        assert set(before) <= in_copy
        served: set[str] = set()
        with ReceiverClient(restored.url, receiver) as rc:
            while True:
                leases = rc.claim(limit=50, wait=0)
                if not leases:
                    break
                for lease in leases:
                    assert rc.complete(lease.task_id, lease.epoch, {"message": {
                        "role": "ROLE_AGENT", "parts": [{"text": "ok"}]}}).ok  # fmt: skip
                    served.add(lease.task_id)
        assert served == in_copy
    finally:
        restored.stop()


# -- SQLite → PostgreSQL ------------------------------------------------------------------------


def seed_everything(s: Store) -> None:
    """Rows in every table, as the relay itself writes them."""
    rec = Record("relay", "seed", "test", "seeding")
    s.ensure_workspace(WS)
    s.ensure_workspace("second")
    owner = s.add_credential(WS, CredentialKind.OWNER, "owner", hash_token("owner-tok"), record=rec)
    s.add_agent(WS, "private/ops", "ops", [Capability("incident.inspect", "look")], record=rec)
    s.add_agent(WS, "local/codex", "codex", [], record=rec)
    far = "2099-01-01T00:00:00.000Z"
    s.add_enrollment(WS, "private/ops", hash_token("code-1"), far, record=rec)
    s.add_enrollment(WS, "local/codex", hash_token("code-2"), far, record=rec)
    assert s.join(hash_token("code-1"), hash_token("ops-tok")) is not None
    s.add_grant(WS, "local/codex", "private/ops", ["incident.inspect"], record=rec)
    tasks = []
    for n in range(3):
        task, _ = s.enqueue(NewTask(
            WS, "local/codex", "private/ops", "incident.inspect",
            f'{{"n": 1234567890123456789{n}}}', message_id=f"m{n}", session_key=None,
            push=NewPush(url="https://hooks.example.net/x", token="push-tok") if n < 2 else None,
            accept=Record("local/codex", "task.accept", "grant", "granted"),
        ))  # fmt: skip
        tasks.append(task)
    leases = s.claim(WS, "private/ops", "receiver-1", limit=2, actor="private/ops")
    for lease in leases:
        s.progress(lease.task.id, lease.epoch, "status", '{"working": true}')
    s.complete(leases[0].task.id, leases[0].epoch, '{"done": 1}', actor="private/ops")
    second = leases[1].task
    s.complete(second.id, leases[1].epoch, '{"which": "one?"}', input_required=True)
    answer = FollowUp(WS, second.id, "local/codex", "m1-answer", '{"text": "that one"}',
                      second.chain, second.hop, second.path)  # fmt: skip
    assert s.continue_task(answer)[0] is not None  # a second turn
    s.add_push_config(WS, tasks[2].id, "local/codex", NewPush(url="https://h.example/2", id="c2"))
    s.add_session(WS, owner, hash_token("session"), idle_seconds=600, max_seconds=3600)
    s.push_secret(WS, "local/codex")
    s.set_push_allow_private("second", True, record=rec)
    s.audit(WS, "owner", "probe", "x", False, "test", "a refusal on the record", {"k": 1})
    s.set_limits(WS, "local/codex", Overrides(send_rate=2.5, burst=4), record=rec)
    s.set_limits(
        WS, "*", Overrides(max_queued=500), record=Record("owner", "x", "y", "z", request_id="r-1")
    )
    claimed = s.claim_pushes("deliverer-1", limit=10, lease_seconds=30)
    assert claimed
    s.push_delivered(claimed[0].id, "deliverer-1")
    route = s.propose_route(NewRoute(
        WS, "private/ops", "incident.inspect", "command", "agent:private/ops",
        cwd="/srv/ops", options='{"argv": ["cat"]}',
    ), record=rec)  # fmt: skip
    s.approve_route(WS, route.id, "owner:owner", record=rec)
    s.receiver_seen(WS, "private/ops", '{"name": "rx"}')
    s.set_wake(WS, "private/ops", "https://wake.example/ops", record=rec)
    s.set_agent_key(
        WS, "private/ops", "mellan-key-v1:" + "A" * 86, "0000-" * 9 + "0000", record=rec
    )


def canonical(url: str, table: str) -> list[tuple[Any, ...]]:
    """A table's rows in one form for both backends (timestamps as ms, booleans as ints)."""
    if url.startswith("postgres"):
        with psycopg.connect(url) as c:
            cur = c.execute(f'SELECT * FROM "{table}"')
            names = [d.name for d in cur.description or ()]
            rows = cur.fetchall()
    else:
        with sqlite3.connect(url.removeprefix("sqlite://")) as c:
            cur = c.execute(f'SELECT * FROM "{table}"')
            names = [d[0] for d in cur.description]
            rows = cur.fetchall()

    def norm(v: Any) -> Any:
        if isinstance(v, datetime):
            return round(v.timestamp() * 1000)
        if isinstance(v, bool):
            return int(v)
        return v

    order = sorted(range(len(names)), key=lambda i: names[i])
    return sorted((tuple(norm(row[i]) for i in order) for row in rows), key=repr)


@pytest.mark.postgres
def test_migrate_sqlite_to_postgresql_keeps_every_row(tmp_path: Path, pg_url: str) -> None:
    source = f"sqlite://{tmp_path / 'relay.db'}"
    store = open_store(source)
    try:
        seed_everything(store)
    finally:
        store.close()
    for table in TABLES:  # a new table must be seeded here too
        assert canonical(source, table), f"seed_everything leaves {table} empty"
    out = mellan(tmp_path, "migrate", "--from", source, "--to", pg_url)
    assert out.returncode == 0, out.stderr
    assert "verified" in out.stderr
    assert "rows copied" in out.stdout
    assert "session_replication_role = replica" in out.stderr
    for table in TABLES:
        assert canonical(pg_url, table) == canonical(source, table), table
    # PostgreSQL → PostgreSQL too (e.g. onto a new server): the same rows again
    second = pg_url + "_2"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{second.rsplit("/", 1)[1]}"')
    try:
        out = mellan(tmp_path, "migrate", "--from", pg_url, "--to", second)
        assert out.returncode == 0, out.stderr
        for table in TABLES:
            assert canonical(second, table) == canonical(source, table), table
    finally:
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{second.rsplit("/", 1)[1]}" WITH (FORCE)')
    # a second run is refused: the target is not empty
    again = mellan(tmp_path, "migrate", "--from", source, "--to", pg_url)
    assert again.returncode == 1
    assert "not empty" in again.stderr
    # the copy works as a relay's database: ids continue past the copied ones, the owner
    # credential still signs in, the audit log is still append-only
    moved = open_store(pg_url)
    try:
        with psycopg.connect(pg_url) as c:
            top_audit = c.execute("SELECT max(seq) FROM audit").fetchone()
            top_task = c.execute("SELECT max(seq) FROM task").fetchone()
            outbox = c.execute("SELECT max(id) FROM push_outbox").fetchone()
        assert top_audit
        assert top_task
        assert outbox
        seq = moved.audit(WS, "owner", "after", "x", True, "test", "after the move")
        assert seq > top_audit[0]
        task, _ = moved.enqueue(NewTask(WS, "local/codex", "private/ops", "incident.inspect",
                                        "{}", message_id="after"))  # fmt: skip
        with psycopg.connect(pg_url) as c:
            row = c.execute("SELECT seq FROM task WHERE id = %s", (task.id,)).fetchone()
            assert row
            assert row[0] > top_task[0]
            with pytest.raises(psycopg.errors.RaiseException, match="append-only"):
                c.execute("DELETE FROM audit")
        assert moved.principal_for(hash_token("owner-tok")) is not None
        # the push triggers are live again on the target
        leased = moved.claim(WS, "private/ops", "r2", limit=5)
        for lease in leased:
            moved.progress(lease.task.id, lease.epoch, "status", "{}")
        with psycopg.connect(pg_url) as c:
            after = c.execute("SELECT max(id) FROM push_outbox").fetchone()
        assert after
        assert after[0] > outbox[0]
    finally:
        moved.close()


@pytest.mark.postgres
def test_migrate_refusals(tmp_path: Path, pg_url: str) -> None:
    source = f"sqlite://{tmp_path / 'relay.db'}"
    open_store(source).close()
    out = mellan(tmp_path, "migrate", "--from", source, "--to", f"sqlite://{tmp_path / 'b.db'}")
    assert out.returncode == 1
    assert "--to must be a postgresql:// URL" in out.stderr
    old = tmp_path / "old.db"
    with sqlite3.connect(old) as c:  # a database an older mellan left at version 5
        c.execute("CREATE TABLE schema_version (version INTEGER PRIMARY KEY, applied_at INTEGER)")
        c.execute("INSERT INTO schema_version VALUES (5, 0)")
    out = mellan(tmp_path, "migrate", "--from", f"sqlite://{old}", "--to", pg_url)
    assert out.returncode == 1
    assert "schema version 5" in out.stderr
    # a target a relay has already started on (workspace and owner created) is refused
    relay = start_relay(pg_url, tmp_path / "pg-relay")
    relay.stop()
    out = mellan(tmp_path, "migrate", "--from", source, "--to", pg_url)
    assert out.returncode == 1
    assert "not empty" in out.stderr


@pytest.mark.postgres
def test_migrate_as_a_role_that_may_not_set_replication_role(tmp_path: Path, pg_url: str) -> None:
    """Not a superuser (the usual managed-PostgreSQL role): the copy disables the target's
    user triggers for its transaction instead, and enables them again."""
    import secrets

    role = f"mellan_t_{secrets.token_hex(4)}"
    db = pg_url.rsplit("/", 1)[1]
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute(f'CREATE ROLE "{role}" LOGIN')
        admin.execute(f'GRANT CREATE ON DATABASE "{db}" TO "{role}"')
        admin.execute(f'GRANT CREATE ON SCHEMA public TO "{role}"')
    as_role = pg_url.replace("postgres@", f"{role}@", 1)
    try:
        source = f"sqlite://{tmp_path / 'relay.db'}"
        store = open_store(source)
        try:
            seed_everything(store)
        finally:
            store.close()
        out = mellan(tmp_path, "migrate", "--from", source, "--to", as_role)
        assert out.returncode == 0, out.stderr
        assert "DISABLE TRIGGER USER" in out.stderr
        for table in TABLES:
            assert canonical(pg_url, table) == canonical(source, table), table
        with psycopg.connect(pg_url) as c:
            disabled = c.execute(
                "SELECT tgname FROM pg_trigger WHERE NOT tgisinternal AND tgenabled = 'D'"
            ).fetchall()
        assert disabled == []
    finally:
        with psycopg.connect(pg_url, autocommit=True) as admin:
            admin.execute(f'DROP OWNED BY "{role}"')
            admin.execute(f'DROP ROLE "{role}"')


def test_sigusr1_writes_every_threads_stack_and_the_relay_keeps_serving(tmp_path: Path) -> None:
    """For a relay that seems stuck: ``kill -USR1`` prints where each thread is."""
    import signal
    import time

    relay = start_relay(f"sqlite://{tmp_path / 'r.db'}", tmp_path)
    try:
        relay.proc.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + 30  # a liveness bound for the dump to arrive
        while not any("most recent call first" in line for line in relay.lines):
            assert time.monotonic() < deadline, relay.lines[-20:]
            time.sleep(0.1)
        assert any(line.startswith(("Current thread 0x", "Thread 0x")) for line in relay.lines)
        with relay.client() as c:
            assert c.get("/healthz").status_code == 200
    finally:
        assert relay.stop() == 0
