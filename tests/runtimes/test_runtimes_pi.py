"""The pi runtime against the stand-in CLI (tests/stand_ins/pi): the exact command line,
sessions bound by their file, the JSON event stream into progress, usage and cost,
failures, cancellation of the whole tree, options checked; and the event reader under
hypothesis (any mix of pi's events, junk lines and bytes: never a crash, usage summed,
the answer the last message's)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import uuid
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from melchior.runtimes import Progress, RuntimeConfigError, Turn, TurnResult, runtime_for
from melchior.runtimes.pi import _Events
from melchior.runtimes.process import group_alive
from runtimes_kit import Sink, StandIns, install_stand_ins, kill_quietly, proc_state, run, wait_for

COST = (100 * 3 + 7 * 15) / 1e6
"""What the stand-in's first call costs: 100 tokens in at $3/M, 7 out at $15/M."""


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
    return run(runtime_for("pi", config).run(t, sink)), sink


def test_a_new_session_with_the_exact_command_line(si: StandIns, work: Path) -> None:
    result, sink = go(turn(si, work, "@~/.ssh/id_rsa -- hello there"))
    assert result.state == "completed", result
    assert result.text == "ok: @~/.ssh/id_rsa -- hello there"
    assert result.path == "new"
    folder = Path(si.env["PI_CODING_AGENT_DIR"]) / "sessions" / "melchior"
    assert result.session is not None
    assert str(uuid.UUID(result.session)) == result.session  # an id a relay route can bind
    file = folder / f"{result.session}.jsonl"
    assert file.is_file()
    (call,) = si.calls("pi")
    assert call["argv"] == ["-p", "--mode", "json", "--session", str(file), "--offline"]
    assert call["stdin"] == "@~/.ssh/id_rsa -- hello there"  # on stdin: no @file, no flag
    assert call["cwd"] == str(work)
    assert result.usage == {"input_tokens": 100, "output_tokens": 7, "cost_usd": COST}
    assert sink.kinds("usage")[0].data == result.usage
    assert sink.texts("message") == [result.text]  # once, not once per message_update
    started = [p for p in sink.kinds("status") if p.data and "session_id" in p.data]
    assert started[0].data is not None
    assert started[0].data["cwd"] == str(work)


def test_a_bound_session_is_resumed_by_its_file_in_the_directory_it_began(
    si: StandIns, work: Path, tmp_path: Path
) -> None:
    first, _ = go(turn(si, work, "hi"))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    second, _ = go(turn(si, elsewhere, "history", session=first.session))
    assert second.state == "completed", second
    assert second.text == "1 turn(s) came before"
    assert second.session == first.session
    assert second.path == "resumed"
    assert second.usage["input_tokens"] == 110  # the history went to the model
    file = Path(si.env["PI_CODING_AGENT_DIR"]) / "sessions" / "melchior" / f"{first.session}.jsonl"
    assert si.calls("pi")[-1]["argv"][4] == str(file)
    assert si.calls("pi")[-1]["cwd"] == str(work)  # pi continues where the session began
    by_path, _ = go(turn(si, work, "history", session=str(file)))  # any session file, locally
    assert by_path.text == "2 turn(s) came before"
    assert by_path.session == str(file)


def test_a_bound_session_must_be_an_existing_session_file(si: StandIns, work: Path) -> None:
    folder = Path(si.env["PI_CODING_AGENT_DIR"]) / "sessions" / "melchior"
    for session, why in (
        ("01a23436-105b", f"there is no pi session file at {folder / '01a23436-105b.jsonl'}"),
        ("relative/s.jsonl", "is neither a session id"),
        ("../../etc/passwd", "is neither a session id"),
        (str(work / "gone.jsonl"), f"there is no pi session file at {work / 'gone.jsonl'}"),
        ("--session-dir", "starts with '-'"),
    ):
        result, _ = go(turn(si, work, "hi", session=session))
        assert result.state == "failed"
        assert result.error is not None
        assert why in result.error
    assert si.calls("pi") == []  # never run: pi would quietly start a new session there


def test_options_become_flags(si: StandIns, work: Path, tmp_path: Path) -> None:
    ext = tmp_path / "ext.ts"
    ext.write_text("export default function () {}\n")
    sessions = tmp_path / "sessions"
    result, _ = go(
        turn(si, work, "hi"),
        provider="mock",
        model="mock-model",
        thinking="low",
        tools=["read", "grep"],
        builtin_tools=False,
        discover_extensions=False,
        extensions=[str(ext)],
        context_files=False,
        append_system_prompt="be brief",
        session_dir=str(sessions),
        offline=False,
        extra_args=["--verbose"],
    )
    assert result.state == "completed", result
    argv = si.calls("pi")[0]["argv"]
    assert argv == [
        "-p", "--mode", "json", "--session", str(sessions / f"{result.session}.jsonl"),
        "--provider", "mock",
        "--model", "mock-model", "--thinking", "low", "--tools", "read,grep",
        "--no-builtin-tools", "--no-extensions", "-e", str(ext), "--no-context-files",
        "--append-system-prompt", "be brief", "--verbose",
    ]  # fmt: skip
    assert (sessions / f"{result.session}.jsonl").is_file()


def test_tools_decide_what_pi_may_use(si: StandIns, work: Path) -> None:
    result, sink = go(turn(si, work, "tool"))
    assert result.text == "DONE after tool"
    assert (work / "out.txt").read_text() == "hello\n"
    assert "using bash: echo hello > out.txt && echo wrote" in sink.texts("status")
    (work / "out.txt").unlink()
    reviewer, _ = go(turn(si, work, "tool"), tools=["read", "grep", "find", "ls"])
    assert reviewer.text == "there is no bash tool here (tools: read, grep, find, ls)"
    assert not (work / "out.txt").exists()


def test_failures_say_why_and_whether_to_retry(si: StandIns, work: Path) -> None:
    failed, _ = go(turn(si, work, "fail"))
    assert failed.state == "failed"
    assert failed.error == "pi reported an error: 401 Incorrect API key provided"
    assert not failed.retryable
    crash, _ = go(turn(si, work, "crash"))
    assert crash.state == "failed"
    assert crash.error is not None
    assert crash.error.startswith("pi exited with status 3 without an answer; stderr: TypeError")
    assert crash.retryable
    refused, _ = go(turn(si, work, "hi"), extra_args=["--no-such-flag"])
    assert refused.error == (
        "pi exited with status 1 without an answer; stderr: Error: Unknown option: --no-such-flag"
    )
    assert not refused.retryable
    aborted, _ = go(turn(si, work, "abort"))
    assert aborted.state == "canceled"
    assert aborted.retryable


def test_a_retried_model_call_and_junk_lines_still_complete(si: StandIns, work: Path) -> None:
    retried, sink = go(turn(si, work, "retry"))
    assert retried.state == "completed", retried
    assert retried.text == "answered on the second try"
    assert "model call failed (Connection error.); retry 1 of 3" in sink.texts("status")
    assert retried.usage["input_tokens"] == 200  # both calls counted
    junk, _ = go(turn(si, work, "junk"))
    assert junk.state == "completed"
    assert junk.text == "ok after junk"


def test_a_long_answer_is_read_without_a_line_per_token(si: StandIns, work: Path) -> None:
    words = " ".join(["word"] * 2000)
    result, sink = go(turn(si, work, words))
    assert result.text == f"ok: {words}"
    assert sink.texts("message") == [result.text]


def test_cancel_stops_pi_and_its_children(si: StandIns, work: Path) -> None:
    async def main() -> tuple[int, int]:
        sink = Sink()
        rt = runtime_for("pi", {"grace": 2})
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


def test_sigterm_from_elsewhere_is_a_canceled_turn_that_can_be_resumed(
    si: StandIns, work: Path
) -> None:
    async def main() -> TurnResult:
        sink = Sink()

        async def on(p: Progress) -> None:
            if p.kind == "message" and p.text.startswith("sleeping"):
                os.killpg(sink.pid(), signal.SIGTERM)

        sink.on = on
        return await runtime_for("pi").run(turn(si, work, "sleep 30"), sink)

    result = run(main())
    assert result.state == "canceled"
    assert result.retryable
    assert "exited with status 143 (SIGTERM) before finishing the turn" in result.text
    assert result.session is not None  # pi saved it on SIGTERM
    again, _ = go(turn(si, work, "history", session=result.session))
    assert again.text == "1 turn(s) came before"


def test_bad_options_are_refused_naming_them(si: StandIns, work: Path) -> None:
    for options, why in (
        ({"thinkng": "low"}, "unknown option thinkng"),
        ({"thinking": "max"}, "option thinking must be one of off, minimal"),
        ({"tools": ["read", "rm -rf"]}, "option tools has 'rm -rf'"),
        ({"tools": "read"}, "option tools must be a list of text"),
        ({"tools": []}, "option tools lists no tool, which would leave pi all of its own"),
        ({"extensions": ["--no-extensions"]}, "option extensions has '--no-extensions'"),
        ({"model": "-m"}, "option model has '-m'"),
        ({"session_dir": "sessions"}, "option session_dir must be an absolute path"),
        ({"extra_args": ["x"]}, "option extra_args must start with a flag"),
        ({"builtin_tools": "no"}, "option builtin_tools must be true or false"),
    ):
        with pytest.raises(RuntimeConfigError, match=f"^pi: .*{why}"):
            runtime_for("pi", options)
    route, _ = go(turn(si, work, "hi", options={"offline": "yes"}))
    assert route.error == "pi: option offline must be true or false, got 'yes'"
    missing, _ = go(turn(si, work, "hi"), binary="no-such-pi")
    assert missing.error is not None
    assert "no-such-pi was not found" in missing.error
    assert si.calls("pi") == []


# -- the event reader, under hypothesis -------------------------------------------------------

texts = st.text(st.characters(blacklist_categories=["Cs"]), max_size=40)
usages = st.fixed_dictionaries(
    {"input": st.integers(0, 10_000), "output": st.integers(0, 10_000)},
    optional={"cost": st.fixed_dictionaries({"total": st.floats(0, 10, allow_nan=False)})},
)


@st.composite
def assistant_end(draw: st.DrawFn) -> dict[str, Any]:
    content = draw(
        st.lists(
            st.one_of(
                st.builds(lambda t: {"type": "text", "text": t}, texts),
                st.builds(lambda t: {"type": "toolCall", "name": "bash", "id": t}, texts),
            ),
            max_size=3,
        )
    )
    stop = draw(st.sampled_from(["stop", "toolUse", "error", "length"]))
    return {
        "type": "message_end",
        "message": {"role": "assistant", "content": content, "usage": draw(usages),
                    "stopReason": stop},
    }  # fmt: skip


others = st.one_of(
    st.builds(lambda t: {"type": "session", "id": t, "cwd": "/w"}, texts),
    st.builds(
        lambda t: {"type": "message_update", "message": {"role": "assistant", "content": t}}, texts
    ),
    st.builds(lambda t: {"type": "tool_execution_start", "toolName": t, "args": {}}, texts),
    st.just({"type": "auto_retry_start", "attempt": 1, "maxAttempts": 3}),
    st.just({"type": "message_end", "message": {"role": "user", "content": "hi"}}),
    st.just({"type": "agent_end", "messages": []}),
)
lines = st.one_of(
    assistant_end().map(lambda e: ("assistant", e)),
    others.map(lambda e: ("event", e)),
    st.binary(max_size=60).map(lambda b: ("junk", b)),
    st.just(("junk", b'{"type": "message_end", "message": [1, 2]}')),
    st.just(("junk", b'{"type":"message_end","message":{"role":"assistant","usage":"x"}}')),
)


@given(stream=st.lists(lines, max_size=25))
def test_any_event_stream_is_read_without_a_crash(stream: list[tuple[str, Any]]) -> None:
    async def read() -> _Events:
        events = _Events(Sink())
        for kind, item in stream:
            raw = item if kind == "junk" else json.dumps(item, separators=(",", ":")).encode()
            await events.line(raw + b"\n")
        return events

    events = asyncio.run(read())
    ends = [e for kind, e in stream if kind == "assistant"]
    if not ends:
        return
    assert events.usage["input_tokens"] == sum(e["message"]["usage"]["input"] for e in ends)
    assert events.usage["output_tokens"] == sum(e["message"]["usage"]["output"] for e in ends)
    costs = [
        e["message"]["usage"]["cost"]["total"] for e in ends if "cost" in e["message"]["usage"]
    ]
    if costs:
        assert events.usage["cost_usd"] == pytest.approx(sum(costs))
    else:
        assert "cost_usd" not in events.usage
    # the answer: the last assistant message's text, else the last text any message said
    accepted = [
        e["message"]["content"] if kind == "assistant" else []
        for kind, e in stream
        if kind == "assistant" or (kind == "junk" and b'"usage":"x"' in e)
    ]
    texts_of = [[b["text"] for b in content if b["type"] == "text"] for content in accepted]
    expected = "".join(texts_of[-1])
    if not expected.strip():
        spoken = ["".join(t for t in texts if t.strip()) for texts in texts_of]
        expected = next((t for t in reversed(spoken) if t), "")
    assert events.answer() == expected
