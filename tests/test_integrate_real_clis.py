"""The real Claude Code and Codex CLIs start the bridge from what ``melchior integrate`` wrote.

Skipped (with the reason) unless the real ``claude`` / ``codex`` are on PATH (``npm i
@anthropic-ai/claude-code @openai/codex`` and put ``node_modules/.bin`` on PATH; they are
not installed on CI). With them, each test writes the configuration into a private
home with ``melchior integrate``, then runs one real turn against a loopback stand-in
for the model API that plays the model's part: the agent must offer the model the
bridge's tools, the model's call must reach the bridge (whose status shows the turn
the agent's hook opened), a message another session sends mid-turn must reach the
model through the agent's own PostToolUse hook, fenced as peer data, and from then on
the agent's PreToolUse hook must refuse a call not known to be harmless, with the
reason, and let a harmless one run.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from melchior.tool import VOCABULARY

CLAUDE = shutil.which("claude")
CODEX = shutil.which("codex")
needs_claude = pytest.mark.skipif(CLAUDE is None, reason="the real claude CLI is not on PATH")
needs_codex = pytest.mark.skipif(CODEX is None, reason="the real codex CLI is not on PATH")
TOOLS = sorted([*(v.name for v in VOCABULARY), "inbox"])
PEER_TEXT = "PEER-HELLO please check INC-42"

Step = dict[str, Any]


class _Model(BaseHTTPRequestHandler):
    """Anthropic Messages and OpenAI Responses, as SSE, with the replies a test scripts."""

    protocol_version = "HTTP/1.1"
    server: ModelServer

    def log_message(self, *args: Any) -> None:
        pass

    def _send(self, status: int, ctype: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("content-type", ctype)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self._send(200, "application/json", b'{"data":[],"models":[]}')

    def _sse(self, events: list[tuple[str, dict[str, Any]]]) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("connection", "close")
        self.end_headers()
        for name, data in events:
            self.wfile.write(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode())
        self.wfile.flush()
        self.close_connection = True

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
        if "count_tokens" in self.path:
            self._send(200, "application/json", b'{"input_tokens":1}')
            return
        main = bool(body.get("tools")) or "input" in body  # side requests have no tools
        step = self.server.next_step(body) if main else {"text": "ok"}
        if self.path.startswith("/v1/messages"):
            self._sse(_anthropic(step))
        else:
            self._sse(_responses(step))


def _anthropic(step: Step) -> list[tuple[str, dict[str, Any]]]:
    usage = {"input_tokens": 10, "output_tokens": 5}
    start = {"type": "message_start", "message": {"id": "msg_1", "type": "message",
             "role": "assistant", "model": "mock", "content": [], "stop_reason": None,
             "stop_sequence": None, "usage": usage}}  # fmt: skip
    if "tool" in step:
        block = {"type": "tool_use", "id": step["id"], "name": step["tool"], "input": {}}
        delta = {"type": "input_json_delta", "partial_json": json.dumps(step["input"])}
        stop = "tool_use"
    else:
        block, delta, stop = (
            {"type": "text", "text": ""},
            {"type": "text_delta", "text": step["text"]},
            "end_turn",
        )
    return [
        ("message_start", start),
        ("content_block_start",
         {"type": "content_block_start", "index": 0, "content_block": block}),
        ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ("message_delta", {"type": "message_delta", "usage": {"output_tokens": 5},
                           "delta": {"stop_reason": stop, "stop_sequence": None}}),
        ("message_stop", {"type": "message_stop"}),
    ]  # fmt: skip


def _responses(step: Step) -> list[tuple[str, dict[str, Any]]]:
    if "tool" in step:
        item: dict[str, Any] = {
            "type": "function_call", "id": f"fc_{step['id']}", "call_id": step["id"],
            "name": step["tool"], "arguments": json.dumps(step["input"]), "status": "completed",
        }  # fmt: skip
        if step.get("namespace"):
            item["namespace"] = step["namespace"]
    else:
        item = {
            "type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": step["text"], "annotations": []}],
        }  # fmt: skip
    usage = {"input_tokens": 100, "output_tokens": 7, "total_tokens": 107,
             "input_tokens_details": {"cached_tokens": 0},
             "output_tokens_details": {"reasoning_tokens": 0}}  # fmt: skip
    return [
        ("response.created", {"type": "response.created", "response": {"id": "resp_1"}}),
        ("response.output_item.done",
         {"type": "response.output_item.done", "output_index": 0, "item": item}),
        ("response.completed",
         {"type": "response.completed", "response": {"id": "resp_1", "usage": usage}}),
    ]  # fmt: skip


class ModelServer(ThreadingHTTPServer):
    """The model's part, played by ``script(body, n)``; every main request is kept."""

    def __init__(self, script: Callable[[dict[str, Any], int], Step]) -> None:
        super().__init__(("127.0.0.1", 0), _Model)
        self.script = script
        self.requests: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    def next_step(self, body: dict[str, Any]) -> Step:
        with self.lock:
            self.requests.append(body)
            return self.script(body, len(self.requests))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


@contextlib.contextmanager
def serving(script: Callable[[dict[str, Any], int], Step]) -> Iterator[ModelServer]:
    server = ModelServer(script)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


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
    (proj / "src").mkdir()
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


@needs_claude
def test_claude_code_starts_the_bridge_and_its_hooks_reach_the_model(world: dict[str, Any]) -> None:
    assert CLAUDE is not None
    env = world["env"]
    _integrate("claude-code", world)
    config = Path(env["XDG_CONFIG_HOME"]) / "melchior" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text("[melchior.mcp]\ntaint_calls = 1\n")
    listed = subprocess.run(
        [CLAUDE, "mcp", "list"],
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
            [CLAUDE, "-p", "check in", "--output-format", "stream-json", "--verbose",
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


@needs_codex
def test_codex_starts_the_bridge_and_its_hooks_reach_the_model(world: dict[str, Any]) -> None:
    assert CODEX is not None
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
            [CODEX, "exec", "--json", "-s", "workspace-write", "--skip-git-repo-check",
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
