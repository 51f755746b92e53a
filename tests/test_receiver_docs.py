"""The walk-through in docs/receiver.md runs as written, from an empty machine, and the
caller sees the answer the receiver's command produced."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parent.parent / "docs" / "receiver.md"


def _walk_through() -> str:
    section = DOC.read_text(encoding="utf-8").split("## Walk-through from an empty machine", 1)[1]
    match = re.search(r"```sh\n(.*?)```", section, re.S)
    assert match, "docs/receiver.md has no sh block under its walk-through"
    return match.group(1)


def test_the_walk_through_runs(tmp_path: Path) -> None:
    bindir = Path(sys.executable).parent
    if not (bindir / "mellan").exists():
        pytest.skip("no mellan script next to this interpreter")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MELLAN_", "XDG_"))}
    env.update(
        PATH=f"{bindir}{os.pathsep}{env.get('PATH', '')}",
        HOME=str(tmp_path / "home"),
        TMPDIR=str(tmp_path),
    )
    (tmp_path / "home").mkdir()
    done = subprocess.run(
        ["bash", "-e", "-c", _walk_through()],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,  # a hang guard, not a threshold
        check=False,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    answer = "inspected (incident.inspect for local/codex): what broke last night?"
    assert re.search(rf"task \S+ completed: {re.escape(answer)}", out), out
    assert f"artifact stdout: {answer}" in out
    assert "receiver for private/ops on http://127.0.0.1:" in out
    assert "complete acknowledged (ok)" in out
    assert "no task running" in out  # the status command, while it still ran
