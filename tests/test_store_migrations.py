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
        queued, _ = s.enqueue(new_task(message_id="m"))
        leased, _ = s.enqueue(new_task(session_key="sess"))
        s.enqueue(new_task(session_key="sess"))
        leases = s.claim(WS, RECEIVER, "r", limit=2)
        assert {x.task.id for x in leases} == {queued.id, leased.id}
    finally:
        s.close()
    s = _make(kind, tmp_path, request)
    try:
        assert s.migrate() == latest
        assert s.migrate() == latest
        assert s.granted_capabilities(WS, CALLER, RECEIVER) == {"incident.inspect"}
        assert [x.id for x in s.list_grants(WS)] == [g.id]
        lease = next(x for x in leases if x.task.id == leased.id)
        assert s.complete(leased.id, lease.epoch, "{}").outcome is Outcome.OK
        again, created = s.enqueue(new_task(message_id="m"))
        assert not created
        assert again.id == queued.id
        nxt = s.claim(WS, RECEIVER, "r")
        assert len(nxt) == 1
        assert nxt[0].task.session_key == "sess"
        cur = s.get_task(WS, leased.id)
        assert cur is not None
        assert cur.state is TaskState.SUCCEEDED
    finally:
        s.close()


def test_versions_are_append_only_shaped() -> None:
    """Each version is a non-empty tuple of statements; both backends move in step."""
    for versions in (migrations.SQLITE, migrations.POSTGRES):
        assert versions
        assert all(v and all(isinstance(s, str) for s in v) for v in versions)
    assert migrations.LATEST_SQLITE == migrations.LATEST_POSTGRES
