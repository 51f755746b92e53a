"""``melchior plane run --headless`` with any stdin: /dev/null, a closed pipe, a pipe
nobody closes, a terminal — and SIGTERM / SIGINT stop it whatever the input is doing."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest

from console_kit import MELCHIOR, Tmux, needs_tmux, tmux
from plane_kit import write_plane

__all__ = ["tmux"]
TEAM = [{"id": "planner", "description": "plans"}, {"id": "ledger", "description": "books"}]


def headless(config: Path, **kw: object) -> subprocess.Popen[str]:
    return subprocess.Popen(  # type: ignore[call-overload, no-any-return]
        [MELCHIOR, "plane", "run", str(config), "--headless"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kw,
    )


def finish(proc: subprocess.Popen[str], timeout: float = 60.0) -> tuple[int, str, str]:
    """Its exit (a hang guard, not a threshold: a plane that never stops fails here).
    Its stdin is left as it is until it has exited: closing it would end the input."""
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(
            f"the headless plane did not stop; stdout:\n{out}\nstderr:\n{err}"
        ) from None
    if proc.stdin is not None and not proc.stdin.closed:
        proc.stdin.close()
    proc.stdin = None
    out, err = proc.communicate()
    return proc.returncode, out, err


def test_stdin_from_dev_null_is_the_end_of_input(tmp_path: Path) -> None:
    config = write_plane(tmp_path, TEAM)
    with open("/dev/null", encoding="utf-8") as null:
        code, _out, err = finish(headless(config, stdin=null))
    assert code == 0, err
    assert "Traceback" not in err


def test_a_closed_pipe_is_the_end_of_input(tmp_path: Path) -> None:
    config = write_plane(tmp_path, TEAM)
    proc = headless(config, stdin=subprocess.PIPE)
    assert proc.stdin is not None
    proc.stdin.write("planner> answer: seen\n")
    proc.stdin.close()
    code, out, err = finish(proc)
    assert code == 0, err
    assert "planner | done: seen" in out


def wait_for_line(proc: subprocess.Popen[str], needle: str) -> list[str]:
    assert proc.stdout is not None
    seen: list[str] = []
    for line in proc.stdout:
        seen.append(line)
        if needle in line:
            return seen
    raise AssertionError(f"never saw {needle!r}; saw:\n{''.join(seen)}")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_it_while_stdin_stays_open_and_a_turn_runs(
    tmp_path: Path, sig: signal.Signals
) -> None:
    config = write_plane(tmp_path, TEAM)
    proc = headless(config, stdin=subprocess.PIPE)
    assert proc.stdin is not None
    proc.stdin.write("planner> sleep: 300\n")
    proc.stdin.flush()  # and never closed: the plane must not wait for the end of input
    wait_for_line(proc, "planner | turn: turn 1")
    time.sleep(0.5)  # the stand-in is past its start
    proc.send_signal(sig)
    code, out, err = finish(proc)
    assert code == 0, err
    assert "interrupted when the plane stopped" in out


def test_serve_with_stdin_from_dev_null_stops_on_sigterm(tmp_path: Path) -> None:
    config = write_plane(tmp_path, TEAM)
    with open("/dev/null", encoding="utf-8") as null:
        proc = subprocess.Popen(
            [MELCHIOR, "plane", "run", str(config), "--headless", "--serve"],
            stdin=null,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        time.sleep(1.0)  # up and serving (nothing to print without a webhook)
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        code, _out, err = finish(proc)
    assert code == 0, err


@needs_tmux
def test_a_terminal_as_stdin_reads_lines_and_ctrl_c_stops_it(tmp_path: Path, tmux: Tmux) -> None:
    config = write_plane(tmp_path, TEAM)
    tmux(
        "new-session",
        "-d",
        "-s",
        "plane",
        "-x",
        "160",
        "-y",
        "40",
        f"{MELCHIOR} plane run {config} --headless; echo exit-status-$?; sleep 120",
    )
    tmux.type("planner> answer: typed at a terminal")
    tmux.key("Enter")
    tmux.wait_for(lambda s: "planner | done: typed at a terminal" in s, "the turn's answer")
    tmux.key("C-c")
    tmux.wait_for(lambda s: "exit-status-0" in s, "the plane stopped by ctrl+c")


def test_a_webhook_port_in_use_is_one_line_naming_it_and_the_fix(tmp_path: Path) -> None:
    import os
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        config = write_plane(tmp_path, TEAM, webhook={"port": port, "token_env": "HOOK_T"})
        with open("/dev/null", encoding="utf-8") as null:
            proc = headless(config, stdin=null, env={**os.environ, "HOOK_T": "t0ken"})
            code, out, err = finish(proc)
    assert code == 2, (out, err)
    assert err.strip().splitlines() == [
        f"melchior plane: the webhook cannot listen on 127.0.0.1:{port} (it is in use); set "
        "port in the [webhook] table of PLANE.toml to another port (0: any free port)"
    ]


def test_the_webhook_default_port_is_not_the_relays(tmp_path: Path) -> None:
    from melchior.plane.config import WEBHOOK_PORT
    from plane_kit import load_plane

    config = write_plane(tmp_path, TEAM, webhook={"token_env": "HOOK_T"})
    hook = load_plane(config).webhook
    assert hook is not None
    assert hook.port == WEBHOOK_PORT == 8790
