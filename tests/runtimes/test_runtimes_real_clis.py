"""The adapters against the real Claude Code, Codex and pi CLIs, oldest and newest.

The releases are those pinned in scripts/cli-pins (``make clis`` installs each; on CI a
missing one fails the test, elsewhere it skips). The newest releases' help texts must
list every flag and choice the adapters pass; one turn of each adapter, on the oldest
supported and the newest release, runs end to end against a loopback stand-in for the
model API (tests/model_kit.py): a new session, then a resume of it that must carry the
history. The release just below Claude Code's range is refused at start-up with the
one line, and is shown to really lack the flag that sets the floor. pi's cancellation
stops its process tree mid-call.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from clis_kit import need, pinned
from melchior.runtimes import Turn, TurnResult, claude_code, codex, pi, runtime_for
from melchior.runtimes.claude_code import PERMISSION_MODES
from melchior.runtimes.codex import SANDBOXES
from melchior.runtimes.process import group_alive
from melchior.runtimes.versions import Version, VersionRefused
from model_kit import USAGE_IN, USAGE_OUT, ModelServer, serving
from runtimes_kit import Sink, run, wait_for

SUPPORTS = {"claude-code": claude_code.SUPPORT, "codex": codex.SUPPORT, "pi": pi.SUPPORT}
ROLES = ("oldest", "newest")


def _out(*argv: str, home: Path) -> str:
    env = {**os.environ, "HOME": str(home), "CODEX_HOME": str(home / ".codex")}
    (home / ".codex").mkdir(parents=True, exist_ok=True)
    r = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env, check=False)
    assert r.returncode == 0, r.stderr
    return " ".join((r.stdout + r.stderr).split())  # help text is wrapped to the terminal width


@pytest.fixture(scope="module")
def model_api() -> Iterator[ModelServer]:
    """One loopback model for the module: it echoes how many user messages it saw."""
    with serving() as server:
        yield server


def test_the_pins_are_the_adapters_ranges() -> None:
    for adapter, support in SUPPORTS.items():
        assert Version(pinned(adapter, "oldest")) == support.oldest, adapter
        assert Version(pinned(adapter, "newest")) >= support.oldest, adapter
    assert Version(pinned("claude-code", "refused")) < claude_code.SUPPORT.oldest


# -- help texts: every flag and choice we pass -------------------------------------------------


def test_claude_help_lists_every_flag_we_pass(tmp_path: Path) -> None:
    claude = need("claude-code")
    assert _out(claude, "--version", home=tmp_path) == f"{pinned('claude-code')} (Claude Code)"
    text = _out(claude, "--help", home=tmp_path)
    for flag in (
        "--print", "--output-format", "stream-json", "--verbose", "--permission-mode",
        "--permission-prompts", "--session-id", "--resume", "--max-budget-usd", "--model",
        "--append-system-prompt", "--settings", "--mcp-config", "--strict-mcp-config",
        "--allowedTools", "--disallowedTools", "--add-dir",
    ):  # fmt: skip
        assert flag in text, f"claude {pinned('claude-code')} has no {flag}"
    for mode in PERMISSION_MODES:
        assert f'"{mode}"' in text
    assert '"none"' in text  # --permission-prompts none


def test_codex_help_lists_every_flag_we_pass(tmp_path: Path) -> None:
    codex_cli = need("codex")
    assert "codex-cli" in _out(codex_cli, "--version", home=tmp_path)
    text = _out(codex_cli, "exec", "--help", home=tmp_path)
    for flag in (
        "--json", "--cd", "--sandbox", "--skip-git-repo-check",
        "--dangerously-bypass-approvals-and-sandbox", "--model", "--profile", "--config",
        "--add-dir", "if `-` is used), instructions are read from stdin",
    ):  # fmt: skip
        assert flag in text
    for sandbox in SANDBOXES:
        assert sandbox in text
    resume = _out(codex_cli, "exec", "resume", "--help", home=tmp_path)
    assert "[SESSION_ID] [PROMPT]" in resume
    assert "If `-` is used, read from stdin" in resume
    # why -C and -s go before `resume`: the subcommand does not take them
    assert "--cd" not in resume
    assert "--sandbox" not in resume


@pytest.mark.parametrize("role", ROLES)
def test_pi_help_lists_every_flag_we_pass(tmp_path: Path, role: str) -> None:
    # pi before 0.73 takes an unknown flag without a word, so the oldest is read too
    pi_cli = need("pi", role)
    assert _out(pi_cli, "--version", home=tmp_path) == pinned("pi", role)
    text = _out(pi_cli, "--help", home=tmp_path)
    always = ["--print", "--mode", "json", "--session", "--offline", "--provider", "--model",
              "--thinking", "--tools", "--no-extensions", "--extension",
              "--append-system-prompt"]  # fmt: skip
    for flag in always:
        assert flag in text, f"pi {pinned('pi', role)} has no {flag}"
    for level in pi.THINKING:
        assert level in text
    for since in pi.SUPPORT.since:  # the newer flags exactly where the range says
        assert (since.flag in text) == (Version(pinned("pi", role)) >= since.version), since


# -- one real turn and its resume, oldest and newest ------------------------------------------


def _twice(rt: Any, a: Path, b: Path, env: dict[str, str]) -> tuple[TurnResult, TurnResult]:
    first = run(rt.run(Turn("-- a prompt that looks like a flag", a, env=env), Sink()))
    assert first.state == "completed", first
    second = run(rt.run(Turn("again", b, session=first.session, env=env), Sink()))
    assert second.state == "completed", second
    assert second.session == first.session
    assert second.path == "resumed"
    return first, second


def _seen(result: TurnResult) -> int:
    """How many user messages the model saw (what the loopback model answers)."""
    prefix, _, rest = result.text.partition("MOCK reply after ")
    assert not prefix, result.text
    return int(rest.split()[0])


def _dirs(tmp_path: Path) -> tuple[Path, Path]:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    return a, b


@pytest.mark.parametrize("role", ROLES)
def test_a_real_claude_turn_and_its_resume(
    tmp_path: Path, model_api: ModelServer, role: str
) -> None:
    claude = need("claude-code", role)
    env = {
        "HOME": str(tmp_path / "home"),
        "ANTHROPIC_BASE_URL": model_api.url,
        "ANTHROPIC_API_KEY": "sk-test-not-a-key",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }
    rt = runtime_for("claude-code", {"binary": claude, "max_turns": 3, "max_budget_usd": 1.0,
                                     "allowed_tools": ["Read"], "timeout": 120})  # fmt: skip
    assert rt.preflight() == f"Claude Code {pinned('claude-code', role)} at {claude}"  # type: ignore[attr-defined]
    first, second = _twice(rt, *_dirs(tmp_path), env)
    assert first.text == "MOCK reply after 1 user message(s)"
    assert first.usage.get("cost_usd") is not None
    assert second.text == "MOCK reply after 2 user message(s)"  # the history came along


@pytest.mark.parametrize("role", ROLES)
def test_a_real_codex_turn_and_its_resume(
    tmp_path: Path, model_api: ModelServer, role: str
) -> None:
    codex_cli = need("codex", role)
    home = tmp_path / "codex-home"
    home.mkdir()
    (home / "config.toml").write_text(
        'model = "mock-model"\nmodel_provider = "mock"\n'
        f'[model_providers.mock]\nname = "mock"\nbase_url = "{model_api.url}/v1"\n'
        'wire_api = "responses"\nenv_key = "MOCK_KEY"\n'
    )
    env = {"HOME": str(tmp_path), "CODEX_HOME": str(home), "MOCK_KEY": "x"}
    rt = runtime_for("codex", {"binary": codex_cli, "timeout": 120})
    first, second = _twice(rt, *_dirs(tmp_path), env)
    assert _seen(first) >= 1  # Codex sends its environment as a user message of its own
    assert first.usage["input_tokens"] == USAGE_IN
    assert _seen(second) > _seen(first)  # the history came along


def _pi_env(tmp_path: Path, model_api: ModelServer) -> dict[str, str]:
    agent = tmp_path / "pi-agent"
    agent.mkdir()
    (agent / "models.json").write_text(json.dumps(model_api.pi_models(cost=(3.0, 15.0))))
    return {"HOME": str(tmp_path), "PI_CODING_AGENT_DIR": str(agent), "MOCK_KEY": "x"}


@pytest.mark.parametrize("role", ROLES)
def test_a_real_pi_turn_and_its_resume(tmp_path: Path, model_api: ModelServer, role: str) -> None:
    pi_cli = need("pi", role)
    env = _pi_env(tmp_path, model_api)
    rt = runtime_for("pi", {"binary": pi_cli, "provider": "mock", "model": "mock-model",
                            "timeout": 120})  # fmt: skip
    first, second = _twice(rt, *_dirs(tmp_path), env)
    assert first.text == "MOCK reply after 1 user message(s)"
    assert first.usage["input_tokens"] == USAGE_IN
    assert first.usage["output_tokens"] == USAGE_OUT
    assert first.usage["cost_usd"] == pytest.approx((USAGE_IN * 3.0 + USAGE_OUT * 15.0) / 1e6)
    assert first.session is not None
    assert (tmp_path / "pi-agent" / "sessions" / "melchior" / f"{first.session}.jsonl").is_file()
    assert second.text == "MOCK reply after 2 user message(s)"


def test_cancelling_a_real_pi_turn_stops_its_process_tree(tmp_path: Path) -> None:
    pi_cli = need("pi")

    with serving(lambda body, n: {"hang": True}) as model:
        env = _pi_env(tmp_path, model)

        async def main() -> int:
            sink = Sink()
            rt = runtime_for("pi", {"binary": pi_cli, "provider": "mock", "model": "mock-model",
                                    "grace": 5})  # fmt: skip
            task = asyncio.ensure_future(rt.run(Turn("wait for me", tmp_path, env=env), sink))
            await wait_for(model.arrived.is_set, timeout=120)  # pi is mid-call
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            return sink.pid()

        pgid = run(main())
    assert not group_alive(pgid)


# -- a release below the range ----------------------------------------------------------------


def test_a_release_below_the_range_is_refused_and_really_lacks_the_flag(tmp_path: Path) -> None:
    old = need("claude-code", "refused")
    release, oldest = pinned("claude-code", "refused"), claude_code.SUPPORT.oldest
    line = f"claude-code needs Claude Code >= {oldest} (found {release} at {old})"
    rt = runtime_for("claude-code", {"binary": old})
    with pytest.raises(VersionRefused) as refused:
        rt.preflight()  # type: ignore[attr-defined]
    assert str(refused.value) == line
    turn = run(rt.run(Turn("hi", tmp_path, env={"HOME": str(tmp_path)}), Sink()))
    assert turn.state == "failed"
    assert turn.error == line
    # and the floor is real: the command line the adapter builds is what this release refuses
    argv = claude_code.build_argv(old, claude_code.ClaudeCodeOptions.parse({}), None, "x")
    done = subprocess.run(
        argv, input="hi", capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "HOME": str(tmp_path)},
    )  # fmt: skip
    assert done.returncode != 0
    assert "unknown option '--permission-prompts'" in done.stderr
