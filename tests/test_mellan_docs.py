"""docs/mellan.md's walk-through from an empty machine runs as written and shows what the
text says: a relay started and waited for, the owner's login, agents, a grant and a
refused one, enrollment (and a used code refused), a task sent, read and cancelled, the
audit log. Only the port differs (a free one, so a relay already on 8787 is no matter)."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parent.parent / "docs" / "mellan.md"


def walk_through() -> str:
    text = DOC.read_text(encoding="utf-8")
    section = text.split("## Walk-through from an empty machine", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```sh\n(.*?)```", section, re.S)
    assert blocks, "docs/mellan.md has no sh blocks in its walk-through"
    assert "make setup" in blocks[0], "the walk-through starts with the set-up"
    return "\n".join(blocks[1:])  # the set-up is this test's own environment


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.mark.skipif(
    shutil.which("jq") is None or shutil.which("curl") is None,
    reason="the walk-through uses jq and curl",
)
def test_the_walk_through_runs(tmp_path: Path) -> None:
    bindir = Path(sys.executable).parent
    if not (bindir / "mellan").exists():
        pytest.skip("no mellan script next to this interpreter")
    script = walk_through().replace("8787", str(free_port()))
    env = {k: v for k, v in os.environ.items() if not k.startswith("MELLAN_")}
    env.update(
        PATH=f"{bindir}{os.pathsep}{env.get('PATH', '')}",
        XDG_DATA_HOME=str(tmp_path / "data"),
        XDG_CONFIG_HOME=str(tmp_path / "config"),
    )
    proc = subprocess.Popen(
        ["bash", "-e", "-c", script],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # the relay it starts goes with it, whatever happens
    )
    try:
        out, err = proc.communicate(timeout=120)  # a hang guard, not a threshold
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, out + err
    assert "logged in to http://127.0.0.1:" in out
    assert "refused: private/ops declares no 'reboot'" in out
    assert "refused: the code is used" in out
    assert re.search(r"joined workspace 'default' as private/ops", out)
    assert "task.accept" in out  # the audit shows both decisions
    assert "task.cancel" in out
    assert (tmp_path / "data" / "mellan" / "owner.token").is_file()
