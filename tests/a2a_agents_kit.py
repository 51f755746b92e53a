"""Scripted A2A agents on loopback for the tests of the a2a runtime and of a receiver
that forwards to one: two a2a-sdk agents on one real uvicorn server, ``/stream`` (a
streaming card) and ``/poll`` (not), behind bearer auth (:data:`TOKEN`), every call's
messages, headers and cancellations kept in :class:`Seen`.

The first word of the user's text picks what the agent does: ``reply`` answers with a
direct message; ``echo`` completes with an artifact of the rest; ``steps`` says it is
working and sends an artifact in two chunks; ``ask`` asks back (input_required), and the
next message on that task completes it; ``fail`` fails; ``mirror`` returns the message's
parts and metadata as an artifact; ``hold`` works until cancelled (or released); anything
else completes with ``ok: <text>``.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

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
