"""Several real processes draining one queue on each backend, checked from outside.

Invariants (issue 4, "Proven by"): zero double recorded successes, zero overlap or
order violation inside a bound session, attempts never above max_attempts, every
duplicate report answered DUPLICATE, no task lost.
"""

from __future__ import annotations

import itertools
import json
import multiprocessing as mp
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from melchior.mellan.relay.store import open_store
from melchior.mellan.relay.store.base import Outcome, Store, TaskState
from storekit import WS, db_url_fixture, new_task, queue_worker, seed  # noqa: F401


def drain(
    url: str,
    tmp: Path,
    *,
    n_tasks: int,
    n_procs: int,
    sessions: int = 40,
    bound_share: float = 0.4,
    max_attempts: int = 3,
    sweep: bool = False,
    batches: tuple[int, ...] = (1, 9, 17),
    cancels: int = 0,
) -> None:
    s = open_store(url)
    seed(s)
    order: dict[str, list[str]] = defaultdict(list)  # session → task ids in enqueue order
    batch: list[Any] = []
    for i in range(n_tasks):
        bound = (i * 7919 % 100) < bound_share * 100
        key = f"s{i % sessions}" if bound else None
        batch.append(new_task(session_key=key, max_attempts=max_attempts))
    created = []
    for k in range(0, len(batch), 1000):
        created += s.enqueue_many(batch[k : k + 1000])
    for task, _ in created:
        if task.session_key is not None:
            order[task.session_key].append(task.id)
    ctx = mp.get_context("spawn")
    procs = []
    for p in range(n_procs):
        args = (
            url,
            f"w{p}",
            str(tmp / f"log{p}.jsonl"),
            p,
            batches[p % len(batches)],  # claim sizes differ between workers
            0.05,  # abandoned (crashed) runs
            0.05,  # transient failures, retried
            0.02,  # duplicate completion reports
            p % 2 == 0,  # half complete in batches
            sweep,
        )
        procs.append(ctx.Process(target=queue_worker, args=args))
    for pr in procs:
        pr.start()
    cancelled_ok: set[str] = set()
    canceller = threading.Thread(
        target=cancel_some, args=(s, [t.id for t, _ in created], cancels, cancelled_ok)
    )
    canceller.start()
    for pr in procs:
        pr.join(timeout=600)
        assert pr.exitcode == 0, f"worker exited with {pr.exitcode}"
    canceller.join()

    runs: dict[str, list[list[Any]]] = defaultdict(list)
    for p in range(n_procs):
        for line in (tmp / f"log{p}.jsonl").read_text().splitlines():
            rec = json.loads(line)
            runs[rec[0]].append(rec)

    tasks = {}
    after = None
    while True:
        page = s.list_tasks(WS, limit=500, after=after)
        if not page:
            break
        tasks.update({t.id: t for t in page})
        after = page[-1].id
    assert len(tasks) == n_tasks
    for tid, t in tasks.items():
        recs = runs[tid]
        oks = [r for r in recs if r[4] == "complete" and r[5] == Outcome.OK.value]
        assert t.state in (TaskState.SUCCEEDED, TaskState.FAILED, TaskState.CANCELLED), t
        assert len(oks) == (1 if t.state is TaskState.SUCCEEDED else 0), (t, recs)
        if tid in cancelled_ok:  # cancel won: nothing recorded a success after it
            assert t.state is TaskState.CANCELLED
            assert not oks
        executions = [r for r in recs if r[4] in ("complete", "fail", "abandon")]
        assert len(executions) == t.attempt <= t.max_attempts
        epochs = [r[1] for r in executions]
        assert len(set(epochs)) == len(epochs)  # one lease, one run
        assert all(r[5] == Outcome.DUPLICATE.value for r in recs if r[4] == "dup")
        # a live lease loses its report only to a cancel: nothing here outlived its TTL
        lost = [r for r in recs if r[4] in ("complete", "fail") and r[5] != Outcome.OK.value]
        assert all(r[5] == Outcome.LEASE_LOST.value for r in lost)
        assert not lost or t.state is TaskState.CANCELLED, (t, recs)

    for key, ids in order.items():
        session_runs = sorted((r for tid in ids for r in runs[tid]), key=lambda r: r[2])
        session_runs = [r for r in session_runs if r[4] != "dup"]
        rank = {tid: i for i, tid in enumerate(ids)}
        for prev, cur in itertools.pairwise(session_runs):
            assert cur[2] >= prev[3], f"session {key} overlap: {prev} / {cur}"
            assert rank[cur[0]] >= rank[prev[0]], f"session {key} order: {prev} / {cur}"
    s.close()


def cancel_some(s: Store, ids: list[str], count: int, won: set[str]) -> None:
    """The caller side meanwhile: cancel ``count`` random tasks, queued or running."""
    import random

    rng = random.Random(7)
    for _ in range(5000):  # start once the receivers are at work (bounded by tries)
        if s.list_tasks(WS, states=[TaskState.LEASED, TaskState.SUCCEEDED], limit=1):
            break
        time.sleep(0.002)
    late = ids[len(ids) * 2 // 3 :]  # likely still queued when we get to them
    for _ in range(count):
        running = s.list_tasks(WS, states=[TaskState.LEASED], limit=20)
        tid = rng.choice(running).id if running and rng.random() < 0.6 else rng.choice(late)
        _, out = s.cancel(WS, tid)
        if out is Outcome.OK:
            won.add(tid)
        time.sleep(0.003)


def test_processes_drain_queue(db_url: str, tmp_path: Path) -> None:
    drain(db_url, tmp_path, n_tasks=1500, n_procs=4, cancels=60)


@pytest.mark.slow
def test_processes_drain_10k(db_url: str, tmp_path: Path) -> None:
    # bigger claims keep this inside a minute or two on a busy 2-core machine
    drain(db_url, tmp_path, n_tasks=10_000, n_procs=6, batches=(4, 16, 32))


@pytest.mark.postgres
def test_pg_two_replicas_sweeping(pg_url: str, tmp_path: Path) -> None:
    """Two relay replicas (separate processes, separate PostgresStore) on one database,
    both running the sweeper on every turn: still every invariant, and no expired lease
    settled twice."""
    drain(pg_url, tmp_path, n_tasks=1000, n_procs=2, sweep=True)
    s = open_store(pg_url)
    expired = [r for r in s.audit_since(WS, limit=100_000) if r.action == "lease.expired"]
    keys = [(r.subject, r.detail["attempt"]) for r in expired]
    assert len(keys) == len(set(keys))
    s.close()


def in_threads(n: int, work: Any) -> None:
    """Run ``work(i)`` for i in 0..n-1, each in its own thread, all at once; the first
    failure of any of them is raised here, in the test's thread."""
    errors: list[BaseException] = []

    def guarded(i: int) -> None:
        try:
            work(i)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def test_threads_share_one_store(db_url: str) -> None:
    """The relay calls one store object from a pool of worker threads."""
    import threading

    s = open_store(db_url)
    seed(s)
    n = 400
    s.enqueue_many([new_task(session_key=f"s{i % 5}" if i % 2 else None) for i in range(n)])
    wins: list[str] = []
    ok = Outcome.OK
    lock = threading.Lock()

    def work(i: int) -> None:
        while True:
            leases = s.claim(WS, "private/ops", f"t{i}", limit=3)
            if not leases:
                if not s.list_tasks(WS, states=[TaskState.QUEUED, TaskState.LEASED], limit=1):
                    return
                continue
            outs = [
                v.outcome for v in s.complete_many([(x.task.id, x.epoch, "{}") for x in leases])
            ]
            with lock:
                wins.extend(x.task.id for x, o in zip(leases, outs, strict=True) if o is ok)

    in_threads(6, work)
    assert len(wins) == len(set(wins)) == n
    assert len(s.list_tasks(WS, states=[TaskState.SUCCEEDED], limit=n + 1)) == n
    s.close()


def test_zombie_reports_after_real_expiry(db_url: str, tmp_path: Path) -> None:
    """Real short leases on the database clock: receivers that stall past theirs and
    report late either still hold the task (nobody took it: their report lands) or are
    fenced out (``lease-lost``). Never two recorded successes; the recorded result is the
    one whose report was answered ``ok``; attempts stay bounded."""
    from storekit import zombie_worker

    s = open_store(db_url)
    seed(s)
    n = 80
    s.enqueue_many([new_task(max_attempts=4) for _ in range(n)])
    ctx = mp.get_context("spawn")
    procs = [
        ctx.Process(target=zombie_worker, args=(db_url, f"z{p}", str(tmp_path / f"z{p}"), p, 0.25))
        for p in range(4)
    ]
    for pr in procs:
        pr.start()
    for pr in procs:
        pr.join(timeout=600)
        assert pr.exitcode == 0
    reports: dict[str, list[list[Any]]] = defaultdict(list)
    for p in range(4):
        for line in (tmp_path / f"z{p}").read_text().splitlines():
            rec = json.loads(line)
            reports[rec[0]].append(rec)
    tasks = s.list_tasks(WS, limit=n + 1)
    assert len(tasks) == n
    fenced = 0
    for t in tasks:
        oks = [r for r in reports[t.id] if r[3] == Outcome.OK.value]
        fenced += sum(r[3] == Outcome.LEASE_LOST.value for r in reports[t.id])
        assert t.attempt <= t.max_attempts
        if t.state is TaskState.SUCCEEDED:
            assert len(oks) == 1
            assert json.loads(t.result or "{}")["epoch"] == oks[0][1] == t.lease_epoch
        else:
            assert t.state is TaskState.FAILED
            assert oks == []
    # ~10 % of runs stall; half of those wait until another receiver took the task over
    assert fenced > 0
    s.close()


def test_concurrent_reports_chain_every_event_to_the_one_before(db_url: str) -> None:
    """Four threads report on one task at once (the progress statement on PostgreSQL, the
    transaction on SQLite) and others append events: each event the witness hears of
    names as its predecessor exactly the task's event before it — what a stream relies on
    to take it without a read — and each report is audited once."""
    from melchior.mellan.relay.store.base import Chained

    s = open_store(db_url)
    seed(s)
    heard: list[Chained] = []
    lock = threading.Lock()

    def witness(written: Any) -> None:
        with lock:
            heard.extend(written)

    s.set_witness(witness)
    ((task, _),) = s.enqueue_many([new_task()])
    (lease,) = s.claim(WS, "private/ops", "w", limit=1)

    def report(i: int) -> None:
        for n in range(25):
            body = json.dumps({"n": f"{i}-{n}"})
            if i == 3:
                s.append_event(task.id, "status", body)
            else:
                verdict = s.progress(task.id, lease.epoch, "status", body, actor="agent:r")
                assert verdict.outcome is Outcome.OK

    in_threads(4, report)
    stored = s.events_after(task.id)
    assert len(stored) == 100
    prev = {c.event.seq: c.prev for c in heard}
    assert [prev[e.seq] for e in stored] == [0, *(e.seq for e in stored[:-1])]
    assert {c.event for c in heard} == set(stored)
    records = [r for r in s.audit_since(WS, 0, 10_000) if r.action == "task.progress"]
    assert len(records) == 75
    assert all(r.subject == task.id and r.allowed for r in records)
    s.close()
