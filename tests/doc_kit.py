"""Running the docs' shell examples as a reader would: the ``sh`` blocks of one section,
pasted into ``bash -e`` with this checkout's scripts first on PATH.

A documented example that does not run is a bug, so each walk-through has a test; this
is what they share. The script runs in its own session (process group), killed whole at
the end, so a background server it starts never outlives the test, pass or fail.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parent.parent / "docs"


def sh_blocks(doc: str, heading: str) -> list[str]:
    """The ``sh`` code blocks under ``## {heading}`` of ``docs/{doc}``, in order."""
    text = (DOCS / doc).read_text(encoding="utf-8")
    marker = f"\n## {heading}"
    assert marker in text, f"docs/{doc} has no section {heading!r}"
    section = text.split(marker, 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```sh\n(.*?)```", section, re.S)
    assert blocks, f"docs/{doc} has no sh block under {heading!r}"
    return blocks


def script_bin(name: str) -> Path:
    """The directory holding this interpreter's ``name`` script (skip when there is none)."""
    bindir = Path(sys.executable).parent
    if not (bindir / name).exists():
        pytest.skip(f"no {name} script next to this interpreter")
    return bindir


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass(frozen=True)
class Ran:
    returncode: int
    stdout: str
    stderr: str


def run_bash(
    script: str,
    *,
    bindir: Path,
    drop: Iterable[str] = (),
    env: dict[str, str] | None = None,
    timeout: float = 120,
) -> Ran:
    """Run ``script`` with ``bash -e``: the environment without variables starting with
    any of ``drop``, plus ``env``, with ``bindir`` first on PATH."""
    prefixes = tuple(drop)
    full = {k: v for k, v in os.environ.items() if not (prefixes and k.startswith(prefixes))}
    full.update(env or {})
    full["PATH"] = f"{bindir}{os.pathsep}{full.get('PATH', '')}"
    proc = subprocess.Popen(
        ["bash", "-e", "-c", script],
        env=full,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)  # a hang guard, not a threshold
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    return Ran(proc.returncode, out, err)
