"""The flags the adapters use, checked against the real Claude Code and Codex CLIs.

Skipped (with the reason) when a real CLI is not on PATH, so CI stays green without
them; with them (``npm i @anthropic-ai/claude-code @openai/codex`` and their ``.bin``
on PATH), the help texts must list every flag and choice we pass, and one turn of
each adapter runs end to end against the real binary, with a loopback stand-in for
the model API (the same way the reference facts were gathered): a new session, then
a resume of it from another directory.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from melchior.runtimes import Turn, runtime_for
from melchior.runtimes.claude_code import PERMISSION_MODES
from melchior.runtimes.codex import SANDBOXES
from runtimes_kit import STAND_INS, Sink, run


def _real(name: str) -> str | None:
    """``name`` on PATH, never our stand-in."""
    path = os.pathsep.join(
        p for p in os.environ.get("PATH", "").split(os.pathsep) if Path(p) != STAND_INS
    )
    found = shutil.which(name, path=path)
    if found is None:
        return None
    head = Path(found).read_bytes()[:200]
    return None if b"stand-in" in head else found


CLAUDE = _real("claude")
CODEX = _real("codex")
needs_claude = pytest.mark.skipif(CLAUDE is None, reason="the real claude CLI is not on PATH")
needs_codex = pytest.mark.skipif(CODEX is None, reason="the real codex CLI is not on PATH")


def _out(*argv: str, home: Path) -> str:
    env = {**os.environ, "HOME": str(home), "CODEX_HOME": str(home / ".codex")}
    (home / ".codex").mkdir(parents=True, exist_ok=True)
    r = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    return " ".join(r.stdout.split())  # help text is wrapped to the terminal width


@needs_claude
def test_claude_help_lists_every_flag_we_pass(tmp_path: Path) -> None:
    assert CLAUDE is not None
    version = _out(CLAUDE, "--version", home=tmp_path)
    assert "Claude Code" in version
    text = _out(CLAUDE, "--help", home=tmp_path)
    for flag in (
        "--print", "--output-format", "stream-json", "--verbose", "--permission-mode",
        "--permission-prompts", "--session-id", "--resume", "--max-budget-usd", "--model",
        "--append-system-prompt", "--settings", "--mcp-config", "--strict-mcp-config",
        "--allowedTools", "--disallowedTools", "--add-dir",
    ):  # fmt: skip
        assert flag in text, f"claude {version.strip()} has no {flag}"
    for mode in PERMISSION_MODES:
        assert f'"{mode}"' in text
    assert '"none"' in text  # --permission-prompts none


@needs_codex
def test_codex_help_lists_every_flag_we_pass(tmp_path: Path) -> None:
    assert CODEX is not None
    assert "codex-cli" in _out(CODEX, "--version", home=tmp_path)
    text = _out(CODEX, "exec", "--help", home=tmp_path)
    for flag in (
        "--json", "--cd", "--sandbox", "--skip-git-repo-check",
        "--dangerously-bypass-approvals-and-sandbox", "--model", "--profile", "--config",
        "--add-dir", "if `-` is used), instructions are read from stdin",
    ):  # fmt: skip
        assert flag in text
    for sandbox in SANDBOXES:
        assert sandbox in text
    resume = _out(CODEX, "exec", "resume", "--help", home=tmp_path)
    assert "[SESSION_ID] [PROMPT]" in resume
    assert "If `-` is used, read from stdin" in resume
    # why -C and -s go before `resume`: the subcommand does not take them
    assert "--cd" not in resume
    assert "--sandbox" not in resume


# -- one real turn each, against a loopback model API ------------------------------------------


class _Model(BaseHTTPRequestHandler):
    """Answers Anthropic Messages (SSE) and OpenAI Responses (SSE) requests with one text
    reply naming how many user turns it saw."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        body = b'{"data":[],"models":[]}'
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

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
        if self.path.startswith("/v1/messages"):
            users = [m for m in body.get("messages", []) if m.get("role") == "user"]
            text = f"MOCK reply after {len(users)} user message(s)"
            usage = {"input_tokens": 10, "output_tokens": 5}
            self._sse([
                ("message_start", {"type": "message_start", "message": {
                    "id": "msg_1", "type": "message", "role": "assistant", "model": "mock",
                    "content": [], "stop_reason": None, "stop_sequence": None, "usage": usage}}),
                ("content_block_start", {"type": "content_block_start", "index": 0,
                                         "content_block": {"type": "text", "text": ""}}),
                ("content_block_delta", {"type": "content_block_delta", "index": 0,
                                         "delta": {"type": "text_delta", "text": text}}),
                ("content_block_stop", {"type": "content_block_stop", "index": 0}),
                ("message_delta", {"type": "message_delta", "usage": {"output_tokens": 5},
                                   "delta": {"stop_reason": "end_turn", "stop_sequence": None}}),
                ("message_stop", {"type": "message_stop"}),
            ])  # fmt: skip
            return
        users = [
            i for i in body.get("input", []) if isinstance(i, dict) and i.get("role") == "user"
        ]
        text = f"MOCK reply after {len(users)} user message(s)"
        item = {
            "type": "message",
            "id": "msg_1",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}],
        }
        self._sse([
            ("response.created", {"type": "response.created", "response": {"id": "resp_1"}}),
            ("response.output_item.done", {"type": "response.output_item.done",
                                           "output_index": 0, "item": item}),
            ("response.completed", {"type": "response.completed", "response": {
                "id": "resp_1", "usage": {"input_tokens": 100, "output_tokens": 7,
                                          "input_tokens_details": {"cached_tokens": 0},
                                          "output_tokens_details": {"reasoning_tokens": 0},
                                          "total_tokens": 107}}}),
        ])  # fmt: skip


@pytest.fixture
def model_api() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Model)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@needs_claude
def test_a_real_claude_turn_and_its_resume(tmp_path: Path, model_api: str) -> None:
    env = {
        "HOME": str(tmp_path / "home"),
        "ANTHROPIC_BASE_URL": model_api,
        "ANTHROPIC_API_KEY": "sk-test-not-a-key",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    rt = runtime_for("claude-code", {"binary": CLAUDE, "max_turns": 3, "max_budget_usd": 1.0,
                                     "allowed_tools": ["Read"], "timeout": 120})  # fmt: skip
    first = run(rt.run(Turn("--looks like a flag, is a prompt", a, env=env), Sink()))
    assert first.state == "completed", first
    assert first.text.startswith("MOCK reply")
    assert first.usage.get("cost_usd") is not None
    second = run(rt.run(Turn("again", b, session=first.session, env=env), Sink()))
    assert second.state == "completed"
    assert second.session == first.session
    assert second.path == "resumed"


@needs_codex
def test_a_real_codex_turn_and_its_resume(tmp_path: Path, model_api: str) -> None:
    home = tmp_path / "codex-home"
    home.mkdir()
    (home / "config.toml").write_text(
        'model = "mock-model"\nmodel_provider = "mock"\n'
        f'[model_providers.mock]\nname = "mock"\nbase_url = "{model_api}/v1"\n'
        'wire_api = "responses"\nenv_key = "MOCK_KEY"\n'
    )
    env = {"HOME": str(tmp_path), "CODEX_HOME": str(home), "MOCK_KEY": "x"}
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    rt = runtime_for("codex", {"binary": CODEX, "timeout": 120})
    first = run(rt.run(Turn("-- a prompt that looks like a flag", a, env=env), Sink()))
    assert first.state == "completed", first
    assert first.text.startswith("MOCK reply")
    assert first.usage["input_tokens"] == 100
    second = run(rt.run(Turn("again", b, session=first.session, env=env), Sink()))
    assert second.state == "completed", second
    assert second.session == first.session
    assert second.path == "resumed"
