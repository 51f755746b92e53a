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


# A block that is a template for the reader's own machine (their certificates, their
# systemd, their database host), or one that runs part of this project's own suite, says
# so on the line before its fence; tests/docs/test_doc_blocks.py checks it as such.
MARK = re.compile(r"<!-- doc-block: (template|suite): (.+?) -->")


@dataclass(frozen=True)
class Block:
    """One ``sh`` block: where it is, its text, and how it is checked."""

    doc: str  # as sh_blocks names it: relative to docs/ ("../README.md" for the README)
    heading: str  # the ``## `` section it is under, as sh_blocks takes it
    text: str
    kind: str  # "run" (a test runs it), "template" or "suite"
    reason: str


def every_sh_block() -> list[Block]:
    """Every ``sh`` block of docs/ and the README, with the section it is under."""
    paths = [*sorted(DOCS.rglob("*.md")), DOCS.parent / "README.md"]
    found: list[Block] = []
    for path in paths:
        doc = "../README.md" if path.parent == DOCS.parent else path.relative_to(DOCS).as_posix()
        heading, fence, mark = "", "", ("run", "")
        body: list[str] = []
        previous = ""
        for line in path.read_text(encoding="utf-8").splitlines():
            if fence:
                if line.startswith("```"):
                    if fence == "sh":
                        found.append(Block(doc, heading, "\n".join(body) + "\n", *mark))
                    fence = ""
                else:
                    body.append(line)
            elif line.startswith("```"):
                fence, body = line[3:].strip() or "text", []
                marked = MARK.fullmatch(previous.strip())
                mark = (marked.group(1), marked.group(2)) if marked else ("run", "")
            elif line.startswith("## "):
                heading = line[3:].strip()
            previous = line
    return found
