"""The claude-code runtime against the stand-in CLI (tests/stand_ins/claude): the exact
command line, stream-json into progress, resume, failures, the unattended profile,
cancellation of the whole tree, and the live session's inbox with its fallback."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from melchior.runtimes import Progress, RuntimeConfigError, Turn, TurnResult, runtime_for
from melchior.runtimes.process import group_alive
from runtimes_kit import (
    Sink,
    StandIns,
    install_stand_ins,
    kill_quietly,
    proc_state,
    run,
    wait_for,
)

UNATTENDED = ["--permission-mode", "acceptEdits", "--permission-prompts", "none"]
HEAD = ["-p", "--output-format", "stream-json", "--verbose", *UNATTENDED]


@pytest.fixture
def si(tmp_path: Path) -> StandIns:
    return install_stand_ins(tmp_path / "si")


@pytest.fixture
def work(tmp_path: Path) -> Path:
    d = tmp_path / "work"
    d.mkdir()
    return d


def turn(si: StandIns, cwd: Path, prompt: str, **kw: Any) -> Turn:
    return Turn(prompt, cwd, env={**si.env, **kw.pop("env", {})}, **kw)


def go(t: Turn, **config: Any) -> tuple[TurnResult, Sink]:
    sink = Sink()
    return run(runtime_for("claude-code", config).run(t, sink)), sink


def test_a_new_session_with_the_exact_command_line(si: StandIns, work: Path) -> None:
    result, sink = go(turn(si, work, "hello there"))
    assert result.state == "completed"
    assert result.path == "new"
    assert result.text == "ok: hello there"
    assert result.session is not None
    assert uuid.UUID(result.session)
    (call,) = si.calls("claude")
    assert call["argv"] == [*HEAD, "--session-id", result.session]
    assert call["stdin"] == "hello there"
    assert call["cwd"] == str(work)
    assert result.usage == {"input_tokens": 200, "output_tokens": 14, "cost_usd": 0.00108}
    statuses = sink.kinds("status")
    assert statuses[0].data == {"path": "new", "session": None}
    assert any(p.data and p.data.get("session_id") == result.session for p in statuses)
    assert sink.texts("message") == ["ok: hello there"]
    assert sink.kinds("usage")[0].data == result.usage


def test_resume_binds_the_session_from_another_directory(
    si: StandIns, work: Path, tmp_path: Path
) -> None:
    first, _ = go(turn(si, work, "remember this"))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    second, sink = go(turn(si, elsewhere, "history", session=first.session))
    assert second.state == "completed"
    assert second.path == "resumed"
    assert second.session == first.session
    assert second.text == "turns before this one: 1"
    call = si.calls("claude")[-1]
    assert call["argv"] == [*HEAD, "--resume", first.session]
    assert call["cwd"] == str(elsewhere)
    assert sink.kinds("status")[0].data == {"path": "resumed", "session": first.session}


def test_an_unknown_session_fails_without_retry(si: StandIns, work: Path) -> None:
    missing = str(uuid.uuid4())
    result, _ = go(turn(si, work, "hi", session=missing))
    assert result.state == "failed"
    assert not result.retryable
    assert result.error is not None
    assert f"No conversation found with session ID: {missing}" in (result.error)


def test_route_options_become_flags(si: StandIns, work: Path) -> None:
    config = {
        "model": "opus",
        "max_turns": 7,
        "max_budget_usd": 1.5,
        "append_system_prompt": "Be brief.",
        "allowed_tools": ["Bash(git *)", "Edit"],
        "disallowed_tools": ["WebFetch"],
        "add_dirs": [str(work)],
        "extra_args": ["--fallback-model", "sonnet"],
        "permission_mode": "dontAsk",
        "permission_prompts": None,
    }
    result, _ = go(turn(si, work, "hi", session=None, options={"max_turns": 9}), **config)
    assert result.state == "completed"
    argv = si.calls("claude")[-1]["argv"]
    assert argv == [
        "-p", "--output-format", "stream-json", "--verbose",
        "--permission-mode", "dontAsk",
        "--session-id", result.session,
        "--max-turns", "9",
        "--max-budget-usd", "1.5",
        "--model", "opus",
        "--append-system-prompt", "Be brief.",
        "--fallback-model", "sonnet",
        "--allowedTools", "Bash(git *)", "Edit",
        "--disallowedTools", "WebFetch",
        "--add-dir", str(work),
    ]  # fmt: skip


def test_tool_calls_under_the_unattended_profile(si: StandIns, work: Path) -> None:
    result, sink = go(turn(si, work, "tool"))
    assert result.state == "completed"
    assert result.text == "DONE after tool"
    assert (work / "out.txt").read_text() == "hello\n"  # ran in the turn's directory
    assert "using Bash: Write a file" in sink.texts("status")
    assert sink.texts("message") == ["DONE after tool"]

    denied, sink = go(turn(si, work, "tool"), permission_mode="manual")
    assert denied.state == "completed"
    assert denied.text == "could not run the tool"
    (note,) = [p for p in sink.kinds("status") if p.data and "permission_denials" in p.data]
    assert "permission mode manual" in note.text
    assert "Bash" in note.text

    capped, _ = go(turn(si, work, "tool"), max_turns=1)
    assert capped.state == "failed"
    assert not capped.retryable
    assert capped.error is not None
    assert "Reached maximum number of turns (1)" in capped.error
    assert "max_turns" in capped.error


def test_an_error_result_fails_and_a_crash_may_be_retried(si: StandIns, work: Path) -> None:
    result, _ = go(turn(si, work, "fail"))
    assert result.state == "failed"
    assert not result.retryable
    assert result.error is not None
    assert "api_error" in result.error
    assert "Invalid API key" in result.error
    assert result.session is not None

    crash, _ = go(turn(si, work, "crash"))
    assert crash.state == "failed"
    assert crash.retryable
    assert crash.error is not None
    assert "exited with status 3 without a result" in crash.error
    assert "TypeError: something inside broke" in crash.error


@pytest.mark.skipif(os.getuid() != 0, reason="Claude Code refuses bypassPermissions only as root")
def test_bypass_as_root_is_refused_unless_sandboxed(si: StandIns, work: Path) -> None:
    result, _ = go(turn(si, work, "hi"), permission_mode="bypassPermissions")
    assert result.state == "failed"
    assert not result.retryable
    assert result.error is not None
    assert "cannot be used with root" in result.error
    ok, _ = go(turn(si, work, "hi", env={"IS_SANDBOX": "1"}), permission_mode="bypassPermissions")
    assert ok.state == "completed"


def test_cancel_stops_claude_and_its_children(si: StandIns, work: Path) -> None:
    async def main() -> tuple[int, int]:
        sink = Sink()
        rt = runtime_for("claude-code", {"grace": 2})
        task = asyncio.ensure_future(rt.run(turn(si, work, "child"), sink))
        await wait_for(lambda: any(t.startswith("child ") for t in sink.texts("message")))
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        grandchild = int(next(t for t in sink.texts("message") if t.startswith("child "))[6:])
        return sink.pid(), grandchild

    pgid, grandchild = run(main())
    try:
        assert not group_alive(pgid)
        assert proc_state(grandchild) in (None, "Z")
    finally:
        kill_quietly(grandchild)


def test_sigterm_from_elsewhere_is_a_canceled_turn(si: StandIns, work: Path) -> None:
    async def main() -> TurnResult:
        sink = Sink()

        async def on(p: Progress) -> None:
            if p.kind == "message" and p.text.startswith("sleeping"):
                os.killpg(sink.pid(), signal.SIGTERM)

        sink.on = on
        return await runtime_for("claude-code").run(turn(si, work, "sleep 30"), sink)

    result = run(main())
    assert result.state == "canceled"
    assert result.retryable
    assert "exited with status 143 (SIGTERM) before finishing the turn" in result.text
    assert result.session is not None
    assert f"resuming session {result.session}" in result.text


def test_a_line_over_the_cap(si: StandIns, work: Path) -> None:
    result, _ = go(turn(si, work, "bigline 5000"), line_limit=1024)
    assert result.state == "failed"
    assert result.error is not None
    assert "longer than the limit of 1024 bytes" in result.error


def test_bad_inputs(si: StandIns, work: Path) -> None:
    result, _ = go(turn(si, work, "hi", session="--dangerously-skip-permissions"))
    assert result.state == "failed"
    assert result.error is not None
    assert "flag" in result.error
    assert si.calls() == []
    missing, _ = go(turn(si, work, "hi"), binary="no-such-claude")
    assert missing.error is not None
    assert "no-such-claude was not found" in missing.error
    with pytest.raises(RuntimeConfigError, match="permission_mode must be one of"):
        runtime_for("claude-code", {"permission_mode": "yolo"})
    with pytest.raises(RuntimeConfigError, match="start with '-'"):
        runtime_for("claude-code", {"allowed_tools": ["--dangerously-skip-permissions"]})
    with pytest.raises(RuntimeConfigError, match="unknown option permision_mode"):
        runtime_for("claude-code", {"permision_mode": "plan"})


# -- the live session's inbox --------------------------------------------------------------------


@pytest.fixture
def short_dir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="ib-", dir="/tmp"))  # sun_path holds 108 bytes
    yield d
    shutil.rmtree(d, ignore_errors=True)


async def _inbox(path: Path, got: list[list[dict[str, Any]]]) -> asyncio.Server:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        lines = (await reader.read()).decode().splitlines()
        got.append([json.loads(line) for line in lines])
        writer.close()

    return await asyncio.start_unix_server(handle, path=str(path))


def test_a_live_session_gets_the_prompt_through_its_inbox(
    si: StandIns, work: Path, short_dir: Path
) -> None:
    sock = short_dir / "live.sock"
    got: list[list[dict[str, Any]]] = []

    async def main() -> tuple[TurnResult, Sink]:
        server = await _inbox(sock, got)
        async with server:
            sink = Sink()
            t = turn(si, work, "please look at PR 12", session="live-1",
                     env={"CC_TOKEN": "s3cret"})  # fmt: skip
            rt = runtime_for("claude-code", {"inbox": str(sock), "inbox_token_env": "CC_TOKEN"})
            result = await rt.run(t, sink)
            await wait_for(lambda: bool(got))
            return result, sink

    result, sink = run(main())
    assert result.state == "completed"
    assert result.path == "inbox"
    assert result.session == "live-1"
    assert "Delivered to the live Claude Code session live-1" in result.text
    assert got == [
        [
            {"type": "auth", "token": "s3cret"},
            {"type": "user", "message": {"role": "user", "content": "please look at PR 12"}},
        ]
    ]
    assert si.calls() == []  # no second process on the live session
    assert sink.kinds("status")[-1].data == {"path": "inbox", "session": "live-1"}


def test_an_absent_or_refusing_inbox_falls_back_to_resume(
    si: StandIns, work: Path, short_dir: Path
) -> None:
    first, _ = go(turn(si, work, "start"))
    dead = short_dir / "dead.sock"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(dead))  # bound, never listening: connections are refused
    s.close()
    for n, (path, reason) in enumerate(
        ((short_dir / "absent.sock", "no such file"), (dead, "refused")), start=1
    ):
        result, sink = go(turn(si, work, "history", session=first.session), inbox=str(path))
        assert result.state == "completed"
        assert result.path == "resumed"
        assert result.text == f"turns before this one: {n}"
        note = sink.kinds("status")[0]
        assert f"inbox {path} is unavailable" in note.text
        assert reason in note.text
        assert f"resuming session {first.session}" in note.text
        assert si.calls("claude")[-1]["argv"][-2:] == ["--resume", first.session]


def test_a_missing_inbox_token_is_a_configuration_error(si: StandIns, work: Path) -> None:
    result, _ = go(turn(si, work, "x"), inbox="/nonexistent.sock", inbox_token_env="NOPE_TOKEN")
    assert result.state == "failed"
    assert result.error is not None
    assert "NOPE_TOKEN" in result.error


# -- the stand-in refuses what the real CLI refuses -----------------------------------------------


def _stand_in(
    si: StandIns, cwd: Path, *args: str, stdin: str = "x"
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(si.bin / "claude"), *args], cwd=cwd, env={**os.environ, **si.env},
        input=stdin, capture_output=True, text=True, timeout=30,
    )  # fmt: skip


def test_the_stand_in_refuses_like_the_real_one(si: StandIns, work: Path) -> None:
    r = _stand_in(si, work, "-p", "--output-format", "stream-json")
    assert (r.returncode, r.stderr) == (
        1,
        "Error: When using --print, --output-format=stream-json requires --verbose\n",
    )
    r = _stand_in(si, work, "-p", "--frobnicate")
    assert (r.returncode, r.stderr) == (1, "error: unknown option '--frobnicate'\n")
    r = _stand_in(si, work, "-p", "--permission-mode", "yolo")
    assert r.returncode == 1
    assert "argument 'yolo' is invalid. Allowed choices are" in r.stderr
    r = _stand_in(si, work, "-p", "--session-id", "nope")
    assert r.stderr == "Error: Invalid session ID. Must be a valid UUID.\n"
    sid = str(uuid.uuid4())
    assert _stand_in(si, work, "-p", "--session-id", sid).returncode == 0
    r = _stand_in(si, work, "-p", "--session-id", sid)
    assert (r.returncode, r.stderr) == (1, f"Error: Session ID {sid} is already in use.\n")
    r = _stand_in(si, work, "-p", "--output-format", "stream-json", "--verbose",
                  "--resume", "11111111-2222-4333-8444-555555555555")  # fmt: skip
    assert r.returncode == 1
    assert "No conversation found with session ID" in r.stderr
    assert json.loads(r.stdout)["subtype"] == "error_during_execution"
    r = _stand_in(si, work, "-p", "--allowedTools", "Read", "Edit", "--", "--help me", stdin="")
    assert (r.returncode, r.stdout.strip()) == (0, "ok: --help me")
