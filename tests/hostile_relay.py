"""A stand-in relay that lies: it hands the real ``mellan receiver run`` crafted leases.

A real relay never hands out a caller name with a newline, a route with options nobody
checked, or a lease it committed long ago; a compromised one would. This speaks the
receiver API (``GET /api/whoami``, ``POST /api/receiver/claim``, the fenced writes under
``/api/receiver/tasks/ID/``) over real HTTP on loopback, from a thread of the test
process, and keeps every request so a test can see what the receiver reported.

``hand(lease, hold=S)`` queues a lease (any JSON, or raw bytes for the whole answer) for
the next claim; ``hold`` keeps the answer back S seconds *after* the claim arrived, as a
relay that committed a claim while the receiver was stopped would. Renewals answer ``ok``
unless ``renew_outcome`` says otherwise.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

AGENT = "private/ops"
CALLER = "local/codex"
CAPABILITY = "incident.inspect"
DEADLINE = 60.0  # for something broken, not a measured threshold


@dataclass
class Seen:
    method: str
    path: str
    body: Any


@dataclass
class Handout:
    answer: bytes
    hold: float = 0.0


@dataclass
class HostileRelay:
    agent: str = AGENT
    handouts: list[Handout] = field(default_factory=list)
    seen: list[Seen] = field(default_factory=list)
    renew_outcome: dict[str, Any] = field(default_factory=lambda: {"outcome": "ok"})
    cond: threading.Condition = field(default_factory=threading.Condition)
    server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}"

    def hand(self, lease: Any, *, hold: float = 0.0, waited: Any = None) -> None:
        """Queue a lease (a dict, or raw bytes standing for the whole claim answer); the
        answer says the claim was held ``waited`` seconds when that is given."""
        said: dict[str, Any] = {"leases": [lease]}
        if waited is not None:
            said["waited"] = waited
        answer = lease if isinstance(lease, bytes) else json.dumps(said).encode()
        with self.cond:
            self.handouts.append(Handout(answer, hold))
            self.cond.notify_all()

    def _next(self, wait: float) -> Handout | None:
        end = time.monotonic() + min(wait, 1.0)
        with self.cond:
            while not self.handouts:
                left = end - time.monotonic()
                if left <= 0:
                    return None
                self.cond.wait(left)
            return self.handouts.pop(0)

    def reports(self, task_id: str) -> list[Seen]:
        """The complete/fail reports for ``task_id``, in order."""
        ends = (f"/api/receiver/tasks/{task_id}/complete", f"/api/receiver/tasks/{task_id}/fail")
        return [s for s in list(self.seen) if s.path in ends]

    def wrote(self, task_id: str, verb: str) -> list[Seen]:
        path = f"/api/receiver/tasks/{task_id}/{verb}"
        return [s for s in list(self.seen) if s.path == path]

    def report(self, task_id: str, deadline: float = DEADLINE) -> Seen:
        """The first report for ``task_id``, waiting for it."""
        end = time.monotonic() + deadline
        while time.monotonic() < end:
            found = self.reports(task_id)
            if found:
                return found[0]
            time.sleep(0.05)
        raise AssertionError(f"no report for task {task_id}; saw {[s.path for s in self.seen]}")

    def claims(self) -> int:
        return sum(1 for s in list(self.seen) if s.path == "/api/receiver/claim")


def _handler(relay: HostileRelay) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _send(self, status: int, body: bytes) -> None:
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # it went away
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        def do_GET(self) -> None:
            relay.seen.append(Seen("GET", self.path, None))
            if self.path == "/api/whoami":
                who = {"kind": "agent", "subject": relay.agent, "workspace": "default"}
                self._send(200, json.dumps(who).encode())
            else:
                self._send(404, b'{"error":{"code":"not-found","reason":"no such path"}}')

        def do_POST(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(length)
            try:
                body = json.loads(raw) if raw else {}
            except ValueError:
                body = raw
            relay.seen.append(Seen("POST", self.path, body))
            if self.path == "/api/receiver/claim":
                wait = float(body.get("wait", 0)) if isinstance(body, dict) else 0.0
                handout = relay._next(wait)
                if handout is None:
                    self._send(200, b'{"leases":[]}')
                    return
                time.sleep(handout.hold)
                self._send(200, handout.answer)
            elif self.path.endswith("/renew"):
                self._send(200, json.dumps(relay.renew_outcome).encode())
            else:
                self._send(200, b'{"outcome":"ok"}')

    return Handler


def start() -> HostileRelay:
    relay = HostileRelay()
    relay.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(relay))
    relay.server.daemon_threads = True
    threading.Thread(target=relay.server.serve_forever, daemon=True).start()
    return relay


def stop(relay: HostileRelay) -> None:
    if relay.server is not None:
        relay.server.shutdown()
        relay.server.server_close()


@contextlib.contextmanager
def serving() -> Iterator[HostileRelay]:
    relay = start()
    try:
        yield relay
    finally:
        stop(relay)


def lease(
    *,
    adapter: str = "command",
    options: dict[str, Any] | None = None,
    cwd: str | None = None,
    route: Any = "default",
    task_id: str | None = None,
    text: str = "hello",
    epoch: int = 1,
    **task: Any,
) -> dict[str, Any]:
    """A well-formed lease (what an honest relay sends), with any field replaced."""
    tid = task_id or str(uuid.uuid4())
    body: dict[str, Any] = {
        "id": tid,
        "workspace": "default",
        "caller": CALLER,
        "receiver": AGENT,
        "capability": CAPABILITY,
        "context_id": "ctx-1",
        "state": "leased",
        "turn": 1,
        "attempt": 1,
        "max_attempts": 3,
        "metadata": None,
        "payload": {"messageId": uuid.uuid4().hex, "role": "ROLE_USER", "parts": [{"text": text}]},
    }
    body.update(task)
    if route == "default":
        route = {
            "id": "rt_" + uuid.uuid4().hex[:20],
            "capability": CAPABILITY,
            "adapter": adapter,
            "session": None,
            "cwd": cwd,
            "profile": None,
            "options": options or {},
        }
    return {"task": body, "epoch": epoch, "expires_at": "2026-12-02T00:00:30Z", "route": route}
