"""What counting the send caps in the enqueue transaction costs: N tasks stored for a
fresh receiver (its queue grows from 0 to N) with and without ``caps`` (one task per
transaction, then batches of 50), on SQLite and PostgreSQL (``$MELCHIOR_TEST_PG``, a
fresh database). Prints tasks/s and the ratio. The counts stop at the cap, so their cost
grows with the queue's depth up to the cap: compare N=200 (a receiver keeping up) with
N=5000 (a backlog).

    .venv/bin/python bench/send_caps_cost.py [N ...]
"""

from __future__ import annotations

import sys
import tempfile
import time
import uuid
from pathlib import Path

from melchior.mellan.relay.store import open_store
from melchior.mellan.relay.store.base import Capability, Caps, NewTask, Store

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common  # (the bench directory is not a package: found by the path above)


def seed(s: Store) -> None:
    s.ensure_workspace("w")
    s.add_agent("w", "c", "c", [Capability("x")])


def run(s: Store, n: int, batch: int, caps: Caps | None) -> float:
    receiver = uuid.uuid4().hex[:12]  # a fresh receiver: its queue starts empty
    s.add_agent("w", receiver, receiver, [Capability("x")])
    tasks = [
        NewTask("w", "c", receiver, "x", "{}", message_id=uuid.uuid4().hex, caps=caps)
        for _ in range(n)
    ]
    start = time.perf_counter()
    for k in range(0, n, batch):
        s.admit(tasks[k : k + batch])
    return n / (time.perf_counter() - start)


def main() -> None:
    sizes = [int(a) for a in sys.argv[1:]] or [200, 5000]
    caps = Caps(max_unfinished_per_receiver=10_000_000, max_queued=10_000_000)
    with tempfile.TemporaryDirectory() as tmp, _common.postgres_database("caps") as pg:
        for label, url in (("sqlite", f"sqlite://{tmp}/b.db"), ("postgres", pg)):
            s = open_store(url)
            seed(s)
            run(s, 200, 1, None)  # warm up
            for n in sizes:
                for batch in (1, 50):
                    plain = run(s, n, batch, None)
                    capped = run(s, n, batch, caps)
                    print(
                        f"{label:8} queue 0..{n:<5} batch {batch:3}: {plain:6.0f} tasks/s "
                        f"without caps, {capped:6.0f} with ({capped / plain:.2f}x)",
                        flush=True,
                    )
            s.close()


if __name__ == "__main__":
    main()
