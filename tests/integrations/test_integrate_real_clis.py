"""The real Claude Code, Codex and pi CLIs run melchior from what ``melchior integrate`` wrote.

The CLIs are the releases pinned in scripts/cli-pins (``make clis``; on CI a missing one
fails the test, elsewhere it skips). Each test writes the configuration into a private
home with ``melchior integrate``, then runs real turns against a loopback stand-in for
the model API that plays the model's part (tests/model_kit.py). Claude Code and Codex:
the agent must offer the model the bridge's tools, the model's call must reach the
bridge (whose status shows the turn the agent's hook opened), and a message another
session sends mid-turn must reach the model through the agent's own PostToolUse hook,
fenced as peer data, and from then on the agent's PreToolUse hook must refuse a call not
known to be harmless, with the reason, and let a harmless one run. pi: in a plane with a
command agent, the extension's ``send_to`` (built from the roster) leaves a note that the
plane delivers, and the answer comes back to pi as a turn of its own.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from clis_kit import need
from melchior.runtimes import Turn, runtime_for
from melchior.tool import VOCABULARY
from model_kit import Step, serving
from plane_kit import AGENT, load_plane, log, running, settle
from plane_kit import turns as plane_turns
from runtimes_kit import Sink
from runtimes_kit import run as run_turn

TOOLS = sorted([*(v.name for v in VOCABULARY), "inbox"])
PEER_TEXT = "PEER-HELLO please check INC-42"


def tell(env: dict[str, str], who: str, project: str) -> dict[str, Any]:
    """Another session (here the operator's anonymous script) writes to the agent."""
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "melchior.cli",
            "tool",
            "--verb=tell",
            f"--who={who}",
            f"--message={PEER_TEXT}",
        ],
        env={**env, "MAGI_MELCHIOR_PROJECT": project},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    reply: dict[str, Any] = json.loads(out.stdout)
    return reply


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(c.get("text", "") for c in content if isinstance(c, dict))


def _result(body: dict[str, Any], tool_use_id: str) -> dict[str, Any]:
    """The tool result for ``tool_use_id`` in an Anthropic request's messages."""
    for message in body["messages"]:
        for part in message["content"] if isinstance(message["content"], list) else []:
            if isinstance(part, dict) and part.get("tool_use_id") == tool_use_id:
                return part
    raise AssertionError(f"no result for {tool_use_id} in {json.dumps(body)[-2000:]}")


def _toml(value: Any) -> str:
    """An inline TOML value (tables, lists, text) for a PLANE.toml written here."""
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {_toml(v)}" for k, v in value.items()) + " }"
    return json.dumps(value)


def _status_from(text: str) -> dict[str, Any]:
    start = text.index('{"ok"')
    first: dict[str, Any] = json.loads(text[start : text.rindex("}") + 1])["result"][0]
    return first


@pytest.fixture
def world(tmp_path: Path, runtime_dir: Path) -> dict[str, Any]:
    home, proj = tmp_path / "home", tmp_path / "proj"
    home.mkdir()
    proj.mkdir()
    subprocess.run(["git", "init", "-q", str(proj)], check=True)
    (proj / "src").mkdir()  # a second workdir inside the project (Codex's harmless call)
    env = {
        "HOME": str(home),
        "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")]),
        "XDG_RUNTIME_DIR": str(runtime_dir),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "LANG": "C.UTF-8",
    }
    return {"home": home, "proj": proj, "env": env}


def _integrate(agent: str, world: dict[str, Any], *extra: str) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "melchior.cli", "integrate", agent, *extra],
        env=world["env"],
        cwd=world["proj"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr


def test_claude_code_starts_the_bridge_and_its_hooks_reach_the_model(world: dict[str, Any]) -> None:
    claude = need("claude-code")
    env = {**world["env"], "PATH": f"{Path(claude).parent}:{world['env']['PATH']}"}
    world = {**world, "env": env}
    _integrate("claude-code", world)
    config = Path(env["XDG_CONFIG_HOME"]) / "melchior" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text("[melchior.mcp]\ntaint_calls = 1\n")
    listed = subprocess.run(
        [claude, "mcp", "list"],
        env=env,
        cwd=world["proj"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert "melchior:" in listed.stdout, listed.stdout
    assert "Connected" in listed.stdout, listed.stdout
    told: dict[str, Any] = {}
    state = {"waits": 0}

    def script(body: dict[str, Any], at: int) -> Step:
        waiting = at == state["waits"] + 1 and "mcp__melchior__" not in json.dumps(body)
        if waiting and state["waits"] < 20:  # a loaded machine: the bridge may connect late
            state["waits"] += 1
            return {"tool": "Bash", "input": {"command": "echo wait"}, "id": f"w{at}"}
        n = at - state["waits"]
        if n == 1:
            return {"tool": "mcp__melchior__status", "input": {}, "id": "toolu_1"}
        if n == 2:
            status = _status_from(_text_of(_result(body, "toolu_1")["content"]))
            told.update(status=status, reply=tell(env, status["id"], status["project"]))
            return {
                "tool": "Bash",
                "input": {"command": "echo hi", "description": "hi"},
                "id": "toolu_2",
            }
        # The peer's words are in the context now: a call not known harmless is asked
        # (and in -p mode refused); a harmless one runs; past the window's limit of
        # one ask, the next is denied and the turn stopped.
        if n == 3:
            return {"tool": "Bash", "input": {"command": "git push origin main"}, "id": "toolu_3"}
        if n == 4:
            return {"tool": "Bash", "input": {"command": "echo after"}, "id": "toolu_4"}
        if n == 5:
            return {"tool": "Bash", "input": {"command": "rm -rf build"}, "id": "toolu_5"}
        return {"text": "done"}

    with serving(script) as model:
        run = subprocess.run(
            [claude, "-p", "check in", "--output-format", "stream-json", "--verbose",
             "--allowedTools", "mcp__melchior__status", "Bash(echo *)"],
            env={**env, "ANTHROPIC_BASE_URL": model.url, "ANTHROPIC_API_KEY": "sk-test-not-a-key",
                 "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"},
            cwd=world["proj"], capture_output=True, text=True, timeout=180, check=False,
        )  # fmt: skip
        assert run.returncode == 0, run.stderr[-2000:]
        requests = model.requests[state["waits"] :]
        first = json.dumps(requests[0])
        for name in TOOLS:  # offered to the model (Claude Code defers MCP tools by name)
            assert f"mcp__melchior__{name}" in first, name
        status = told["status"]
        assert status["bridge"] == "mcp"
        assert status["turn"]["open"] is True
        assert told["reply"]["result"][0]["receipt"] == "queued"
        after_tool = json.dumps(requests[2])
        assert "PostToolUse:Bash hook additional context" in after_tool
        assert PEER_TEXT in after_tool
        assert "<<peer-message " in after_tool
        refused = _result(requests[3], "toolu_3")
        assert refused["is_error"] is True
        assert "git push is not one of git's read-only subcommands" in _text_of(refused["content"])
        assert _text_of(_result(requests[4], "toolu_4")["content"]).strip() == "after"
        assert len(requests) == 5, "the turn did not stop past the window's limit"
        events = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
        denied = [d["tool_input"] for e in events for d in e.get("permission_denials", [])]
        assert {"command": "git push origin main"} in denied
        assert {"command": "rm -rf build"} in denied


def test_codex_starts_the_bridge_and_its_hooks_reach_the_model(world: dict[str, Any]) -> None:
    codex = need("codex")
    codex_home = world["home"] / ".codex"
    codex_home.mkdir()
    env = {**world["env"], "CODEX_HOME": str(codex_home), "MOCK_KEY": "not-a-key"}
    told: dict[str, Any] = {}
    state = {"waits": 0}

    def script(body: dict[str, Any], n: int) -> Step:
        spaces = {t.get("name"): t for t in body.get("tools", []) if t.get("type") == "namespace"}
        last = body["input"][-1]
        if "mcp__melchior" not in spaces and state["waits"] < 20:
            state["waits"] += 1  # Codex starts MCP servers in the background
            return {"tool": "exec_command", "input": {"cmd": "sleep 1"}, "id": f"w{n}"}
        if "tools" not in told:
            told["tools"] = sorted(t["name"] for t in spaces["mcp__melchior"]["tools"])
            return {"tool": "status", "namespace": "mcp__melchior", "input": {}, "id": "s1"}
        if "status" not in told:
            told["status"] = _status_from(last["output"])
            told["reply"] = tell(env, told["status"]["id"], told["status"]["project"])
            return {"tool": "exec_command", "input": {"cmd": "echo hi"}, "id": "e1"}
        told.setdefault("after", json.dumps(body["input"][-3:]))
        # The peer's words are in the context: a call not known harmless is denied (Codex
        # cannot ask), with the reason; a harmless one, in another workdir, runs.
        if "push" not in told:
            told["push"] = True
            return {"tool": "exec_command", "input": {"cmd": "git push origin main"}, "id": "e2"}
        if "refused" not in told:
            told["refused"] = last["output"]
            return {"tool": "exec_command", "input": {"cmd": "echo after", "workdir": "src"},
                    "id": "e3"}  # fmt: skip
        told.setdefault("ran", last["output"])
        return {"text": "done"}

    with serving(script) as model:
        (codex_home / "config.toml").write_text(
            'model = "mock-model"\nmodel_provider = "mock"\n\n'
            f'[model_providers.mock]\nname = "mock"\nbase_url = "{model.url}/v1"\n'
            'wire_api = "responses"\nenv_key = "MOCK_KEY"\n'
        )
        _integrate("codex", {**world, "env": env})
        run = subprocess.run(
            [codex, "exec", "--json", "-s", "workspace-write", "--skip-git-repo-check",
             "--dangerously-bypass-hook-trust", "check in"],
            env=env, cwd=world["proj"], capture_output=True, text=True, timeout=240, check=False,
            stdin=subprocess.DEVNULL,
        )  # fmt: skip
        assert run.returncode == 0, run.stderr[-2000:]
        assert told["tools"] == TOOLS
        assert told["status"]["bridge"] == "mcp"
        assert told["status"]["turn"]["open"] is True
        assert told["reply"]["result"][0]["receipt"] == "queued"
        assert PEER_TEXT in told["after"]
        assert '"role": "developer"' in told["after"]
        assert "Command blocked by PreToolUse hook" in told["refused"], told["refused"]
        assert "git push is not one of git's read-only subcommands" in told["refused"]
        assert "operator's next prompt decides" in told["refused"]
        assert "after" in told["ran"]
        assert "blocked" not in told["ran"]


def _said(message: dict[str, Any]) -> str:
    """The text of one Chat Completions message (a string, or a list of parts)."""
    return _text_of(message.get("content") or "")


@pytest.mark.parametrize("role", ["oldest", "newest"])
def test_a_pi_agent_in_a_plane_writes_a_note_and_its_answer_comes_back(
    world: dict[str, Any], role: str
) -> None:
    pi_cli = need("pi", role)
    agent_dir = world["home"] / ".pi" / "agent"
    env = {**world["env"], "PI_CODING_AGENT_DIR": str(agent_dir), "MOCK_KEY": "not-a-key"}
    _integrate("pi", {**world, "env": env})
    told: dict[str, Any] = {}
    note = "answer: we spent 42 in August"

    def script(body: dict[str, Any], n: int) -> Step:
        last = body["messages"][-1]
        if last["role"] == "tool":  # send_to's receipt, in the same turn
            told["receipt"] = _said(last)
            return {"text": "asked ledger; its answer comes as a turn of its own"}
        if _said(last) == "outside a plane":
            told["outside"] = sorted(t["function"]["name"] for t in body.get("tools", []))
            return {"text": "nothing to send"}
        if "An answer from ledger" in _said(last):  # a turn of its own, woken by the answer
            told["answer"] = _said(last)
            return {"text": "ledger says we spent 42"}
        told["tools"] = {t["function"]["name"]: t["function"] for t in body.get("tools", [])}
        return {"tool": "send_to", "input": {"to": "ledger", "message": note}, "id": "call_1"}

    with serving(script) as model:
        agent_dir.mkdir(parents=True, exist_ok=True)
        (agent_dir / "models.json").write_text(json.dumps(model.pi_models()))
        plane_file = world["proj"] / "PLANE.toml"
        pi_options = {"binary": pi_cli, "provider": "mock", "model": "mock-model",
                      "timeout": 120, "env": env}  # fmt: skip
        ledger = [sys.executable, str(AGENT)]
        plane_file.write_text(
            '[[agents]]\nid = "planner"\ndescription = "plans the work"\n'
            f'talksTo = ["ledger"]\nruntime = "pi"\noptions = {_toml(pi_options)}\n\n'
            '[[agents]]\nid = "ledger"\ndescription = "keeps the books"\n'
            f'runtime = "command"\noptions = {{ argv = {json.dumps(ledger)} }}\n'
        )
        config = load_plane(plane_file)
        alone = runtime_for("pi", pi_options)  # the extension installed, but no plane turn
        assert run_turn(alone.run(Turn("outside a plane", world["proj"]), Sink())).ok

        async def go() -> tuple[list[dict[str, Any]], list[str], int, float]:
            async with running(config) as (plane, watch):
                plane.operator_line("planner", "what did we spend in August? ask ledger")
                await settle(plane, timeout=240)
                done = [e.text for e in watch.of("planner", "done")]
                turns, cost = plane.state.spent("planner")
                return log(plane), done, turns, cost

        entries, done, turns, cost = asyncio.run(go())

    assert "send_to" not in told["outside"]  # the plane's verbs exist only in a plane turn
    assert "team" not in told["outside"]
    assert "read" in told["outside"]
    # the tool was offered as the roster has it: who there is, and whom it may write to
    send_to = told["tools"]["send_to"]
    assert "You may write to: ledger (keeps the books)." in send_to["description"]
    assert "team" in told["tools"]
    assert told["receipt"].startswith("Written to ledger. It goes when this turn ends")
    # the plane delivered the note, fenced as a peer's request, and ledger answered it
    (ledger_turn,) = plane_turns(config, "ledger")
    assert "A message from planner, another agent on this plane" in ledger_turn["prompt"]
    assert f"\n{note}\n" in ledger_turn["prompt"]
    assert "<<peer-message " in ledger_turn["prompt"]
    sent = [e for e in entries if e["kind"] == "note" and e.get("receipt") == "delivered"]
    assert [(e["sender"], e["recipient"], e["text"]) for e in sent] == [("planner", "ledger", note)]
    back = [e for e in entries if e["kind"] == "answer" and e.get("receipt") == "delivered"]
    assert [(e["sender"], e["recipient"]) for e in back] == [("ledger", "planner")]
    # and the answer came back to pi as a turn of its own, fenced
    assert "we spent 42 in August" in told["answer"]
    assert "<<peer-message " in told["answer"]
    assert done[-1] == "ledger says we spent 42"
    assert turns == 2
    assert cost > 0  # pi's own cost, from its events, counts against the ceiling
    assert len(model.requests) == 4
