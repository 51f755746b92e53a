"""Schema versions: a database created by the first released schema upgrades in place."""

from __future__ import annotations

from pathlib import Path

import pytest

from melchior.mellan.relay.store import migrations
from melchior.mellan.relay.store.base import Outcome, Store, TaskState
from melchior.mellan.relay.store.sqlite import SQLiteStore
from storekit import CALLER, RECEIVER, WS, new_task, seed


def _make(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> Store:
    if kind == "sqlite":
        return SQLiteStore(tmp_path / "relay.db")
    from melchior.mellan.relay.store.postgres import PostgresStore

    return PostgresStore(request.getfixturevalue("pg_url"))


V1_TASK = (
    "INSERT INTO task (id, workspace, caller, receiver, capability, context_id, state, payload,"
    " metadata, message_id, session_key, chain, hop, path, attempt, max_attempts, lease_epoch,"
    " lease_owner, lease_expires_at, run_after, created_at, updated_at) VALUES"
    " (%s, 'w', 'local/caller', 'private/ops', 'incident.inspect', 'ctx', %s, '{{}}', '{{}}', %s,"
    " %s, 'c', 1, '[]', %s, 3, %s, %s, CASE WHEN %s::text IS NOT NULL THEN {expires} END,"
    " {now}, {now}, {now})"
)


def _write_v1_tasks(kind: str, s: Store, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """Tasks as the v1 schema held them, written with v1's own columns (today's code
    speaks a newer schema): one queued with a messageId, one leased of session "sess",
    and its successor in that session, queued."""
    rows = [
        ("t-queued", "queued", "m", None, 0, 0, None),
        ("t-leased", "leased", None, "sess", 1, 1, "r"),
        ("t-next", "queued", None, "sess", 0, 0, None),
    ]
    if kind == "sqlite":
        import sqlite3

        conn = sqlite3.connect(tmp_path / "relay.db", isolation_level=None)
        now = "CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER)"
        sql = V1_TASK.replace("%s::text", "?").replace("%s", "?")
        sql = sql.format(expires=f"{now} + 600000", now=now)
        for tid, state, mid, key, attempt, epoch, owner in rows:
            conn.execute(sql, (tid, state, mid, key, attempt, epoch, owner, owner))
        conn.close()
        return
    import psycopg

    with psycopg.connect(request.getfixturevalue("pg_url"), autocommit=True) as conn:
        sql = V1_TASK.format(expires="now() + interval '10 minutes'", now="now()")
        for tid, state, mid, key, attempt, epoch, owner in rows:
            conn.execute(sql, (tid, state, mid, key, attempt, epoch, owner, owner))


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_upgrade_from_v1(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    latest = migrations.LATEST_SQLITE if kind == "sqlite" else migrations.LATEST_POSTGRES
    s = _make(kind, tmp_path, request)
    try:
        migrate = getattr(s, "migrate")  # noqa: B009 - target= is a backend extra
        assert migrate(target=1) == 1
        assert getattr(s, "schema_version")() == 1  # noqa: B009
        # data written under v1, including a task mid-lease
        seed(s)
        g = s.add_grant(WS, CALLER, RECEIVER, ["incident.inspect"])
        _write_v1_tasks(kind, s, tmp_path, request)
    finally:
        s.close()
    s = _make(kind, tmp_path, request)
    try:
        assert s.migrate() == latest
        assert s.migrate() == latest
        assert s.granted_capabilities(WS, CALLER, RECEIVER) == {"incident.inspect"}
        assert [x.id for x in s.list_grants(WS)] == [g.id]
        assert s.complete("t-leased", 1, "{}").outcome is Outcome.OK
        again, created = s.enqueue(new_task(message_id="m"))  # the ledger knows v1's ids
        assert not created
        assert again.id == "t-queued"
        nxt = s.claim(WS, RECEIVER, "r", limit=5)
        assert {x.task.id for x in nxt} == {"t-queued", "t-next"}
        assert {x.task.session_key for x in nxt} == {None, "sess"}
        cur = s.get_task(WS, "t-leased")
        assert cur is not None
        assert cur.state is TaskState.SUCCEEDED
    finally:
        s.close()


def test_versions_are_append_only_shaped() -> None:
    """Each version is a tuple of statements; both backends move in step, and every
    version changes something on at least one of them (v9 is PostgreSQL's alone)."""
    for versions in (migrations.SQLITE, migrations.POSTGRES):
        assert versions
        assert all(all(isinstance(s, str) and s for s in v) for v in versions)
    assert migrations.LATEST_SQLITE == migrations.LATEST_POSTGRES
    assert all(a or b for a, b in zip(migrations.SQLITE, migrations.POSTGRES, strict=True))


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_v7_routes_on_agents_made_before(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Agents stored under v6 read back with no receiver sighting and no wake URL after
    v7, and can propose routes at once; only one route per (agent, capability) may be
    approved, by the schema itself."""
    from melchior.mellan.relay.store.base import NewRoute, RouteState

    latest = migrations.LATEST_SQLITE if kind == "sqlite" else migrations.LATEST_POSTGRES
    s = _make(kind, tmp_path, request)
    try:
        assert getattr(s, "migrate")(target=6) == 6  # noqa: B009
        seed(s)
    finally:
        s.close()
    s = _make(kind, tmp_path, request)
    try:
        assert s.migrate() == latest
        agent = s.get_agent(WS, RECEIVER)
        assert agent is not None
        assert (agent.receiver_seen_at, agent.receiver_info, agent.wake_url) == (None, None, None)
        new = NewRoute(WS, RECEIVER, "incident.inspect", "command", "agent:x")
        a, b = s.propose_route(new), s.propose_route(new)
        assert s.approve_route(WS, a.id, "owner:o").changed
        assert s.approve_route(WS, b.id, "owner:o").superseded[0].id == a.id
        states = {r.id: r.state for r in s.list_routes(WS)}
        assert states == {a.id: RouteState.REVOKED, b.id: RouteState.APPROVED}
    finally:
        s.close()


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_v8_on_a_v6_database(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """v8 (send limits, request ids in audit) on a database from v6: its audit records and
    grants come through, old records without a request id."""
    from melchior.mellan.relay.store.base import Caps, OverLimit, Record
    from melchior.policy.send_limits import Overrides

    latest = migrations.LATEST_SQLITE if kind == "sqlite" else migrations.LATEST_POSTGRES
    s = _make(kind, tmp_path, request)
    try:
        assert getattr(s, "migrate")(target=6) == 6  # noqa: B009
        seed(s)
        g = s.add_grant(WS, CALLER, RECEIVER, ["incident.inspect"])
        # a v6 audit row, written with v6's columns
        if kind == "sqlite":
            import sqlite3

            conn = sqlite3.connect(tmp_path / "relay.db", isolation_level=None)
            conn.execute(
                "INSERT INTO audit (workspace, at, actor, action, subject, allowed, rule, reason,"
                " detail) VALUES ('w', 0, 'relay', 'old', 's', 1, 'r', 'v6', '{}')"
            )
            conn.close()
        else:
            import psycopg

            with psycopg.connect(request.getfixturevalue("pg_url"), autocommit=True) as conn:
                conn.execute(
                    "INSERT INTO audit (workspace, actor, action, subject, allowed, rule, reason,"
                    " detail) VALUES ('w', 'relay', 'old', 's', true, 'r', 'v6', '{}')"
                )
    finally:
        s.close()
    s = _make(kind, tmp_path, request)
    try:
        assert s.migrate() == latest
        assert [(r.action, r.request_id) for r in s.audit_since(WS)] == [("old", None)]
        assert [x.id for x in s.list_grants(WS)] == [g.id]
        rec = Record("owner:o", "limits.set", "owner", "v8", request_id="r-1")
        assert s.set_limits(WS, RECEIVER, Overrides(max_queued=1), record=rec).max_queued == 1
        assert s.audit_since(WS)[-1].request_id == "r-1"
        caps = Caps(max_unfinished_per_receiver=10, max_queued=1)
        got = s.admit([new_task(caps=caps), new_task(caps=caps)])
        assert isinstance(got[1], OverLimit)
    finally:
        s.close()


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_v10_counts_the_tasks_already_there(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The counters v10 adds start from the rows a v9 database holds (queued, running,
    waiting for input, finished), so the first capped send after the upgrade counts them."""
    from melchior.mellan.relay.store.base import Caps, OverLimit
    from melchior.policy.send_limits import QUEUED

    s = _make(kind, tmp_path, request)
    try:
        assert getattr(s, "migrate")(target=9) == 9  # noqa: B009
        seed(s)
        for k in range(4):
            s.enqueue(new_task(message_id=f"m{k}"))
        (first, second) = s.claim(WS, RECEIVER, "rx", limit=2)
        s.complete(first.task.id, first.epoch, "{}")
        s.complete(second.task.id, second.epoch, "{}", input_required=True)
    finally:
        s.close()
    s = _make(kind, tmp_path, request)
    try:
        s.migrate()
        read = getattr(s, "_read")  # noqa: B009
        (q,) = read("SELECT sum(n) AS n FROM receiver_queued")
        (u,) = read("SELECT sum(n) AS n FROM caller_unfinished")
        assert (int(q["n"]), int(u["n"])) == (2, 3)  # 2 queued; + 1 waiting for input
        (over,) = s.admit([new_task(message_id="m9", caps=Caps(1000, 2))])
        assert isinstance(over, OverLimit)
        assert (over.limit, over.count) == (QUEUED, 2)
    finally:
        s.close()


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_v11_flags_the_tasks_with_push_configs(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """After v11 a task's state changes are pushed only when it is flagged: a task with a
    config made under v10 is flagged by the upgrade and still pushed; one without is not."""
    from melchior.mellan.relay.store.base import NewPush

    s = _make(kind, tmp_path, request)
    try:
        assert getattr(s, "migrate")(target=10) == 10  # noqa: B009
        seed(s)
        pushed, _ = s.enqueue(new_task(message_id="a"))
        s.add_push_config(WS, pushed.id, CALLER, NewPush(url="https://hooks.example/t"))
        silent, _ = s.enqueue(new_task(message_id="b"))
    finally:
        s.close()
    s = _make(kind, tmp_path, request)
    try:
        s.migrate()
        read = getattr(s, "_read")  # noqa: B009
        flags = {r["id"]: bool(r["push"]) for r in read("SELECT id, push FROM task")}
        assert flags == {pushed.id: True, silent.id: False}
        assert len(s.claim(WS, RECEIVER, "rx", limit=2)) == 2
        assert [r.state for r in s.push_attempts(pushed.id)] == [TaskState.LEASED]
        assert s.push_attempts(silent.id) == []
        later, _ = s.enqueue(new_task(message_id="c"))
        s.add_push_config(WS, later.id, CALLER, NewPush(url="https://hooks.example/u"))
        (row,) = read(f"SELECT push FROM task WHERE id = '{later.id}'")
        assert bool(row["push"])  # a config made after the upgrade flags its task too
    finally:
        s.close()
