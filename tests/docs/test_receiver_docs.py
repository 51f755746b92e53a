"""The walk-through in docs/receiver.md runs as written, from an empty machine, and the
caller sees the answer the receiver's command produced."""

from __future__ import annotations

import re
from pathlib import Path

from doc_kit import run_bash, script_bin, sh_blocks


def test_the_walk_through_runs(tmp_path: Path) -> None:
    (script,) = sh_blocks("receiver.md", "Walk-through from an empty machine")
    home = tmp_path / "home"
    home.mkdir()
    done = run_bash(
        script,
        bindir=script_bin("mellan"),
        drop=["MELLAN_", "XDG_"],
        env={"HOME": str(home), "TMPDIR": str(tmp_path)},
        timeout=180,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    answer = "inspected (incident.inspect for local/codex): what broke last night?"
    assert re.search(rf"task \S+ completed: {re.escape(answer)}", out), out
    assert f"artifact stdout: {answer}" in out
    assert "receiver for private/ops on http://127.0.0.1:" in out
    assert "complete acknowledged (ok)" in out
    assert "no task running" in out  # the status command, while it still ran
