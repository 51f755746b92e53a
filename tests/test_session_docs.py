"""The walk-through in docs/local.md runs as written and shows what the text says.

A documented example that does not run is a bug; this pastes it into bash, as a
reader would, with a private runtime directory.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parent.parent / "docs" / "local.md"


def _walk_through() -> str:
    text = DOC.read_text(encoding="utf-8")
    section = text.split("## Walk-through", 1)[1]
    match = re.search(r"```sh\n(.*?)```", section, re.S)
    assert match, "docs/local.md has no sh block under Walk-through"
    return match.group(1)


@pytest.mark.skipif(shutil.which("jq") is None, reason="the walk-through needs jq")
def test_the_walk_through_runs(runtime_dir: Path, tmp_path: Path) -> None:
    bindir = Path(sys.executable).parent
    if not (bindir / "melchior").exists():
        pytest.skip("no melchior script next to this interpreter")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAGI_MELCHIOR_")}
    env.update(
        PATH=f"{bindir}{os.pathsep}{env.get('PATH', '')}",
        XDG_RUNTIME_DIR=str(runtime_dir),
        XDG_CONFIG_HOME=str(tmp_path / "config"),
    )
    done = subprocess.run(
        ["bash", "-e", "-c", _walk_through()],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,  # a hang guard, not a threshold
        check=False,
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
