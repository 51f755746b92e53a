"""A big result read by several clients: does the relay's event loop stay responsive?

A real ``mellan relay`` (SQLite, or PostgreSQL with ``BENCH_DB=postgres``; its own
process, ``--max-result`` raised to 16 MiB so a 15 MiB result is allowed) gets one
task, completed by a receiver through the receiver API with a ``BENCH_MIB`` MiB text
result (default 15). Then ``BENCH_READERS`` clients (3) read
it with A2A ``GetTask`` in a loop for ``BENCH_SECONDS`` (10) while a prober asks
``/healthz`` every 20 ms. Printed: /healthz p50/p99/max while idle (the baseline, same run)
and while the readers read, their ratio, the bytes of one GetTask answer against the
result's size, and how long the complete took. No thresholds: the numbers go to
docs/benchmarks.md.

Run ``.venv/bin/python bench/big_result.py``. With ``BENCH_PYSPY=out.txt`` (and
``py-spy`` installed next to the interpreter) the relay is sampled during the reads,
``py-spy record --gil``, folded stacks written to that file: where the GIL went.
"""

from __future__ import annotations

import contextlib
import http.client
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

import _common

MIB = float(os.environ.get("BENCH_MIB", "15"))
READERS = int(os.environ.get("BENCH_READERS", "3"))
SECONDS = float(os.environ.get("BENCH_SECONDS", "10"))


DB = os.environ.get("BENCH_DB", "sqlite")


@contextlib.contextmanager
def database(home: Path) -> Iterator[str]:
    """The relay's database: a SQLite file, or (``BENCH_DB=postgres``) a fresh
    PostgreSQL database on the test server, dropped after."""
    with _common.throwaway_database(DB, home / "relay.db", "big") as url:
        yield url


def start(db: str, home: Path) -> tuple[subprocess.Popen[str], str, str]:
    return _common.start_mellan_relay(db, home, "--max-result", str(16 * 1024 * 1024))


def ok(r: httpx.Response, status: int = 200) -> Any:
    if r.status_code != status:
        raise SystemExit(f"{r.request.method} {r.request.url}: {r.status_code} {r.text[:300]}")
    return r.json()


def setup(url: str, owner: str) -> tuple[str, str]:
    with httpx.Client(base_url=url, headers={"authorization": f"Bearer {owner}"}) as c:
        ok(c.post("/api/agents", json={"id": "private/ops", "capabilities": ["run"]}), 201)
        ok(c.post("/api/agents", json={"id": "local/caller"}), 201)
        grant = {"caller": "local/caller", "receiver": "private/ops", "capabilities": ["run"]}
        ok(c.post("/api/grants", json=grant), 201)
        tokens = []
        for agent in ("local/caller", "private/ops"):
            code = ok(c.post("/api/enrollments", json={"agent": agent}), 201)["code"]
            tokens.append(ok(httpx.post(f"{url}/api/join", json={"code": code}), 201)["token"])
    return tokens[0], tokens[1]


def probe(url: str, seconds: float, go: Any, out: Any) -> None:
    """Ask ``/healthz`` every 20 ms for ``seconds``; put the list of latencies (ms)."""
    ms: list[float] = []
    with httpx.Client(base_url=url, timeout=30) as c:
        go.wait()
        stop_at = time.monotonic() + seconds
        while time.monotonic() < stop_at:
            began = time.perf_counter()
            c.get("/healthz")
            ms.append((time.perf_counter() - began) * 1000)
            time.sleep(0.02)
    out.put(ms)


def read(url: str, headers: dict[str, str], seconds: float, go: Any, out: Any) -> None:
    """GetTask ``url`` in a loop for ``seconds``; put the list of answer sizes (bytes).
    ``http.client`` reads a ``Content-Length`` body in big C reads: a reader costs the
    shared cores little, so it does not starve the relay it measures."""
    sizes: list[int] = []
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=120)
    go.wait()
    stop_at = time.monotonic() + seconds
    while time.monotonic() < stop_at:
        conn.request("GET", parts.path, headers=headers)
        response = conn.getresponse()
        body = response.read()
        if response.status != 200:
            raise SystemExit(f"GetTask: {response.status} {body[:300]!r}")
        sizes.append(len(body))
    conn.close()
    out.put(sizes)


def summary(ms: list[float]) -> tuple[float, float, float]:
    ms = sorted(ms)
    return statistics.median(ms), ms[min(len(ms) - 1, int(len(ms) * 0.99))], ms[-1]


def probed(
    url: str, seconds: float, readers: Sequence[tuple[str, dict[str, str]]] = ()
) -> tuple[list[float], list[int]]:
    """/healthz latencies while ``readers`` (GetTask url, headers) read, each in a process
    of its own; all start together once every process is up (a barrier)."""
    ctx = multiprocessing.get_context("spawn")
    probe_out, read_out = ctx.Queue(), ctx.Queue()
    go = ctx.Barrier(len(readers) + 2)
    procs = [ctx.Process(target=read, args=(u, h, seconds, go, read_out)) for u, h in readers]
    prober = ctx.Process(target=probe, args=(url, seconds, go, probe_out))
    for p in [*procs, prober]:
        p.start()
    go.wait()
    ms: list[float] = probe_out.get()
    sizes: list[int] = []
    for _ in procs:
        sizes += read_out.get()
    for p in [prober, *procs]:
        p.join()
    return ms, sizes


def profile(pid: int) -> subprocess.Popen[bytes] | None:
    """py-spy sampling the relay's GIL holder for the reads, when ``BENCH_PYSPY`` names a
    file for its folded stacks."""
    out = os.environ.get("BENCH_PYSPY")
    if not out:
        return None
    spy = str(Path(sys.executable).parent / "py-spy")
    args = [spy, "record", "--gil", "--pid", str(pid), "--duration", str(int(SECONDS)),
            "--format", "raw", "--output", out, "--nonblocking"]  # fmt: skip
    return subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp, database(Path(tmp)) as db:
        proc, url, owner = start(db, Path(tmp))
        try:
            caller, ops = setup(url, owner)
            idle, _ = probed(url, 3.0)
            base = f"{url}/a2a/default/private/ops"
            h = {"A2A-Version": "1.0", "Authorization": f"Bearer {caller}"}
            send = {"message": {"messageId": "m1", "role": "ROLE_USER", "parts": [{"text": "go"}],
                                "metadata": {"capability": "run"}},
                    "configuration": {"returnImmediately": True}}  # fmt: skip
            task_id = ok(httpx.post(f"{base}/message:send", json=send, headers=h))["task"]["id"]
            rh = {"authorization": f"Bearer {ops}"}
            lease = ok(httpx.post(f"{url}/api/receiver/claim", json={"wait": 5}, headers=rh))
            epoch = lease["leases"][0]["epoch"]
            text = "x" * int(MIB * 1024 * 1024)
            result = {"message": {"role": "ROLE_AGENT", "parts": [{"text": text}]}}
            began = time.perf_counter()
            done = httpx.post(
                f"{url}/api/receiver/tasks/{task_id}/complete",
                json={"epoch": epoch, "result": result}, headers=rh, timeout=120,
            )  # fmt: skip
            completed_ms = (time.perf_counter() - began) * 1000
            ok(done)
            reader = (f"{base}/tasks/{task_id}", h)
            spy = profile(proc.pid)
            busy, sizes = probed(url, SECONDS, [reader] * READERS)
            if spy is not None:
                spy.wait(timeout=60)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    i50, i99, imax = summary(idle)
    b50, b99, bmax = summary(busy)
    print(f"{DB}: result {MIB:g} MiB, {READERS} readers, {SECONDS:g} s,"
          f" {len(sizes)} GetTask answers")  # fmt: skip
    print(f"complete: {completed_ms:.0f} ms")
    print(f"GetTask answer: {sizes[0] / 2**20:.1f} MiB = {sizes[0] / len(text):.2f}x the result")
    print(f"/healthz idle  p50 {i50:.1f} ms  p99 {i99:.1f} ms  max {imax:.1f} ms")
    print(f"/healthz busy  p50 {b50:.1f} ms  p99 {b99:.1f} ms  max {bmax:.1f} ms")
    print(f"ratio busy/idle: p50 {b50 / i50:.1f}x  p99 {b99 / i99:.1f}x")


if __name__ == "__main__":
    main()
