"""docs/plane.md: the walk-through runs as written and shows what the text says; every
PLANE.toml example in it is a valid configuration."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from doc_kit import run_bash, script_bin, sh_blocks
from melchior.plane.config import parse
from paths_kit import REPO

DOC = REPO / "docs" / "plane.md"


def test_the_walk_through_runs(tmp_path: Path) -> None:
    (script,) = sh_blocks("plane.md", "Walk-through")
    done = run_bash(
        script,
        bindir=script_bin("melchior"),
        drop=["MAGI_", "MELCHIOR_"],
        env={"TMPDIR": str(tmp_path)},
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


def test_the_webhook_round_runs_as_written(tmp_path: Path) -> None:
    """A line POSTed with the token (the scheme in any case) wakes the agent, one without
    it is refused, and SIGTERM stops a headless plane whose stdin is /dev/null."""
    (script,) = sh_blocks("plane.md", "The webhook")
    done = run_bash(
        script,
        bindir=script_bin("melchior"),
        drop=["MAGI_", "MELCHIOR_", "PLANE_WEBHOOK_TOKEN"],
        env={"TMPDIR": str(tmp_path)},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert '{"ok":true,"input":1,"agent":"planner"}' in out.replace(" ", "")
    assert "401 without the token" in out
    assert "planner | webhook: the nightly build failed" in out
    assert re.search(r"planner \| done: \d+ lines read", out)
    assert "Traceback" not in done.stderr + out
    assert list(tmp_path.iterdir()) == []
