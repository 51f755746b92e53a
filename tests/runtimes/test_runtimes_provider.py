"""The provider runtime against a fake OpenAI-compatible provider on loopback.

Fresh model turns, with and without the plane's tools; tool calls carried out through
the plane's verbs (the same outbox ``melchior tool --verb=send_to`` writes) and only
after ``Done``; a restarted attempt's calls discarded; bad arguments told, not run.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from melchior.plane import outbox, roster, verbs
from melchior.plane.verbs import ENV_AGENT, ENV_OUTBOX, ENV_ROSTER
from melchior.runtimes import COMPLETED, FAILED, RuntimeConfigError, Turn, runtime_for
from provider_kit import LoopbackServer, call_stream, sequence, served, text_stream
from runtimes_kit import Sink

pytestmark = pytest.mark.streaming


def options(server: LoopbackServer, **extra: Any) -> dict[str, Any]:
    return {
        "provider": "fake",
        "kind": "openai",
        "base_url": server.url + "/v1",
        "api_key_env": "FAKE_KEY",
        "model": "m-1",
        "attempts": 2,
        **extra,
    }


def plane_env(tmp_path: Path, may_write: bool = True) -> dict[str, str]:
    data = roster.build(
        "planner",
        [("planner", "plans"), ("ledger", "keeps the books")],
        talks_to={"ledger"} if may_write else set(),
        opened=set(),
        mentioned=set(),
        turn=1,
    )
    path = roster.write(tmp_path, data)
    return {
        "FAKE_KEY": "sk-test",
        ENV_AGENT: "planner",
        ENV_ROSTER: str(path),
        ENV_OUTBOX: str(tmp_path / "out.ndjson"),
    }


def go(opts: dict[str, Any], env: dict[str, str], tmp_path: Path, prompt: str = "hi") -> Any:
    sink = Sink()
    rt = runtime_for("provider", opts)
    result = asyncio.run(rt.run(Turn(prompt=prompt, cwd=tmp_path, env=env, plane=verbs), sink))
    return result, sink


def test_without_the_plane_it_is_one_fresh_run_with_no_tools(tmp_path: Path) -> None:
    with LoopbackServer(served(text_stream("the books balance", cost=0.002))) as server:
        result, sink = go(options(server, system="be brief"), {"FAKE_KEY": "sk-test"}, tmp_path)
    assert result.state == COMPLETED
    assert result.text == "the books balance "
    assert result.usage == {"input_tokens": 10, "output_tokens": 3, "cost_usd": 0.002}
    (request,) = server.requests
    body = request.json()
    assert "tools" not in body
    assert body["model"] == "m-1"
    assert body["messages"][0] == {"role": "system", "content": "be brief"}
    assert request.headers["authorization"] == "Bearer sk-test"
    assert "the books balance" in " ".join(sink.texts("message"))


def test_the_plane_environment_without_the_planes_verbs_offers_no_tools(tmp_path: Path) -> None:
    """The plane hands its verbs in with the turn (the runtime never imports the plane):
    a turn without them has no tools, whatever its environment says."""
    env = plane_env(tmp_path)
    with LoopbackServer(served(text_stream("no tools here"))) as server:
        rt = runtime_for("provider", options(server))
        result = asyncio.run(rt.run(Turn(prompt="hi", cwd=tmp_path, env=env), Sink()))
    assert result.state == COMPLETED
    (request,) = server.requests
    assert "tools" not in request.json()


def test_in_a_plane_turn_send_to_writes_the_outbox_and_the_model_reads_the_box(
    tmp_path: Path,
) -> None:
    env = plane_env(tmp_path)
    args = json.dumps({"to": "ledger", "message": "what did we spend in August?"})
    handler = sequence(served(call_stream("send_to", args)), served(text_stream("asked ledger")))
    with LoopbackServer(handler) as server:
        result, sink = go(options(server), env, tmp_path)
    assert result.state == COMPLETED
    assert result.text == "asked ledger "
    (note,) = outbox.read(Path(env[ENV_OUTBOX])).notes
    assert (note.to, note.text) == ("ledger", "what did we spend in August?")
    first, second = (r.json() for r in server.requests)
    assert {t["function"]["name"] for t in first["tools"]} == {"send_to", "team"}
    assert "You are planner" in first["messages"][0]["content"]
    assert "ledger: keeps the books (you may write to it now)" in first["messages"][0]["content"]
    tool_msg = second["messages"][-1]
    assert tool_msg["role"] == "tool"
    assert tool_msg["tool_call_id"] == "call_1"
    receipt = json.loads(tool_msg["content"])[0]
    assert receipt["receipt"] == "queued"
    assert receipt["text"].startswith("Written to ledger.")
    assert any("send_to(" in t and "-> ok" in t for t in sink.texts("status"))


def test_a_restarted_attempts_tool_calls_are_discarded(tmp_path: Path) -> None:
    env = plane_env(tmp_path)
    args = json.dumps({"to": "ledger", "message": "from the failed attempt"})
    handler = sequence(
        # text, a complete call, then the connection cut before [DONE]: a failed attempt
        served(call_stream("send_to", args, done=False, say="let me ask\n"), end=False),
        served(text_stream("nothing to send after all")),
    )
    with LoopbackServer(handler) as server:
        result, sink = go(options(server), env, tmp_path)
    assert result.state == COMPLETED
    assert result.text == "nothing to send after all "
    assert outbox.read(Path(env[ENV_OUTBOX])).notes == []
    assert len(server.requests) == 2
    assert any("restarted" in t for t in sink.texts("status"))
    assert sink.texts("message")[0] == "let me ask"  # shown as it streamed, then withdrawn


def test_bad_arguments_and_a_team_change_are_told_to_the_model_not_run(tmp_path: Path) -> None:
    env = plane_env(tmp_path)
    handler = sequence(
        served(call_stream("send_to", "not json")),
        served(call_stream("team", json.dumps({"line": "/team ledger"}), call_id="call_2")),
        served(call_stream("send_to", json.dumps({"to": "ghost", "message": "x"}), "call_3")),
        served(text_stream("done")),
    )
    with LoopbackServer(handler) as server:
        result, _sink = go(options(server), env, tmp_path)
    assert result.state == COMPLETED
    replies = [r.json()["messages"][-1] for r in server.requests[1:]]
    assert "not a JSON object" in replies[0]["content"]
    refused = json.loads(replies[1]["content"])
    assert refused["rule"] == "operator-only"
    assert refused["line"] == "/team ledger"
    assert "no agent 'ghost'" in json.loads(replies[2]["content"])["refused"]
    assert outbox.read(Path(env[ENV_OUTBOX])).notes == []


def test_a_model_that_keeps_calling_tools_is_stopped_at_tool_rounds(tmp_path: Path) -> None:
    env = plane_env(tmp_path)
    with LoopbackServer(served(call_stream("team", "{}"))) as server:
        result, _sink = go(options(server, tool_rounds=2), env, tmp_path)
    assert result.state == FAILED
    assert "tool_rounds" in (result.error or "")
    assert len(server.requests) == 3


def test_configuration_and_credentials_fail_clearly(tmp_path: Path) -> None:
    with pytest.raises(RuntimeConfigError, match="give provider"):
        runtime_for("provider", {"model": "m"})
    with pytest.raises(RuntimeConfigError, match="option model is required"):
        runtime_for("provider", {"provider": "x"})
    with pytest.raises(RuntimeConfigError, match="describe a provider here, with kind"):
        runtime_for("provider", {"provider": "x", "model": "m", "base_url": "http://h"})
    with LoopbackServer(served(text_stream("x"))) as server:
        result, _ = go(options(server), {}, tmp_path)
    assert result.state == FAILED
    assert "$FAKE_KEY is not set" in (result.error or "")
    assert not result.retryable
    assert server.requests == []
    env = {"XDG_CONFIG_HOME": str(tmp_path / "none")}
    result, _ = go({"provider": "absent", "model": "m"}, env, tmp_path)
    assert result.state == FAILED
    assert "no [providers.absent]" in (result.error or "")
