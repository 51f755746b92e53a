"""A real relay and a real receiver for the A2A tests.

The relay is the production app (``create_app``) served by uvicorn on a loopback port
in a background thread, on a real store (a SQLite file, or PostgreSQL for the replica
tests). The receiver is a loop over the receiver API's typed client — claim, progress,
renew, complete/fail/cancel-ack — so every task a test sends is served exactly the way
a deployed receiver serves it, never by writing to the database behind the relay's back.

The receiver's behaviour is chosen by the first word of the task's first text part:

* ``echo …``   completes with a message ``echo: …`` and an artifact with the same text;
* ``mirror``   completes with one artifact whose parts are the caller's parts, verbatim;
* ``steps N``  reports a status message and N artifact chunks, then completes;
* ``hold``     reports a status, then holds the lease (renewing) until the test calls
               :meth:`Receiver.release` or the task is cancelled (then cancel-acks);
* ``ask``      completes with ``input_required`` and the question "which one?";
* ``fail``     fails without retry, error "it broke";
* ``say …``    answers with a message and no task of its own (``asMessage``).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import uvicorn

from melchior.mellan.client.receiver import ReceiverClient, ReceiverError
from melchior.mellan.relay.auth import hash_token, new_token
from melchior.mellan.relay.context import Relay
from melchior.mellan.relay.notify import LocalNotifier, Notifier
from melchior.mellan.relay.server.app import create_app
from melchior.mellan.relay.store import open_store
from melchior.mellan.relay.store.base import Capability, CredentialKind, Store
from melchior.mellan.relay.workers.push import Pusher

WS = "acme"
CALLER = "local/codex"
RECEIVER = "private/ops"
OTHER = "local/other"
CAPS = ("incident.inspect", "incident.fix")


class Server:
    """One relay replica: the real app under uvicorn on 127.0.0.1, in a thread."""

    def __init__(
        self,
        db_url: str,
        poll: float = 0.2,
        notifier: Notifier | None = None,
        push: dict[str, Any] | None = None,
        relay: dict[str, Any] | None = None,
    ) -> None:
        self.notifier = notifier or LocalNotifier()
        self.store = open_store(db_url, publish=self.notifier.publish)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # no delayed-ACK stalls
        sock.bind(("127.0.0.1", 0))
        sock.listen(512)
        self.sock = sock
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        self.relay = Relay(
            store=self.store, notifier=self.notifier, public_url=self.url, poll_interval=poll,
            **(relay or {}),
        )  # fmt: skip
        if push is not None:  # the push deliverer with a test's pace (see relay/workers/push.py)
            self.relay.pusher = Pusher(self.relay, **push)
        config = uvicorn.Config(
            create_app(self.relay), log_level="warning", lifespan="on", timeout_graceful_shutdown=1
        )
        self.server = uvicorn.Server(config)
        self.peer: Server = self  # another replica on the same database, if any
        self.thread = threading.Thread(
            target=lambda: asyncio.run(self.server.serve(sockets=[sock])), daemon=True
        )
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("relay did not start")
            time.sleep(0.01)

    def base(self, agent: str = RECEIVER, ws: str = WS) -> str:
        return f"{self.url}/a2a/{ws}/{agent}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()
        self.store.close()


@dataclass
class World:
    """Workspace ``acme``: caller ``local/codex`` granted incident.inspect on ``private/ops``;
    ``local/other`` granted nothing; an owner; workspace ``rival`` with its own agent."""

    tokens: dict[str, str] = field(default_factory=dict)
    grant_ids: dict[str, str] = field(default_factory=dict)
    credential_ids: dict[str, str] = field(default_factory=dict)


def credential(store: Store, ws: str, kind: CredentialKind, subject: str) -> tuple[str, str]:
    token = new_token()
    cid = store.add_credential(ws, kind, subject, hash_token(token))
    return token, cid


def seed(store: Store) -> World:
    world = World()
    store.ensure_workspace(WS)
    store.ensure_workspace("rival")
    store.add_agent(WS, CALLER, "the caller", [Capability("code.review", "reviews code")])
    store.add_agent(
        WS,
        RECEIVER,
        "operations agent",
        [Capability(CAPS[0], "inspect an incident"), Capability(CAPS[1], "fix an incident")],
    )
    store.add_agent(WS, OTHER, "another agent", [])
    store.add_agent("rival", "rival/agent", "someone else's", [])
    world.grant_ids["caller"] = store.add_grant(WS, CALLER, RECEIVER, [CAPS[0]]).id
    for name, (ws, kind, subject) in {
        "caller": (WS, CredentialKind.AGENT, CALLER),
        "receiver": (WS, CredentialKind.AGENT, RECEIVER),
        "other": (WS, CredentialKind.AGENT, OTHER),
        "owner": (WS, CredentialKind.OWNER, "alice"),
        "rival": ("rival", CredentialKind.AGENT, "rival/agent"),
    }.items():
        world.tokens[name], world.credential_ids[name] = credential(store, ws, kind, subject)
    return world


def _first_text(payload: Any) -> str:
    for part in (payload or {}).get("parts", []):
        if isinstance(part, dict) and isinstance(part.get("text"), str):
            return str(part["text"])
    return ""


class Receiver:
    """The receiver-side loop, on the receiver API, in a thread."""

    def __init__(self, url: str, token: str, *, renew_every: float = 0.2) -> None:
        self.client = ReceiverClient(url, token)
        self.renew_every = renew_every
        self._stop = threading.Event()
        self._release: dict[str, threading.Event] = {}
        self._lock = threading.Lock()
        self.handled: list[str] = []
        self.cancelled: list[str] = []
        self.errors: list[BaseException] = []
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def release(self, task_id: str) -> None:
        self._gate(task_id).set()

    def _gate(self, task_id: str) -> threading.Event:
        with self._lock:
            return self._release.setdefault(task_id, threading.Event())

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(timeout=10)
        self.client.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                leases = self.client.claim(wait=0.5, lease_seconds=10)
            except ReceiverError as exc:
                if self._stop.is_set():
                    return
                self.errors.append(exc)
                time.sleep(0.1)
                continue
            for lease in leases:
                threading.Thread(target=self._serve, args=(lease,), daemon=True).start()

    def _serve(self, lease: Any) -> None:
        try:
            self._handle(lease.task_id, lease.epoch, lease.payload)
        except BaseException as exc:  # surfaced by tests that check receiver.errors
            self.errors.append(exc)

    def _handle(self, tid: str, epoch: int, payload: Any) -> None:
        rc = self.client
        text = _first_text(payload)
        word, _, rest = text.partition(" ")
        self.handled.append(tid)
        if word == "echo":
            reply = f"echo: {rest}"
            rc.complete(
                tid,
                epoch,
                {
                    "message": {"role": "ROLE_AGENT", "parts": [{"text": reply}]},
                    "artifacts": [
                        {"artifactId": "echo", "name": "echo", "parts": [{"text": reply}]}
                    ],
                },
            )
        elif word == "mirror":
            parts = payload.get("parts", [])
            rc.complete(
                tid,
                epoch,
                {"artifacts": [{"artifactId": "mirror", "parts": parts,
                                "metadata": payload.get("metadata", {})}]},
            )  # fmt: skip
        elif word == "steps":
            n = int(rest or "2")
            rc.progress(tid, epoch, "status", {"message": {"parts": [{"text": "working"}]}})
            for i in range(n):
                rc.progress(
                    tid,
                    epoch,
                    "artifact",
                    {
                        "artifact": {"artifactId": "out", "parts": [{"text": f"chunk-{i}"}]},
                        "append": i > 0,
                        "lastChunk": i == n - 1,
                    },
                )
            rc.complete(tid, epoch, {"message": {"parts": [{"text": f"{n} steps done"}]}})
        elif word == "hold":
            rc.progress(tid, epoch, "status", {"message": {"parts": [{"text": "holding"}]}})
            gate = self._gate(tid)
            while not gate.wait(self.renew_every):
                if self._stop.is_set():
                    return
                out = rc.renew(tid, epoch, lease_seconds=10)
                if out.lease_lost:
                    self.cancelled.append(tid)
                    with contextlib.suppress(ReceiverError):
                        rc.cancel_ack(tid, epoch)
                    return
            rc.complete(tid, epoch, {"message": {"parts": [{"text": "released"}]}})
        elif word == "ask":
            rc.complete(
                tid, epoch, {"message": {"parts": [{"text": "which one?"}]}}, input_required=True
            )
        elif word == "fail":
            rc.fail(tid, epoch, "it broke", retryable=False)
        elif word == "say":  # a direct reply: a message and no task of its own
            said: dict[str, Any] = {"role": "ROLE_AGENT", "parts": [{"text": rest}]}
            rc.complete(tid, epoch, {"message": said, "asMessage": True})
        else:
            rc.complete(tid, epoch, {"message": {"parts": [{"text": f"ok: {text}"}]}})


@contextlib.contextmanager
def running(
    db_url: str,
    *,
    receiver: bool = True,
    push: dict[str, Any] | None = None,
    poll: float = 0.2,
    grpc: bool = False,
) -> Iterator[tuple[Server, World, Receiver | None]]:
    server = Server(db_url, poll=poll, push=push, relay=grpc_on() if grpc else None)
    world = seed(server.store)
    rx = Receiver(server.url, world.tokens["receiver"]) if receiver else None
    try:
        yield server, world, rx
    finally:
        if rx is not None:
            rx.stop()
        server.stop()


def message(text: str, **extra: Any) -> dict[str, Any]:
    msg: dict[str, Any] = {
        "messageId": secrets.token_hex(8),
        "role": "ROLE_USER",
        "parts": [{"text": text}],
    }
    msg.update(extra)
    return msg


@contextlib.contextmanager
def pg_database() -> Iterator[str]:
    """A fresh PostgreSQL database for a whole module (``pg_url`` is per test)."""
    from conftest import fresh_pg_database

    with fresh_pg_database() as url:
        yield url


def grpc_on() -> dict[str, Any]:
    """Relay settings that serve the A2A gRPC binding on a free loopback port."""
    from melchior.mellan.relay.surfaces.a2a.grpc_binding import GrpcEndpoint

    return {"grpc": GrpcEndpoint("127.0.0.1", 0)}


@contextlib.contextmanager
def replicas(db_url: str, *, grpc: bool = False) -> Iterator[tuple[Server, World, Receiver]]:
    """Two relay replicas on one PostgreSQL database, woken across replicas by LISTEN/NOTIFY
    as deployed: callers use the first (its ``peer`` is the second, for streams on a third
    connection), the receiver the second."""
    from melchior.mellan.relay.server.pgnotify import PgNotifier

    front = Server(db_url, notifier=PgNotifier(db_url), relay=grpc_on() if grpc else None)
    back = Server(db_url, notifier=PgNotifier(db_url), relay=grpc_on() if grpc else None)
    front.peer = back
    world = seed(front.store)
    rx = Receiver(back.url, world.tokens["receiver"])
    try:
        yield front, world, rx
    finally:
        rx.stop()
        back.stop()
        front.stop()
