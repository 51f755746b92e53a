"""A real webhook endpoint for push-notification tests: an HTTP server on loopback, in a
thread, that records every request and answers as the test tells it (down, slow, 500s).

``Hook(port=0)`` listens at once; ``Hook.reserve()`` gives a port with nothing listening
(a webhook that is down) that ``Hook(port=…)`` can start on later.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Seen:
    """One request as the webhook received it."""

    path: str
    headers: dict[str, str]
    body: bytes
    status: int

    @property
    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def delivery(self) -> str:
        return self.headers.get("x-mellan-delivery", "")


@dataclass
class Behaviour:
    """How the hook answers: ``statuses`` are used one per request, then ``status``;
    ``hold`` (while set... cleared) makes a request wait until released."""

    status: int = 200
    statuses: list[int] = field(default_factory=list)
    hold: threading.Event | None = None


class Hook:
    def __init__(self, port: int = 0, behaviour: Behaviour | None = None) -> None:
        self.behaviour = behaviour or Behaviour()
        self.requests: list[Seen] = []
        self.active = 0
        self.received = 0  # requests that arrived (answered or still held)
        self._lock = threading.Lock()
        hook = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length)
                with hook._lock:
                    hook.active += 1
                    hook.received += 1
                    b = hook.behaviour
                    status = b.statuses.pop(0) if b.statuses else b.status
                try:
                    if b.hold is not None:
                        b.hold.wait(30)
                    headers = {k.lower(): v for k, v in self.headers.items()}
                    with hook._lock:
                        hook.requests.append(Seen(self.path, headers, body, status))
                    self.send_response(status)
                    self.send_header("content-length", "2")
                    self.end_headers()
                    self.wfile.write(b"ok")
                finally:
                    with hook._lock:
                        hook.active -= 1

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @staticmethod
    def reserve() -> int:
        """A loopback port nobody listens on (yet)."""
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port: int = s.getsockname()[1]
        return port

    def ok(self) -> list[Seen]:
        """The requests answered 2xx, in the order they arrived."""
        with self._lock:
            return [r for r in self.requests if 200 <= r.status < 300]

    def wait_for(self, done: Callable[[list[Seen]], bool], timeout: float = 60) -> list[Seen]:
        """Until ``done(ok requests)``; the timeout is a hang guard, not a threshold."""
        deadline = time.monotonic() + timeout
        while True:
            got = self.ok()
            if done(got):
                return got
            if time.monotonic() > deadline:
                raise AssertionError(f"webhook never saw what was expected; got {got!r}")
            time.sleep(0.02)

    def close(self) -> None:
        if self.behaviour.hold is not None:
            self.behaviour.hold.set()
        self.server.shutdown()
        self.server.server_close()


def states(seen: list[Seen]) -> list[str]:
    """The task states the statusUpdates among ``seen`` carried, in order."""
    return [r.json["statusUpdate"]["status"]["state"] for r in seen if "statusUpdate" in r.json]


def ended(seen: list[Seen]) -> bool:
    return any(
        s in ("TASK_STATE_COMPLETED", "TASK_STATE_FAILED", "TASK_STATE_CANCELED")
        for s in states(seen)
    )
