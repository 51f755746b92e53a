"""The walk-through in docs/providers.md runs as written and shows what the text says."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.streaming

DOC = Path(__file__).resolve().parent.parent / "docs" / "providers.md"


def _walk_through() -> str:
    section = DOC.read_text(encoding="utf-8").split("## Walk-through", 1)[1]
    match = re.search(r"```sh\n(.*?)```", section, re.S)
    assert match, "docs/providers.md has no sh block under Walk-through"
    return match.group(1)


def test_the_walk_through_runs(tmp_path: Path) -> None:
    bindir = Path(sys.executable).parent
    if not (bindir / "melchior").exists():
        pytest.skip("no melchior script next to this interpreter")
    env = {k: v for k, v in os.environ.items() if not k.startswith("XDG_")}
    env.update(PATH=f"{bindir}{os.pathsep}{env.get('PATH', '')}", TMPDIR=str(tmp_path))
    done = subprocess.run(
        ["bash", "-e", "-c", _walk_through()],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,  # a hang guard, not a threshold
        check=False,
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
