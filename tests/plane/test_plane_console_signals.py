"""The console stops on SIGTERM and on SIGINT sent from outside its terminal (a service
manager, ``kill``) as it does when the operator quits: exit 0, a running turn's process
stopped, and the terminal given back — not left in the app's alternate screen."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from console_kit import Tmux, needs_tmux, tmux
from plane_kit import write_plane

pytestmark = needs_tmux
__all__ = ["tmux"]


def console_pid(config: Path) -> int:
    """The pid of the interpreter running ``melchior plane run CONFIG`` — not the shell or
    the tmux that started it (a hang guard, not a threshold)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = subprocess.run(
            ["pgrep", "-f", f"python[0-9.]* [^ ]*melchior plane run {config}"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.split()
        pids = [int(p) for p in found if int(p) != os.getpid()]
        if pids:
            return min(pids)
        time.sleep(0.2)
    raise AssertionError("the console never started")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_ends_the_console_and_gives_the_terminal_back(
    tmp_path: Path, tmux: Tmux, sig: int
) -> None:
    config = write_plane(tmp_path, [{"id": "planner", "description": "plans"}])
    tmux.start(config)
    tmux.wait_for(lambda s: "planner" in s and "idle" in s, "the console drawn")
    os.kill(console_pid(config), sig)
    screen = tmux.wait_for(lambda s: "exit-status-" in s, "the console gone")
    assert "exit-status-0" in screen, screen
    assert "╔" not in screen  # the app's frame is gone: the terminal is the shell's again
