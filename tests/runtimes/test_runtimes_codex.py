"""The codex runtime against the stand-in CLI (tests/stand_ins/codex): the exact command
line with exec options before `resume`, the prompt on stdin, JSONL into progress,
resume, failures, the unattended sandbox, and cancellation of the whole tree."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
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
    return run(runtime_for("codex", config).run(t, sink)), sink


def head(cwd: Path, sandbox: str = "workspace-write") -> list[str]:
    return ["exec", "--json", "-C", str(cwd), "-s", sandbox, "--skip-git-repo-check"]


def test_a_new_thread_with_the_exact_command_line(si: StandIns, work: Path) -> None:
    result, sink = go(turn(si, work, "hello there"))
    assert result.state == "completed"
    assert result.path == "new"
    assert result.text == "ok: hello there"
    (call,) = si.calls("codex")
    assert call["argv"] == [*head(work), "-"]
    assert call["stdin"] == "hello there"
    assert call["prompt"] == "hello there"
    assert result.session is not None
    assert result.session.count("-") == 4
    assert result.usage == {"input_tokens": 240, "output_tokens": 18, "cached_input_tokens": 40}
    statuses = sink.texts("status")
    assert statuses[0] == f"starting a new codex thread in {work}"
    assert f"codex thread {result.session}" in statuses
    # the configuration warning is shown, not fatal
    assert any(t.startswith("warning: Model metadata") for t in statuses)
    assert sink.texts("message") == ["ok: hello there"]
    assert sink.kinds("usage")[0].data == result.usage


def test_resume_puts_exec_options_before_the_subcommand(
    si: StandIns, work: Path, tmp_path: Path
) -> None:
    first, _ = go(turn(si, work, "remember this"))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    second, sink = go(turn(si, elsewhere, "history", session=first.session))
    assert second.state == "completed"
    assert second.path == "resumed"
    assert (second.session, second.text) == (first.session, "turns before this one: 1")
    assert si.calls("codex")[-1]["argv"] == [*head(elsewhere), "resume", first.session, "-"]
    assert sink.kinds("status")[0].data == {"path": "resumed", "session": first.session}


def test_an_unknown_thread_fails_without_retry(si: StandIns, work: Path) -> None:
    result, _ = go(turn(si, work, "hi", session="11111111-2222-4333-8444-555555555555"))
    assert result.state == "failed"
    assert not result.retryable
    assert result.error is not None
    assert "no rollout found for thread id" in result.error


def test_route_options_become_flags(si: StandIns, work: Path, tmp_path: Path) -> None:
    extra = tmp_path / "extra"
    config = {
        "sandbox": "read-only",
        "model": "gpt-5.5",
        "profile": "queue",
        "config": {"model_reasoning_effort": '"high"'},
        "add_dirs": [str(extra)],
        "extra_args": ["--ephemeral"],
    }
    result, _ = go(turn(si, work, "hi", options={"model": "o4"}), **config)
    assert result.state == "completed"
    assert si.calls("codex")[-1]["argv"] == [
        *head(work, "read-only"),
        "-m", "o4",
        "-p", "queue",
        "-c", 'model_reasoning_effort="high"',
        "--add-dir", str(extra),
        "--ephemeral",
        "-",
    ]  # fmt: skip
    bypass, _ = go(turn(si, work, "hi"), bypass_sandbox=True, skip_git_repo_check=False)
    assert bypass.state == "failed"
    assert not bypass.retryable
    assert bypass.error is not None
    assert "Not inside a trusted directory" in bypass.error
    argv = si.calls("codex")[-1]["argv"]
    assert argv == ["exec", "--json", "-C", str(work),
                    "--dangerously-bypass-approvals-and-sandbox", "-"]  # fmt: skip


def test_the_sandbox_decides_what_a_command_may_touch(si: StandIns, work: Path) -> None:
    result, sink = go(turn(si, work, "tool"))
    assert result.state == "completed"
    assert result.text == "DONE after tool"
    assert (work / "out.txt").read_text() == "hello\n"
    assert "running: /bin/bash -lc 'echo hello > out.txt && echo wrote'" in sink.texts("status")
    assert any(t.startswith("command finished (exit 0)") for t in sink.texts("status"))

    (work / "out.txt").unlink()
    ro, sink = go(turn(si, work, "tool"), sandbox="read-only")
    assert ro.text == "the sandbox refused the write"
    assert not (work / "out.txt").exists()

    mcp, sink = go(turn(si, work, "mcp"))
    assert mcp.text == "the tool was not allowed"
    assert "calling demo.add" in sink.texts("status")
    assert any("demo.add failed: MCP tool call requires approval" in t for t in sink.texts())


def test_failures(si: StandIns, work: Path) -> None:
    result, _ = go(turn(si, work, "fail"))
    assert result.state == "failed"
    assert not result.retryable
    assert result.error is not None
    assert "codex reported the turn failed: stream disconnected" in result.error
    assert "stderr: Error: the model is overloaded" in result.error

    crash, _ = go(turn(si, work, "crash"))
    assert crash.state == "failed"
    assert crash.retryable
    assert crash.error is not None
    assert "exited with status 3 without completing the turn" in (crash.error)
    assert "panicked" in crash.error

    flaky, sink = go(turn(si, work, "flaky"))
    assert flaky.state == "completed"
    assert flaky.text == "made it after a reconnect"
    assert "codex: Reconnecting... 1/5" in sink.texts("status")


def test_cancel_stops_codex_and_its_children(si: StandIns, work: Path) -> None:
    async def main() -> tuple[int, int]:
        sink = Sink()
        task = asyncio.ensure_future(
            runtime_for("codex", {"grace": 2}).run(turn(si, work, "child"), sink)
        )
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


def test_eof_without_turn_completed_after_sigterm_is_canceled(si: StandIns, work: Path) -> None:
    async def main() -> TurnResult:
        sink = Sink()

        async def on(p: Progress) -> None:
            if p.kind == "message" and p.text.startswith("sleeping"):
                os.killpg(sink.pid(), signal.SIGTERM)

        sink.on = on
        return await runtime_for("codex").run(turn(si, work, "sleep 30"), sink)

    result = run(main())
    assert result.state == "canceled"
    assert result.retryable
    assert result.text.startswith("codex was killed by SIGTERM before the turn completed")
    assert result.session is not None
    assert result.session in result.text


def test_limits_and_bad_inputs(si: StandIns, work: Path) -> None:
    big, _ = go(turn(si, work, "bigline 5000"), line_limit=1024)
    assert big.error is not None
    assert "longer than the limit of 1024 bytes" in big.error
    slow, _ = go(turn(si, work, "sleep 30"), timeout=0.5, grace=2)
    assert slow.state == "failed"
    assert slow.error is not None
    assert "did not finish within 0.5 s" in slow.error
    dash, _ = go(turn(si, work, "hi", session="--last"))
    assert dash.error is not None
    assert "flag" in dash.error
    with pytest.raises(RuntimeConfigError, match="sandbox must be one of"):
        runtime_for("codex", {"sandbox": "yolo"})
    with pytest.raises(RuntimeConfigError, match="bad key"):
        runtime_for("codex", {"config": {"a b": "1"}})
    missing, _ = go(turn(si, work, "hi"), binary="no-such-codex")
    assert missing.error is not None
    assert "no-such-codex was not found" in missing.error


# -- the stand-in refuses what the real CLI refuses -----------------------------------------------


def _stand_in(si: StandIns, cwd: Path, *args: str, stdin: Any = subprocess.DEVNULL) -> Any:
    return subprocess.run(
        [str(si.bin / "codex"), *args], cwd=cwd, env={**os.environ, **si.env},
        stdin=stdin, capture_output=True, text=True, timeout=30,
    )  # fmt: skip


def test_the_stand_in_refuses_like_the_real_one(si: StandIns, work: Path) -> None:
    r = _stand_in(si, work, "exec", "--json", "resume", "x", "-C", str(work), "hi")
    assert r.returncode == 2
    assert r.stderr.startswith("error: unexpected argument '-C' found")
    assert "Usage: codex exec resume [OPTIONS] [SESSION_ID] [PROMPT]" in r.stderr
    r = _stand_in(si, work, "exec", "--full-auto", "hi")
    assert r.returncode == 2
    assert "unexpected argument '--full-auto' found" in r.stderr
    r = _stand_in(si, work, "exec", "-s", "yolo", "hi")
    assert r.returncode == 2
    assert "invalid value 'yolo' for '--sandbox <SANDBOX_MODE>'" in r.stderr
    # a prompt argument plus piped stdin: stdin is appended, the trap DEVNULL avoids
    r = subprocess.run(
        [str(si.bin / "codex"), "exec", "--json", "--skip-git-repo-check", "hello"],
        cwd=work, env={**os.environ, **si.env}, input="surprise",
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert "Reading additional input from stdin" in r.stderr
    assert si.calls("codex")[-1]["prompt"] == "hello\n\n<stdin>\nsurprise\n</stdin>"
    r = _stand_in(si, work, "exec", "--json", "--skip-git-repo-check", "--", "--dash")
    assert r.returncode == 0
    assert si.calls("codex")[-1]["prompt"] == "--dash"
