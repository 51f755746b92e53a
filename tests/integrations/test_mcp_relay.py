"""The bridge as a relay caller, against a live relay with a real receiver (tests/a2a_kit).

The bridge holds the agent credential of ``local/codex`` (granted ``incident.inspect`` on
``private/ops``) and offers the agent the relay: who it may send to, send (return, wait,
stream), get and cancel, with receipts, the relay's refusals, and the hop chain carried
into the task's metadata.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest

from a2a_kit import CAPS, OTHER, RECEIVER, Receiver, Server, World, running
from mcp_kit import base_env, hook, start
from melchior.policy.hops import HOPS_URI


@pytest.fixture(scope="module")
def relay(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, World, Receiver]]:
    db = tmp_path_factory.mktemp("mcp-relay") / "relay.db"
    with running(f"sqlite://{db}") as (server, world, rx):
        assert rx is not None
        yield server, world, rx


def test_a_bridge_with_a_credential_calls_agents_on_other_machines(
    relay: Any, runtime_dir: Path, tmp_path: Path
) -> None:
    server, world, _ = relay
    env = base_env(
        runtime_dir,
        tmp_path / "config",
        MELLAN_TOKEN=world.tokens["caller"],
        MELLAN_RELAY=server.url,
        CLAUDE_CODE_SESSION_ID="relay-agent",
    )

    async def scenario() -> None:
        async with AsyncExitStack() as stack:
            me = await start(stack, env)
            assert {"relay_agents", "relay_send", "relay_get", "relay_cancel"} <= set(
                await me.tools()
            )
            listed = await me.one("relay_agents")
            assert listed["me"] == "local/codex"
            assert listed["agents"] == [
                {
                    "agent": RECEIVER,
                    "capabilities": [{"id": CAPS[0], "description": "inspect an incident"}],
                }
            ]

            waited = await me.one("relay_send", agent=RECEIVER, message="echo hi", mode="wait")
            assert waited["receipt"] == "answered"
            assert waited["task"]["status"]["state"] == "TASK_STATE_COMPLETED"
            assert "echo: hi" in json.dumps(waited["task"]["artifacts"])

            queued = await me.one("relay_send", agent=RECEIVER, message="hold on")
            assert queued["receipt"] == "queued"
            assert queued["task"]["id"] == queued["message_id"]
            tid = queued["task"]["id"]
            for _ in range(200):  # until the receiver holds it
                got = await me.one("relay_get", agent=RECEIVER, task=tid)
                if got["task"]["status"]["state"] == "TASK_STATE_WORKING":
                    break
                await asyncio.sleep(0.05)
            cancelled = await me.one("relay_cancel", agent=RECEIVER, task=tid)
            assert cancelled["task"]["status"]["state"] == "TASK_STATE_CANCELED"

            streamed = await me.one(
                "relay_send", agent=RECEIVER, message="steps 2", mode="stream", capability=CAPS[0]
            )
            assert streamed["receipt"] == "answered"
            assert streamed["events"][0].startswith("task ")
            assert any("chunk-1" in e for e in streamed["events"])
            assert streamed["events"][-1].startswith("completed")

            # Refusals are the relay's, as receipts: no grant reads like no agent.
            for agent in (OTHER, "private/nobody"):
                no = await me.error("relay_send", agent=agent, message="echo x")
                assert no["receipt"] == "refused"
                assert no["rule"] == "grant"
                assert "no such capability is available to you" in no["reason"]
            unknown = await me.error("relay_get", agent=RECEIVER, task="t-nope")
            assert unknown["rule"] == "unknown-task"
            assert (await me.error("relay_send", agent=RECEIVER))["code"] == "bad-args"

    asyncio.run(scenario())


def test_the_hop_chain_crosses_to_the_relay_and_is_bounded_there(
    relay: Any, runtime_dir: Path, tmp_path: Path
) -> None:
    server, world, _ = relay
    env = base_env(runtime_dir, tmp_path / "config")
    agent = {
        **env,
        "MELLAN_TOKEN": world.tokens["caller"],
        "MELLAN_RELAY": server.url,
        "CLAUDE_CODE_SESSION_ID": "relay-hops",
    }

    async def scenario() -> None:
        async with AsyncExitStack() as stack:
            peer = await start(stack, env)
            me = await start(stack, agent)
            await asyncio.to_thread(hook, agent, "UserPromptSubmit", {"prompt": "work"})
            # A peer writes in answer to something at hop 1 of chain c0: its note is hop 2.
            said = json.dumps({"chain": "c0", "hop": 1, "path": ["alice"]})
            told = await peer.one("tell", who=me.id, message="ask ops", chain=said)
            assert told["hop"] == 2
            await asyncio.to_thread(hook, agent, "PostToolUse", {"tool_name": "Read"})

            mirrored = await me.one("relay_send", agent=RECEIVER, message="mirror", mode="wait")
            meta = mirrored["task"]["metadata"][HOPS_URI]
            assert meta["chain"] == "c0"
            assert meta["hop"] == 3
            assert meta["path"][-1] == "local/codex"
            assert peer.id in meta["path"]

            # The same chain, two hops further on, is past the budget: refused here.
            far = json.dumps({"chain": "c1", "hop": 3, "path": ["alice", "x"]})
            await peer.one("tell", who=me.id, message="and again", chain=far)
            await asyncio.to_thread(hook, agent, "PostToolUse", {"tool_name": "Read"})
            refused = await me.error("relay_send", agent=RECEIVER, message="echo loop")
            assert refused["rule"] == "hop-limit"
            assert "hop 5" in refused["reason"]
            # So is a local tell on it: one budget for every transport.
            local = await me.error("tell", who=peer.id, message="loop?")
            assert local["rule"] == "hop-limit"

    asyncio.run(scenario())


def test_a_named_credential_that_is_not_there_stops_the_bridge(
    runtime_dir: Path, tmp_path: Path
) -> None:
    env = base_env(runtime_dir, tmp_path / "config")
    proc = subprocess.run(
        [sys.executable, "-m", "melchior.cli", "mcp", "--as", "local/nobody"],
        env=env,
        capture_output=True,
        timeout=60,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 2
    assert b"no stored credential for agent 'local/nobody'" in proc.stderr


def test_the_relay_caller_is_one_more_delivery(relay: Any) -> None:
    from melchior.envelope import Message
    from melchior.integrations.relay_caller import Credential, RelayCaller

    server, world, _ = relay

    async def scenario() -> None:
        caller = RelayCaller(Credential(server.url, world.tokens["caller"], None))
        try:
            sent = await caller.deliver(Message("local/codex", RECEIVER, "echo via the seam"))
            assert sent.kind == "queued"
            assert sent.message_id == (sent.detail or {})["task"]
            no = await caller.deliver(Message("local/codex", OTHER, "echo x"))
            assert no.refused
            assert no.decision is not None
            assert no.decision.rule == "grant"
        finally:
            await caller.close()

    asyncio.run(scenario())
