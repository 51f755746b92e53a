"""PostgreSQL-only relay behaviour: two replica processes on one database, and a database
outage answered with a clear 503, nothing half-written, and recovery without a restart."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from melchior.mellan.client.receiver import ClaimedTask, ReceiverClient, ReceiverError
from melchior.mellan.relay.store import open_store
from melchior.mellan.relay.store.base import Outcome, Store
from relay_proc import RelayProc, enqueue, enroll_and_join, ok, setup_pair, start_relay

pytestmark = pytest.mark.postgres
RECOVERY_DEADLINE = 60.0  # how long to keep retrying after the database is back; not a metric


@pytest.fixture
def replicas(pg_url: str, tmp_path: Path) -> Iterator[tuple[RelayProc, RelayProc]]:
    a = start_relay(pg_url, tmp_path / "a")
    b = start_relay(pg_url, tmp_path / "b")
    try:
        yield a, b
    finally:
        a.stop()
        b.stop()


def test_two_replicas_share_one_database(
    replicas: tuple[RelayProc, RelayProc], pg_url: str
) -> None:
    a, b = replicas
    assert a.owner_token
    assert not b.token_file.exists()
    assert any("exists" in line for line in b.lines)
    b.owner_token = a.owner_token
    _, ops = setup_pair(a)
    store: Store = open_store(pg_url)
    try:
        got: list[ClaimedTask] = []

        def receive_on_b() -> None:
            with ReceiverClient(b.url, ops) as rc:
                got.extend(rc.claim(wait=30))

        t = threading.Thread(target=receive_on_b)
        t.start()
        task_id = enqueue(store, '{"n":12345678901234567890}')
        t.join(timeout=60)
        assert not t.is_alive()
        assert [g.task_id for g in got] == [task_id]
        assert got[0].payload == {"n": 12345678901234567890}
        with b.owner() as c:  # b sees what a wrote, and the other way round
            assert ok(c.get(f"/api/tasks/{task_id}"))["state"] == "leased"
        with a.owner() as c:
            assert ok(c.post(f"/api/tasks/{task_id}/cancel"))["outcome"] == "ok"
        with ReceiverClient(b.url, ops) as rc:
            out = rc.renew(task_id, got[0].epoch)
            assert out.lease_lost
            assert out.reason == "cancelled"
        second = enqueue(store)
        with ReceiverClient(a.url, ops) as rc:
            lease = rc.claim(wait=10)[0]
        with ReceiverClient(b.url, ops) as rc:
            assert rc.complete(second, lease.epoch, {}).outcome is Outcome.OK
        with a.owner() as c:
            assert ok(c.get(f"/api/tasks/{second}"))["state"] == "succeeded"
        with b.owner() as c:
            actions = [r["action"] for r in ok(c.get("/api/audit"))["records"]]
        assert "grant.add" in actions
        assert "task.cancel" in actions
        assert "task.complete" in actions
        # an enrollment code minted on one replica is redeemed on the other, once
        with a.owner() as c:
            c.post("/api/agents", json={"id": "third/one"})
            code = ok(c.post("/api/enrollments", json={"agent": "third/one"}), 201)["code"]
        with b.client() as c:
            ok(c.post("/api/join", json={"code": code}), 201)
        with a.client() as c:
            assert c.post("/api/join", json={"code": code}).status_code == 401
    finally:
        store.close()


def _db_name(url: str) -> str:
    return url.rsplit("/", 1)[1]


def _set_outage(pg_url: str, down: bool) -> None:
    """Refuse new connections to the relay's database and cut the existing ones (or undo)."""
    import psycopg

    from conftest import PG_ADMIN_URL

    name = _db_name(pg_url)
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
        admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS {"false" if down else "true"}')
        if down:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = %s AND pid <> pg_backend_pid()",
                (name,),
            )


def test_database_outage_is_a_clear_503_then_recovers(pg_url: str, tmp_path: Path) -> None:
    relay = start_relay(pg_url, tmp_path)
    try:
        codex, ops = setup_pair(relay)
        _set_outage(pg_url, down=True)
        try:
            with relay.owner() as c:
                r = c.post("/api/agents", json={"id": "during/outage"})
                assert r.status_code == 503, r.text
                error = r.json()["error"]
                assert error["code"] == "database-unavailable"
                assert "nothing was changed" in error["reason"]
                assert c.get("/healthz").status_code == 503
            with ReceiverClient(relay.url, ops) as rc:
                with pytest.raises(ReceiverError) as claim:
                    rc.claim(wait=0)
                assert claim.value.status == 503
                assert claim.value.code == "database-unavailable"
        finally:
            _set_outage(pg_url, down=False)
        deadline = time.monotonic() + RECOVERY_DEADLINE
        with relay.owner() as c:
            while c.get("/healthz").status_code != 200:
                assert time.monotonic() < deadline, "relay did not recover"
                time.sleep(0.2)
            agents = [a["id"] for a in ok(c.get("/api/agents"))["agents"]]
            assert "during/outage" not in agents  # refused means not written
            ok(c.post("/api/agents", json={"id": "during/outage"}), 201)
        with ReceiverClient(relay.url, ops) as rc:
            assert rc.claim(wait=0) == []
        assert enroll_and_join(relay, "during/outage")
        assert codex
    finally:
        relay.stop()


def test_terminated_backends_never_surface_as_500(pg_url: str, tmp_path: Path) -> None:
    """Connections cut under the relay (a failover, an admin's pg_terminate_backend): each
    request is answered or refused with 503, and service comes back on its own."""
    import psycopg

    from conftest import PG_ADMIN_URL

    relay = start_relay(pg_url, tmp_path)
    try:
        setup_pair(relay)
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = %s AND pid <> pg_backend_pid()",
                (_db_name(pg_url),),
            )
        statuses = []
        with relay.owner() as c:
            for i in range(6):
                r = c.post("/api/agents", json={"id": f"after/cut-{i}"})
                statuses.append(r.status_code)
                if r.status_code == 503:
                    assert r.json()["error"]["code"] == "database-unavailable"
            assert set(statuses) <= {201, 503}, statuses
            assert statuses[-1] == 201
            made = {a["id"] for a in ok(c.get("/api/agents"))["agents"]}
        assert made >= {f"after/cut-{i}" for i, s in enumerate(statuses) if s == 201}
        assert not made & {f"after/cut-{i}" for i, s in enumerate(statuses) if s == 503}
    finally:
        relay.stop()
