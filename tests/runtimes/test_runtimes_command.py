"""The command runtime with real programs: input on stdin and MELCHIOR_TURN_*, the exit-code
contract, failure reasons with the stderr tail, limits, and cancellation of the tree."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from melchior.envelope import Message
from melchior.policy.hops import Chain
from melchior.runtimes import Progress, RuntimeConfigError, Turn, TurnResult, runtime_for
from melchior.runtimes.process import group_alive
from runtimes_kit import Sink, kill_quietly, proc_state, run, wait_for

SHOW = """
import json, os, sys
data = sys.stdin.read()
env = {k: v for k, v in os.environ.items() if k.startswith('MELCHIOR_TURN_')}
print(json.dumps({'stdin': data, 'env': env, 'cwd': os.getcwd(), 'extra': os.environ.get('EXTRA')}))
"""


def command(code: str, **options: Any) -> Any:
    return runtime_for("command", {"argv": [sys.executable, "-c", code], **options})


def go(code: str, turn: Turn, **options: Any) -> tuple[TurnResult, Sink]:
    sink = Sink()
    return run(command(code, **options).run(turn, sink)), sink


def test_prompt_and_envelope_reach_the_program(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MELCHIOR_TURN_ABOUT", "stale, from the receiver's own environment")
    msg = Message(
        "local/codex",
        "private/ops",
        "look at incident 7",
        sort="question",
        chain=Chain("c0ffee", 2, ("alice", "local/codex")),
        message_id="m-1",
        context="ctx-9",
    )
    turn = Turn("fenced: look at incident 7 ψ", tmp_path, message=msg, session="s-1",
                env={"EXTRA": "from the turn"})  # fmt: skip
    result, sink = go(SHOW, turn)
    assert result.state == "completed"
    assert result.path == "command"
    seen = json.loads(result.text)
    assert seen["stdin"] == "fenced: look at incident 7 ψ"
    assert seen["cwd"] == str(tmp_path)
    assert seen["extra"] == "from the turn"
    assert seen["env"] == {
        "MELCHIOR_TURN_PROMPT": "fenced: look at incident 7 ψ",
        "MELCHIOR_TURN_SESSION": "s-1",
        "MELCHIOR_TURN_SENDER": "local/codex",
        "MELCHIOR_TURN_RECIPIENT": "private/ops",
        "MELCHIOR_TURN_SORT": "question",
        "MELCHIOR_TURN_MESSAGE_ID": "m-1",
        "MELCHIOR_TURN_CONTEXT": "ctx-9",
        "MELCHIOR_TURN_CHAIN": json.dumps(
            {"chain": "c0ffee", "hop": 2, "path": ["alice", "local/codex"]}
        ),
    }
    assert result.artifacts == (
        {"artifactId": "stdout", "name": "stdout", "parts": [{"text": result.text}]},
    )
    assert sink.texts("status")[0].startswith("started ")


def test_a_big_prompt_goes_on_stdin_only(tmp_path: Path) -> None:
    prompt = "p" * 100_000
    result, _ = go(SHOW, Turn(prompt, tmp_path))
    seen = json.loads(result.text)
    assert seen["stdin"] == prompt
    assert "MELCHIOR_TURN_PROMPT" not in seen["env"]


def test_no_stdin_when_asked(tmp_path: Path) -> None:
    result, _ = go(SHOW, Turn("hello", tmp_path), prompt_on_stdin=False)
    assert json.loads(result.text)["stdin"] == ""


def test_failure_carries_the_stderr_tail(tmp_path: Path) -> None:
    code = "import sys; print('partial'); sys.stderr.write('x' * 20000 + 'disk full'); sys.exit(1)"
    result, _ = go(code, Turn("hi", tmp_path), stderr_tail=200)
    assert result.state == "failed"
    assert result.retryable
    assert result.error is not None
    assert result.error.startswith(f"{sys.executable} exited with status 1; stderr: ")
    assert result.error.endswith("disk full")
    assert len(result.error) < 400
    assert result.text == "partial"


@pytest.mark.parametrize(
    ("code", "options", "state", "retryable"),
    [
        (3, {}, "input_required", False),
        (4, {}, "failed", False),
        (5, {"retryable": False}, "failed", False),
        (3, {"input_required_exit": None}, "failed", True),
        (9, {"input_required_exit": 9, "permanent_exit": 8}, "input_required", False),
        (8, {"input_required_exit": 9, "permanent_exit": 8}, "failed", False),
        (5, {"reply_exit": 5}, "completed", False),
        (0, {"reply_exit": 5}, "completed", False),
    ],
)
def test_the_exit_code_contract(
    tmp_path: Path, code: int, options: dict[str, Any], state: str, retryable: bool
) -> None:
    result, _ = go(f"import sys; print('which one?'); sys.exit({code})", Turn("x", tmp_path),
                   **options)  # fmt: skip
    assert (result.state, result.retryable) == (state, retryable)
    if state == "input_required":
        assert result.text == "which one?"
    # reply_exit: stdout is a direct reply, a message with no artifact; 0 stays a task's
    assert result.reply == (code == options.get("reply_exit"))
    if result.reply:
        assert (result.text, result.artifacts) == ("which one?", ())
    elif state == "completed":
        assert result.artifacts[0]["parts"] == [{"text": "which one?"}]


def test_cancel_stops_the_command_and_its_children(tmp_path: Path) -> None:
    code = (
        "import subprocess, sys, time\n"
        "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'])\n"
        "print(g.pid, flush=True); time.sleep(300)\n"
    )

    async def main() -> tuple[int, int]:
        sink = Sink()
        rt = command(code, grace=1, progress_lines=True)
        task = asyncio.ensure_future(rt.run(Turn("x", tmp_path), sink))
        await wait_for(lambda: len(sink.items) >= 2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return sink.pid(), int(sink.items[1].text)

    pgid, grandchild = run(main())
    try:
        assert not group_alive(pgid)
        assert proc_state(grandchild) in (None, "Z")
    finally:
        kill_quietly(grandchild)


def test_limits(tmp_path: Path) -> None:
    slow, _ = go("import time; time.sleep(300)", Turn("x", tmp_path), timeout=0.3, grace=1)
    assert slow.state == "failed"
    assert not slow.retryable
    assert slow.error is not None
    assert "did not finish within 0.3 s" in slow.error

    long_line, _ = go("print('z' * 4000)", Turn("x", tmp_path), line_limit=1024)
    assert long_line.error is not None
    assert "longer than the limit of 1024 bytes" in long_line.error

    chatty, _ = go("for i in range(100): print(i)", Turn("x", tmp_path), output_limit=50)
    assert chatty.error is not None
    assert "output was longer than 50 bytes" in chatty.error


def test_progress_lines(tmp_path: Path) -> None:
    _, sink = go("print('one'); print('two')", Turn("x", tmp_path), progress_lines=True)
    assert sink.texts("status")[1:] == ["one", "two"]
    assert all(isinstance(p, Progress) for p in sink.items)


def test_bad_configuration_is_refused_with_the_option_named(tmp_path: Path) -> None:
    with pytest.raises(RuntimeConfigError, match="argv is required"):
        runtime_for("command", {})
    with pytest.raises(RuntimeConfigError, match="unknown option argz"):
        runtime_for("command", {"argz": ["x"]})
    with pytest.raises(RuntimeConfigError, match="grace must be a number"):
        runtime_for("command", {"argv": ["x"], "grace": "soon"})
    with pytest.raises(RuntimeConfigError, match="argv must be a list of text"):
        runtime_for("command", {"argv": "echo hi"})
    with pytest.raises(RuntimeConfigError, match="must differ"):
        runtime_for("command", {"argv": ["x"], "input_required_exit": 7, "permanent_exit": 7})
    with pytest.raises(RuntimeConfigError, match="reply_exit must differ from input_requ"):
        runtime_for("command", {"argv": ["x"], "reply_exit": 3})
    # a route's bad option fails that turn, with the reason, rather than raising
    rt = runtime_for("command", {"argv": ["true"]})
    bad = run(rt.run(Turn("x", tmp_path, options={"timeout": -1}), Sink()))
    assert bad.state == "failed"
    assert bad.error is not None
    assert "timeout" in bad.error


def test_missing_program_and_bad_cwd(tmp_path: Path) -> None:
    rt = runtime_for("command", {"argv": ["no-such-program-xyz"]})
    missing = run(rt.run(Turn("x", tmp_path), Sink()))
    assert missing.error is not None
    assert "no-such-program-xyz was not found" in missing.error
    assert not missing.retryable
    nowhere, _ = go("print(1)", Turn("x", tmp_path / "gone"))
    assert nowhere.error is not None
    assert "cannot start" in nowhere.error


# -- stdout = "parts": a program whose answer is a file or data ---------------------------------

FILE = {"raw": "dGNr", "filename": "output.txt", "mediaType": "text/plain"}
PARTS = [{"text": "the report"}, FILE, {"url": "https://example.org/r.pdf"},
         {"data": {"key": "value", "count": 42}}]  # fmt: skip


def test_a_program_answers_with_a2a_parts(tmp_path: Path) -> None:
    code = f"import json; print(json.dumps({PARTS!r}))"
    result, _ = go(code, Turn("x", tmp_path), stdout="parts")
    assert result.state == "completed", result.error
    (artifact,) = result.artifacts
    assert artifact["parts"] == PARTS  # as printed: a file, a URL, data
    assert result.text == "the report"  # what its text parts say
    same, _ = go(code, Turn("x", tmp_path))  # by default, stdout is the answer's text
    assert same.artifacts[0]["parts"] == [{"text": json.dumps(PARTS)}]


@pytest.mark.parametrize(
    ("printed", "reason"),
    [
        ("not json", "its stdout is not JSON"),
        ("[]", "not a non-empty JSON array"),
        ('{"text": "hi"}', "not a non-empty JSON array"),
        ('[{"text": "a", "data": 1}]', "part 0 of its stdout: a part carries exactly one of"),
        ('[{"text": "a"}, {"raw": "***"}]', "part 1 of its stdout: raw: must be its bytes in"),
        ('[{"raw": "aGk"}]', "raw: must be its bytes in standard base64 with padding"),
        ('[{"raw": "aGk-"}]', "raw: must be its bytes in standard base64 with padding"),
        ('[{"text": "a", "kind": "text"}]', "kind: is not a field of a part"),
        ('[{"text": "a", "filename": null}]', "filename: must be a string, got null"),
        ('[{"url": 7}]', "part 0 of its stdout: url: must be a string, got number"),
    ],
)
def test_parts_that_are_not_a2a_parts_fail_the_turn_naming_why(
    tmp_path: Path, printed: str, reason: str
) -> None:
    result, _ = go(f"print({printed!r})", Turn("x", tmp_path), stdout="parts")
    assert result.state == "failed"
    assert not result.retryable  # the same program would print the same again
    assert result.error is not None
    assert 'answered with stdout = "parts", but' in result.error
    assert reason in result.error


def test_the_stdout_option_takes_text_or_parts() -> None:
    with pytest.raises(RuntimeConfigError, match='option stdout must be "text"'):
        runtime_for("command", {"argv": ["x"], "stdout": "json"})
