"""Shared parts for the runtime adapter tests: stand-in CLIs on PATH, a progress sink,
and process-table checks.

The stand-ins in ``tests/stand_ins/`` are installed into a private ``bin`` directory
with this interpreter in their shebang, so they run with the test's Python wherever the
checkout lives, and put first on the turn's PATH. Their session stores live under the
test's temporary directory (``CLAUDE_CONFIG_DIR``, ``CODEX_HOME``, ``PI_CODING_AGENT_DIR``),
and every call they
receive is appended to ``calls.jsonl`` (``STAND_IN_RECORD``) so tests can assert the
exact command line an adapter built.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from melchior.runtimes.base import Progress

STAND_INS = Path(__file__).parent / "stand_ins"
T = TypeVar("T")


@dataclass
class StandIns:
    """Where the stand-ins are and what they saw."""

    root: Path
    bin: Path
    env: dict[str, str]

    @property
    def record(self) -> Path:
        return self.root / "calls.jsonl"

    def calls(self, prog: str | None = None) -> list[dict[str, Any]]:
        if not self.record.exists():
            return []
        rows = [json.loads(line) for line in self.record.read_text().splitlines() if line]
        return [r for r in rows if prog is None or r["prog"] == prog]


def install_stand_ins(root: Path) -> StandIns:
    bin_dir = root / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    for src in STAND_INS.iterdir():
        if src.suffix or src.name.startswith((".", "_")):
            continue
        body = src.read_text().split("\n", 1)[1]
        dst = bin_dir / src.name
        dst.write_text(f"#!{sys.executable}\n{body}")
        dst.chmod(0o755)
    (root / "claude-config").mkdir(exist_ok=True)
    (root / "codex-home").mkdir(exist_ok=True)
    (root / "pi-agent").mkdir(exist_ok=True)
    env = {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}",
        "CLAUDE_CONFIG_DIR": str(root / "claude-config"),
        "CODEX_HOME": str(root / "codex-home"),
        "PI_CODING_AGENT_DIR": str(root / "pi-agent"),
        "STAND_IN_RECORD": str(root / "calls.jsonl"),
    }
    return StandIns(root, bin_dir, env)


@dataclass
class Sink:
    """An ``emit`` that keeps everything, optionally reacting to each item."""

    items: list[Progress] = field(default_factory=list)
    on: Callable[[Progress], Awaitable[None]] | None = None

    async def __call__(self, p: Progress) -> None:
        self.items.append(p)
        if self.on is not None:
            await self.on(p)

    def kinds(self, kind: str) -> list[Progress]:
        return [p for p in self.items if p.kind == kind]

    def texts(self, kind: str | None = None) -> list[str]:
        return [p.text for p in self.items if kind is None or p.kind == kind]

    def pid(self) -> int:
        """The process group the adapter reported starting."""
        for p in self.items:
            if p.data and isinstance(p.data.get("pid"), int):
                return int(p.data["pid"])
        raise AssertionError(f"no started-process progress in {self.items}")


def proc_state(pid: int) -> str | None:
    """The state letter of ``pid`` (``Z`` for a zombie), or None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rfind(")") + 2 :].split()[0]


def running(pid: int) -> bool:
    """A zombie is not running: where PID 1 does not reap orphans it stays one."""
    return proc_state(pid) not in (None, "Z", "X")


def kill_quietly(pid: int) -> None:
    import signal

    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


async def wait_for(predicate: Callable[[], bool], timeout: float = 20.0) -> None:  # noqa: ASYNC109 (a hang guard)
    """Poll until ``predicate`` holds; a generous bound, never asserted as a speed."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not predicate():
        if loop.time() > end:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.02)


def run(coro: Awaitable[T]) -> T:
    async def main() -> T:
        return await coro

    return asyncio.run(main())
