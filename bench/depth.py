"""Does the relay's door care how deep the queue is? Accepts/s, claim latency and the
relay's memory at several depths, each printed as a ratio to the empty queue of the same
run (issue 25: "accept rate at 100k queued ≥ 90 % of the rate with an empty queue").

One database per backend (a file; a throwaway PostgreSQL database from
``$MELCHIOR_TEST_PG``, dropped at the end), deepened step by step: before each step's
measurements the receiver's backlog is topped up to that depth with one set-based
statement (``INSERT … SELECT generate_series`` on PostgreSQL, a recursive CTE on SQLite;
the seconds it took are printed), all from the bench's own caller, so both send caps
(that caller's unfinished tasks at the receiver, the receiver's queued tasks) meet the
whole backlog. Then, at that depth:

* **A2A accepts/s** — ``SendMessage`` (``returnImmediately``) against a real relay process
  started on the database for this step (``CONCURRENCY`` clients, ``SENDS`` sends, the
  loader of ``bench/a2a_send.py``), with the relay's CPU per request and its RSS after;
* **store accepts/s** — ``admit`` with caps (set past the bench's load, so they count and
  never refuse), in batches of 50 (as the accept batcher makes them under load) and one by
  one;
* **claim latency** — an audited claim of 1 (as the receiver API makes it) followed by its
  completion, p50 and p99 of the claim alone; and a claim of 50.

The ratio printed beside each rate is (rate at this depth) / (rate at depth 0).

    .venv/bin/python bench/depth.py                 # depths 0, 10k, 100k
    .venv/bin/python bench/depth.py 0 1000 10000 100000 1000000   # the scale section
    BENCH_ENGINES=sqlite .venv/bin/python bench/depth.py
    .venv/bin/python bench/depth.py --door [DEPTH]       # empty vs DEPTH, alternated
    .venv/bin/python bench/depth.py --triggers [DEPTH]   # what the triggers cost a claim

``--door`` runs the steps above on two databases per engine, alternated for
``BENCH_ROUNDS`` (3) rounds: one emptied before each of its steps, one topped up to DEPTH
(100k) queued; it prints the medians and their ratio (the issue's figure).

``--triggers`` (PostgreSQL) seeds DEPTH queued tasks (100k) and alternates, round by
round in that one database, the shapes of the schema a claim pays for: as shipped; the
push trigger without its v11 gate; the counters on one row per key; no counters. Each
round: claim latency (as above) and drain rates — 4 threads claiming 1, 2 threads
claiming 50, each completing what it claimed (audited claims, as the receiver API) —
printed with the ratio to "as shipped".
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import httpx

import _common  # (the bench directory is not a package: found by the path above)
import a2a_send
from melchior.mellan.relay.store import open_store
from melchior.mellan.relay.store.base import Caps, NewTask, Store

WS, CALLER, RECEIVER, CAP = a2a_send.WS, a2a_send.CALLER, a2a_send.RECEIVER, a2a_send.CAP
ADMITS = int(os.environ.get("BENCH_ADMITS", "2000"))  # tasks stored in batches of 50
SINGLES = int(os.environ.get("BENCH_SINGLES", "300"))  # tasks stored one by one
CLAIMS = int(os.environ.get("BENCH_CLAIMS", "200"))
CAPS = Caps(max_unfinished_per_receiver=10_000_000, max_queued=10_000_000)
PAYLOAD = '{"messageId":"seed","role":"ROLE_USER","parts":[{"text":"seed"}]}'


# -- the relay (a child process) -------------------------------------------------------------


def serve(db: str, info: Path) -> None:
    """``bench/a2a_send.py``'s relay, but on a database that may already hold the bench's
    workspace and agents (each depth step starts a fresh relay process on it)."""
    import uvicorn

    from melchior.mellan.relay.auth import hash_token, new_token
    from melchior.mellan.relay.caches.limits import SendLimits
    from melchior.mellan.relay.context import Relay
    from melchior.mellan.relay.notify import LocalNotifier
    from melchior.mellan.relay.server.app import create_app
    from melchior.mellan.relay.server.serve import MAX_HEADER_BYTES, HeaderLimitedH11
    from melchior.mellan.relay.store.base import CredentialKind
    from melchior.policy.send_limits import Limits

    notifier = LocalNotifier()
    store = open_store(db, publish=notifier.publish)
    setup(store)
    tokens = {}
    for who, subject in (("caller", CALLER), ("receiver", RECEIVER)):
        tokens[who] = new_token()
        store.add_credential(WS, CredentialKind.AGENT, subject, hash_token(tokens[who]))
    sock = a2a_send.listener()
    sock.listen(2048)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    limits = SendLimits(Limits(1e6, 10**7, 10**7, 10**7))  # counted, never refusing here
    relay = Relay(store=store, notifier=notifier, public_url=url, limits=limits)
    info.write_text(json.dumps({"url": url, "rpc": f"{url}/a2a/{WS}/{RECEIVER}", **tokens}))
    config = uvicorn.Config(
        create_app(relay),
        log_level="warning",
        http=HeaderLimitedH11,
        h11_max_incomplete_event_size=MAX_HEADER_BYTES,
        loop="asyncio",
    )
    uvicorn.Server(config).run(sockets=[sock])


def setup(store: Store) -> None:
    from melchior.mellan.relay.store.base import Capability

    store.ensure_workspace(WS)
    if store.get_agent(WS, CALLER) is None:
        store.add_agent(WS, CALLER, "bench caller", [])
        store.add_agent(WS, RECEIVER, "bench receiver", [Capability(CAP, "run")])
        store.add_grant(WS, CALLER, RECEIVER, [CAP])


def start_relay(db: str, tmp: Path) -> tuple[subprocess.Popen[bytes], dict[str, str]]:
    info = tmp / f"relay-{uuid.uuid4().hex[:6]}.json"
    proc = subprocess.Popen([sys.executable, __file__, "--serve", db, str(info)])
    deadline = time.monotonic() + 60
    while not info.exists() or not info.read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("the relay did not start")
        time.sleep(0.05)
    data: dict[str, str] = json.loads(info.read_text())
    for _ in range(200):
        try:
            httpx.get(data["url"] + "/", timeout=1)
            break
        except httpx.HTTPError:
            time.sleep(0.05)
    return proc, data


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


# -- seeding -----------------------------------------------------------------------------------


def seed_sql(engine: str) -> str:
    """One statement that adds ``n`` queued tasks from the bench's caller to its receiver."""
    cols = (
        "id, workspace, caller, receiver, capability, context_id, state, payload, metadata,"
        " chain, hop, path, max_attempts"
    )
    if engine == "postgres":
        return (
            f"INSERT INTO task ({cols}) SELECT md5(g::text || random()::text), %(ws)s,"
            " %(caller)s, %(rcv)s, %(cap)s, md5(g::text), 'queued', %(payload)s, '{}',"
            " md5(g::text), 0, '[]', 3 FROM generate_series(1, %(n)s) g"
        )
    now = "CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER)"
    return (
        "WITH RECURSIVE g(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM g WHERE x < :n)"
        f" INSERT INTO task ({cols}, run_after, created_at, updated_at)"
        " SELECT lower(hex(randomblob(16))), :ws, :caller, :rcv, :cap, lower(hex(randomblob(8))),"
        " 'queued', :payload, '{}', lower(hex(randomblob(8))), 0, '[]', 3,"
        f" {now}, {now}, {now} FROM g"
    )


def seed(engine: str, url: str, n: int) -> float:
    """Add ``n`` queued tasks in one statement, then settle the table (statistics, vacuum
    and checkpoint); the seconds all of it took."""
    if n <= 0:
        return 0.0
    params: dict[str, Any] = {
        "ws": WS, "caller": CALLER, "rcv": RECEIVER, "cap": CAP, "payload": PAYLOAD, "n": n,
    }  # fmt: skip
    t0 = time.perf_counter()
    if engine == "postgres":
        import psycopg

        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(seed_sql(engine), params)  # type: ignore[arg-type]
            # what the seeding leaves behind (an insert-triggered autovacuum, a checkpoint of
            # its WAL) done now, not during the measurements it would otherwise overlap
            conn.execute("VACUUM ANALYZE task")
            conn.execute("CHECKPOINT")
    else:
        import sqlite3

        conn = sqlite3.connect(url.removeprefix("sqlite://"), isolation_level=None)
        try:
            conn.execute("PRAGMA busy_timeout = 60000")
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(seed_sql(engine), params)
            conn.execute("COMMIT")
            conn.execute("ANALYZE")
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            conn.close()
    return time.perf_counter() - t0


def queued(store: Store) -> int:
    gauges = store.queue_gauges()[1]
    return gauges.get((WS, RECEIVER), 0)


# -- measurements ------------------------------------------------------------------------------


def admit_rate(store: Store, n: int, batch: int) -> float:
    tasks = [
        NewTask(WS, CALLER, RECEIVER, CAP, PAYLOAD, message_id=uuid.uuid4().hex, caps=CAPS)
        for _ in range(n)
    ]
    t0 = time.perf_counter()
    for k in range(0, n, batch):
        store.admit(tasks[k : k + batch])
    return n / (time.perf_counter() - t0)


def claim_latency(store: Store) -> tuple[float, float, float]:
    """p50 and p99 of an audited claim of 1 (ms; each then completed, untimed), and the
    time of one claim of 50 (ms, median of three)."""
    ms: list[float] = []
    for _ in range(CLAIMS):
        t0 = time.perf_counter()
        leases = store.claim(WS, RECEIVER, "bench", limit=1, actor=f"agent:{RECEIVER}")
        ms.append((time.perf_counter() - t0) * 1000)
        for x in leases:
            store.complete(x.task.id, x.epoch, "{}", actor=f"agent:{RECEIVER}")
    fifty: list[float] = []
    for _ in range(3):
        t0 = time.perf_counter()
        leases = store.claim(WS, RECEIVER, "bench", limit=50, actor=f"agent:{RECEIVER}")
        fifty.append((time.perf_counter() - t0) * 1000)
        store.complete_many([(x.task.id, x.epoch, "{}") for x in leases])
    ms.sort()
    p99 = ms[min(len(ms) - 1, int(len(ms) * 0.99))]
    return statistics.median(ms), p99, statistics.median(fifty)


def step(engine: str, url: str, tmp: Path) -> dict[str, float]:
    proc, info = start_relay(url, tmp)
    try:
        rate, cpu, _ = asyncio.run(a2a_send.accepted_per_second(info, proc.pid))
        rss = rss_mib(proc.pid)
    finally:
        proc.terminate()
        proc.wait()
    store = open_store(url)
    try:
        batched = admit_rate(store, ADMITS, 50)
        single = admit_rate(store, SINGLES, 1)
        p50, p99, fifty = claim_latency(store)
    finally:
        store.close()
    return {"a2a": rate, "cpu": cpu, "rss": rss, "b50": batched, "b1": single,
            "c50": p50, "c99": p99, "claim50": fifty}  # fmt: skip


@contextlib.contextmanager
def database(engine: str, tmp: Path, label: str = "depth") -> Iterator[str]:
    with _common.throwaway_database(engine, tmp / f"{label}.db", "depth") as url:
        yield url


def run_engine(engine: str, depths: list[int]) -> None:
    with tempfile.TemporaryDirectory() as d, database(engine, Path(d)) as url:
        store = open_store(url)
        setup(store)
        store.close()
        base: dict[str, float] | None = None
        print(
            f"[{engine}] {'depth':>9} {'seeded':>9} {'A2A/s':>7} {'ratio':>6} {'ms CPU':>6}"
            f" {'RSS MiB':>7} {'admit50/s':>9} {'ratio':>6} {'admit1/s':>8} {'ratio':>6}"
            f" {'claim p50':>9} {'p99':>7} {'claim50':>8}",
            flush=True,
        )
        for depth in depths:
            store = open_store(url)
            have = queued(store)
            store.close()
            took = seed(engine, url, depth - have)
            r = step(engine, url, Path(d))
            base = base or r
            print(
                f"[{engine}] {depth:>9,} {took:>8.1f}s {r['a2a']:>7.0f}"
                f" {r['a2a'] / base['a2a']:>5.2f}x {r['cpu']:>6.2f} {r['rss']:>7.1f}"
                f" {r['b50']:>9.0f} {r['b50'] / base['b50']:>5.2f}x {r['b1']:>8.0f}"
                f" {r['b1'] / base['b1']:>5.2f}x {r['c50']:>7.2f}ms {r['c99']:>5.2f}ms"
                f" {r['claim50']:>6.2f}ms",
                flush=True,
            )


# -- the door: an empty queue against a deep one, alternated ------------------------------------


def empty_out(engine: str, url: str) -> None:
    """Back to an empty queue (the tasks a step stored deleted; the counters follow)."""
    sql = ("DELETE FROM task_message", "DELETE FROM task_event", "DELETE FROM task")
    if engine == "postgres":
        import psycopg

        with psycopg.connect(url, autocommit=True) as conn:
            for q in sql:
                conn.execute(q)  # type: ignore[arg-type]
        return
    import sqlite3

    conn = sqlite3.connect(url.removeprefix("sqlite://"), isolation_level=None)
    try:
        conn.execute("PRAGMA busy_timeout = 60000")
        for q in sql:
            conn.execute(q)
    finally:
        conn.close()


def door(engine: str, depth: int, rounds: int) -> None:
    """The same steps on two databases of one engine, alternated round by round: one
    emptied before each of its steps, one kept at ``depth`` queued. The ratio of the
    medians is the issue's figure (accepts at depth / accepts with an empty queue)."""
    got: dict[str, list[dict[str, float]]] = {"empty": [], "deep": []}
    with (
        tempfile.TemporaryDirectory() as d,
        database(engine, Path(d), "empty") as empty,
        database(engine, Path(d), "deep") as deep,
    ):
        for url in (empty, deep):
            store = open_store(url)
            setup(store)
            store.close()
        took = seed(engine, deep, depth)
        print(f"[{engine}] {depth:,} queued seeded in {took:.1f}s", flush=True)
        for _ in range(rounds):
            for label, url in (("empty", empty), ("deep", deep)):
                if label == "empty":
                    empty_out(engine, url)
                else:
                    store = open_store(url)
                    have = queued(store)
                    store.close()
                    seed(engine, url, depth - have)
                got[label].append(step(engine, url, Path(d)))
    med = {k: {m: statistics.median(r[m] for r in v) for m in v[0]} for k, v in got.items()}
    e, q = med["empty"], med["deep"]
    print(
        f"[{engine}] medians of {rounds} alternated rounds, empty queue vs {depth:,} queued:\n"
        f"[{engine}]   A2A accepts/s {e['a2a']:.0f} vs {q['a2a']:.0f} ({q['a2a'] / e['a2a']:.2f}x),"
        f" relay CPU {e['cpu']:.2f} vs {q['cpu']:.2f} ms/request,"
        f" RSS {e['rss']:.1f} vs {q['rss']:.1f} MiB\n"
        f"[{engine}]   admit batch 50 {e['b50']:.0f} vs {q['b50']:.0f}/s"
        f" ({q['b50'] / e['b50']:.2f}x),"
        f" batch 1 {e['b1']:.0f} vs {q['b1']:.0f}/s ({q['b1'] / e['b1']:.2f}x)\n"
        f"[{engine}]   claim p50 {e['c50']:.2f} vs {q['c50']:.2f} ms, p99 {e['c99']:.2f} vs"
        f" {q['c99']:.2f} ms, claim of 50 {e['claim50']:.2f} vs {q['claim50']:.2f} ms",
        flush=True,
    )


# -- what the triggers cost a claim (PostgreSQL) ------------------------------------------------


def _variants() -> dict[str, list[str]]:
    """SQL putting the schema in each shape compared by ``--triggers``: as shipped; the
    push trigger without its v11 gate; the counters on one row per key instead of
    ``COUNT_SLOTS``; no counters at all (their triggers disabled: the counts go wrong,
    which a claim does not read)."""
    from melchior.mellan.relay.store import migrations as m

    def push_trigger(version: int) -> str:
        return next(
            q for q in m.POSTGRES[version - 1] if q.startswith("CREATE TRIGGER push_on_state")
        )

    def counters(slot: str) -> list[str]:
        out = []
        for event in ("insert", "update", "delete"):
            function = m._pg_counts(event)[0]
            out.append(
                function.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION").replace(
                    f"mod(pg_backend_pid(), {m.COUNT_SLOTS})", slot
                )
            )
        return out

    drop = "DROP TRIGGER push_on_state ON task"
    enable = "ALTER TABLE task ENABLE TRIGGER USER"
    slots = f"mod(pg_backend_pid(), {m.COUNT_SLOTS})"
    return {
        "as shipped": [drop, push_trigger(11), enable, *counters(slots)],
        "push ungated": [drop, push_trigger(6), enable, *counters(slots)],
        "counters, 1 row": [drop, push_trigger(11), enable, *counters("0")],
        "no counters": [
            drop, push_trigger(11), enable, *counters(slots),
            *(f"ALTER TABLE task DISABLE TRIGGER task_counts_{e}"
              for e in ("insert", "update", "delete")),
        ],
    }  # fmt: skip


def drain_rate(store: Store, n: int, threads: int, limit: int) -> float:
    """Tasks/s claimed and completed by ``threads`` threads sharing one store (its pool:
    a connection each, as the relay's request threads), ``limit`` per claim."""
    import threading

    left = [n]
    lock = threading.Lock()

    def work() -> None:
        while True:
            with lock:
                if left[0] <= 0:
                    return
                left[0] -= limit
            leases = store.claim(WS, RECEIVER, "bench", limit=limit, actor=f"agent:{RECEIVER}")
            store.complete_many([(x.task.id, x.epoch, "{}") for x in leases])

    workers = [threading.Thread(target=work) for _ in range(threads)]
    t0 = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return n / (time.perf_counter() - t0)


def triggers(depth: int, rounds: int = 4) -> None:
    """Claim latency and drain rates at ``depth`` queued, alternating the schema's shapes
    (:func:`_variants`) round by round in one database: ratios to "as shipped"."""
    import psycopg

    variants = _variants()
    got: dict[str, dict[str, list[float]]] = {v: {} for v in variants}
    with tempfile.TemporaryDirectory() as d, database("postgres", Path(d)) as url:
        store = open_store(url)
        setup(store)
        store.close()
        took = seed("postgres", url, depth)
        print(f"[postgres] {depth:,} queued seeded in {took:.1f}s", flush=True)
        store = open_store(url)
        try:
            names = list(variants)
            for k in range(rounds):
                # each round in another order, each shape from a vacuumed table: the rows
                # a shape claimed leave dead entries at the head of the ready index, which
                # the next claims walk past until a vacuum (an order effect, not a shape's)
                for name in names[k % len(names) :] + names[: k % len(names)]:
                    with psycopg.connect(url, autocommit=True) as conn:
                        for q in variants[name]:
                            conn.execute(q)  # type: ignore[arg-type]
                        conn.execute("VACUUM ANALYZE task")
                    store.close()
                    store = open_store(url)  # fresh connections: no plan cached across shapes
                    p50, _, fifty = claim_latency(store)
                    one = drain_rate(store, 400, 4, 1)
                    many = drain_rate(store, 2000, 2, 50)
                    for k, v in (("claim1", p50), ("claim50", fifty), ("drain1", one),
                                 ("drain50", many)):  # fmt: skip
                        got[name].setdefault(k, []).append(v)
        finally:
            store.close()
    base = {k: statistics.median(v) for k, v in got["as shipped"].items()}
    print(
        f"[postgres] {'shape':16} {'claim1 p50':>10} {'ratio':>6} {'claim50':>8} {'ratio':>6}"
        f" {'4x claim1/s':>11} {'ratio':>6} {'2x claim50/s':>12} {'ratio':>6}"
    )
    for name, runs in got.items():
        m = {k: statistics.median(v) for k, v in runs.items()}
        print(
            f"[postgres] {name:16} {m['claim1']:>8.2f}ms {m['claim1'] / base['claim1']:>5.2f}x"
            f" {m['claim50']:>6.2f}ms {m['claim50'] / base['claim50']:>5.2f}x"
            f" {m['drain1']:>11.0f} {m['drain1'] / base['drain1']:>5.2f}x"
            f" {m['drain50']:>12.0f} {m['drain50'] / base['drain50']:>5.2f}x",
            flush=True,
        )


def main() -> None:
    if sys.argv[1:2] == ["--triggers"]:
        print(f"uptime: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} (1, 5 min load)")
        triggers(int(sys.argv[2]) if len(sys.argv) > 2 else 100_000)
        return
    if sys.argv[1:2] == ["--door"]:
        print(f"uptime: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} (1, 5 min load)")
        depth = int(sys.argv[2]) if len(sys.argv) > 2 else 100_000
        for engine in os.environ.get("BENCH_ENGINES", "postgres,sqlite").split(","):
            door(engine, depth, int(os.environ.get("BENCH_ROUNDS", "3")))
        return
    depths = [int(a) for a in sys.argv[1:]] or [0, 10_000, 100_000]
    print(f"uptime: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} (1, 5 min load)")
    for engine in os.environ.get("BENCH_ENGINES", "postgres,sqlite").split(","):
        run_engine(engine, depths)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--serve":
        serve(sys.argv[2], Path(sys.argv[3]))
    else:
        main()
