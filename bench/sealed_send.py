"""What sealing costs a caller (issue 28): accepted sends/s sealed vs in clear, one run.

A real ``mellan relay`` (SQLite, then PostgreSQL on ``$MELCHIOR_TEST_PG``;
``BENCH_ENGINES``), two agents with registered keys and a grant; ``CONCURRENCY``
``AsyncRelayClient`` callers send ``SENDS`` messages of ``SIZE`` bytes with
``returnImmediately`` (no receiver: the work stays queued, as for an offline agent),
alternately in clear and sealed, ``ROUNDS`` rounds each, and the medians are printed with
their ratio. A sealed send pays, on the caller's side, the key read (``GET
/api/keys/AGENT``) and the pin check, the seal (HPKE + Ed25519) and a bigger body
(base64 ciphertext); the relay stores more bytes and skips nothing else.

Then **end to end** through a real ``mellan receiver run`` (the route's program ``cat``,
so the answer is as big as the message): ``E2E_TASKS`` blocking sends (``send(...,
wait=True)``: accepted, followed, read and — sealed — opened) from ``E2E_CALLERS``
callers, alternately in clear and sealed, ``ROUNDS`` rounds each; printed: the caller's
latency p50/p99 and tasks/s, medians over the rounds, and the sealed/clear ratios. The
sealed path adds the receiver's open (its pin check, the signature, HPKE) and its seal of
the answer, and the caller's open.

Then the envelope alone, in process: seal and open of 1 MiB of parts, per MiB.

    .venv/bin/python bench/sealed_send.py
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common  # (the bench directory is not a package: found by the path above)
from melchior.mellan.client.caller import AsyncRelayClient
from melchior.mellan.keys import ensure_keypair
from melchior.mellan.sealed_tasks import KeyRing
from melchior.mellan.sealing import Binding, KeyPair, open_envelope, seal

SENDS = int(os.environ.get("BENCH_SENDS", "600"))
CONCURRENCY = int(os.environ.get("BENCH_CONCURRENCY", "16"))
SIZE = int(os.environ.get("BENCH_SIZE", "1024"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))
ENGINES = os.environ.get("BENCH_ENGINES", "sqlite,postgres").split(",")
E2E_TASKS = int(os.environ.get("BENCH_E2E_TASKS", "150"))
E2E_CALLERS = int(os.environ.get("BENCH_E2E_CALLERS", "1"))
CALLER, RECEIVER, CAP = "bench/caller", "bench/receiver", "bench.run"


def seed(url: str, owner: str, config: Path) -> dict[str, str]:
    """Two agents, a grant, each joined with its key registered; their tokens.
    The keys are kept under ``config`` the way 'mellan join' keeps them."""
    agents = config / "agents"
    tokens: dict[str, str] = {}
    with httpx.Client(base_url=url, headers={"authorization": f"Bearer {owner}"}) as http:
        http.post("/api/agents", json={"id": RECEIVER, "capabilities": [CAP]}).raise_for_status()
        http.post("/api/agents", json={"id": CALLER, "capabilities": []}).raise_for_status()
        grant = {"caller": CALLER, "receiver": RECEIVER, "capabilities": [CAP]}
        http.post("/api/grants", json=grant).raise_for_status()
        for agent in (CALLER, RECEIVER):
            code = http.post("/api/enrollments", json={"agent": agent}).json()["code"]
            tokens[agent] = httpx.post(f"{url}/api/join", json={"code": code}).json()["token"]
            pair, _ = ensure_keypair(agents, agent)
            httpx.put(
                f"{url}/api/keys/{agent}",
                json={"public_key": pair.public.text()},
                headers={"authorization": f"Bearer {tokens[agent]}"},
            ).raise_for_status()
    return tokens


async def sends_per_second(url: str, token: str, config: Path, sealed: bool) -> float:
    text = "x" * SIZE
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(SENDS):
        queue.put_nowait(i)

    async def caller() -> None:
        async with AsyncRelayClient(url, token, keys=KeyRing(config)) as client:
            while not queue.empty():
                queue.get_nowait()
                await client.send(RECEIVER, text, capability=CAP, seal=sealed)

    start = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(CONCURRENCY)))
    return SENDS / (time.perf_counter() - start)


def receiver_for(
    url: str, owner: str, token: str, home: Path, config_dir: Path
) -> subprocess.Popen[bytes]:
    """The receiver agent's route (``cat``, approved) and ``mellan receiver run`` with the
    receiver's credential and key as 'mellan join' keeps them (``config_dir``: the
    ``mellan`` directory under ``$XDG_CONFIG_HOME``, where its pins are kept too)."""
    work = home / "work"
    work.mkdir()
    agents = config_dir / "agents"
    credential = agents / f"{RECEIVER}.json"
    credential.write_text(json.dumps({"relay": url, "workspace": "default", "agent": RECEIVER,
                                      "token": token}))  # fmt: skip
    credential.chmod(0o600)
    route = {
        "capability": CAP,
        "adapter": "command",
        "cwd": str(work),
        "options": {"argv": ["cat"]},
    }
    with httpx.Client(base_url=url, timeout=30) as http:
        made = http.post("/api/routes", json=route, headers={"authorization": f"Bearer {token}"})
        made.raise_for_status()
        http.post(
            f"/api/routes/{made.json()['id']}/approve", headers={"authorization": f"Bearer {owner}"}
        ).raise_for_status()
    config = home / "receiver.toml"
    config.write_text(
        f'credential = "{credential}"\nconcurrency = {max(4, E2E_CALLERS)}\n'
        f'state_dir = "{home / "receiver-state"}"\n'
        f'[allow]\nadapters = ["command"]\ncwd = ["{work}"]\nprograms = ["cat"]\n'
    )
    env = {**os.environ, "XDG_CONFIG_HOME": str(config_dir.parent)}
    return subprocess.Popen(
        [str(Path(sys.executable).parent / "mellan"), "receiver", "run", "--config", str(config)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, start_new_session=True,
    )  # fmt: skip


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def end_to_end(
    url: str, token: str, config: Path, sealed: bool, n: int
) -> tuple[float, float, float]:
    """``n`` blocking sends answered by the receiver: (tasks/s, p50 ms, p99 ms)."""
    text = "x" * SIZE
    todo: asyncio.Queue[int] = asyncio.Queue()
    for i in range(n):
        todo.put_nowait(i)
    took: list[float] = []

    async def caller() -> None:
        async with AsyncRelayClient(url, token, keys=KeyRing(config)) as client:
            while not todo.empty():
                todo.get_nowait()
                began = time.perf_counter()
                done = await client.send(RECEIVER, text, capability=CAP, seal=sealed, wait=True)
                if done.state != "TASK_STATE_COMPLETED" or len(done.answer) < SIZE:
                    raise SystemExit(f"a {'sealed' if sealed else 'clear'} task: {done.text[:300]}")
                took.append(time.perf_counter() - began)

    began = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(E2E_CALLERS)))
    return n / (time.perf_counter() - began), pct(took, 0.5) * 1e3, pct(took, 0.99) * 1e3


def envelope_cost() -> tuple[float, float]:
    """Seconds to seal, and to open, 1 MiB of parts (median of 5)."""
    me, them = KeyPair.generate(), KeyPair.generate()
    binding = Binding("request", "w", "c", "r", "cap", None, None, "m")
    parts = [{"text": "y" * (1024 * 1024)}]
    seals, opens = [], []
    for _ in range(5):
        t0 = time.perf_counter()
        envelope = seal(parts, binding=binding, to=them.public, sender=me)
        t1 = time.perf_counter()
        open_envelope(envelope, binding=binding, me=them, sender=me.public)
        t2 = time.perf_counter()
        seals.append(t1 - t0)
        opens.append(t2 - t1)
    return statistics.median(seals), statistics.median(opens)


def print_end_to_end(engine: str, url: str, token: str, config: Path) -> None:
    asyncio.run(end_to_end(url, token, config, True, 10))  # warm-up: the receiver pins
    asyncio.run(end_to_end(url, token, config, False, 10))
    runs: dict[bool, list[tuple[float, float, float]]] = {False: [], True: []}
    for _ in range(ROUNDS):
        for kind in (False, True):
            runs[kind].append(asyncio.run(end_to_end(url, token, config, kind, E2E_TASKS)))
    clear, sealed = ([statistics.median(r[i] for r in runs[k]) for i in range(3)]
                     for k in (False, True))  # fmt: skip
    print(
        f"{engine:8} end to end, {E2E_CALLERS} caller(s): p50 clear {clear[1]:.1f} ms, sealed "
        f"{sealed[1]:.1f} ms ({sealed[1] / clear[1]:.2f}x); p99 clear {clear[2]:.1f} ms, sealed "
        f"{sealed[2]:.1f} ms; tasks/s clear {clear[0]:.0f}, sealed {sealed[0]:.0f} "
        f"({sealed[0] / clear[0]:.2f}x)",
        flush=True,
    )


def main() -> None:
    print(f"# sealed vs clear sends, {_common.machine()}; {SENDS} sends of {SIZE} B, "
          f"{CONCURRENCY} callers, {ROUNDS} rounds each, alternating", flush=True)  # fmt: skip
    for engine in ENGINES:
        with (
            tempfile.TemporaryDirectory() as tmp,
            _common.throwaway_database(engine, Path(tmp) / "relay.db", "sealed") as db,
        ):
            home = Path(tmp)
            big = str(10**7)  # the caps and rate limits are checked, set past the bench's load
            proc, url, owner = _common.start_mellan_relay(
                db, home / "relay", "--limits-max-unfinished-per-receiver", big,
                "--limits-max-queued", big, "--limits-send-rate", big, "--limits-burst", big,
            )  # fmt: skip
            try:
                config = home / "xdg" / "mellan"
                tokens = seed(url, owner, config)
                token = tokens[CALLER]
                # end to end first: the accepted/s rounds leave thousands of tasks queued,
                # which a receiver started after them would drain during the measurement
                receiver = receiver_for(url, owner, tokens[RECEIVER], home, config)
                try:
                    print_end_to_end(engine, url, token, config)
                finally:
                    receiver.send_signal(signal.SIGTERM)
                    receiver.wait(60)
                asyncio.run(sends_per_second(url, token, config, True))  # warm up
                rates: dict[bool, list[float]] = {False: [], True: []}
                for _ in range(ROUNDS):
                    for sealed in (False, True):
                        rate = asyncio.run(sends_per_second(url, token, config, sealed))
                        rates[sealed].append(rate)
                clear, sealed_rate = (statistics.median(rates[k]) for k in (False, True))
                print(
                    f"{engine:8} accepted/s: clear {clear:6.0f}, sealed {sealed_rate:6.0f} "
                    f"({sealed_rate / clear:.2f}x; rounds clear "
                    f"{', '.join(f'{r:.0f}' for r in rates[False])}, sealed "
                    f"{', '.join(f'{r:.0f}' for r in rates[True])})",
                    flush=True,
                )
            finally:
                proc.terminate()
                proc.wait(20)
    sealing, opening = envelope_cost()
    print(f"envelope, 1 MiB of parts: seal {sealing * 1e3:.1f} ms, open {opening * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
