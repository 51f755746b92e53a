"""The a2a runtime against real A2A servers on loopback: a scripted a2a-sdk agent (one
streaming card, one not, bearer auth) and the project's own relay with a real receiver.
Blocking/polling and streaming, artifacts, input_required and its continuation,
failure, a direct message reply, cancel forwarded as CancelTask, and the hop chain."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes, create_rest_routes
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    Message,
    Part,
    Role,
    Task,
    TaskState,
    TaskStatus,
)
from google.protobuf.json_format import MessageToDict
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Mount
from starlette.types import ASGIApp, Receive, Scope, Send

from melchior.envelope import Message as Envelope
from melchior.policy.hops import HOPS_URI, Chain
from melchior.runtimes import RuntimeConfigError, Turn, TurnResult, runtime_for
from melchior.runtimes.a2a import outbound_message
from runtimes_kit import Sink, run, wait_for

TOKEN = "a2a_test.0123456789abcdef0123456789abcdef"


@dataclass
class Seen:
    messages: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)


def _msg(text: str) -> Message:
    return Message(
        role=Role.ROLE_AGENT, message_id=f"m-{time.monotonic_ns()}", parts=[Part(text=text)]
    )


class Scripted(AgentExecutor):
    """The first word of the user's text picks the behaviour (see the module docstring)."""

    def __init__(self, seen: Seen) -> None:
        self.seen = seen

    async def execute(self, ctx: RequestContext, q: EventQueue) -> None:
        assert ctx.message is not None
        self.seen.messages.append(MessageToDict(ctx.message))
        text = ctx.get_user_input()
        word, _, rest = text.partition(" ")
        if word == "reply":
            await q.enqueue_event(_msg(f"direct: {rest}"))
            return
        task_id, context_id = ctx.task_id or "", ctx.context_id or ""
        current = ctx.current_task
        if current is None:
            await q.enqueue_event(
                Task(id=task_id, context_id=context_id, history=[ctx.message],
                     status=TaskStatus(state=TaskState.TASK_STATE_SUBMITTED))
            )  # fmt: skip
        up = TaskUpdater(q, task_id, context_id)
        await up.start_work()
        if current is not None and current.status.state == TaskState.TASK_STATE_INPUT_REQUIRED:
            await up.complete(_msg(f"you chose {text}"))
        elif word == "echo":
            await up.add_artifact([Part(text=f"echo: {rest}")], artifact_id="echo", name="echo",
                                  last_chunk=True)  # fmt: skip
            await up.complete(_msg(f"echo: {rest}"))
        elif word == "steps":
            await up.update_status(TaskState.TASK_STATE_WORKING, message=_msg("working on it"))
            await up.add_artifact([Part(text="chunk-0 ")], artifact_id="out", name="out")
            await up.add_artifact([Part(text="chunk-1")], artifact_id="out", name="out",
                                  append=True, last_chunk=True)  # fmt: skip
            await up.complete(_msg("2 steps done"))
        elif word == "ask":
            await up.requires_input(_msg("which one?"))
        elif word == "fail":
            await up.failed(_msg("it broke"))
        elif word == "mirror":
            meta = MessageToDict(ctx.message).get("metadata", {})
            await up.add_artifact(list(ctx.message.parts), artifact_id="mirror", name="mirror",
                                  metadata=meta, last_chunk=True)  # fmt: skip
            await up.complete(_msg("mirrored"))
        elif word == "hold":
            await up.update_status(TaskState.TASK_STATE_WORKING, message=_msg("holding"))
            await asyncio.to_thread(self.seen.release.wait, 30)
        else:
            await up.complete(_msg(f"ok: {text}"))

    async def cancel(self, ctx: RequestContext, q: EventQueue) -> None:
        self.seen.cancelled.append(ctx.task_id or "")
        self.seen.release.set()
        await TaskUpdater(q, ctx.task_id or "", ctx.context_id or "").cancel()


class Auth:
    """Bearer auth for everything but the card; records the headers of each call."""

    def __init__(self, app: ASGIApp, seen: Seen) -> None:
        self.app, self.seen = app, seen

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not scope["path"].endswith("agent-card.json"):
            headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
            self.seen.headers.append(headers)
            if headers.get("authorization") != f"Bearer {TOKEN}":
                await JSONResponse({"error": "unauthorized"}, status_code=401)(scope, receive, send)
                return
        await self.app(scope, receive, send)


class Agents:
    """Two agents on one loopback server: /stream (streaming card) and /poll (not)."""

    def __init__(self) -> None:
        self.seen = Seen()
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        self.sock = sock
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        routes: list[Any] = []
        for prefix, streaming in (("/stream", True), ("/poll", False)):
            card = AgentCard(
                name=f"scripted{prefix}", description="a scripted agent", version="1.0.0",
                capabilities=AgentCapabilities(streaming=streaming),
                default_input_modes=["text/plain"], default_output_modes=["text/plain"],
                skills=[AgentSkill(id="s", name="s", description="s", tags=["s"])],
                supported_interfaces=[
                    AgentInterface(protocol_binding="JSONRPC", protocol_version="1.0",
                                   url=f"{self.url}{prefix}/rpc"),
                    AgentInterface(protocol_binding="HTTP+JSON", protocol_version="1.0",
                                   url=f"{self.url}{prefix}/rest"),
                ],
            )  # fmt: skip
            handler = DefaultRequestHandler(
                agent_executor=Scripted(self.seen), task_store=InMemoryTaskStore(), agent_card=card
            )
            # One mount per agent: the SDK's REST routes add a catch-all "/{tenant}" mount.
            inner = create_agent_card_routes(card) + create_jsonrpc_routes(handler, rpc_url="/rpc")
            routes.append(
                Mount(prefix, routes=inner + create_rest_routes(handler, path_prefix="/rest"))
            )
        app = Auth(Starlette(routes=routes), self.seen)
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
        self.thread = threading.Thread(
            target=lambda: asyncio.run(self.server.serve(sockets=[sock])), daemon=True
        )
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline, "agent did not start"
            assert self.thread.is_alive(), "agent did not start"
            time.sleep(0.01)

    def card(self, prefix: str) -> str:
        return f"{self.url}{prefix}/.well-known/agent-card.json"

    def stop(self) -> None:
        self.seen.release.set()
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()


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
