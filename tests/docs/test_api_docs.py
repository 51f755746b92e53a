"""docs/api.md's walk-through runs as written: a throwaway relay, two agents, a grant, a
receiver with a command route, then the Python blocks (each with ``python -`` in the same
shell) send tasks with the relay client and get their answers."""

from __future__ import annotations

import re
from pathlib import Path

from doc_kit import DOCS, run_bash, script_bin, sh_blocks

HEADING = "Walk-through: send a task and wait for its answer"


def python_blocks() -> list[str]:
    text = (DOCS / "api.md").read_text(encoding="utf-8")
    section = text.split(f"\n## {HEADING}", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 3, "the sync send, the async stream, the errors"
    return blocks


def test_the_walk_through_runs(tmp_path: Path) -> None:
    setup, stop = sh_blocks("api.md", HEADING)
    pythons = "".join(f"python - <<'PYTHON'\n{block}PYTHON\n" for block in python_blocks())
    home = tmp_path / "home"
    home.mkdir()
    done = run_bash(
        setup + pythons + stop,
        bindir=script_bin("mellan"),
        drop=["MELLAN_", "XDG_"],
        env={"HOME": str(home), "TMPDIR": str(tmp_path)},
        timeout=180,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "sending as local/codex in workspace default" in out
    assert re.search(r"task \S+: queued", out), out
    assert "TASK_STATE_COMPLETED inspected: what broke last night?" in out
    assert "stdout inspected: what broke last night?" in out
    # the stream: the task first, in the state it has when the stream opens (a receiver
    # on a loaded machine may already have claimed it), the completed status last
    lines = out.splitlines()
    first = lines[lines.index("stdout inspected: what broke last night?") + 1]
    assert re.fullmatch(r"task \S+ (submitted|working)", first), out
    assert "completed: inspected: and the night before?" in out
    assert re.search(r"2 tasks sent to private/ops, newest TASK_STATE_COMPLETED", out), out
    assert re.search(r"refused: 403 PERMISSION_DENIED: \S", out), out
    assert "refused: 404 TASK_NOT_FOUND" in out
