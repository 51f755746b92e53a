"""The operator console in a real terminal: tmux types, tmux reads the screen.

Every screen a test waited for is kept under the test's ``tmp_path`` (``screens/``) and
the last one is printed when a wait fails, so a failing run leaves what the operator
would have seen.
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

MELCHIOR = str(Path(sys.executable).with_name("melchior"))
needs_tmux = pytest.mark.skipif(
    shutil.which("tmux") is None, reason="tmux is not installed (apt-get install -y tmux)"
)


class Tmux:
    def __init__(self, socket: str, artifacts: Path) -> None:
        self.socket = socket
        self.artifacts = artifacts
        self.shots = 0

    def __call__(self, *args: str) -> str:
        done = subprocess.run(
            ["tmux", "-L", self.socket, *args], capture_output=True, text=True, check=True
        )
        return done.stdout

    def screen(self) -> str:
        return self("capture-pane", "-p", "-t", "plane")

    def keep(self, screen: str, what: str) -> None:
        self.artifacts.mkdir(parents=True, exist_ok=True)
        self.shots += 1
        name = "".join(c if c.isalnum() else "-" for c in what)[:60]
        (self.artifacts / f"{self.shots:02d}-{name}.txt").write_text(screen, encoding="utf-8")

    def wait_for(self, ok: Callable[[str], bool], what: str, timeout: float = 60.0) -> str:
        """Poll the screen until ``ok`` (a hang guard, not a threshold)."""
        deadline = time.monotonic() + timeout
        screen = ""
        while time.monotonic() < deadline:
            screen = self.screen()
            if ok(screen):
                self.keep(screen, what)
                return screen
            time.sleep(0.2)
        self.keep(screen, f"never-{what}")
        raise AssertionError(f"the console never showed {what}; the screen was:\n{screen}")

    def type(self, text: str) -> None:
        self("send-keys", "-t", "plane", "-l", text)

    def answer(self, key: str) -> None:
        """Answer the question on screen as an operator would: having read it (a key
        within the console's guard after the box appears goes to the prompt instead)."""
        time.sleep(0.5)
        self.type(key)

    def key(self, *keys: str) -> None:
        self("send-keys", "-t", "plane", *keys)

    def start(self, config: Path, width: int = 200, height: int = 50) -> None:
        """``melchior plane run CONFIG`` in a fresh tmux session of a fixed size."""
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
                "; echo exit-status-$?; sleep 120",
            ]
        )
        self("new-session", "-d", "-s", "plane", "-x", str(width), "-y", str(height), command)


@pytest.fixture
def tmux(tmp_path: Path) -> Iterator[Tmux]:
    t = Tmux(f"melchior-test-{os.getpid()}-{tmp_path.name}", tmp_path / "screens")
    yield t
    subprocess.run(["tmux", "-L", t.socket, "kill-server"], capture_output=True, check=False)
