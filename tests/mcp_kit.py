"""Real bridges for the MCP tests: ``melchior mcp`` processes driven by the SDK's own client.

Each bridge is a subprocess started over stdio by ``mcp.Client`` (the official SDK's
client, the same code path any MCP client takes), in a private runtime directory. The
hook command runs as the agent's hook system runs it: a process with the hook's JSON on
stdin, whose stdout is what the agent would read.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mcp import Client, StdioServerParameters

WAIT = 30.0
"""Seconds a hook process may take before the test fails (a hang guard, not a threshold)."""


def base_env(
    runtime_dir: Path, config_home: Path, project: str = "demo", **extra: str
) -> dict[str, str]:
    """A clean environment: no MAGI_MELCHIOR_*, no mellan credential, our registry."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("MAGI_MELCHIOR_", "MELLAN_", "CLAUDE", "MELCHIOR_"))
    }
    env.update(
        XDG_RUNTIME_DIR=str(runtime_dir),
        XDG_CONFIG_HOME=str(config_home),
        MAGI_MELCHIOR_PROJECT=project,
    )
    env.update(extra)
    return env


@dataclass
class Bridge:
    """One running bridge and the client the "agent" holds it with."""

    client: Client
    env: dict[str, str]
    id: str = ""
    info: dict[str, Any] = field(default_factory=dict)

    async def call(self, tool: str, **arguments: Any) -> dict[str, Any]:
        """A tool's JSON reply (the same object ``melchior tool`` prints)."""
        r = await self.client.call_tool(tool, arguments)
        assert r.structured_content is not None, r
        data: dict[str, Any] = dict(r.structured_content)
        assert r.is_error == (not data["ok"]), (r, data)
        return data

    async def one(self, tool: str, **arguments: Any) -> dict[str, Any]:
        data = await self.call(tool, **arguments)
        assert data["ok"], data
        first: dict[str, Any] = data["result"][0]
        return first

    async def error(self, tool: str, **arguments: Any) -> dict[str, Any]:
        data = await self.call(tool, **arguments)
        assert not data["ok"], data
        err: dict[str, Any] = data["error"]
        return err

    async def text(self, tool: str, **arguments: Any) -> str:
        r = await self.client.call_tool(tool, arguments)
        return "\n".join(getattr(c, "text", "") for c in r.content)

    async def tools(self) -> list[str]:
        return [t.name for t in (await self.client.list_tools()).tools]


async def start(
    stack: AsyncExitStack, env: Mapping[str, str], *args: str, mode: str = "auto"
) -> Bridge:
    """Start ``melchior mcp ARGS`` as an agent would, and learn its session id."""
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "melchior.cli", "mcp", *args], env=dict(env)
    )
    client = await stack.enter_async_context(Client(params, mode=mode))
    bridge = Bridge(client, dict(env))
    bridge.info = await bridge.one("status")
    bridge.id = bridge.info["id"]
    return bridge


@dataclass
class Hook:
    rc: int
    output: dict[str, Any] | None
    stderr: str

    @property
    def context(self) -> str:
        assert self.output is not None, self.stderr
        text: str = self.output["hookSpecificOutput"]["additionalContext"]
        return text

    @property
    def decision(self) -> tuple[str, str]:
        assert self.output is not None, self.stderr
        out = self.output["hookSpecificOutput"]
        return out["permissionDecision"], out["permissionDecisionReason"]


def hook(
    env: Mapping[str, str],
    event: str,
    data: Mapping[str, Any] | None = None,
    *,
    agent: str = "claude-code",
    payload: str | None = None,
    cwd: Path | None = None,
) -> Hook:
    """Run ``melchior hook EVENT`` the way an agent's hook system does."""
    body = {"hook_event_name": event, **(data or {})}
    argv = [sys.executable, "-m", "melchior.cli", "hook", event, f"--agent={agent}"]
    if payload is not None:
        argv.append(payload)
    proc = subprocess.run(
        argv,
        input=b"" if payload is not None else json.dumps(body).encode(),
        capture_output=True,
        env=dict(env),
        cwd=cwd,
        timeout=WAIT,
        check=False,
    )
    out = proc.stdout.decode().strip()
    return Hook(proc.returncode, json.loads(out) if out else None, proc.stderr.decode())
