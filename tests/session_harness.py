"""A small stand-in harness: spawns ``melchior serve`` children through real pipes.

It does what a real harness does and nothing more: starts serve with the environment
it was given, reads its events, writes ``doing`` lines, runs ``melchior tool`` execs
as the session, and forks children with the environment ``melchior fork`` printed.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

WAIT = 30.0
"""Seconds to wait for an event before failing the test (a hang guard, not a threshold)."""


def melchior(*args: str) -> list[str]:
    return [sys.executable, "-m", "melchior.cli", *args]


@dataclass
class ToolResult:
    rc: int
    reply: dict[str, Any]
    stderr: str

    @property
    def result(self) -> list[Any]:
        assert self.reply.get("ok") is True, self.reply
        out: list[Any] = self.reply["result"]
        return out

    @property
    def one(self) -> dict[str, Any]:
        assert len(self.result) == 1, self.reply
        first: dict[str, Any] = self.result[0]
        return first

    @property
    def error(self) -> dict[str, Any]:
        assert self.reply.get("ok") is False, self.reply
        err: dict[str, Any] = self.reply["error"]
        return err


@dataclass
class Harness:
    """Everything a test's sessions share: the project, the environment, the cwd."""

    runtime_dir: Path
    config_home: Path
    project: str = "demo"
    sessions: list[Session] = field(default_factory=list)

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("MAGI_MELCHIOR_")}
        env.update(
            XDG_RUNTIME_DIR=str(self.runtime_dir),
            XDG_CONFIG_HOME=str(self.config_home),
            MAGI_MELCHIOR_PROJECT=self.project,
        )
        env.update(extra)
        return env

    @property
    def registry(self) -> Path:
        return self.runtime_dir / "melchior" / self.project

    def set_talk(self, talk: str) -> None:
        cfg = self.config_home / "melchior" / "config.toml"
        cfg.parent.mkdir(parents=True, exist_ok=True)
        cfg.write_text(f'[melchior]\ntalk = "{talk}"\n')

    def start(self, env: dict[str, str] | None = None) -> Session:
        s = Session(self, env if env is not None else self.env())
        self.sessions.append(s)
        return s

    def tool(self, *args: str, env: dict[str, str] | None = None, stdin: bytes = b"") -> ToolResult:
        proc = subprocess.run(
            melchior("tool", *args),
            input=stdin,
            capture_output=True,
            env=env if env is not None else self.env(),
            timeout=WAIT,
            check=False,
        )
        lines = proc.stdout.decode().splitlines()
        assert len(lines) == 1, (proc.stdout, proc.stderr)
        return ToolResult(proc.returncode, json.loads(lines[0]), proc.stderr.decode())

    def close(self) -> None:
        for s in self.sessions:
            s.close()


class Session:
    """One serve child and the harness end of its two pipes."""

    def __init__(self, harness: Harness, env: dict[str, str]) -> None:
        self.harness = harness
        self.env = env
        self.proc = subprocess.Popen(
            melchior("serve"),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        self.events: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        first = self.next_event()
        assert first["event"] == "listening", first
        self.at = Path(first["at"])
        self.id: str = self.at.name

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.events.put(json.loads(line))
        self.events.put(None)

    def next_event(self, event: str | None = None) -> dict[str, Any]:
        while True:
            try:
                item = self.events.get(timeout=WAIT)
            except queue.Empty:
                raise AssertionError(f"no event from serve within {WAIT}s") from None
            if item is None:
                err = self.proc.stderr.read().decode() if self.proc.stderr else ""
                raise AssertionError(f"serve closed its stdout; stderr: {err}")
            if event is None or item.get("event") == event:
                return item

    def doing(self, **fields: Any) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps({"event": "doing", **fields}) + "\n").encode())
        self.proc.stdin.flush()

    def tool_env(self) -> dict[str, str]:
        return self.harness.env(MAGI_MELCHIOR_ID=self.id)

    def tool(self, *args: str, stdin: bytes = b"") -> ToolResult:
        return self.harness.tool(*args, env=self.tool_env(), stdin=stdin)

    def fork(self, role: str = "sub") -> dict[str, Any]:
        proc = subprocess.run(
            melchior("fork", f"--role={role}"),
            capture_output=True,
            env=self.tool_env(),
            timeout=WAIT,
            check=True,
        )
        out: dict[str, Any] = json.loads(proc.stdout)
        return out

    def spawn(self, role: str = "sub") -> Session:
        """Fork a child and start it the way a harness would: with the printed environment."""
        minted = self.fork(role)
        child = self.harness.start(self.harness.env(**minted["environment"]))
        assert child.id == minted["id"]
        return child

    def close(self) -> int:
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.close()
        try:
            code = self.proc.wait(timeout=WAIT)
            self._reader.join(timeout=WAIT)
            return code
        finally:
            for pipe in (self.proc.stdout, self.proc.stderr):
                if pipe is not None:
                    pipe.close()
