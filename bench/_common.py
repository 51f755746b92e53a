"""Shared parts of the socket benchmarks: the raw echo baseline, timing and reporting.

Every benchmark here prints ratios against a baseline measured in the same run on the
same machine, never a pass/fail threshold: absolute microseconds swing by 2x between
interpreter builds and with vCPU placement (see shared/reference/ipc_sse.md, A6), and a
ratio taken in one run cancels most of that.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import statistics
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

HEADER = struct.Struct(">I")


def recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        part = sock.recv(n - len(buf))
        if not part:
            raise ConnectionError("peer closed")
        buf += part
    return bytes(buf)


def serve_echo(path: str) -> None:
    """The baseline peer: read a length-prefixed frame, write it back. Nothing else.

    Blocking and single-threaded, one connection at a time: the least a Python process
    can do per round trip on this transport, so anything above it is our own cost.
    """
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(8)
    print("ready", flush=True)
    while True:
        conn, _ = srv.accept()
        with conn:
            try:
                while True:
                    header = recv_exact(conn, 4)
                    (n,) = HEADER.unpack(header)
                    conn.sendall(header + recv_exact(conn, n))
            except ConnectionError:
                continue


def spawn(
    args: list[str], env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[bytes], bytes]:
    """Start a helper process; return it and its first stdout line (its 'ready')."""
    proc = subprocess.Popen(
        args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env or dict(os.environ)
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        raise SystemExit(f"helper {args} exited before it was ready")
    return proc, line


def spawn_echo(path: Path) -> subprocess.Popen[bytes]:
    here = Path(__file__).resolve().parent
    code = (
        f"import sys; sys.path.insert(0, {str(here)!r}); "
        "import _common; _common.serve_echo(sys.argv[1])"
    )
    return spawn([sys.executable, "-c", code, str(path)])[0]


def stop(proc: subprocess.Popen[bytes], *, graceful: bool = False) -> None:
    """End a helper: by closing its stdin when it honours that (serve does), else SIGTERM."""
    if proc.stdin is not None:
        proc.stdin.close()
    if graceful:
        try:
            proc.wait(10)
            return
        except subprocess.TimeoutExpired:
            pass
    proc.terminate()
    proc.wait(10)


@dataclass
class Timing:
    name: str
    samples_us: list[float]

    @property
    def p50(self) -> float:
        return statistics.median(self.samples_us)

    @property
    def p99(self) -> float:
        s = sorted(self.samples_us)
        return s[min(len(s) - 1, int(len(s) * 0.99))]

    @property
    def mean(self) -> float:
        return statistics.fmean(self.samples_us)


def time_calls(fn: Callable[[], object], n: int, warmup: int) -> list[float]:
    for _ in range(warmup):
        fn()
    out = []
    clock = time.perf_counter_ns
    for _ in range(n):
        t0 = clock()
        fn()
        out.append((clock() - t0) / 1000)
    return out


def interleave(
    cases: dict[str, Callable[[], object]], n: int, rounds: int, warmup: int
) -> dict[str, Timing]:
    """Run each case ``rounds`` times, alternating, so drift hits all cases alike."""
    got: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(rounds):
        for name, fn in cases.items():
            got[name] += time_calls(fn, n, warmup)
    return {name: Timing(name, samples) for name, samples in got.items()}


def report(timings: dict[str, Timing], baseline: str, unit: str = "us") -> None:
    base = timings[baseline]
    width = max(len(n) for n in timings)
    print(f"  {'case':<{width}}  {'p50':>10}  {'p99':>10}  {'mean':>10}  {'p50 / baseline':>14}")
    for name, t in timings.items():
        ratio = t.p50 / base.p50
        print(
            f"  {name:<{width}}  {t.p50:>8.1f}{unit}  {t.p99:>8.1f}{unit}  {t.mean:>8.1f}{unit}"
            f"  {ratio:>13.2f}x"
        )


def machine() -> str:
    return (
        f"{os.cpu_count()} CPUs, Python {sys.version.split()[0]} ({sys.implementation.name}), "
        f"{sys.platform}"
    )


def start_mellan_relay(db: str, home: Path, *extra: str) -> tuple[subprocess.Popen[str], str, str]:
    """A real ``mellan relay`` on ``db`` (its state under ``home``, a free port), waited
    for: the process, its URL and the owner token. Its output is drained in a thread so
    a chatty relay never blocks on a full pipe."""
    import threading

    mellan = str(Path(sys.executable).parent / "mellan")
    env = {**os.environ, "XDG_DATA_HOME": str(home / "data"),
           "XDG_CONFIG_HOME": str(home / "config")}  # fmt: skip
    token_file = home / "owner.token"
    proc = subprocess.Popen(
        [mellan, "relay", "--database", db, "--port", "0", "--owner-token-file",
         str(token_file), *extra],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    )  # fmt: skip
    assert proc.stdout is not None
    for line in proc.stdout:
        if "listening on " in line:
            url = line.split("listening on ", 1)[1].split()[0]
            break
    else:
        raise SystemExit(f"the relay did not start ({proc.wait()})")
    threading.Thread(target=lambda: [None for _ in proc.stdout or ()], daemon=True).start()
    return proc, url, token_file.read_text().strip()


PG_ADMIN = os.environ.get("MELCHIOR_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")


@contextlib.contextmanager
def throwaway_database(engine: str, sqlite_file: Path, label: str) -> Iterator[str]:
    """A relay database for one measurement: the SQLite file given, or a fresh
    PostgreSQL database (:func:`postgres_database`)."""
    if engine == "sqlite":
        yield f"sqlite://{sqlite_file}"
        return
    with postgres_database(label) as url:
        yield url


@contextlib.contextmanager
def postgres_database(label: str) -> Iterator[str]:
    """A fresh PostgreSQL database on the test server (``bench_<label>_<random>``),
    dropped after (``WITH (FORCE)``: a killed relay may still hold connections)."""
    import psycopg

    name = f"bench_{label}_{secrets.token_hex(4)}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"{PG_ADMIN.rsplit('/', 1)[0]}/{name}"
    finally:
        with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
