"""The a2a runtime against real A2A servers on loopback: a scripted a2a-sdk agent (one
streaming card, one not, bearer auth) and the project's own relay with a real receiver.
Blocking/polling and streaming, artifacts, input_required and its continuation,
failure, a direct message reply, cancel forwarded as CancelTask, and the hop chain."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from a2a_agents_kit import TOKEN, Agents
from melchior.envelope import Message as Envelope
from melchior.policy.hops import HOPS_URI, Chain
from melchior.runtimes import RuntimeConfigError, Turn, TurnResult, runtime_for
from melchior.runtimes.a2a import outbound_message
from runtimes_kit import Sink, run, wait_for


@pytest.fixture(scope="module")
def agents() -> Iterator[Agents]:
    a = Agents()
    yield a
    a.stop()


def forward(
    agents: Agents, prefix: str, prompt: str, *, message: Envelope | None = None,
    session: str | None = None, **config: Any,
) -> tuple[TurnResult, Sink]:  # fmt: skip
    sink = Sink()
    options = {"card_url": agents.card(prefix), "token_env": "AGENT_TOKEN", **config}
    t = Turn(prompt, Path("."), message=message, session=session, env={"AGENT_TOKEN": TOKEN})
    return run(runtime_for("a2a", options).run(t, sink)), sink


@pytest.mark.parametrize("prefix", ["/poll", "/stream"])
def test_a_completed_task_with_artifacts(agents: Agents, prefix: str) -> None:
    result, sink = forward(agents, prefix, "echo hello", headers={"X-Extra": "yes"})
    assert result.state == "completed"
    assert result.path == "forwarded"
    assert result.text == "echo: hello"
    assert [dict(a) for a in result.artifacts] == [
        {"artifactId": "echo", "name": "echo", "parts": [{"text": "echo: hello"}]}
    ]
    assert result.session is not None
    assert result.session.startswith("context:")
    first = sink.kinds("status")[0]
    assert first.data is not None
    assert first.data["path"] == "forwarded"
    assert ("streaming" if prefix == "/stream" else "polling") in first.text
    seen = agents.seen.headers[-1]
    assert seen["a2a-version"] == "1.0"
    assert seen["x-extra"] == "yes"
    assert seen["authorization"] == f"Bearer {TOKEN}"


def test_streamed_progress_and_chunked_artifacts(agents: Agents) -> None:
    result, sink = forward(agents, "/stream", "steps")
    assert result.state == "completed"
    assert result.text == "2 steps done"
    assert [dict(a) for a in result.artifacts] == [
        {"artifactId": "out", "name": "out", "parts": [{"text": "chunk-0 "}, {"text": "chunk-1"}]}
    ]
    assert "working on it" in sink.texts("status")
    chunks = sink.kinds("artifact")
    assert [c.text for c in chunks] == ["chunk-0 ", "chunk-1"]
    assert chunks[1].data == {
        "artifact": {"artifactId": "out", "name": "out", "parts": [{"text": "chunk-1"}]},
        "append": True,
        "lastChunk": True,
    }


@pytest.mark.parametrize("prefix", ["/poll", "/stream"])
def test_input_required_then_the_answer_continues_the_task(agents: Agents, prefix: str) -> None:
    asked, _ = forward(agents, prefix, "ask")
    assert asked.state == "input_required"
    assert asked.text == "which one?"
    assert asked.session is not None
    assert asked.session.startswith("task:")
    answered, _ = forward(agents, prefix, "blue", session=asked.session)
    assert answered.state == "completed"
    assert answered.text == "you chose blue"
    assert agents.seen.messages[-1]["taskId"] == asked.session.removeprefix("task:")


@pytest.mark.parametrize("prefix", ["/poll", "/stream"])
def test_failure_and_direct_replies(agents: Agents, prefix: str) -> None:
    broke, _ = forward(agents, prefix, "fail")
    assert broke.state == "failed"
    assert not broke.retryable
    assert broke.error == "the agent failed the task: it broke"
    direct, _ = forward(agents, prefix, "reply hi")
    assert direct.state == "completed"
    assert direct.text == "direct: hi"
    assert direct.reply  # a message, no task: said as one
    assert direct.artifacts == ()
    assert not broke.reply


@pytest.mark.parametrize("prefix", ["/poll", "/stream"])
def test_cancel_is_forwarded_as_cancel_task(agents: Agents, prefix: str) -> None:
    agents.seen.release.clear()

    async def main() -> None:
        sink = Sink()
        options = {"card_url": agents.card(prefix), "token_env": "AGENT_TOKEN",
                   "poll_interval": 0.05}  # fmt: skip
        t = Turn("hold", Path("."), env={"AGENT_TOKEN": TOKEN})
        task = asyncio.ensure_future(runtime_for("a2a", options).run(t, sink))
        await wait_for(lambda: "holding" in sink.texts("status"))
        before = len(agents.seen.cancelled)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert len(agents.seen.cancelled) == before + 1  # forwarded before propagating

    run(main())


def test_our_deadline_cancels_the_remote_task(agents: Agents) -> None:
    agents.seen.release.clear()
    before = len(agents.seen.cancelled)
    result, _ = forward(agents, "/poll", "hold", timeout=0.5, poll_interval=0.05)
    assert result.state == "failed"
    assert result.error is not None
    assert "did not finish within 0.5 s; its task was canceled" in result.error
    assert len(agents.seen.cancelled) == before + 1


def test_parts_and_the_hop_chain_travel_verbatim(agents: Agents) -> None:
    env = Envelope(
        "local/codex", "private/ops", "mirror",
        chain=Chain("c0ffee", 2, ("alice", "local/codex")),
        parts=({"text": "mirror"}, {"data": {"k": "v"}, "mediaType": "application/json"}),
        metadata={"note": "kept"},
    )  # fmt: skip
    result, _ = forward(agents, "/stream", "fenced text the agent does not get", message=env)
    assert result.state == "completed"
    mirror = next(a for a in result.artifacts if a["artifactId"] == "mirror")
    assert mirror["parts"] == [
        {"text": "mirror"}, {"data": {"k": "v"}, "mediaType": "application/json"}
    ]  # fmt: skip
    assert mirror["metadata"] == {
        "note": "kept",
        HOPS_URI: {"chain": "c0ffee", "hop": 2, "path": ["alice", "local/codex"]},
    }


def test_refusals(agents: Agents) -> None:
    no_token = run(
        runtime_for("a2a", {"card_url": agents.card("/stream")}).run(
            Turn("echo x", Path(".")), Sink()
        )
    )
    assert no_token.state == "failed"
    assert no_token.error == "the agent answered HTTP 401"
    assert not no_token.retryable
    unset, _ = forward(agents, "/stream", "echo x", token_env="NOT_SET_ANYWHERE_XYZ")
    assert unset.error is not None
    assert "NOT_SET_ANYWHERE_XYZ" in unset.error
    stream_only, _ = forward(agents, "/poll", "echo x", mode="stream")
    assert stream_only.error is not None
    assert "does not offer streaming" in stream_only.error
    missing, _ = forward(agents, "/nowhere", "echo x")
    assert missing.error is not None
    assert "answered HTTP 404" in missing.error
    bad_parts, _ = forward(
        agents, "/stream", "x", message=Envelope("a", "b", "x", parts=({"nonsense": 1},))
    )
    assert bad_parts.error is not None
    assert "A2A parts are not valid" in bad_parts.error


def test_unreachable_is_retryable() -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    rt = runtime_for("a2a", {"card_url": f"http://127.0.0.1:{port}/.well-known/agent-card.json"})
    result = run(rt.run(Turn("x", Path(".")), Sink()))
    assert result.state == "failed"
    assert result.retryable
    assert result.error is not None
    assert "cannot reach the agent card" in result.error


def test_configuration_is_checked() -> None:
    with pytest.raises(RuntimeConfigError, match="card_url is required"):
        runtime_for("a2a", {})
    with pytest.raises(RuntimeConfigError, match="plain http to another machine"):
        runtime_for("a2a", {"card_url": "http://agent.example.com/.well-known/agent-card.json"})
    runtime_for("a2a", {"card_url": "http://agent.example.com/c.json", "insecure_http": True})
    with pytest.raises(RuntimeConfigError, match="bindings has 'GRPC'"):
        runtime_for("a2a", {"card_url": "https://a.example/c.json", "bindings": ["GRPC"]})
    with pytest.raises(RuntimeConfigError, match="may not set A2A-Version"):
        runtime_for(
            "a2a", {"card_url": "https://a.example/c.json", "headers": {"A2A-Version": "0.3"}}
        )


def test_sessions_pick_task_or_context() -> None:
    assert outbound_message(Turn("x", Path("."), session="task:t1"))["taskId"] == "t1"
    assert outbound_message(Turn("x", Path("."), session="context:c1"))["contextId"] == "c1"
    assert outbound_message(Turn("x", Path("."), session="c2"))["contextId"] == "c2"
    plain = outbound_message(Turn("hello", Path(".")))
    assert plain["parts"] == [{"text": "hello"}]
    assert "metadata" not in plain


# -- through the project's own relay, with a real receiver -----------------------------------------


def _relay_send(
    tmp_path: Path, server: Any, world: Any, prompt: str, chain: Chain | None
) -> TurnResult:
    from a2a_kit import CALLER, RECEIVER

    options = {
        "card_url": f"{server.base(RECEIVER)}/.well-known/agent-card.json",
        "token_env": "RELAY_TOKEN",
    }
    msg = Envelope(
        CALLER, RECEIVER, prompt, chain=chain, metadata={"capability": "incident.inspect"}
    )
    t = Turn(prompt, tmp_path, message=msg, env={"RELAY_TOKEN": world.tokens["caller"]})
    return run(runtime_for("a2a", options).run(t, Sink()))


def test_through_the_mellan_relay(tmp_path: Path) -> None:
    from a2a_kit import running

    with running(f"sqlite:///{tmp_path / 'relay.db'}") as (server, world, _rx):
        echoed = _relay_send(tmp_path, server, world, "echo over the relay", None)
        assert echoed.state == "completed", echoed
        assert echoed.text == "echo: over the relay"
        assert echoed.artifacts[0]["parts"] == [{"text": "echo: over the relay"}]
        asked = _relay_send(tmp_path, server, world, "ask", None)
        assert asked.state == "input_required"
        assert asked.text == "which one?"
        broke = _relay_send(tmp_path, server, world, "fail", None)
        assert broke.state == "failed"
        assert broke.error == "the agent failed the task: it broke"


def test_the_hop_chain_through_the_mellan_relay(tmp_path: Path) -> None:
    from a2a_kit import CALLER, running

    with running(f"sqlite:///{tmp_path / 'relay.db'}") as (server, world, _rx):
        chained = _relay_send(tmp_path, server, world, "echo hop", Chain("feed", 1, (CALLER,)))
        assert chained.state == "completed", chained
