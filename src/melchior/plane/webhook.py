"""Lines from outside: an HTTP POST on loopback, with a bearer token, read at stranger trust.

``POST /agents/NAME/lines`` with ``Authorization: Bearer TOKEN`` and the line as the
body (``text/plain``, or JSON ``{"text": "..."}``) wakes agent NAME with that line,
fenced as a stranger's words. It is never an operator line: an ``@NAME`` or a
``/team`` in it opens no door (:meth:`melchior.plane.runner.Plane.webhook_line`
reads it at stranger trust), which is what the trust levels are for. The answer of the
turn it woke stays with the webhook's origin (the log and the agent's pane) and
wakes nobody, whatever the payload says.

Answers: 202 ``{"ok": true, "input": ID, "agent": NAME}``; 401 without the right
token (compared in constant time); 404 for an unknown agent (after the token, so the
roster is not probed); 413 over :data:`MAX_BODY` bytes; 400 for a body that is not
UTF-8 or not the JSON shape; 415 for another content type.
"""

from __future__ import annotations

import errno
import hmac
import json
import socket
from collections.abc import Callable
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

if TYPE_CHECKING:
    from collections.abc import Iterator

    from melchior.plane.runner import Plane

MAX_BODY = 64 * 1024


class WebhookPortError(OSError):
    """The webhook's port cannot be listened on; the message names it and the fix."""


def _error(status: int, reason: str) -> JSONResponse:
    return JSONResponse({"ok": False, "error": {"reason": reason}}, status_code=status)


def make_app(plane: Plane, token: str) -> Starlette:
    """The webhook's ASGI app for ``plane``, accepting ``token``."""
    expected = token.encode()

    async def lines(request: Request) -> JSONResponse:
        # an auth scheme is case-insensitive (RFC 9110 11.1): bearer, Bearer, BEARER
        scheme, _, given = request.headers.get("authorization", "").strip().partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            given.strip().encode("utf-8", "replace"), expected
        ):
            return _error(401, "a bearer token is required (Authorization: Bearer TOKEN)")
        agent = request.path_params["agent"]
        if agent not in plane.config.by_id:
            return _error(404, f"no agent {agent!r} on this plane")
        body = bytearray()
        async for chunk in request.stream():
            body.extend(chunk)
            if len(body) > MAX_BODY:
                return _error(413, f"a line is at most {MAX_BODY} bytes")
        try:
            text = bytes(body).decode("utf-8")
        except UnicodeDecodeError:
            return _error(400, "the body is not UTF-8")
        kind = request.headers.get("content-type", "text/plain").split(";")[0].strip().lower()
        if kind == "application/json":
            try:
                value: Any = json.loads(text)
            except ValueError:
                return _error(400, "the body is not JSON")
            if not isinstance(value, dict) or not isinstance(value.get("text"), str):
                return _error(400, 'a JSON body is {"text": "..."}')
            text = value["text"]
        elif kind != "text/plain":
            return _error(415, 'send text/plain, or application/json {"text": ...}')
        if not text.strip():
            return _error(400, "the line is empty")
        input_id = plane.webhook_line(agent, text, "webhook")
        return JSONResponse({"ok": True, "input": input_id, "agent": agent}, status_code=202)

    return Starlette(routes=[Route("/agents/{agent}/lines", lines, methods=["POST"])])


class _Server(uvicorn.Server):
    """uvicorn without its signal handlers: the plane's command owns SIGINT and SIGTERM."""

    @contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class Webhook:
    """The webhook server, bound at once (so its port is known) and served by :meth:`serve`."""

    def __init__(self, plane: Plane, token: str, host: str = "127.0.0.1", port: int = 0) -> None:
        if not token:
            raise ValueError("the webhook needs a token")
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        # IPPROTO_TCP spelled out: asyncio sets TCP_NODELAY on accepted connections only
        # when the listening socket says TCP (else each response waits a delayed ACK)
        self.sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.sock.bind((host, port))
            self.sock.listen(64)
        except OSError as exc:
            self.sock.close()
            why = "it is in use" if exc.errno == errno.EADDRINUSE else exc.strerror
            raise WebhookPortError(
                f"the webhook cannot listen on {host}:{port} ({why}); set port in the "
                "[webhook] table of PLANE.toml to another port (0: any free port)"
            ) from None
        self.port: int = self.sock.getsockname()[1]
        config = uvicorn.Config(
            make_app(plane, token), log_level="warning", lifespan="off", access_log=False
        )
        self.server = _Server(config)

    async def serve(self, ready: Callable[[int], None] | None = None) -> None:
        """Serve until :meth:`stop`."""
        if ready is not None:
            ready(self.port)
        try:
            await self.server.serve(sockets=[self.sock])
        finally:
            self.sock.close()

    def stop(self) -> None:
        self.server.should_exit = True
