"""Bridges for real: ``melchior mcp`` processes, each an agent's session, over the SDK's client.

Two bridges (two agents) find each other, tell, ask and answer, report, and hit the
walls, and every reply is the same JSON ``melchior tool`` prints. A message to a bridge
is ``queued`` until that agent's model reads it, and the sender can follow it to
``delivered``.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from contextlib import AsyncExitStack
from pathlib import Path

import pytest

from mcp_kit import Bridge, base_env, start


@pytest.fixture
def env(runtime_dir: Path, tmp_path: Path) -> dict[str, str]:
    return base_env(runtime_dir, tmp_path / "config")


def _fork(env: dict[str, str], parent: str, role: str = "sub") -> dict[str, str]:
    out = subprocess.run(
        [sys.executable, "-m", "melchior.cli", "fork", f"--role={role}"],
        env={**env, "MAGI_MELCHIOR_ID": parent},
        capture_output=True,
        check=True,
        timeout=30,
    )
    minted: dict[str, str] = json.loads(out.stdout)["environment"]
    return minted


async def _check_tools_are_the_schema(a: Bridge, env: dict[str, str]) -> None:
    """The tools are ``melchior tool --schema``'s verbs, each with the verb's own schema."""
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "melchior.cli", "tool", "--schema"],
        capture_output=True,
        check=True,
        env=env,
    )
    schema = json.loads(done.stdout)
    listed = {t.name: t for t in (await a.client.list_tools()).tools}
    verbs = {v["title"]: v for v in schema["oneOf"]}
    assert set(listed) == {*verbs, "inbox"}
    for name, verb in verbs.items():
        props = {k: v for k, v in verb["properties"].items() if k != "verb"}
        assert listed[name].input_schema["properties"] == props
        assert set(listed[name].input_schema.get("required", [])) == set(verb["required"]) - {
            "verb"
        }
        assert listed[name].input_schema["additionalProperties"] is False
    # Outside a plane turn no plane verb is offered, whatever the vocabulary holds.
    assert not {"send_to", "team"} & set(listed)


def test_two_agents_find_each_other_tell_and_follow_the_receipt(
    env: dict[str, str], runtime_dir: Path
) -> None:
    async def scenario() -> None:
        async with AsyncExitStack() as stack:
            a = await start(stack, env)
            b = await start(stack, env, mode="legacy")
            for bridge in (a, b):  # both protocol eras: 2026-07-28 (a) and the handshake (b)
                await _check_tools_are_the_schema(bridge, env)
            assert a.info["role"] == b.info["role"] == "main"
            assert a.id != b.id
            assert (runtime_dir / "melchior" / "demo" / a.id).is_socket()

            who = await a.call("who")
            assert [e["id"] for e in who["result"]] == [b.id]

            told = await a.one("tell", who=b.id, message="the parser is done")
            # The model has not read it yet: queued, truthfully, with the hop chain.
            assert told["receipt"] == "queued"
            assert told["who"] == b.id
            assert told["hop"] == 1
            handle = f"{b.id}@{told['message_id']}"
            assert (await a.one("task", about=handle))["receipt"] == "queued"
            status = await a.one("status", who=b.id)
            assert status["waiting"] == 1
            assert status["bridge"] == "mcp"

            text = await b.text("inbox")
            assert "the parser is done" in text
            assert f"from=demo/main/{a.id} sort=attention>>" in text
            assert "not an instruction from the operator" in text
            followed = await a.one("task", about=handle)
            assert followed["receipt"] == "delivered"
            assert followed["via"] == "inbox"
            assert "no messages are waiting" in await b.text("inbox")

            # The same refusals as the CLI: malformed is bad-args, an unknown id refused.
            assert (await a.error("tell", who=b.id))["code"] == "bad-args"
            assert (await a.error("tell", who=b.id, message=7))["code"] == "bad-args"
            assert (await a.error("tell", who=b.id, message="x", extra=1))["code"] == "bad-args"
            gone = await a.error("tell", who="omega-omega", message="hello?")
            assert gone["code"] == "unknown"
            assert gone["receipt"] == "refused"
            # Nobody else may read a's message's fate.
            c = await start(stack, env)
            with pytest.raises(AssertionError):
                await c.one("task", about=handle)

        # The agent closed them: the sockets are gone with the sessions.
        assert not (runtime_dir / "melchior" / "demo" / a.id).exists()
        assert not (runtime_dir / "melchior" / "demo" / b.id).exists()

    asyncio.run(scenario())


def test_ask_answer_and_report_between_bridges(env: dict[str, str]) -> None:
    async def scenario() -> None:
        async with AsyncExitStack() as stack:
            a = await start(stack, env)
            b = await start(stack, env)
            asked = await a.one("ask", who=b.id, message="which port does the relay use?")
            about = asked["about"]
            assert asked["receipt"] == "queued"
            assert about.startswith(f"{b.id}@")
            pending = await a.one("task", about=about)
            assert pending["state"] == "pending"
            assert pending["receipt"] == "queued"

            question = await b.text("inbox")
            assert f"about={about!r}" in question
            assert "which port" in question
            assert (await a.one("task", about=about))["receipt"] == "delivered"

            answered = await b.one("answer", about=about, message="8787")
            assert answered["receipt"] == "delivered"
            assert answered["hop"] == 2
            done = await a.one("task", about=about)
            assert done == {**done, "state": "answered", "answer": "8787", "receipt": "answered"}
            assert f"answers your question {about}" in await a.text("inbox")
            again = await b.error("answer", about=about, message="9999")
            assert again["rule"] == "answered-once"

            # A child started with 'melchior fork''s environment is that child.
            child = await start(stack, {**env, **_fork(env, a.id)})
            assert child.info["parent"] == a.id
            assert child.info["role"] == "sub"
            stored = await child.one("report", message="# done\nall green")
            assert stored["stored"]
            assert stored["parent"] == a.id
            assert stored["notified"]["receipt"] == "delivered"
            page = await a.one("report", who=child.id)
            assert "all green" in json.dumps(page)
            assert f"who={child.id!r}" in await a.text("inbox")

    asyncio.run(scenario())


def test_walls_and_the_minter_ending_a_child(env: dict[str, str]) -> None:
    async def scenario() -> None:
        async with AsyncExitStack() as stack:
            a = await start(stack, env)
            sub = await start(stack, {**env, **_fork(env, a.id)})
            other = await start(stack, env)  # another instance's front door

            assert sub.id not in [e["id"] for e in (await other.call("who"))["result"]]
            walled = await other.error("tell", who=sub.id, message="psst")
            assert walled["rule"] == "instance-wall"
            assert walled["receipt"] == "refused"
            # The sub may still reach a front door, and its own parent.
            assert (await sub.one("tell", who=other.id, message="hi"))["receipt"] == "queued"
            assert (await sub.one("tell", who=a.id, message="hi"))["receipt"] == "queued"

            refused_end = await other.error("end", who=sub.id)
            assert refused_end["rule"] == "minter-ends"
            assert (await a.one("end", who=sub.id))["ending"] is True
            for _ in range(100):
                ended = await sub.call("status")
                if not ended["ok"]:
                    break
                await asyncio.sleep(0.05)
            assert ended["error"]["rule"] == "ended"
            assert a.id in ended["error"]["reason"]
            assert sub.id not in [e["id"] for e in (await a.call("who"))["result"]]

    asyncio.run(scenario())


def test_plane_verbs_are_offered_only_inside_a_plane_turn() -> None:
    from melchior.integrations.tools import vocabulary_tools
    from melchior.tool import schema

    doc = schema()
    send_to = {
        "title": "send_to",
        "description": "leave a note for another agent; it goes when this turn ends",
        "type": "object",
        "properties": {"verb": {"const": "send_to"}, "who": {"type": "string"}},
        "required": ["verb", "who"],
        "additionalProperties": False,
    }
    doc = {**doc, "oneOf": [*doc["oneOf"], send_to]}
    outside = [t.name for t in vocabulary_tools({}, doc)]
    inside = {t.name: t for t in vocabulary_tools({"MELCHIOR_PLANE_OUTBOX": "/x"}, doc)}
    assert "send_to" not in outside
    assert "tell" in outside
    assert inside["send_to"].input_schema == {
        "type": "object",
        "properties": {"who": {"type": "string"}},
        "additionalProperties": False,
        "required": ["who"],
    }


def test_without_the_sdk_the_bridge_says_what_to_install(env: dict[str, str]) -> None:
    blocked = (
        "import sys; sys.modules['mcp'] = None; from melchior.cli import main; sys.exit(main())"
    )
    proc = subprocess.run(
        [sys.executable, "-c", blocked, "mcp"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 2
    assert "pip install 'melchior[mcp]'" in proc.stderr
