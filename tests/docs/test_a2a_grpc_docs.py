"""docs/a2a.md's gRPC section runs as written: a relay with ``--grpc-port 0``, the
control commands, and a call through the sdk's generated stubs."""

from __future__ import annotations

import shlex
from pathlib import Path

from doc_kit import run_bash, script_bin, sh_blocks


def test_the_grpc_example_runs_as_written(tmp_path: Path) -> None:
    (script,) = sh_blocks("a2a.md", "gRPC")
    work = tmp_path / "work"
    work.mkdir()
    home = tmp_path / "home"
    env = {
        "HOME": str(home),
        "XDG_DATA_HOME": str(home / "data"),
        "XDG_CONFIG_HOME": str(home / "config"),
    }
    done = run_bash(
        f"cd {shlex.quote(str(work))}\n{script}",
        bindir=script_bin("mellan"),
        drop=["MELLAN_", "XDG_"],
        env=env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert any(line.startswith("got ") and line.endswith("TASK_STATE_SUBMITTED") for line in lines)
    assert "cancel TASK_STATE_CANCELED" in lines
    assert "refused NOT_FOUND" in lines
