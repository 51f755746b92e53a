"""The walk-through in docs/security.md runs as written, from an empty machine: two
agents, a sealed grant, a sealed task completed by a receiver and opened by the caller,
the payload absent from the relay's database, the same send in clear refused, the sealed
task followed as a stream, and a key rotated: refused by the caller until trusted."""

from __future__ import annotations

import re
from pathlib import Path

from doc_kit import run_bash, script_bin, sh_blocks


def test_the_sealed_walk_through_runs(tmp_path: Path) -> None:
    (script,) = sh_blocks("security.md", "Walk-through: a sealed task from an empty machine")
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
    out, err = done.stdout, done.stderr
    answer = re.search(
        r"task \S+ completed: inspected for local/codex: payroll ledger line (\d+)", out
    )
    assert answer, out + err
    assert "relay database: no plaintext of the payload or the result" in out
    assert "requires sealed sends" in out  # refused.txt, printed
    assert "(pinned on this machine)" in out
    # 9: the stream's last line is the answer, opened
    assert re.search(
        r"completed: inspected for local/codex: payroll ledger line \d+, streamed", out
    )
    # 10: the rotated key refused until trusted, then used
    assert "the key the relay gives for private/ops changed" in out  # changed.txt
    assert "trusted; it is pinned the next time it is seen" in out
    assert "completed: inspected for local/codex: after the rotation" in out
    assert "Traceback" not in err
