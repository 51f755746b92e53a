"""A loopback stand-in for the model APIs the real coding-agent CLIs call.

Claude Code speaks Anthropic Messages (``ANTHROPIC_BASE_URL``), Codex OpenAI Responses
(a ``[model_providers]`` entry), pi OpenAI Chat Completions (a ``models.json``
provider); all three stream SSE. The CLIs are real; only what the model says is
scripted: ``script(body, n)`` returns the n-th main request's step, ``{"text": T}`` or
``{"tool": NAME, "input": {...}, "id": ID}`` (with ``"namespace"`` for Codex's MCP
tools). Side requests (Claude Code's title and token counting, without tools) get a
short text and are not counted. :func:`echo` answers with how many user messages it
saw, which is how a test knows a resumed session carried its history.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Step = dict[str, Any]
Script = Callable[[dict[str, Any], int], Step]
Events = list[tuple[str | None, dict[str, Any]]]

USAGE_IN, USAGE_OUT = 100, 7
"""What every Responses and Chat Completions reply says it used (Anthropic: 10 and 5)."""


def users(body: dict[str, Any]) -> int:
    """User messages in a request of any of the three APIs."""
    items = body.get("messages") or body.get("input") or []
    return sum(1 for m in items if isinstance(m, dict) and m.get("role") == "user")


def echo(body: dict[str, Any], n: int) -> Step:
    return {"text": f"MOCK reply after {users(body)} user message(s)"}


def anthropic(step: Step) -> Events:
    usage = {"input_tokens": 10, "output_tokens": 5}
    start = {"type": "message_start", "message": {"id": "msg_1", "type": "message",
             "role": "assistant", "model": "mock", "content": [], "stop_reason": None,
             "stop_sequence": None, "usage": usage}}  # fmt: skip
    if "tool" in step:
        block = {"type": "tool_use", "id": step["id"], "name": step["tool"], "input": {}}
        delta = {"type": "input_json_delta", "partial_json": json.dumps(step["input"])}
        stop = "tool_use"
    else:
        block = {"type": "text", "text": ""}
        delta = {"type": "text_delta", "text": step["text"]}
        stop = "end_turn"
    return [
        ("message_start", start),
        ("content_block_start",
         {"type": "content_block_start", "index": 0, "content_block": block}),
        ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ("message_delta", {"type": "message_delta", "usage": {"output_tokens": 5},
                           "delta": {"stop_reason": stop, "stop_sequence": None}}),
        ("message_stop", {"type": "message_stop"}),
    ]  # fmt: skip


def responses(step: Step) -> Events:
    if "tool" in step:
        item: dict[str, Any] = {
            "type": "function_call", "id": f"fc_{step['id']}", "call_id": step["id"],
            "name": step["tool"], "arguments": json.dumps(step["input"]), "status": "completed",
        }  # fmt: skip
        if step.get("namespace"):
            item["namespace"] = step["namespace"]
    else:
        item = {
            "type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": step["text"], "annotations": []}],
        }  # fmt: skip
    usage = {"input_tokens": USAGE_IN, "output_tokens": USAGE_OUT,
             "total_tokens": USAGE_IN + USAGE_OUT, "input_tokens_details": {"cached_tokens": 0},
             "output_tokens_details": {"reasoning_tokens": 0}}  # fmt: skip
    return [
        ("response.created", {"type": "response.created", "response": {"id": "resp_1"}}),
        ("response.output_item.done",
         {"type": "response.output_item.done", "output_index": 0, "item": item}),
        ("response.completed",
         {"type": "response.completed", "response": {"id": "resp_1", "usage": usage}}),
    ]  # fmt: skip


def chat(step: Step) -> Events:
    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "mock",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}  # fmt: skip

    if "tool" in step:
        call = {"index": 0, "id": step["id"], "type": "function",
                "function": {"name": step["tool"], "arguments": ""}}  # fmt: skip
        args = {"index": 0, "function": {"arguments": json.dumps(step["input"])}}
        events = [
            chunk({"role": "assistant", "content": ""}),
            chunk({"tool_calls": [call]}),
            chunk({"tool_calls": [args]}),
            chunk({}, "tool_calls"),
        ]
    else:
        events = [chunk({"role": "assistant", "content": step["text"]}), chunk({}, "stop")]
    usage = {"prompt_tokens": USAGE_IN, "completion_tokens": USAGE_OUT,
             "total_tokens": USAGE_IN + USAGE_OUT}  # fmt: skip
    events.append({"id": "c1", "object": "chat.completion.chunk", "created": 1,
                   "model": "mock", "choices": [], "usage": usage})  # fmt: skip
    return [(None, e) for e in events]


class _Model(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: ModelServer

    def log_message(self, *args: Any) -> None:
        pass

    def _send(self, status: int, ctype: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("content-type", ctype)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self._send(200, "application/json", b'{"data":[],"models":[]}')

    def _sse(self, events: Events, done: bool = False) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("connection", "close")
        self.end_headers()
        for name, data in events:
            head = f"event: {name}\n" if name else ""
            self.wfile.write(f"{head}data: {json.dumps(data)}\n\n".encode())
        if done:
            self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()
        self.close_connection = True

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
        if "count_tokens" in self.path:
            self._send(200, "application/json", b'{"input_tokens":1}')
            return
        if self.path.endswith("/chat/completions"):
            step = self.server.next_step(body, self.path)
            if step.get("hang"):
                self.server.release.wait(300)
            self._sse(chat(step), done=True)
            return
        main = bool(body.get("tools")) or "input" in body  # side requests have no tools
        step = self.server.next_step(body, self.path) if main else {"text": "ok"}
        if self.path.startswith("/v1/messages"):
            self._sse(anthropic(step))
        else:
            self._sse(responses(step))


class ModelServer(ThreadingHTTPServer):
    """The model's part, played by ``script``; every main request is kept, in order."""

    daemon_threads = True

    def __init__(self, script: Script = echo) -> None:
        super().__init__(("127.0.0.1", 0), _Model)
        self.script = script
        self.requests: list[dict[str, Any]] = []
        self.paths: list[str] = []
        self.lock = threading.Lock()
        self.arrived = threading.Event()
        self.release = threading.Event()
        """Set to let a ``{"hang": True}`` step answer (so a test can cancel mid-call)."""

    def next_step(self, body: dict[str, Any], path: str = "") -> Step:
        with self.lock:
            self.requests.append(body)
            self.paths.append(path)
            step = self.script(body, len(self.requests))
        self.arrived.set()
        return step

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def pi_models(self, cost: tuple[float, float] = (3.0, 15.0)) -> dict[str, Any]:
        """A pi ``models.json`` naming this server as provider ``mock`` (model
        ``mock-model``, its key in ``$MOCK_KEY``), priced per million tokens."""
        price = {"input": cost[0], "output": cost[1], "cacheRead": 0, "cacheWrite": 0}
        model = {"id": "mock-model", "cost": price}
        return {"providers": {"mock": {"baseUrl": f"{self.url}/v1", "api": "openai-completions",
                                       "apiKey": "MOCK_KEY", "models": [model]}}}  # fmt: skip


@contextlib.contextmanager
def serving(script: Script = echo) -> Iterator[ModelServer]:
    server = ModelServer(script)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.release.set()
        server.shutdown()
        server.server_close()
