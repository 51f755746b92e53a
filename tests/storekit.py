"""Fixtures and helpers the store/queue tests share: every test runs on both backends.

Import ``db_url_fixture``/``store_fixture`` into a test module to get fixtures
``db_url`` and ``store`` there.

A real SQLite file in a temporary directory and a real, fresh PostgreSQL database
(``pg_url`` from conftest). Test modules import the fixtures by name.
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from melchior.mellan.relay.store import open_store
from melchior.mellan.relay.store.base import Capability, NewTask, Store

WS = "w"
CALLER = "local/caller"
RECEIVER = "private/ops"
DAY = 86400.0


@pytest.fixture(
    name="db_url",
    params=[pytest.param("sqlite"), pytest.param("postgres", marks=pytest.mark.postgres)],
)
def db_url_fixture(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A database URL for one backend: a SQLite file, or a fresh PostgreSQL database."""
    if request.param == "sqlite":
        return f"sqlite://{tmp_path / 'relay.db'}"
    url: str = request.getfixturevalue("pg_url")
    return url


@pytest.fixture(name="store")
def store_fixture(db_url: str) -> Iterator[Store]:
    """A migrated store with workspace ``w`` and agents caller → receiver."""
    s = open_store(db_url)
    seed(s)
    try:
        yield s
    finally:
        s.close()


def seed(s: Store) -> None:
    s.ensure_workspace(WS)
    for agent in (CALLER, RECEIVER):
        if s.get_agent(WS, agent) is None:
            s.add_agent(WS, agent, f"agent {agent}", [Capability("incident.inspect", "look")])


def new_task(**kw: Any) -> NewTask:
    base: dict[str, Any] = {
        "workspace": WS,
        "caller": CALLER,
        "receiver": RECEIVER,
        "capability": "incident.inspect",
        "payload": '{"n": 12345678901234567890}',
    }
    base.update(kw)
    return NewTask(**base)


def wait_db_clock_past(s: Store, iso_stamp: str) -> None:
    """Block until the *database* clock is past ``iso_stamp`` (never a wall-clock bound:
    the loop asks the database, and gives up only after very many tries)."""
    for _ in range(100_000):
        if s.now() > iso_stamp:
            return
        time.sleep(0.005)
    raise AssertionError(f"database clock never passed {iso_stamp}")


def queue_worker(
    url: str,
    owner: str,
    log_path: str,
    seed_value: int,
    batch: int,
    abandon_rate: float,
    fail_rate: float,
    dup_rate: float,
    batched_complete: bool,
    sweep: bool,
) -> None:
    """One receiver process: claim, "run", report, in a loop until no work is left.

    Every run is logged (JSON lines, CLOCK_MONOTONIC is system-wide so processes
    compare) as ``[task_id, epoch, start_ns, end_ns, kind, outcome]`` so the parent can
    check the invariants from the outside. ``abandon`` simulates a receiver that crashed
    mid-task: it never reports, and its lease is made to expire (the store's drill hook,
    i.e. the TTL running out without waiting for it).
    """
    import json
    import random

    from melchior.mellan.relay.store.base import Outcome, TaskState

    rng = random.Random(seed_value)
    s = open_store(url, migrate=False)
    expire = getattr(s, "expire_leases")  # noqa: B009
    open_states = [TaskState.QUEUED, TaskState.LEASED]
    with open(log_path, "a", encoding="utf-8") as log:

        def note(*rec: object) -> None:
            log.write(json.dumps(rec) + "\n")

        while True:
            leases = s.claim(WS, RECEIVER, owner, limit=batch, lease_seconds=120)
            if not leases:
                if sweep:
                    s.sweep()
                if not s.list_tasks(WS, states=open_states, limit=1):
                    break
                time.sleep(0.002)
                continue
            done: list[tuple[str, int, int]] = []
            for lease in leases:
                tid, ep = lease.task.id, lease.epoch
                start = time.monotonic_ns()
                r = rng.random()
                if r < abandon_rate:
                    note(tid, ep, start, time.monotonic_ns(), "abandon", "")
                    expire([tid])
                elif r < abandon_rate + fail_rate:
                    end = time.monotonic_ns()
                    out = s.fail(tid, ep, "transient", backoff_seconds=0).outcome
                    note(tid, ep, start, end, "fail", out.value)
                else:
                    done.append((tid, ep, start))
            if done:
                end = time.monotonic_ns()
                items = [(tid, ep, f'{{"by": "{owner}"}}') for tid, ep, _ in done]
                if batched_complete:
                    outs = [v.outcome for v in s.complete_many(items)]
                else:
                    outs = [s.complete(*it).outcome for it in items]
                for (tid, ep, start), out in zip(done, outs, strict=True):
                    note(tid, ep, start, end, "complete", out.value)
                    if out is Outcome.OK and rng.random() < dup_rate:
                        again = s.complete(tid, ep, "{}").outcome
                        note(tid, ep, end, end, "dup", again.value)
            if sweep:
                s.sweep()
    s.close()


def zombie_worker(url: str, owner: str, log_path: str, seed_value: int, ttl: float) -> None:
    """A receiver that sometimes stalls past its lease (real TTL, real clock) and then
    reports anyway, as a partitioned or frozen receiver would. Logs
    ``[task_id, epoch, kind, outcome]``."""
    import json
    import random

    from melchior.mellan.relay.store.base import TaskState

    rng = random.Random(seed_value)
    s = open_store(url, migrate=False)
    open_states = [TaskState.QUEUED, TaskState.LEASED]
    first = True
    with open(log_path, "a", encoding="utf-8") as log:
        while True:
            leases = s.claim(WS, RECEIVER, owner, limit=2, lease_seconds=ttl)
            if not leases:
                if not s.list_tasks(WS, states=open_states, limit=1):
                    break
                s.sweep()
                time.sleep(0.005)
                continue
            for lease in leases:
                # worker 0's first run always stalls until taken over, so fencing is
                # surely exercised; after that ~10 % stall, half of them until takeover
                forced, first = seed_value == 0 and first, False
                stalled = forced or rng.random() < 0.1
                if stalled:
                    wait_db_clock_past(s, lease.expires_at)
                    # bounded by tries, not time: others may be stalled too
                    for _ in range(4000 if forced else 400 if rng.random() < 0.5 else 0):
                        cur = s.get_task(WS, lease.task.id)
                        if cur is None or cur.lease_epoch != lease.epoch:
                            break
                        time.sleep(0.005)
                body = json.dumps({"owner": owner, "epoch": lease.epoch})
                out = s.complete(lease.task.id, lease.epoch, body).outcome
                kind = "stalled" if stalled else "prompt"
                log.write(json.dumps([lease.task.id, lease.epoch, kind, out.value]) + "\n")
    s.close()


def backdate_in(db_url: str, task_id: str, days: float) -> None:
    """Make a task look as if it finished ``days`` earlier than it did (the test's only
    reach into the schema: waiting days for a clock is not an option)."""
    if db_url.startswith("sqlite://"):
        with contextlib.closing(sqlite3.connect(db_url.removeprefix("sqlite://"))) as c:
            sql = "UPDATE task SET finished_at = finished_at - ? WHERE id = ?"
            assert c.execute(sql, (int(days * DAY * 1000), task_id)).rowcount == 1
            c.commit()
    else:
        import psycopg

        with psycopg.connect(db_url) as c:
            sql = "UPDATE task SET finished_at = finished_at - make_interval(days => %s)"
            assert c.execute(sql + " WHERE id = %s", (days, task_id)).rowcount == 1


def rewrite_payload_in(db_url: str, task_id: str, payload: str) -> None:
    """Replace a task's stored payload, as a relay that tampers with its own database
    would (the hostile-relay tests' reach into the schema)."""
    sql = "UPDATE task SET payload = {p} WHERE id = {p}"
    if db_url.startswith("sqlite://"):
        with contextlib.closing(sqlite3.connect(db_url.removeprefix("sqlite://"))) as c:
            assert c.execute(sql.format(p="?"), (payload, task_id)).rowcount == 1
            c.commit()
    else:
        with psycopg.connect(db_url) as c:
            assert c.execute(sql.format(p="%s"), (payload, task_id)).rowcount == 1


def assert_holds_none(db_url: str, *texts: str) -> None:
    """The database holds none of ``texts`` anywhere (sealed content never reaches it)."""
    held = database_text(db_url)
    for text in texts:
        assert text.encode() not in held, f"the relay's database holds {text!r}"


def database_text(db_url: str) -> bytes:
    """Everything the database holds, as bytes: the SQLite files, or every PostgreSQL row."""
    if db_url.startswith("sqlite"):
        path = Path(db_url.removeprefix("sqlite://"))
        return b"".join(p.read_bytes() for p in path.parent.glob(path.name + "*"))
    out = []
    with psycopg.connect(db_url) as c:
        tables = [r[0] for r in c.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
        )]  # fmt: skip
        for t in tables:
            for row in c.execute(f'SELECT * FROM "{t}"'):
                out.append(repr(row).encode())
    return b"\n".join(out)
