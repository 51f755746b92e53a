"""The relay's retention job: a real replica with ``retain_days`` deletes old finished
tasks by itself, records it, and leaves the rest; ``mellan relay --retain-days`` refuses
nonsense. (The store's rules — batches, what goes with a task, one replica at a time —
are in tests/relay/test_store_retention.py.)"""

from __future__ import annotations

import subprocess
import sys
import time

from a2a_kit import CALLER, RECEIVER, WS, Server, seed
from melchior.mellan.relay.store.base import AuditFilter, NewTask
from storekit import backdate_in, db_url_fixture  # noqa: F401


def test_a_replica_deletes_old_finished_tasks_by_itself(db_url: str) -> None:
    # a round every 50 ms here (an hour in production)
    server = Server(db_url, relay={"retain_days": 7, "retention_first": 0.05,
                                   "retention_interval": 0.05})  # fmt: skip
    try:
        seed(server.store)
        store = server.store
        old, _ = store.enqueue(NewTask(WS, CALLER, RECEIVER, "incident.inspect", "{}"))
        (lease,) = store.claim(WS, RECEIVER, "rx")
        assert store.complete(old.id, lease.epoch, "{}").ok
        young, _ = store.enqueue(NewTask(WS, CALLER, RECEIVER, "incident.inspect", "{}"))
        (lease,) = store.claim(WS, RECEIVER, "rx")
        assert store.complete(young.id, lease.epoch, "{}").ok
        waiting, _ = store.enqueue(NewTask(WS, CALLER, RECEIVER, "incident.inspect", "{}"))
        backdate_in(db_url, old.id, 8)
        deadline = time.monotonic() + 60  # a hang guard, not a threshold
        while store.get_task(WS, old.id) is not None:
            assert time.monotonic() < deadline, "the retention job never deleted the old task"
            time.sleep(0.05)
        assert store.get_task(WS, young.id) is not None  # finished a moment ago
        assert store.get_task(WS, waiting.id) is not None  # never finished
        (record, *_) = store.audit_matching(WS, AuditFilter(action="task.purge"), limit=10)
        assert record.actor == "system:retention"
        assert record.detail["tasks"] == 1
    finally:
        server.stop()


def test_the_flag_refuses_what_is_not_an_age() -> None:
    for bad in ("0", "-1", "nan", "inf"):
        done = subprocess.run(
            [sys.executable, "-m", "melchior.mellan.cli", "relay", "--retain-days", bad],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 2, (bad, done.stdout, done.stderr)
        assert "--retain-days" in done.stdout + done.stderr
    shown = subprocess.run(
        [sys.executable, "-m", "melchior.mellan.cli", "relay", "--help"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert "--retain-days DAYS" in shown.stdout
