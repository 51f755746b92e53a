"""The operator console driven in a real terminal: tmux types, tmux reads the screen.

A plane of two stand-ins runs under ``melchior plane run`` in a tmux session of a fixed
size; the test types a line at planner's prompt, sees the held note's question on
planner's pane, answers ``y`` with one key, and sees both panes and the status line
update. Skipped where tmux is not installed (.ci/run installs it).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from plane_kit import write_plane

pytestmark = pytest.mark.skipif(
    shutil.which("tmux") is None, reason="tmux is not installed (apt-get install -y tmux)"
)
MELCHIOR = str(Path(sys.executable).with_name("melchior"))


class Tmux:
    def __init__(self, socket: str) -> None:
        self.socket = socket

    def __call__(self, *args: str) -> str:
        done = subprocess.run(
            ["tmux", "-L", self.socket, *args], capture_output=True, text=True, check=True
        )
        return done.stdout

    def screen(self) -> str:
        return self("capture-pane", "-p", "-t", "plane")

    def wait_for(self, ok: Callable[[str], bool], what: str, timeout: float = 60.0) -> str:
        """Poll the screen until ``ok`` (a hang guard, not a threshold)."""
        deadline = time.monotonic() + timeout
        screen = ""
        while time.monotonic() < deadline:
            screen = self.screen()
            if ok(screen):
                return screen
            time.sleep(0.2)
        raise AssertionError(f"the console never showed {what}; the screen was:\n{screen}")


@pytest.fixture
def tmux(tmp_path: Path) -> Iterator[Tmux]:
    t = Tmux(f"melchior-test-{os.getpid()}-{tmp_path.name}")
    yield t
    subprocess.run(["tmux", "-L", t.socket, "kill-server"], capture_output=True, check=False)


def test_type_a_line_answer_y_and_see_the_panes_update(tmp_path: Path, tmux: Tmux) -> None:
    config = write_plane(
        tmp_path,
        [{"id": "planner", "description": "plans"}, {"id": "ledger", "description": "books"}],
    )
    env = {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    command = " ".join(
        [
            "env",
            "-u",
            "COLUMNS",  # the size is the terminal's, not what pytest's environment says
            "-u",
            "LINES",
            *(f"{k}={shlex.quote(v)}" for k, v in env.items()),
            shlex.quote(MELCHIOR),
            "plane",
            "run",
            shlex.quote(str(config)),
        ]
    )
    tmux("new-session", "-d", "-s", "plane", "-x", "140", "-y", "36", f"{command}; sleep 60")
    tmux.wait_for(lambda s: "planner · idle" in s and "ledger · idle" in s, "both panes")
    tmux("send-keys", "-t", "plane", "-l", "send ledger: answer: 42 euros")
    tmux("send-keys", "-t", "plane", "Enter")
    screen = tmux.wait_for(lambda s: "write to ledger? y / n" in s, "the held note's question")
    assert "planner → ledger · hop 1" in screen
    assert "answer: 42 euros" in screen.split("planner → ledger")[1]  # the note in the box
    assert "> send ledger: answer: 42 euros" in screen
    assert "y/n:1" in screen  # the status line counts the question
    time.sleep(0.5)  # past the guard: a key just after the box appears is not an answer
    tmux("send-keys", "-t", "plane", "-l", "y")
    screen = tmux.wait_for(lambda s: "<< 42 euros" in s, "ledger's answer")
    assert "(hop 1, operator-yes)" in screen
    screen = tmux.wait_for(
        lambda s: "answer from ledger arrived (hop 2)" in s, "the answer back at planner"
    )
    # move to ledger's pane and type there: the status line shows both agents' ceilings
    tmux("send-keys", "-t", "plane", "C-n")
    tmux.wait_for(lambda s: "▶ ledger" in s, "ledger's pane selected")
    tmux("send-keys", "-t", "plane", "-l", "/team")
    tmux("send-keys", "-t", "plane", "Enter")
    tmux.wait_for(lambda s: "/team at ledger: planner (no door)" in s, "the team listing")
    tmux.wait_for(
        lambda s: "planner: idle 2/100 turns" in s and "ledger: idle 1/100 turns" in s,
        "both ceilings on the status line",
    )
    tmux("send-keys", "-t", "plane", "C-q")
