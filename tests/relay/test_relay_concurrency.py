"""Several receivers claiming through two relay replicas on one database, with leases
revoked under their feet: no double success, sessions serialised in order, attempts
bounded. Everything the receivers do goes over HTTP; the chaos (expiring every live
lease now and then) and the enqueueing go through the store API in-process.
"""

from __future__ import annotations

import itertools
import random
import threading
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest

from melchior.mellan.client.receiver import ReceiverClient
from melchior.mellan.relay.store import open_store
from melchior.mellan.relay.store.base import NewTask, Outcome, Store
from relay_proc import RelayProc, db_url_fixture, ok, setup_pair, start_relay

__all__ = ["db_url_fixture"]

TASKS = 300
SESSIONS = 6  # a third of the tasks belong to one of these bound sessions
WORKERS = 6
MAX_ATTEMPTS = 4


@pytest.fixture
def two_replicas(db_url: str, tmp_path: Path) -> Iterator[tuple[RelayProc, RelayProc]]:
    a = start_relay(db_url, tmp_path / "a")
    b = start_relay(db_url, tmp_path / "b")
    b.owner_token = a.owner_token
    try:
        yield a, b
    finally:
        a.stop()
        b.stop()


def test_receivers_on_two_replicas_keep_the_queue_rules(
    db_url: str, two_replicas: tuple[RelayProc, RelayProc]
) -> None:
    a, b = two_replicas
    _drain_through(db_url, a, b, TASKS)


@pytest.mark.slow
@pytest.mark.postgres
def test_10k_tasks_through_two_postgres_replicas(pg_url: str, tmp_path: Path) -> None:
    """The issue's full size, on the deployment several replicas need: PostgreSQL."""
    a = start_relay(pg_url, tmp_path / "a")
    b = start_relay(pg_url, tmp_path / "b")
    b.owner_token = a.owner_token
    try:
        _drain_through(pg_url, a, b, 10_000)
    finally:
        a.stop()
        b.stop()


def _drain_through(db_url: str, a: RelayProc, b: RelayProc, tasks: int) -> None:
    _, ops = setup_pair(a)
    store: Store = open_store(db_url)
    rng = random.Random(7)
    order: dict[str, list[str]] = defaultdict(list)  # session → task ids in enqueue order
    ids: list[str] = []
    try:
        for i in range(tasks):
            session = f"s{rng.randrange(SESSIONS)}" if i % 3 == 0 else None
            task, _ = store.enqueue(
                NewTask(
                    workspace="default",
                    caller="local/codex",
                    receiver="private/ops",
                    capability="incident.inspect",
                    payload=f'{{"i":{i},"big":{10**20 + i}}}',
                    session_key=session,
                    max_attempts=MAX_ATTEMPTS,
                )
            )
            ids.append(task.id)
            if session:
                order[session].append(task.id)

        lock = threading.Lock()
        successes: Counter[str] = Counter()
        success_claim_at: dict[str, str] = {}
        payload_ok: list[bool] = []
        stop = threading.Event()

        def settled() -> bool:
            with a.owner() as c:
                live = ok(c.get("/api/tasks", params={"state": "queued,leased", "limit": 1}))
            return not live["tasks"]

        def worker(n: int) -> None:
            url = (a if n % 2 else b).url
            with ReceiverClient(url, ops) as rc:
                while not stop.is_set():
                    leases = rc.claim(limit=5, wait=2, lease_seconds=60, worker=f"w{n}")
                    for lease in leases:
                        body = lease.payload
                        with lock:
                            payload_ok.append(body["big"] == 10**20 + body["i"])
                        if rng.random() < 0.05:
                            continue  # a receiver that crashed mid-task: never reports
                        out = rc.complete(lease.task_id, lease.epoch, {"artifacts": []})
                        if out.outcome is Outcome.OK:
                            with lock:
                                successes[lease.task_id] += 1
                                success_claim_at[lease.task_id] = lease.task["updated_at"]

        def chaos() -> None:
            while not stop.wait(0.5):
                store.expire_leases()  # type: ignore[attr-defined]

        threads = [threading.Thread(target=worker, args=(n,)) for n in range(WORKERS)]
        threads.append(threading.Thread(target=chaos))
        for t in threads:
            t.start()
        try:
            while not stop.wait(1.0):
                if settled():
                    stop.set()
        finally:
            stop.set()
            for t in threads:
                t.join(timeout=120)
        assert not any(t.is_alive() for t in threads)

        final = {tid: store.get_task("default", tid) for tid in ids}
        assert all(payload_ok)
        assert payload_ok
        assert max(successes.values()) == 1  # rule 1/4/5: never two recorded successes
        for tid, task in final.items():
            assert task is not None
            assert task.attempt <= task.max_attempts  # rule 2
            if task.state.value == "succeeded":
                assert successes[tid] == 1
            else:
                assert task.state.value == "failed"
                assert successes[tid] == 0
        # rule 3: within a session, each successful run was leased only after the previous
        # task of the session had finished (database clock), and in enqueue order
        for session_ids in order.values():
            for prev, nxt in itertools.pairwise(session_ids):
                p, n = final[prev], final[nxt]
                assert p is not None
                assert n is not None
                if nxt in success_claim_at:
                    assert success_claim_at[nxt] >= p.updated_at, (session_ids, prev, nxt)
        assert sum(successes.values()) >= tasks // 2  # the run did real work
    finally:
        store.close()
