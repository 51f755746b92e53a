"""The receiver's wall through a real relay, on SQLite and PostgreSQL: routes the owner
approved (as a stolen owner credential could) that would widen what runs are refused with
their rule on the task and in the receiver's log, and a receiver stopped while its claim
was answered never starts the task after another receiver ran it."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

from receiver_kit import (
    RECEIVER,
    Net,
    executions,
    make_net,
    receiving,
    start_receiver,
    wait_for,
    worker_route,
    write_config,
)
from relay_proc import RelayProc, db_url_fixture, ok, relay_fixture
from runtimes_kit import install_stand_ins

__all__ = ["db_url_fixture", "relay_fixture"]


def test_approved_routes_that_widen_what_runs_are_refused(relay: RelayProc, tmp_path: Path) -> None:
    net = make_net(relay, tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    si = install_stand_ins(tmp_path / "si")
    config = write_config(tmp_path / "receiver.toml", net, work,
                          adapters=("command", "claude-code", "codex"))  # fmt: skip
    cases: list[tuple[str, dict[str, Any], str]] = [
        ("claude-code", {"extra_args": ["--permission-mode", "bypassPermissions"]},
         "route-option-not-allowed"),
        ("claude-code", {"extra_args": ["--add-dir", "/"]}, "route-option-not-allowed"),
        ("claude-code", {"allowed_tools": ["Bash"]}, "route-option-not-allowed"),
        ("codex", {"config": {"sandbox_mode": "danger-full-access"}}, "route-option-not-allowed"),
        ("codex", {"extra_args": ["--yolo"]}, "route-option-not-allowed"),
        ("command", {"argv": ["./worker.py"]}, "program-not-allowed"),
    ]  # fmt: skip
    with receiving(net, config, env=si.env) as rp:
        for adapter, options, rule in cases:
            net.route(adapter=adapter, cwd=str(work), options=options)
            view = net.settled(net.send("hello"))
            assert view["state"] == "failed"
            assert view["error"].startswith(f"refused by the receiver ({rule}): "), view["error"]
            rp.wait_line(f"task {view['id']}: refused ({rule})")
        # and it goes on serving what is inside the wall
        worker_route(net, work, tmp_path / "worker.py")
        assert net.settled(net.send("still here"))["state"] == "succeeded"
    assert si.calls() == []  # no coding agent was started


def _online(net: Net) -> bool:
    with net.owner() as c:
        agents = ok(c.get("/api/agents"))["agents"]
    mine = [a for a in agents if a["id"] == RECEIVER]
    return bool(mine and (mine[0].get("receiver") or {}).get("online"))


def test_a_receiver_stopped_while_its_claim_was_answered_does_not_run_the_task_again(
    relay: RelayProc, tmp_path: Path
) -> None:
    """SIGSTOP a receiver during its claim long-poll; the relay hands it a task, the lease
    runs out, a second receiver runs and completes the task; SIGCONT: the first one reads
    its stale lease and does not start the program. The work ran exactly once."""
    net = make_net(relay, tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    worker_route(net, work, tmp_path / "worker.py")
    count = tmp_path / "count"
    env = {"COUNT_FILE": str(count)}
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    slow = write_config(tmp_path / "a" / "receiver.toml", net, work, lease_seconds=3, wait=30)
    other = write_config(tmp_path / "b" / "receiver.toml", net, work, lease_seconds=6)
    first = start_receiver(net, slow, env=env)
    try:
        first.wait_line(f"receiver for {RECEIVER}")
        wait_for(lambda: _online(net), "the first receiver's claim to reach the relay")
        os.kill(first.proc.pid, signal.SIGSTOP)
        task_id = net.send("once")

        def leased() -> bool:
            view = net.task(task_id)
            return view["state"] == "leased" and view["attempt"] == 1

        wait_for(leased, "the relay to answer the stopped receiver's claim with the task")
        with receiving(net, other, env=env):
            view = net.settled(task_id)
            assert view["state"] == "succeeded", view["error"]
            assert view["attempt"] == 2
            os.kill(first.proc.pid, signal.SIGCONT)
            dropped = f"task {task_id}: not started: the lease may have run out"

            def settled_here() -> bool:
                return any(dropped in line for line in first.lines) or (
                    executions(count, task_id) > 1
                )

            wait_for(settled_here, "the resumed receiver to act on its stale lease")
        assert executions(count, task_id) == 1, first.lines
        first.wait_line(dropped)
        assert net.task(task_id)["state"] == "succeeded"
    finally:
        os.kill(first.proc.pid, signal.SIGCONT)
        first.stop()
