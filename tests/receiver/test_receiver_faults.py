"""Faults with real processes, on SQLite and PostgreSQL: a ``mellan relay`` subprocess, the
receiver as a subprocess killed with SIGKILL, the work a script that counts its own
executions in a file. Leases are made to run out with the store's ``expire_leases``
drill instead of waiting out a TTL (the next claim or sweep settles them exactly as a
real expiry)."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from melchior.mellan.relay.store.base import Store
from receiver_kit import (
    Net,
    executions,
    make_net,
    receiving,
    result_text,
    start_receiver,
    wait_for,
    worker_route,
    write_config,
)
from relay_proc import RelayProc, db_url_fixture, relay_fixture, start_relay, store_fixture

__all__ = ["db_url_fixture", "relay_fixture", "store_fixture"]


def setup(relay: RelayProc, tmp_path: Path) -> tuple[Net, Path, Path, Path]:
    net = make_net(relay, tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    config = write_config(tmp_path / "receiver.toml", net, work)
    worker_route(net, work, tmp_path / "worker.py")
    return net, work, config, tmp_path / "count"


def completions(net: Net, task_id: str) -> list[dict[str, object]]:
    """The successes the relay recorded for ``task_id`` (not repeated reports of one)."""
    return [
        r
        for r in net.audit()
        if r["action"] == "task.complete"
        and r["subject"] == task_id
        and r["allowed"]
        and str(r["reason"]).endswith(": ok")
    ]


def kill_orphans(count: Path) -> None:
    """The first run's program is stopped by the SIGKILLed receiver's guard; should the
    kill land in the guard's window, stop what is left so nothing leaks past the test."""
    if not count.exists():
        return
    for line in count.read_text().splitlines():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(line.split()[1]), signal.SIGKILL)


def test_receiver_killed_mid_task_the_task_is_reclaimed_and_completes_once(
    relay: RelayProc, store: Store, tmp_path: Path
) -> None:
    net, _, config, count = setup(relay, tmp_path)
    env = {"COUNT_FILE": str(count)}
    first = start_receiver(net, config, env=env)
    try:
        task_id = net.send("first-sleep 60")
        first.wait_line(f"task {task_id}: started turn 1")
        wait_for(lambda: executions(count, task_id) == 1, "the first run to start")
        first.kill()
        kill_orphans(count)
        # leased, or already queued again if a loaded machine let the lease run out and
        # the relay's sweeper settle it before this line
        assert net.task(task_id)["state"] in ("leased", "queued")
        store.expire_leases([task_id])  # the dead receiver's lease runs out
        with receiving(net, config, env=env) as second:
            view = net.settled(task_id)
            assert view["state"] == "succeeded", (view["error"], second.lines)
    finally:
        first.kill()
    assert view["attempt"] == 2
    assert result_text(view) == "done: FIRST-SLEEP 60 (turn 1)"
    assert len(completions(net, task_id)) == 1
    assert executions(count, task_id) == 2  # at least once: the first run died unfinished


@pytest.mark.parametrize("expired", [False, True], ids=["lease-held", "lease-expired"])
def test_killed_after_spooling_the_result_is_reported_not_run_again(
    relay: RelayProc, store: Store, tmp_path: Path, expired: bool
) -> None:
    net, _, config, count = setup(relay, tmp_path)
    env = {"COUNT_FILE": str(count)}
    dying = start_receiver(
        net, config, env={**env, "MELLAN_RECEIVER_TEST_HOOK": "kill-after-spool"}
    )
    task_id = net.send("hello")
    assert dying.finish() == -signal.SIGKILL
    assert executions(count, task_id, "end") == 1
    assert len(list((tmp_path / "state" / "spool").glob("*.json"))) == 1
    assert net.task(task_id)["state"] == "leased"  # the relay has not heard of it
    if expired:
        # the lease ran out and was settled before the receiver came back: the task is
        # queued again, and the spooled report's epoch is stale
        store.expire_leases([task_id])
        store.sweep()  # (or the relay's own sweeper, whichever comes first)
        assert net.task(task_id)["state"] == "queued"
    with receiving(net, config, env=env) as rp:
        view = net.settled(task_id)
        assert view["state"] == "succeeded", (view["error"], rp.lines)
        if expired:
            rp.wait_line(f"task {task_id}: turn 1 already ran here (complete)")
        else:
            rp.wait_line("reporting 1 spooled result(s) before claiming new work")
        rp.wait_line(f"task {task_id}: complete acknowledged")
    assert result_text(view) == "done: HELLO (turn 1)"
    assert executions(count, task_id) == 1  # the work ran once
    assert len(completions(net, task_id)) == 1
    assert view["attempt"] == (2 if expired else 1)
    assert list((tmp_path / "state" / "spool").glob("*.json")) == []


def test_killed_after_concurrent_turns_spooled_together_each_is_reported_none_run_again(
    relay: RelayProc, tmp_path: Path
) -> None:
    """Four turns end together and their spool writes share directory syncs; the
    receiver is SIGKILLed right after the fourth result is spooled. Whatever had been
    reported is recorded once; the rest is in the spool; the next receiver reports it —
    every task succeeds once, and no program ran twice."""
    net = make_net(relay, tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    config = write_config(tmp_path / "receiver.toml", net, work, concurrency=4)
    worker_route(net, work, tmp_path / "worker.py")
    count = tmp_path / "count"
    met = tmp_path / "met"
    met.mkdir()
    env = {"COUNT_FILE": str(count)}
    dying = start_receiver(
        net, config, env={**env, "MELLAN_RECEIVER_TEST_HOOK": "kill-after-spool:4"}
    )
    tasks = [net.send(f"meet 4 {met}") for _ in range(4)]
    assert dying.finish() == -signal.SIGKILL
    spool = tmp_path / "state" / "spool"
    for task_id in tasks:
        assert executions(count, task_id, "end") == 1
    unreported = [t for t in tasks if net.task(t)["state"] == "leased"]
    spooled = len(list(spool.glob("*.json")))  # and those reported but not yet dropped
    assert spooled >= len(unreported)  # each one the relay has not heard of is there
    with receiving(net, config, env=env) as rp:
        views = [net.settled(t) for t in tasks]
        for view in views:
            assert view["state"] == "succeeded", (view["error"], rp.lines)
        if spooled:
            rp.wait_line(f"reporting {spooled} spooled result(s) before claiming")
    for task_id, view in zip(tasks, views, strict=True):
        assert result_text(view) == f"done: MEET 4 {str(met).upper()} (turn 1)"
        assert executions(count, task_id) == 1  # the work ran once
        assert len(completions(net, task_id)) == 1
        assert view["attempt"] == 1
    assert list(spool.glob("*.json")) == []


def test_a_revoked_credential_stops_claiming_and_says_why(relay: RelayProc, tmp_path: Path) -> None:
    net, _, config, count = setup(relay, tmp_path)
    with relay.client(net.receiver_token) as c:
        credential = c.get("/api/whoami").json()["credential_id"]
    rp = start_receiver(net, config, env={"COUNT_FILE": str(count)})
    try:
        done = net.settled(net.send("first"))
        assert done["state"] == "succeeded"
        with net.owner() as c:
            assert c.post(f"/api/credentials/{credential}/revoke").status_code == 200
        assert rp.finish() == 77
        said = "\n".join(rp.lines)
        assert "stopping: the relay refuses this receiver's credential" in said
        assert "revoked or expired" in said
        assert "mellan join" in said
        # nothing claims any more: new work stays queued
        later = net.send("second")
        assert net.task(later)["state"] == "queued"
    finally:
        rp.stop()
    # started again with the revoked credential: refused at once, same words
    again = start_receiver(net, config)
    assert again.finish() == 77
    assert any("the relay refuses this receiver's credential" in line for line in again.lines)
    assert net.task(later)["state"] == "queued"


def running(pid: int) -> bool:
    """Alive and not a zombie (where PID 1 does not reap orphans one stays a zombie)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2 :].split()[0] not in ("Z", "X")


def test_cancel_stops_the_whole_process_tree_and_the_task_ends_cancelled(
    relay: RelayProc, tmp_path: Path
) -> None:
    net = make_net(relay, tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    config = write_config(tmp_path / "receiver.toml", net, work)
    worker_route(net, work, tmp_path / "worker.py", grace=1)
    pids = tmp_path / "pids"
    with receiving(net, config, env={"PID_FILE": str(pids)}) as rp:
        task_id = net.send("child")
        found = wait_for(lambda: pids.exists() and pids.read_text().split(), "the worker's pids")
        tree = [int(p) for p in found]
        assert all(running(p) for p in tree)
        with net.owner() as c:
            assert c.post(f"/api/tasks/{task_id}/cancel").status_code == 200
        rp.wait_line(f"task {task_id}: cancelled by the caller; the adapter was stopped")
        # the line is written after the adapter stopped its group: TERM (ignored by the
        # program), KILL after the 1 s grace, the grandchild with it
        assert not any(running(p) for p in tree)
        view = net.task(task_id)
    assert view["state"] == "cancelled"
    assert view["attempt"] == 1
    acts = [r["action"] for r in net.audit() if r["subject"] == task_id]
    assert "task.cancel_ack" in acts
    assert "task.fail" not in acts
    assert "task.complete" not in acts


def test_two_tasks_bound_to_one_session_never_overlap(relay: RelayProc, tmp_path: Path) -> None:
    net = make_net(relay, tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    config = write_config(tmp_path / "receiver.toml", net, work, concurrency=4)
    script = tmp_path / "worker.py"
    worker_route(net, work, script)
    count = tmp_path / "count"
    with receiving(net, config, env={"COUNT_FILE": str(count)}):
        # unbound: two tasks in two contexts may run side by side
        free = [net.send("sleep 1", context=f"ctx-free-{i}") for i in range(2)]
        for tid in free:
            assert net.settled(tid)["state"] == "succeeded"
        net.route(adapter="command", cwd=str(work), session="sess-1",
                  options={"argv": [sys.executable, str(script)]})  # fmt: skip
        bound = [net.send("sleep 0.5", context=f"ctx-{i}") for i in range(3)]
        for tid in bound:
            assert net.settled(tid)["state"] == "succeeded"
    events = [
        (line.split()[0], line.split()[-1])
        for line in count.read_text().splitlines()
        if line.split()[0] in bound
    ]
    assert len(events) == 6
    for i in range(0, 6, 2):  # start, end, start, end, ... one task at a time
        assert events[i][1] == "start", events
        assert events[i + 1] == (events[i][0], "end"), events
    assert [e[0] for e in events[::2]] == bound  # in the order they were sent


def test_relay_restarted_mid_task_nothing_is_lost(
    relay: RelayProc, db_url: str, tmp_path: Path
) -> None:
    net, _, config, count = setup(relay, tmp_path)
    port = relay.url.rsplit(":", 1)[1]
    current = relay
    try:
        with receiving(net, config, env={"COUNT_FILE": str(count)}) as rp:
            go = tmp_path / "go"
            task_id = net.send(f"wait-for {go}")
            rp.wait_line(f"task {task_id}: started turn 1")
            assert relay.stop() == 0
            go.touch()
            # the work finishes while the relay is away: its result waits in the spool
            rp.wait_line(f"task {task_id}: reporting failed")
            assert executions(count, task_id, "end") == 1
            current = start_relay(db_url, tmp_path, "--port", port, token_file=relay.token_file)
            net.relay = current
            view = net.settled(task_id)
            assert view["state"] == "succeeded", (view["error"], rp.lines)
            rp.wait_line(f"task {task_id}: complete acknowledged")
            # and the receiver claims again from the restarted relay
            again = net.settled(net.send("after"))
            assert again["state"] == "succeeded"
        assert executions(count, task_id) == 1
        assert len(completions(net, task_id)) == 1
    finally:
        if current is not relay:
            current.stop()


@pytest.mark.postgres
def test_postgres_connections_terminated_the_receiver_recovers(pg_url: str, tmp_path: Path) -> None:
    import psycopg

    relay = start_relay(pg_url, tmp_path)
    try:
        net, _, config, count = setup(relay, tmp_path)
        with receiving(net, config, env={"COUNT_FILE": str(count)}) as rp:
            tasks = [net.send(f"sleep 0.{i}") for i in range(1, 4)]
            rp.wait_line("started turn 1")
            with psycopg.connect(pg_url, autocommit=True) as admin:
                for _ in range(5):  # again and again while the tasks run and report
                    admin.execute(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                    )
                    time.sleep(0.3)
            views = [net.settled(t) for t in tasks]
            assert [v["state"] for v in views] == ["succeeded"] * 3, rp.lines
            later = net.settled(net.send("after"))
            assert later["state"] == "succeeded"
        for t in tasks:
            assert executions(count, t) == 1
            assert len(completions(net, t)) == 1
    finally:
        relay.stop()


def test_renewals_failing_past_the_lease_self_fence_the_turn(
    relay: RelayProc, db_url: str, tmp_path: Path
) -> None:
    """Cut off from the relay longer than its lease, the receiver stops the work itself
    before another receiver may take the task over; the task is run again later."""
    net = make_net(relay, tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    config = write_config(tmp_path / "receiver.toml", net, work, lease_seconds=3)
    worker_route(net, work, tmp_path / "worker.py")
    count = tmp_path / "count"
    port = relay.url.rsplit(":", 1)[1]
    current = relay
    try:
        with receiving(net, config, env={"COUNT_FILE": str(count)}) as rp:
            task_id = net.send("first-sleep 60")
            rp.wait_line(f"task {task_id}: started turn 1")
            first = wait_for(lambda: count.exists() and count.read_text().split(), "a pid")
            pid = int(first[1])
            assert relay.stop() == 0
            rp.wait_line(f"task {task_id}: renewals failed past the lease's expiry")
            rp.wait_line(f"task {task_id}: lease lost (self-fenced)")
            assert not running(pid)  # the work was stopped, not left to run on
            assert executions(count, task_id, "end") == 0
            current = start_relay(db_url, tmp_path, "--port", port, token_file=relay.token_file)
            net.relay = current
            view = net.settled(task_id)
            assert view["state"] == "succeeded", (view["error"], rp.lines)
            assert view["attempt"] == 2
            assert executions(count, task_id, "end") == 1
    finally:
        if current is not relay:
            current.stop()


def test_sigterm_stops_the_work_and_hands_the_task_back(relay: RelayProc, tmp_path: Path) -> None:
    net, _, config, count = setup(relay, tmp_path)
    pids = tmp_path / "pids"
    env = {"COUNT_FILE": str(count), "PID_FILE": str(pids)}
    rp = start_receiver(net, config, env=env)
    task_id = net.send("child")
    tree = [int(p) for p in wait_for(lambda: pids.exists() and pids.read_text().split(), "pids")]
    rp.proc.send_signal(signal.SIGTERM)
    assert rp.finish() == 0
    assert not any(running(p) for p in tree)  # the whole group, TERM-ignoring program too
    said = "\n".join(rp.lines)
    assert "stopping: signal SIGTERM" in said
    assert f"task {task_id}: stopped with the receiver; handing the task back" in said
    view = net.task(task_id)
    assert view["state"] == "queued"  # at once, not after the lease
    assert "the receiver was stopped while the task ran" in (view["error"] or "")
