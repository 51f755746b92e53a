"""process.py with real processes: own group, bounded reading, and a stop that leaves
nothing running — on cancel, on deadline, on a bad line, and after a normal exit."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest

from melchior.runtimes.process import (
    Exit,
    Limits,
    LineTooLong,
    SpawnError,
    group_alive,
    run_process,
)
from runtimes_kit import kill_quietly, proc_state, run, running, wait_for

ENV = dict(os.environ)

SPAWN_GRANDCHILD = """
import subprocess, sys, time, signal
if 'ignore' in sys.argv:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    pre = lambda: signal.signal(signal.SIGTERM, signal.SIG_IGN)
else:
    pre = None
g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'], preexec_fn=pre)
print('grandchild', g.pid, flush=True)
time.sleep(300)
"""


def py(code: str, *args: str) -> list[str]:
    return [sys.executable, "-c", code, *args]


async def _lines(collected: list[bytes], b: bytes) -> None:
    collected.append(b)


def test_lines_stdin_and_a_bounded_stderr_tail(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "data = sys.stdin.read()\n"
        "print('first'); print('got', data)\n"
        "sys.stderr.write('x' * 50000 + 'THE END')\n"
        "sys.stdout.write('no newline at the end')\n"
        "sys.exit(3)\n"
    )
    out: list[bytes] = []
    ex = run(
        run_process(
            py(code),
            cwd=tmp_path,
            env=ENV,
            stdin="ψ input".encode(),
            on_line=lambda b: _lines(out, b),
            limits=Limits(stderr_tail=100),
        )
    )
    assert out == [b"first\n", "got ψ input\n".encode(), b"no newline at the end"]
    assert ex.returncode == 3
    assert not ex.timed_out
    assert ex.stderr.endswith("THE END")
    assert len(ex.stderr) == 100
    assert ex.describe() == "exited with status 3"
    assert "stderr: " in ex.with_stderr("it failed")
    assert not group_alive(ex.pid)


def test_stdin_is_devnull_when_no_input_is_given(tmp_path: Path) -> None:
    out: list[bytes] = []
    code = "import sys; print(repr(sys.stdin.read()))"
    run(run_process(py(code), cwd=tmp_path, env=ENV, on_line=lambda b: _lines(out, b)))
    assert out == [b"''\n"]


def test_a_line_over_the_cap_stops_the_program(tmp_path: Path) -> None:
    code = "import time; print('short'); print('y' * 5000, flush=True); time.sleep(300)"
    out: list[bytes] = []
    started: list[int] = []

    async def on_start(pid: int) -> None:
        started.append(pid)

    async def go() -> None:
        await run_process(
            py(code),
            cwd=tmp_path,
            env=ENV,
            on_line=lambda b: _lines(out, b),
            on_start=on_start,
            limits=Limits(line_limit=1024, grace=2),
        )

    with pytest.raises(LineTooLong, match="1024 bytes"):
        run(go())
    assert out == [b"short\n"]
    assert not group_alive(started[0])


def _start_tree(
    tmp_path: Path, *args: str, grace: float = 5.0
) -> tuple[list[int], asyncio.Task[Exit]]:
    found: list[int] = []

    async def on_line(b: bytes) -> None:
        word, pid = b.split()
        assert word == b"grandchild"
        found.append(int(pid))

    async def on_start(pid: int) -> None:
        found.insert(0, pid)

    task = asyncio.ensure_future(
        run_process(
            py(SPAWN_GRANDCHILD, *args),
            cwd=tmp_path,
            env=ENV,
            on_line=on_line,
            on_start=on_start,
            limits=Limits(grace=grace),
        )
    )
    return found, task


@pytest.mark.parametrize("stubborn", [False, True], ids=["polite", "ignores-sigterm"])
def test_cancel_stops_the_whole_tree(tmp_path: Path, stubborn: bool) -> None:
    async def go() -> tuple[int, int]:
        found, task = _start_tree(tmp_path, *(["ignore"] if stubborn else []), grace=0.3)
        await wait_for(lambda: len(found) == 2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return found[0], found[1]

    pgid, grandchild = run(go())
    try:
        assert not group_alive(pgid)
        # gone, or a zombie where PID 1 does not reap orphans: either way not running
        assert proc_state(grandchild) in (None, "Z")
    finally:
        kill_quietly(grandchild)


def test_a_second_cancel_during_the_stop_still_stops_everything(tmp_path: Path) -> None:
    async def go() -> tuple[int, int]:
        found, task = _start_tree(tmp_path, "ignore", grace=0.5)
        await wait_for(lambda: len(found) == 2)
        task.cancel()
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return found[0], found[1]

    pgid, grandchild = run(go())
    try:
        assert not group_alive(pgid)
        assert not running(grandchild)
    finally:
        kill_quietly(grandchild)


def test_leftovers_are_stopped_when_the_program_exits(tmp_path: Path) -> None:
    # The background child inherits stdout; without stopping it the read would never end.
    code = (
        "import subprocess, sys\n"
        "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'])\n"
        "print('grandchild', g.pid, flush=True)\n"
    )
    out: list[bytes] = []
    ex = run(run_process(py(code), cwd=tmp_path, env=ENV, on_line=lambda b: _lines(out, b)))
    grandchild = int(out[0].split()[1])
    try:
        assert ex.returncode == 0
        assert not group_alive(ex.pid)
        assert not running(grandchild)
    finally:
        kill_quietly(grandchild)


def test_a_process_that_left_the_group_cannot_hold_the_run_open(tmp_path: Path) -> None:
    code = (
        "import subprocess, sys\n"
        "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'],"
        " start_new_session=True)\n"
        "print('escaped', g.pid, flush=True)\n"
    )
    out: list[bytes] = []
    ex = run(
        run_process(
            py(code),
            cwd=tmp_path,
            env=ENV,
            on_line=lambda b: _lines(out, b),
            limits=Limits(grace=0.2),
        )
    )
    escaped = int(out[0].split()[1])
    try:
        assert ex.returncode == 0
        assert running(escaped)  # outside our group: not ours to kill, but not waited on
    finally:
        kill_quietly(escaped)


def test_deadline_stops_the_tree_and_says_so(tmp_path: Path) -> None:
    out: list[bytes] = []
    ex = run(
        run_process(
            py("import time; time.sleep(300)"),
            cwd=tmp_path,
            env=ENV,
            on_line=lambda b: _lines(out, b),
            limits=Limits(timeout=0.3, grace=1),
        )
    )
    assert ex.timed_out
    assert ex.signal == 15
    assert ex.describe() == "was killed by SIGTERM"
    assert not group_alive(ex.pid)


def test_an_error_in_the_line_callback_stops_the_program(tmp_path: Path) -> None:
    started: list[int] = []

    async def on_start(pid: int) -> None:
        started.append(pid)

    async def on_line(b: bytes) -> None:
        raise RuntimeError("the sink is gone")

    with pytest.raises(RuntimeError, match="sink is gone"):
        run(
            run_process(
                py("import time; print('hi', flush=True); time.sleep(300)"),
                cwd=tmp_path,
                env=ENV,
                on_line=on_line,
                on_start=on_start,
            )
        )
    assert not group_alive(started[0])


def test_cannot_start(tmp_path: Path) -> None:
    async def nothing(b: bytes) -> None:
        pass

    with pytest.raises(SpawnError, match="no-such-program"):
        run(run_process(["no-such-program-xyz"], cwd=tmp_path, env=ENV, on_line=nothing))
    with pytest.raises(SpawnError, match="cannot start"):
        run(run_process([sys.executable], cwd=tmp_path / "missing", env=ENV, on_line=nothing))


def test_exit_descriptions() -> None:
    assert Exit(-9, "", 1).describe() == "was killed by SIGKILL"
    assert Exit(143, "", 1).describe() == "exited with status 143 (SIGTERM)"
    assert Exit(143, "", 1).signal == 15
    assert Exit(1, "", 1).signal is None
    assert Exit(1, "  \n", 1).with_stderr("bad") == "bad"


RUNNER = """
import asyncio, os, sys
from pathlib import Path
from melchior.runtimes.process import run_process

async def started(pid: int) -> None:
    Path(sys.argv[1]).write_text(str(pid))

async def line(_: bytes) -> None:
    pass

asyncio.run(run_process([sys.executable, '-c', 'import time; time.sleep(300)'],
                        cwd=Path.cwd(), env=dict(os.environ), on_line=line,
                        on_start=started))
"""


def test_the_program_dies_with_the_process_that_started_it(tmp_path: Path) -> None:
    """A runner SIGKILLed mid-turn (a receiver killed mid-task) takes its program with it:
    nothing of the turn works on while the task is claimed and run again."""
    import signal
    import subprocess

    pid_file = tmp_path / "pid"
    runner = subprocess.Popen([sys.executable, "-c", RUNNER, str(pid_file)], env=ENV)
    try:

        async def program() -> int:
            await wait_for(lambda: pid_file.exists() and pid_file.read_text() != "")
            return int(pid_file.read_text())

        pid = run(program())
        assert running(pid)
        runner.send_signal(signal.SIGKILL)
        runner.wait(timeout=30)
        run(wait_for(lambda: not running(pid)))  # gone, not reparented and sleeping on
    finally:
        kill_quietly(runner.pid)
        if pid_file.exists() and pid_file.read_text():
            kill_quietly(int(pid_file.read_text()))


GROUP_RUNNER = """
import asyncio, os, sys
from pathlib import Path
from melchior.runtimes import guard
from melchior.runtimes.process import run_process

out = Path(sys.argv[1])
kill_guard = 'kill-guard' in sys.argv

async def line(text: bytes) -> None:  # the program's grandchild, then the guard's pid
    if kill_guard:  # the guard is killed: the next group it is told of starts a new one
        os.kill(guard.GUARD.pid(), 9)
        while True:
            try:
                os.waitpid(guard.GUARD.pid(), 0)
            except ChildProcessError:
                break
        guard.watch(10**7)
    out.write_text(text.decode().strip() + ' ' + str(guard.GUARD.pid()))

code = ('import subprocess, sys, time; '
        'g = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"]); '
        'print(g.pid, flush=True); time.sleep(300)')
asyncio.run(run_process([sys.executable, '-c', code], cwd=Path.cwd(), env=dict(os.environ),
                        on_line=line))
"""


@pytest.mark.parametrize("guard_killed", [False, True], ids=["guard", "guard-replaced"])
def test_the_whole_group_dies_with_the_runner_and_the_guard_goes_too(
    tmp_path: Path, guard_killed: bool
) -> None:
    """Not only the program: what it started is stopped too when its runner is SIGKILLed
    (the guard SIGKILLs the group), the guard ends with it — and a guard killed on the
    way is replaced, told every group still running."""
    import signal
    import subprocess

    out = tmp_path / "out"
    args = ["kill-guard"] if guard_killed else []
    runner = subprocess.Popen([sys.executable, "-c", GROUP_RUNNER, str(out), *args], env=ENV)
    grandchild = guard_pid = 0
    try:

        async def started() -> tuple[int, int]:
            await wait_for(lambda: out.exists() and len(out.read_text().split()) == 2)
            first, second = out.read_text().split()
            return int(first), int(second)

        grandchild, guard_pid = run(started())
        assert running(grandchild)
        assert running(guard_pid)
        runner.send_signal(signal.SIGKILL)
        runner.wait(timeout=30)
        run(wait_for(lambda: not running(grandchild)))  # the group went, not only its leader
        run(wait_for(lambda: not running(guard_pid)))  # and the guard after it
    finally:
        kill_quietly(runner.pid)
        for pid in (grandchild, guard_pid):
            if pid:
                kill_quietly(pid)
