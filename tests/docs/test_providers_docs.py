"""The walk-through in docs/providers.md runs as written and shows what the text says."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from doc_kit import run_bash, script_bin, sh_blocks

pytestmark = pytest.mark.streaming


def test_the_walk_through_runs(tmp_path: Path) -> None:
    (script,) = sh_blocks("providers.md", "Walk-through")
    done = run_bash(
        script, bindir=script_bin("melchior"), drop=["XDG_"], env={"TMPDIR": str(tmp_path)}
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split() == ["PROVIDER", "MODEL", "CONTEXT", "LISTED"]
    assert lines[1].split() == ["demo", "demo-large", "-", "now"]
    assert lines[3].split() == ["pinned", "claude-sonnet-4-5", "-", "config"]
    assert lines[4] == "demo.json"
    cached, refreshed = json.loads(lines[5]), json.loads(lines[6])
    assert cached["refreshed"] is False
    assert cached["failed"] == []
    assert cached["n"] == 3
    assert refreshed["refreshed"] is True
    assert refreshed["failed"] == ["demo"]
    assert refreshed["result"] == cached["result"]  # the last listing is kept
    assert lines[7] == "exit status 0"
    assert "provider 'demo'" in done.stderr
    assert "showing its listing from" in done.stderr
    assert list(tmp_path.iterdir()) == []  # the walk-through cleans up after itself
