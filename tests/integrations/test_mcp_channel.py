"""``melchior mcp --channel``: messages pushed as Claude Code channel notifications.

Read off the raw stdio wire (the SDK's own client drops notification methods it does not
know), as Claude Code would see them: the handshake declares
``experimental["claude/channel"]``, and a message arriving for the session is pushed as
``notifications/claude/channel`` with the fenced text and its metadata — and so counts
as handed to the agent (``delivered``, via channel) instead of waiting in the inbox.
Without the flag nothing is declared and nothing is pushed.
"""

from __future__ import annotations

import asyncio
import json
import sys
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest

from mcp_kit import WAIT, base_env, start


class RawClient:
    """JSON-RPC lines over a bridge's stdin/stdout, handshake era, nothing hidden."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.next_id = 0
        self.notes: list[dict[str, Any]] = []

    async def send(self, msg: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps({"jsonrpc": "2.0", **msg}) + "\n").encode())
        await self.proc.stdin.drain()

    async def read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(self.proc.stdout.readline(), WAIT)
        assert line, "the bridge closed its stdout"
        msg: dict[str, Any] = json.loads(line)
        return msg

    async def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        self.next_id += 1
        await self.send({"id": self.next_id, "method": method, "params": params})
        while True:
            msg = await self.read()
            if msg.get("id") == self.next_id:
                result: dict[str, Any] = msg["result"]
                return result
            self.notes.append(msg)

    async def notification(self, method: str) -> dict[str, Any]:
        while True:
            for note in self.notes:
                if note.get("method") == method:
                    self.notes.remove(note)
                    return note
            self.notes.append(await self.read())

    async def handshake(self) -> dict[str, Any]:
        init = await self.request(
            "initialize",
            {
                "protocolVersion": "2025-11-25",
                "capabilities": {},
                "clientInfo": {"name": "raw", "version": "0"},
            },
        )
        await self.send({"method": "notifications/initialized"})
        return init


async def _raw(env: dict[str, str], *args: str) -> RawClient:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "melchior.cli",
        "mcp",
        *args,
        env=env,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    return RawClient(proc)


@pytest.mark.parametrize("channel", [True, False])
def test_channel_notifications_push_messages_when_asked(
    runtime_dir: Path, tmp_path: Path, channel: bool
) -> None:
    env = base_env(runtime_dir, tmp_path / "config")

    async def scenario() -> None:
        raw = await _raw(env, *(["--channel"] if channel else []))
        try:
            init = await raw.handshake()
            experimental = init["capabilities"].get("experimental") or {}
            assert ("claude/channel" in experimental) == channel
            status = await raw.request("tools/call", {"name": "status", "arguments": {}})
            me = status["structuredContent"]["result"][0]["id"]
            async with AsyncExitStack() as stack:
                peer = await start(stack, env)
                told = await peer.one("tell", who=me, message="deploy is green")
                if not channel:
                    assert told["receipt"] == "queued"
                    return
                assert told["receipt"] == "delivered"
                note = await raw.notification("notifications/claude/channel")
                params = note["params"]
                assert "deploy is green" in params["content"]
                assert f"from=demo/main/{peer.id} sort=attention>>" in params["content"]
                assert params["meta"] == {"sort": "attention", "message_id": told["message_id"]}
                followed = await peer.one("task", about=f"{me}@{told['message_id']}")
                assert followed["receipt"] == "delivered"
                assert followed["via"] == "channel"
            empty = await raw.request("tools/call", {"name": "inbox", "arguments": {}})
            assert "no messages are waiting" in empty["content"][0]["text"]
        finally:
            assert raw.proc.stdin is not None
            raw.proc.stdin.close()
            await asyncio.wait_for(raw.proc.wait(), WAIT)

    asyncio.run(scenario())
