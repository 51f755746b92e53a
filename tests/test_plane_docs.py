"""docs/plane.md: the walk-through runs as written and shows what the text says; every
PLANE.toml example in it is a valid configuration."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from melchior.plane.config import parse

DOC = Path(__file__).resolve().parent.parent / "docs" / "plane.md"


def _walk_through() -> str:
    section = DOC.read_text(encoding="utf-8").split("## Walk-through", 1)[1]
    match = re.search(r"```sh\n(.*?)```", section, re.S)
    assert match, "docs/plane.md has no sh block under Walk-through"
    return match.group(1)


def test_the_walk_through_runs(tmp_path: Path) -> None:
    bindir = Path(sys.executable).parent
    if not (bindir / "melchior").exists():
        pytest.skip("no melchior script next to this interpreter")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MAGI_", "MELCHIOR_"))}
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
    out = done.stdout
    assert "planner | question: write to ledger? y / n" in out
    assert "planner | done: I asked ledger (receipt queued, door no-door)." in out
    assert re.search(r"planner +1/100 turns +queued 0 +write to ledger\? y / n", out)
    assert "planner | note: note to ledger delivered (hop 1, operator-yes)" in out
    assert "planner | done: ledger says: We spent 1234 EUR in August." in out
    assert "/team at planner: ledger (/team): keeps the books" in out
    assert "door mention" in out
    log = out.strip().splitlines()[-5:]
    assert log == [
        "note planner -> ledger held no-door hop 1",
        "note planner -> ledger delivered operator-yes hop 1",
        "answer ledger -> planner delivered origin hop 2",
        "note planner -> ledger delivered mention hop 1",
        "answer ledger -> planner delivered origin hop 2",
    ]
    assert list(tmp_path.iterdir()) == []  # the walk-through cleans up after itself


def test_every_plane_example_is_a_valid_configuration(tmp_path: Path) -> None:
    blocks = [
        b for b in re.findall(r"```toml\n(.*?)```", DOC.read_text(), re.S) if "[[agents]]" in b
    ]
    assert len(blocks) >= 2
    for block in blocks:
        tomllib.loads(block)
        config = parse(block, tmp_path / "PLANE.toml")
        assert config.agents
