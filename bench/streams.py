"""Many SubscribeToTask streams on one relay: what does a stream cost?

A real ``mellan relay`` (SQLite, its own process) gets ``BENCH_TASKS`` queued tasks (10).
A client process of its own (asyncio, bare sockets: an HTTP client per stream would cost
the client more than the relay) opens SubscribeToTask streams spread over those tasks, in
steps up to ``BENCH_STREAMS`` (10,000), reads each snapshot and then keeps reading. At
0 streams and after each step a prober asks ``/healthz`` every 20 ms for ``BENCH_SECONDS``
(5), while the receiver writes one progress event to every task every ``BENCH_TICK``
seconds (10: every stream gets an event that often, and every shared reader reads).
Printed: /healthz p50/p99 per step against the idle baseline of the same run (ratios),
the relay's RSS per 1,000 streams, and the store reads the streams cost
(``mellan_stream_reads_total``). The whole sequence runs once per young GC threshold in
``BENCH_GC`` (``700,50000``: Python's own, then the relay's default; see
``melchior.mellan.relay.server.gcpolicy``), with the full collector passes each relay
made and the p99 of each step as a ratio to the first threshold's.
No thresholds: the numbers go to docs/benchmarks.md, with ``uptime``.

Run ``.venv/bin/python bench/streams.py`` (the open-files limit must exceed the stream
count: the relay and the client each hold one socket per stream).
"""

from __future__ import annotations

import asyncio
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).parent))
import _common
from big_result import ok, setup

STREAMS = int(os.environ.get("BENCH_STREAMS", "10000"))
TASKS = int(os.environ.get("BENCH_TASKS", "10"))
SECONDS = float(os.environ.get("BENCH_SECONDS", "5"))
TICK = float(os.environ.get("BENCH_TICK", "10"))
STEPS = [s for s in (1000, 5000, 10000) if s < STREAMS] + [STREAMS]
THRESHOLDS = [int(t) for t in os.environ.get("BENCH_GC", "700,50000").split(",")]
"""Young GC thresholds of the relays compared, the first the baseline (700: Python's)."""


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def metric(url: str, owner: str, name: str) -> float:
    auth = {"authorization": f"Bearer {owner}"}
    text = httpx.get(f"{url}/metrics", headers=auth, timeout=120).text
    return sum(float(ln.split()[-1]) for ln in text.splitlines() if ln.startswith(name))


class Streams:
    """The client side: an event loop in a thread holding every stream open."""

    def __init__(self, url: str, token: str, paths: list[str]) -> None:
        self.host, port = url.removeprefix("http://").split(":")
        self.port = int(port)
        self.token, self.paths = token, paths
        self.loop = asyncio.new_event_loop()
        self.open = 0
        self.failed: list[str] = []
        self.events = 0
        self._tasks: set[asyncio.Task[None]] = set()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()

    async def _one(self, path: str, ready: asyncio.Semaphore) -> None:
        try:
            reader, writer = await asyncio.open_connection(self.host, self.port)
            writer.write(
                f"GET {path} HTTP/1.1\r\nHost: {self.host}\r\nA2A-Version: 1.0\r\n"
                f"Authorization: Bearer {self.token}\r\n\r\n".encode()
            )
            head = await reader.readuntil(b"\r\n\r\n")
            if not head.startswith(b"HTTP/1.1 200"):
                raise RuntimeError(head.split(b"\r\n", 1)[0].decode())
            got = b""
            while b"data: " not in got:
                got += await reader.read(65536)
        except Exception as exc:
            self.failed.append(repr(exc))
            ready.release()
            return
        self.open += 1
        ready.release()
        while chunk := await reader.read(65536):
            self.events += chunk.count(b"data: ")
        self.open -= 1

    async def _grow(self, to: int) -> None:
        ready = asyncio.Semaphore(200)  # connections being opened at once
        first = self.open + len(self.failed)
        for k in range(first, to):
            await ready.acquire()
            path = self.paths[k % len(self.paths)]
            task = asyncio.ensure_future(self._one(path, ready))
            self._tasks.add(task)
        for _ in range(200):
            await ready.acquire()

    def grow(self, to: int) -> None:
        asyncio.run_coroutine_threadsafe(self._grow(to), self.loop).result()


def probe(url: str, seconds: float) -> list[float]:
    out: list[float] = []
    with httpx.Client(base_url=url, timeout=60) as c:
        stop_at = time.monotonic() + seconds
        while time.monotonic() < stop_at:
            began = time.perf_counter()
            c.get("/healthz")
            out.append((time.perf_counter() - began) * 1000)
            time.sleep(0.02)
    return out


def summary(ms: list[float]) -> tuple[float, float]:
    ms = sorted(ms)
    return statistics.median(ms), ms[min(len(ms) - 1, int(len(ms) * 0.99))]


Row = tuple[int, float, float, float, float, float]


@dataclass
class Run:
    """One relay's steps (streams open, /healthz p50 and p99, RSS, reads/s, probes)."""

    threshold: int
    rows: list[Row]
    rss0: float
    failed: list[str]
    events: int
    tick_errors: list[str]
    full_passes: float
    full_pass_seconds: float


def run(threshold: int) -> Run:
    """The whole sequence on a fresh relay whose young GC threshold is ``threshold``."""
    with tempfile.TemporaryDirectory() as tmp:
        db = f"sqlite://{Path(tmp) / 'relay.db'}"
        extra = ("--max-result", str(16 * 1024 * 1024), "--gc-threshold", str(threshold))
        proc, url, owner = _common.start_mellan_relay(db, Path(tmp), *extra)
        try:
            caller, ops = setup(url, owner)
            base = f"{url}/a2a/default/private/ops"
            h = {"A2A-Version": "1.0", "Authorization": f"Bearer {caller}"}
            rh = {"authorization": f"Bearer {ops}"}
            ids: list[str] = []
            for i in range(TASKS):
                send = {"message": {"messageId": f"m{i}", "role": "ROLE_USER",
                                    "parts": [{"text": "go"}], "metadata": {"capability": "run"}},
                        "configuration": {"returnImmediately": True}}  # fmt: skip
                ids.append(
                    ok(httpx.post(f"{base}/message:send", json=send, headers=h))["task"]["id"]
                )
            # A lease long enough for the whole run: progress does not renew it, and a task
            # whose lease lapsed refuses the ticks (the streams would then get no events).
            claim = {"wait": 5, "limit": TASKS, "lease_seconds": 3600}
            leases = ok(httpx.post(f"{url}/api/receiver/claim", json=claim, headers=rh))["leases"]
            epochs = {lease["task"]["id"]: lease["epoch"] for lease in leases}
            stop = threading.Event()
            tick_errors: list[str] = []

            def progress() -> None:  # one event every TICK seconds on every task
                with httpx.Client(base_url=url, headers=rh, timeout=60) as c:
                    n = 0
                    while not stop.wait(TICK):
                        n += 1
                        for tid, epoch in epochs.items():
                            said = {"message": {"parts": [{"text": f"tick {n}"}]}}
                            body = {"epoch": epoch, "kind": "status", "body": said}
                            try:
                                r = c.post(f"/api/receiver/tasks/{tid}/progress", json=body)
                            except httpx.HTTPError as exc:  # counted, not fatal
                                tick_errors.append(repr(exc))
                                continue
                            if r.status_code >= 300:  # refused: counted, and said why
                                tick_errors.append(f"{r.status_code} {r.text[:200]}")

            paths = [f"/a2a/default/private/ops/tasks/{tid}:subscribe" for tid in ids]
            streams = Streams(url, caller, paths)
            rows: list[Row] = []
            rss0 = rss_mib(proc.pid)
            ticker = threading.Thread(target=progress, daemon=True)
            ticker.start()
            for at in [0, *STEPS]:
                if at:
                    streams.grow(at)
                settled = time.monotonic()  # opening thousands of streams is its own load:
                httpx.get(f"{url}/healthz", timeout=300)  # measured apart, once it is over
                time.sleep(2.0)
                print(f"... {at}: settled {time.monotonic() - settled:.1f} s after opening")
                reads0 = metric(url, owner, "mellan_stream_reads_total")
                events0 = streams.events
                began = time.monotonic()
                ms = probe(url, SECONDS)
                reads = (metric(url, owner, "mellan_stream_reads_total") - reads0) / (
                    time.monotonic() - began
                )
                p50, p99 = summary(ms)
                rows.append((streams.open, p50, p99, rss_mib(proc.pid), reads, len(ms)))
                print(f"... {streams.open} open, {len(streams.failed)} failed: /healthz p50"
                      f" {p50:.1f} ms p99 {p99:.1f} ms, RSS {rows[-1][3]:.0f} MiB,"
                      f" {reads:.1f} reads/s, {streams.events - events0} events to the"
                      " client while probed", flush=True)  # fmt: skip
            stop.set()
            ticker.join()
            gen2 = 'mellan_gc_pause_seconds_{}{{generation="2"}}'
            full = metric(url, owner, gen2.format("count"))
            full_s = metric(url, owner, gen2.format("sum"))
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:  # 10,000 connections to close: do not wait
                proc.kill()
                proc.wait()
    return Run(threshold, rows, rss0, streams.failed, streams.events, tick_errors, full, full_s)


def report(r: Run) -> None:
    i50, i99 = r.rows[0][1], r.rows[0][2]
    print(f"# young GC threshold {r.threshold}: {r.full_passes:.0f} full passes,"
          f" {r.full_pass_seconds:.2f} s in them")  # fmt: skip
    if r.failed:
        print(f"failed to open: {len(r.failed)}, e.g. {r.failed[0]}")
    print("streams   /healthz p50   p99      x idle p50  x idle p99   RSS MiB  MiB/1000  reads/s")
    for n, p50, p99, rss, reads, _ in r.rows:
        per = (rss - r.rss0) / n * 1000 if n else 0.0
        print(f"{n:7d}  {p50:9.1f} ms {p99:7.1f} ms  {p50 / i50:8.1f}x  {p99 / i99:9.1f}x"
              f"  {rss:8.0f}  {per:8.1f}  {reads:7.1f}")  # fmt: skip
    print(f"events read by the client in all: {r.events}")
    if r.tick_errors:
        print(f"progress posts that failed: {len(r.tick_errors)}, e.g. {r.tick_errors[0]}")


def main() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, STREAMS + 1000)), hard))
    runs = [run(t) for t in THRESHOLDS]
    print(f"uptime: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")
    print(f"{TASKS} tasks, an event every {TICK:g} s on each; {SECONDS:g} s of probes a step")
    for r in runs:
        report(r)
    if len(runs) > 1:  # the relay's policy against Python's own, step by step, same run
        base, *rest = runs
        for r in rest:
            print(f"# /healthz p99 at threshold {r.threshold} / at {base.threshold}, per step:")
            for (n, _, p99, *_), (_, _, b99, *_) in zip(r.rows, base.rows, strict=False):
                print(f"{n:7d}  {p99:7.1f} ms / {b99:7.1f} ms = {p99 / b99:5.2f}x")
    sys.stdout.flush()
    os._exit(0)  # the client's streams are cut with the relay: no teardown to wait for


if __name__ == "__main__":
    main()
