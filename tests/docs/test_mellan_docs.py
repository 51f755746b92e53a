"""docs/mellan.md's walk-through from an empty machine runs as written and shows what the
text says: a relay started and waited for, the owner's login, agents, a grant and a
refused one, enrollment (and a used code refused), a task sent, read and cancelled, the
audit log. Only the port differs (a free one, so a relay already on 8787 is no matter)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from doc_kit import free_port, run_bash, script_bin, sh_blocks


@pytest.mark.skipif(
    shutil.which("jq") is None or shutil.which("curl") is None,
    reason="the walk-through uses jq and curl",
)
def test_the_walk_through_runs(tmp_path: Path) -> None:
    setup, *blocks = sh_blocks("mellan.md", "Walk-through from an empty machine")
    assert "make setup" in setup  # the set-up is this test's own environment
    done = run_bash(
        "\n".join(blocks).replace("8787", str(free_port())),
        bindir=script_bin("mellan"),
        drop=["MELLAN_"],
        env={"XDG_DATA_HOME": str(tmp_path / "data"), "XDG_CONFIG_HOME": str(tmp_path / "config")},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "logged in to http://127.0.0.1:" in out
    assert "refused: private/ops declares no 'reboot'" in out
    assert "refused: the code is used" in out
    assert re.search(r"joined workspace 'default' as private/ops", out)
    assert "task.accept" in out  # the audit shows both decisions
    assert "task.cancel" in out
    assert (tmp_path / "data" / "mellan" / "owner.token").is_file()
