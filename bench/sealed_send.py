"""What sealing costs a caller (issue 28): accepted sends/s sealed vs in clear, one run.

A real ``mellan relay`` (SQLite, then PostgreSQL on ``$MELCHIOR_TEST_PG``;
``BENCH_ENGINES``), two agents with registered keys and a grant; ``CONCURRENCY``
``AsyncRelayClient`` callers send ``SENDS`` messages of ``SIZE`` bytes with
``returnImmediately`` (no receiver: the work stays queued, as for an offline agent),
alternately in clear and sealed, ``ROUNDS`` rounds each, and the medians are printed with
their ratio. A sealed send pays, on the caller's side, the key read (``GET
/api/keys/AGENT``) and the pin check, the seal (HPKE + Ed25519) and a bigger body
(base64 ciphertext); the relay stores more bytes and skips nothing else.

Then the envelope alone, in process: seal and open of 1 MiB of parts, per MiB.

End-to-end latency sealed vs clear (through a receiver, which also opens and seals
back) is not measured here yet: ``bench/end_to_end.py`` is where it belongs.

    .venv/bin/python bench/sealed_send.py
"""

from __future__ import annotations

import asyncio
import os
import statistics
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
CALLER, RECEIVER, CAP = "bench/caller", "bench/receiver", "bench.run"


def seed(url: str, owner: str, config: Path) -> str:
    """Two agents, a grant, each joined with its key registered; the caller's token.
    The keys are kept under ``config`` the way 'mellan join' keeps them."""
    agents = config / "agents"
    tokens = {}
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
    return str(tokens[CALLER])


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
                config = home / "caller-config"
                token = seed(url, owner, config)
                asyncio.run(sends_per_second(url, token, config, True))  # warm up, pins
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
