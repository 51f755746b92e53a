"""A real HTTP/1.1 server on loopback whose answers a test scripts byte by byte.

Provider boundary tests need what a mock transport cannot give: bytes that drip, a
chunked body cut mid-stream, a socket the client must really close. Each connection
is handed to the test's handler as a :class:`Conn` after its request was read; the
handler writes a head, chunks, raw bytes, or cuts the connection. The server runs its
own event loop in a thread, so the client under test keeps the main thread's loop.

Every response says ``connection: close``: one request per connection, so "the client
closed the socket" is observable (:attr:`LoopbackServer.client_closed`) and never
confused with a connection returned to a pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

MAX_HEAD = 64 * 1024


@dataclass
class Request:
    method: str
    target: str
    headers: dict[str, str]
    body: bytes

    @property
    def path(self) -> str:
        return self.target.split("?", 1)[0]

    @property
    def query(self) -> str:
        return self.target.split("?", 1)[1] if "?" in self.target else ""

    def json(self) -> Any:
        return json.loads(self.body)


class Conn:
    """The server's side of one exchange, for a handler to script."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: LoopbackServer
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._server = server
        self.closed = asyncio.Event()
        """Set when the client closed (or reset) its end while the handler ran."""
        self.sent = 0
        self._chunked = False

    async def watch(self) -> None:
        try:
            while await self._reader.read(4096):
                pass
        except (ConnectionError, OSError):
            pass
        self.closed.set()
        self._server.client_closed.set()

    async def send(self, data: bytes) -> None:
        """Raw bytes; a write to a connection the client closed marks it closed."""
        if self.closed.is_set():
            raise ConnectionResetError("the client closed the connection")
        try:
            self._writer.write(data)
            await self._writer.drain()
        except (ConnectionError, OSError):
            self.closed.set()
            self._server.client_closed.set()
            raise
        self.sent += len(data)

    async def head(
        self,
        status: int,
        headers: Mapping[str, str] | None = None,
        *,
        length: int | None = None,
    ) -> None:
        """Status line and headers; chunked unless ``length`` is given."""
        lines = [f"HTTP/1.1 {status} {REASONS.get(status, 'Status')}", "connection: close"]
        lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
        if length is None:
            self._chunked = True
            lines.append("transfer-encoding: chunked")
        else:
            lines.append(f"content-length: {length}")
        await self.send(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))

    async def chunk(self, data: bytes) -> None:
        """One piece of the body (framed as a chunk when the head said chunked)."""
        if not data:
            return
        if self._chunked:
            await self.send(b"%x\r\n%s\r\n" % (len(data), data))
        else:
            await self.send(data)

    async def end(self) -> None:
        """A clean end of body: the terminating zero chunk."""
        if self._chunked:
            await self.send(b"0\r\n\r\n")

    async def reply(
        self, status: int, body: bytes, content_type: str = "application/json", **headers: str
    ) -> None:
        """A complete answer with a Content-Length."""
        await self.head(status, {"content-type": content_type, **headers}, length=len(body))
        await self.send(body)

    def cut(self) -> None:
        """Close the socket now, mid-whatever: the client sees a truncated body."""
        self._writer.transport.abort()

    async def wait_closed(self, timeout: float = 10.0) -> bool:  # noqa: ASYNC109 (False: the client never closed)
        """Wait for the client to close its end; False if it did not (a hang guard)."""
        try:
            await asyncio.wait_for(self.closed.wait(), timeout)
        except TimeoutError:
            return False
        return True


Handler = Callable[[Request, Conn], Awaitable[None]]

REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    404: "Not Found",
    413: "Payload Too Large",
    429: "Too Many Requests",
    500: "Internal Server Error",
    502: "Bad Gateway",
    503: "Service Unavailable",
    529: "Overloaded",
}


@dataclass
class LoopbackServer:
    """Serve ``handler`` (or ``routes`` by path, 404 otherwise) on 127.0.0.1."""

    handler: Handler | None = None
    routes: Mapping[str, Handler] = field(default_factory=dict)
    requests: list[Request] = field(default_factory=list)
    errors: list[BaseException] = field(default_factory=list)
    client_closed: threading.Event = field(default_factory=threading.Event)
    port: int = 0

    def __post_init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> LoopbackServer:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the loopback server did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._stop)
        self._thread.join(10)

    def hits(self, path: str) -> int:
        return sum(1 for r in self.requests if r.path == path)

    def _stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        if self._server is not None:
            self._server.close()
        self._loop.call_later(0.05, self._loop.stop)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)

        async def start() -> None:
            self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
            self.port = self._server.sockets[0].getsockname()[1]

        self._loop.run_until_complete(start())
        self._ready.set()
        self._loop.run_forever()
        self._loop.close()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._serve(reader, writer)
        except asyncio.CancelledError:
            pass
        finally:
            self._tasks.discard(task)
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            return
        if len(head) > MAX_HEAD:
            return
        first, *lines = head.decode("latin-1").split("\r\n")
        method, target, _ = first.split(" ", 2)
        headers: dict[str, str] = {}
        for line in lines:
            if line:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
        body = b""
        if "content-length" in headers:
            body = await reader.readexactly(int(headers["content-length"]))
        request = Request(method, target, headers, body)
        self.requests.append(request)
        conn = Conn(reader, writer, self)
        watcher = asyncio.create_task(conn.watch())
        handler = self.routes.get(request.path, self.handler or not_found)
        try:
            await handler(request, conn)
        except (ConnectionError, OSError):
            pass  # the client went away: that is what several tests are about
        except Exception as exc:
            self.errors.append(exc)
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher


async def not_found(request: Request, conn: Conn) -> None:
    await conn.reply(404, b'{"error":"not found"}')


def json_reply(obj: Any, status: int = 200, **headers: str) -> Handler:
    async def handle(request: Request, conn: Conn) -> None:
        await conn.reply(status, json.dumps(obj).encode(), **headers)

    return handle


def sse_reply(pieces: Sequence[bytes], *, end: bool = True, status: int = 200) -> Handler:
    """A chunked ``text/event-stream`` answer, one chunk per piece, ended cleanly or cut."""

    async def handle(request: Request, conn: Conn) -> None:
        await conn.head(status, {"content-type": "text/event-stream"})
        for piece in pieces:
            await conn.chunk(piece)
            await asyncio.sleep(0)
        if end:
            await conn.end()
        else:
            conn.cut()

    return handle


def sequence(*handlers: Handler) -> Handler:
    """The n-th request gets the n-th handler; the last one repeats."""
    count = 0

    async def handle(request: Request, conn: Conn) -> None:
        nonlocal count
        current = handlers[min(count, len(handlers) - 1)]
        count += 1
        await current(request, conn)

    return handle


def split_bytes(data: bytes, size: int) -> list[bytes]:
    """``data`` in pieces of ``size`` bytes: cuts through UTF-8 and CRLF on purpose."""
    return [data[i : i + size] for i in range(0, len(data), size)]


def sse(*events: Any, event: str | None = None) -> bytes:
    """SSE bytes: each item a JSON-able value (or raw str data) as one ``data:`` event."""
    out = b""
    for item in events:
        data = item if isinstance(item, str) else json.dumps(item, ensure_ascii=False)
        out += (f"event: {event}\n" if event else "").encode() + f"data: {data}\n\n".encode()
    return out


def anthropic_sse(*events: dict[str, Any]) -> bytes:
    """Anthropic's framing: ``event:`` named by each payload's ``type``."""
    return b"".join(sse(e, event=str(e["type"])) for e in events)


# -- OpenAI-compatible chat completion streams (runtime and plane tests) ----------------------


def delta(**fields: Any) -> dict[str, Any]:
    return {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": fields}]}


def text_stream(text: str, cost: float | None = None) -> bytes:
    """An OpenAI-compatible chat stream answering ``text`` word by word, then usage."""
    usage: dict[str, Any] = {"prompt_tokens": 10, "completion_tokens": 3}
    if cost is not None:
        usage["cost"] = cost
    return sse(
        delta(role="assistant", content=""),
        *[delta(content=part) for part in text.split(" ") if part for part in (part + " ",)],
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
        {"choices": [], "usage": usage},
        "[DONE]",
    )


def call_stream(
    name: str, arguments: str, call_id: str = "call_1", done: bool = True, say: str = ""
) -> bytes:
    """A chat stream whose answer is one tool call (after ``say``); without ``done`` it
    stops before ``[DONE]``, as a cut connection does."""
    events: list[Any] = [
        delta(role="assistant", content=say),
        delta(
            tool_calls=[
                {
                    "index": 0,
                    "id": call_id,
                    "type": "function",
                    "function": {"name": name, "arguments": ""},
                }
            ]
        ),
        delta(tool_calls=[{"index": 0, "function": {"arguments": arguments}}]),
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
    ]
    if done:
        events.append("[DONE]")
    return sse(*events)


def served(body: bytes, end: bool = True) -> Handler:
    """``body`` as an SSE reply dripped in 13-byte pieces (cut through frames on purpose)."""
    return sse_reply(split_bytes(body, 13), end=end)
