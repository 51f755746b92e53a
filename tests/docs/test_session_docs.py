"""The walk-through in docs/local.md runs as written and shows what the text says.

A documented example that does not run is a bug; this pastes it into bash, as a
reader would, with a private runtime directory.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from doc_kit import run_bash, script_bin, sh_blocks


@pytest.mark.skipif(shutil.which("jq") is None, reason="the walk-through needs jq")
def test_the_walk_through_runs(runtime_dir: Path, tmp_path: Path) -> None:
    (script,) = sh_blocks("local.md", "Walk-through")
    done = run_bash(
        script,
        bindir=script_bin("melchior"),
        drop=["MAGI_MELCHIOR_"],
        env={"XDG_RUNTIME_DIR": str(runtime_dir), "XDG_CONFIG_HOME": str(tmp_path / "config")},
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert '"rule":"family"' in out
    assert '"receipt":"delivered"' in out
    assert re.search(
        r'"who":"demo/sub/[a-z-]+","sort":"attention","text":"the parser is done"', out
    )
    assert '{"state":"pending"}' in out
    assert '{"state":"answered","answer":"all pass"}' in out
    assert '{"revision":1,"notified":{"receipt":"delivered"}}' in out
    assert '{"busy":true,"working_for":7}' in out
    assert '"ending":true' in out
    listing = out.strip().splitlines()[-3:]  # no sockets left: only the child's notes
    assert all(re.fullmatch(r"[a-z]+-[a-z]+\.(parent|report|role)", name) for name in listing)
