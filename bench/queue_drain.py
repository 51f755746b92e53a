"""Queue drain and pickup latency: mellan's store vs pgqueuer vs procrastinate.

One run, one PostgreSQL server, a throwaway database per system (dropped at the
end), SQLite on the local filesystem with ``synchronous=FULL``. Each system drains
N pre-enqueued no-op tasks in this one process (so the machine's cores are shared
the same way); we report tasks/s, PostgreSQL commits per task (``xact_commit``
delta of that database, read after its connections closed so the counters are
flushed), and for mellan the pickup latency of a receiver woken by NOTIFY vs one
that polls.

mellan's numbers include what the others skip: every completion is fenced by the
lease epoch, attempts are counted at claim, the session rule is evaluated in the
claim, and (as the relay does) every claim and completion writes its audit record in
the same transaction (``--no-audit`` drains without them).
Run: ``.venv/bin/python bench/queue_drain.py [--tasks N]``; needs the
``bench`` extra (pgqueuer, procrastinate, asyncpg) and PostgreSQL at
``$MELCHIOR_TEST_PG`` (default ``postgresql://postgres@127.0.0.1:5432/test``), on
throwaway databases created there and dropped after each run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import shutil
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common  # (the bench directory is not a package: found by the path above)
from melchior.mellan.relay.notify import LocalNotifier, receiver_topic
from melchior.mellan.relay.server.pgnotify import PgNotifier
from melchior.mellan.relay.store import open_store
from melchior.mellan.relay.store.base import Capability, NewTask, Store

ADMIN = _common.PG_ADMIN
WS, CALLER, RECEIVER = "bench", "local/caller", "private/worker"
PAYLOAD = '{"kind": "noop", "pad": "' + "x" * 200 + '"}'


@dataclass
class Result:
    name: str
    tasks: int
    enqueue_s: float
    drain_s: float
    commits: float | None  # per task, drain phase

    @property
    def rate(self) -> float:
        return self.tasks / self.drain_s


# -- databases --------------------------------------------------------------------------------


def xact_commits(url: str) -> int:
    time.sleep(0.6)  # backends flush their stats at exit / within ~0.5 s of idling
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("SELECT pg_stat_clear_snapshot()")
        row = c.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
    assert row is not None
    return int(row[0])


# -- mellan -----------------------------------------------------------------------------------


def prepare(store: Store, n: int) -> float:
    store.ensure_workspace(WS)
    for a in (CALLER, RECEIVER):
        if store.get_agent(WS, a) is None:
            store.add_agent(WS, a, "", [Capability("noop")])
    tasks = [NewTask(WS, CALLER, RECEIVER, "noop", PAYLOAD) for _ in range(n)]
    t0 = time.perf_counter()
    for k in range(0, n, 1000):
        store.enqueue_many(tasks[k : k + 1000])
    return time.perf_counter() - t0


ACTOR = "agent:" + RECEIVER  # what the relay's receiver API passes as ``actor``


def mellan_drain(store: Store, batch: int, threads: int, actor: str | None) -> tuple[float, int]:
    """Drain with ``threads`` receivers; returns (seconds, store transactions). With
    ``actor`` each claim and completion writes its audit record in the transaction of
    the change, as the relay does."""
    txs = [0] * threads

    def work(i: int) -> None:
        while True:
            leases = store.claim(WS, RECEIVER, f"bench-{i}", limit=batch, actor=actor)
            txs[i] += 1
            if not leases:
                return
            if len(leases) == 1:
                store.complete(leases[0].task.id, leases[0].epoch, "{}", actor=actor)
            else:
                store.complete_many([(x.task.id, x.epoch, "{}") for x in leases], actor=actor)
            txs[i] += 1

    t0 = time.perf_counter()
    ts = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return time.perf_counter() - t0, sum(txs)


def run_mellan_sqlite(
    n: int, batch: int, threads: int, tmp: Path, actor: str | None = ACTOR
) -> Result:
    path = tmp / f"relay-{batch}-{threads}.db"
    store = open_store(str(path))
    enq = prepare(store, n)
    before = getattr(store, "commits", 0)
    secs, _ = mellan_drain(store, batch, threads, actor)
    commits = (getattr(store, "commits", 0) - before) / n  # group commit shares COMMITs
    store.close()
    return Result(f"mellan SQLite, claim {batch}, {threads} thr", n, enq, secs, commits)


def run_mellan_pg(n: int, batch: int, threads: int, actor: str | None = ACTOR) -> Result:
    with _common.postgres_database("mellan") as url:
        store = open_store(url)
        enq = prepare(store, n)
        store.close()
        before = xact_commits(url)
        store = open_store(url, migrate=False)
        secs, _ = mellan_drain(store, batch, threads, actor)
        store.close()
        commits = (xact_commits(url) - before - 1) / n
    return Result(f"mellan PG, claim {batch}, {threads} thr", n, enq, secs, commits)


# -- pgqueuer ---------------------------------------------------------------------------------


def run_pgqueuer(n: int, batch: int) -> Result:
    import asyncpg  # type: ignore[import-untyped]
    from pgqueuer import PgQueuer
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.models import Job
    from pgqueuer.queries import Queries
    from pgqueuer.types import QueueExecutionMode

    with _common.postgres_database("pgqueuer") as url:

        async def setup() -> float:
            conn = await asyncpg.connect(url)
            q = Queries(AsyncpgDriver(conn))
            await q.install()
            t0 = time.perf_counter()
            for k in range(0, n, 1000):
                m = min(1000, n - k)
                await q.enqueue(["noop"] * m, [PAYLOAD.encode()] * m, [0] * m)
            secs = time.perf_counter() - t0
            await conn.close()
            return secs

        async def drain() -> float:
            conn = await asyncpg.connect(url)
            pgq = PgQueuer(AsyncpgDriver(conn))

            @pgq.entrypoint("noop")
            async def noop(job: Job) -> None:
                return None

            t0 = time.perf_counter()
            await pgq.qm.run(
                batch_size=batch,
                mode=QueueExecutionMode.drain,
                dequeue_timeout=timedelta(seconds=1),
            )
            secs = time.perf_counter() - t0
            await conn.close()
            return secs

        enq = asyncio.run(setup())
        before = xact_commits(url)
        secs = asyncio.run(drain())
        commits = (xact_commits(url) - before - 1) / n
    return Result(f"pgqueuer, batch {batch}", n, enq, secs, commits)


# -- procrastinate ----------------------------------------------------------------------------


def run_procrastinate(n: int, concurrency: int) -> Result:
    import procrastinate

    with _common.postgres_database("procrastinate") as url:
        app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=url))

        @app.task(name="noop")
        async def noop(**_: Any) -> None:
            return None

        async def setup() -> float:
            async with app.open_async():
                await app.schema_manager.apply_schema_async()
                t0 = time.perf_counter()
                for k in range(0, n, 1000):
                    m = min(1000, n - k)
                    kwargs: list[dict[str, Any]] = [{"pad": "x" * 200} for _ in range(m)]
                    await noop.batch_defer_async(*kwargs)
                return time.perf_counter() - t0

        async def drain() -> float:
            async with app.open_async():
                t0 = time.perf_counter()
                await app.run_worker_async(concurrency=concurrency, wait=False, listen_notify=False)
                return time.perf_counter() - t0

        enq = asyncio.run(setup())
        before = xact_commits(url)
        secs = asyncio.run(drain())
        commits = (xact_commits(url) - before - 1) / n
    return Result(f"procrastinate, concurrency {concurrency}", n, enq, secs, commits)


# -- pickup latency ---------------------------------------------------------------------------


def pickup_latency(
    url: str | None, mode: str, count: int, spacing: float, poll: float
) -> list[float]:
    """enqueue-commit → claimed, in ms, for a receiver woken by ``mode`` ("notify" waits
    on PgNotifier/LocalNotifier with ``poll`` as its fallback timer; "poll" sleeps
    ``poll`` between empty claims)."""

    async def main() -> list[float]:
        path = None
        if url is None:
            path = str(Path(tempfile.mkdtemp(prefix="mellan-bench-")) / "lat.db")
        producer_store = open_store(url or path)
        prepare(producer_store, 0)
        consumer_store = open_store(url or path, migrate=False)
        waker: PgNotifier | LocalNotifier | None = None
        publisher: PgNotifier | None = None
        if mode == "notify":
            if url is not None:
                publisher, waker = PgNotifier(url, debounce=0.0), PgNotifier(url)
                await publisher.start()
                producer_store.set_publisher(publisher.publish)
            else:
                waker = LocalNotifier()
                producer_store.set_publisher(waker.publish)
            await waker.start()
        sent: dict[str, float] = {}
        lat: list[float] = []
        topic = receiver_topic(WS, RECEIVER)

        async def produce() -> None:
            for _ in range(count):
                await asyncio.sleep(spacing)
                t, _ = await asyncio.to_thread(
                    producer_store.enqueue, NewTask(WS, CALLER, RECEIVER, "noop", PAYLOAD)
                )
                sent[t.id] = time.perf_counter()  # the commit has happened by now

        async def consume() -> None:
            while len(lat) < count:
                leases = await asyncio.to_thread(
                    consumer_store.claim, WS, RECEIVER, "lat", limit=10
                )
                now = time.perf_counter()
                for x in leases:
                    for _ in range(100):  # producer may not have recorded the send yet
                        if x.task.id in sent:
                            break
                        await asyncio.sleep(0.001)
                    lat.append((now - sent[x.task.id]) * 1000)
                    await asyncio.to_thread(consumer_store.complete, x.task.id, x.epoch, "{}")
                if leases:
                    continue
                if waker is not None:
                    await waker.wait(topic, poll)
                else:
                    await asyncio.sleep(poll)

        await asyncio.gather(produce(), consume())
        for n in (publisher, waker):
            if n is not None:
                await n.stop()
        producer_store.close()
        consumer_store.close()
        return lat

    return asyncio.run(main())


def pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(p / 100 * (len(s) - 1)))]


# -- main -------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--tasks", type=int, default=5000)
    ap.add_argument("--procrastinate-tasks", type=int, default=1000)
    ap.add_argument("--latency-tasks", type=int, default=150)
    ap.add_argument("--no-audit", action="store_true", help="drain mellan without audit records")
    args = ap.parse_args(argv)
    actor = None if args.no_audit else ACTOR
    n = args.tasks
    tmp = Path(tempfile.mkdtemp(prefix="mellan-bench-"))
    results: list[Result] = []
    try:
        with psycopg.connect(ADMIN, autocommit=True) as c:
            pgv = c.execute("SHOW server_version").fetchone()
            sc = c.execute("SHOW synchronous_commit").fetchone()
        try:
            import pgqueuer
            import procrastinate

            peers = (
                f" pgqueuer={getattr(pgqueuer, '__version__', '?')}"
                f" procrastinate={getattr(procrastinate, '__version__', '?')}"
            )
        except ImportError:  # the peers are optional: pip install -e '.[bench]'
            peers = ""
            print("# pgqueuer/procrastinate not installed (extra 'bench'): mellan only")

        print(
            f"# {platform.node()} cpus={os.cpu_count()} python={sys.version.split()[0]}"
            f" postgresql={pgv[0] if pgv else '?'} synchronous_commit={sc[0] if sc else '?'}"
            f" sqlite={sqlite3.sqlite_version}{peers}"
            f" loadavg={os.getloadavg()[0]:.1f}"
            f" mellan_audit={'off' if args.no_audit else 'in-transaction'}"
        )
        print(
            f"# drain: {n} no-op tasks per system ({min(n, 2000)} unbatched,"
            f" {args.procrastinate_tasks} for procrastinate)"
        )
        runs: list[Callable[[], Result]] = [
            # unbatched runs make 2 commits per task: fewer tasks give the same rate sooner
            lambda: run_mellan_sqlite(min(n, 2000), 1, 1, tmp, actor),
            lambda: run_mellan_sqlite(min(n, 2000), 1, 8, tmp, actor),
            lambda: run_mellan_sqlite(n, 50, 1, tmp, actor),
            lambda: run_mellan_pg(min(n, 2000), 1, 4, actor),
            lambda: run_mellan_pg(n, 50, 2, actor),
        ]
        if peers:
            runs.append(lambda: run_pgqueuer(min(n, 2000), 1))
            runs.append(lambda: run_pgqueuer(n, 10))
            runs.append(lambda: run_procrastinate(args.procrastinate_tasks, 10))
        for run in runs:
            r = run()
            results.append(r)
            commits = "-" if r.commits is None else f"{r.commits:.2f}"
            print(
                f"{r.name:34s} drain {r.rate:8.0f} tasks/s  enqueue {r.tasks / r.enqueue_s:8.0f}/s"
                f"  commits/task {commits}",
                flush=True,
            )
        by = {r.name: r.rate for r in results}
        best_pg = max(v for k, v in by.items() if k.startswith("mellan PG"))
        best_sqlite = max(v for k, v in by.items() if k.startswith("mellan SQLite"))
        pgq = max((v for k, v in by.items() if k.startswith("pgqueuer")), default=float("nan"))
        pro = next((v for k, v in by.items() if k.startswith("procrastinate")), float("nan"))
        print(
            f"ratios: mellan PG / pgqueuer {best_pg / pgq:.2f}x,"
            f" / procrastinate {best_pg / pro:.1f}x;"
            f" mellan SQLite / pgqueuer {best_sqlite / pgq:.2f}x,"
            f" / procrastinate {best_sqlite / pro:.1f}x"
        )

        print(f"# pickup latency, enqueue commit → claim, {args.latency_tasks} tasks 20 ms apart")
        with _common.postgres_database("latency") as url:
            cases: list[tuple[str, str | None, str, float]] = [
                ("PG NOTIFY (fallback poll 1 s)", url, "notify", 1.0),
                ("PG poll 100 ms", url, "poll", 0.1),
                ("PG poll 1 s", url, "poll", 1.0),
                ("SQLite in-process wake", None, "notify", 1.0),
            ]
            for label, u, mode, poll in cases:
                lat = pickup_latency(u, mode, args.latency_tasks, 0.02, poll)
                print(
                    f"{label:32s} p50 {statistics.median(lat):7.2f} ms  p90 {pct(lat, 90):7.2f}"
                    f"  p99 {pct(lat, 99):7.2f}  max {max(lat):7.2f}",
                    flush=True,
                )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
