"""melchior.wire.server: the socket rules of one connection, on a real unix socket.

What moving from asyncio streams to a buffered protocol must not change: one reply per
call in the order of the calls (whether a call is answered at once or waits), events
unanswered, refusals that keep the connection or close it, pipelined calls answered
before a half-close ends the connection, a reader that stops reading its replies
stopping the server from reading more, and many clients at once.
"""

from __future__ import annotations

import asyncio
import os
import socket
import struct
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from melchior.wire import Refused, call, event, frames
from melchior.wire.codec import JSONObject
from melchior.wire.server import Answerer


class Peer:
    """A server on its own loop in a thread: ``now`` answers ``fast``; ``slow`` waits."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.events: list[JSONObject] = []
        self.answerers: list[Answerer] = []
        self.release = threading.Event()
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, daemon=True)
        self._thread.start()
        assert self._ready.wait(10)

    def now(self, verb: str, args: list[Any], msg: JSONObject) -> list[Any] | None:
        if verb == "fast":
            return ["fast", *args]
        if verb == "refuse-now":
            raise Refused("refused at once", code="test")
        return None

    async def on_call(self, verb: str, args: list[Any], msg: JSONObject) -> list[Any]:
        if verb == "slow":
            await asyncio.get_running_loop().run_in_executor(None, self.release.wait, 10)
            return ["slow", *args]
        if verb == "events":
            return list(self.events)
        if verb == "big":
            return ["x" * int(args[0])]
        raise Refused(f"unknown verb {verb!r}", code="unknown-verb")

    async def on_event(self, msg: JSONObject) -> None:
        await asyncio.sleep(0)
        self.events.append(msg)

    def _factory(self) -> Answerer:
        a = Answerer(self.on_call, self.on_event, now=self.now, limit=4096)
        self.answerers.append(a)
        return a

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.server = self.loop.run_until_complete(
            self.loop.create_unix_server(self._factory, path=os.fspath(self.path))
        )
        self._ready.set()
        self.loop.run_forever()

    def close(self) -> None:
        self.release.set()

        async def stop() -> None:
            self.server.close()
            await self.server.wait_closed()

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)


@pytest.fixture
def peer() -> Iterator[Peer]:
    d = Path(tempfile.mkdtemp(prefix="ms-", dir="/tmp"))
    p = Peer(d / "s")
    yield p
    p.close()
    (d / "s").unlink(missing_ok=True)
    d.rmdir()


def connect(peer: Peer) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect(os.fspath(peer.path))
    return s


def replies(s: socket.socket, n: int) -> list[JSONObject]:
    out = []
    for _ in range(n):
        got = frames.recv(s)
        assert got is not None
        out.append(got)
    return out


def test_pipelined_calls_are_answered_in_order_whether_or_not_they_wait(peer: Peer) -> None:
    with connect(peer) as s:
        batch = [
            call("fast", [1], id="1"),
            call("slow", [2], id="2"),
            event("seen", n=1),
            call("fast", [3], id="3"),
            call("refuse-now", [], id="4"),
            call("nope", [], id="5"),
            call("events", [], id="6"),
        ]
        s.sendall(b"".join(frames.pack(m) for m in batch))
        threading.Timer(0.2, peer.release.set).start()
        got = replies(s, 6)
    assert [r["id"] for r in got] == ["1", "2", "3", "4", "5", "6"]
    assert got[0]["result"] == ["fast", 1]
    assert got[1]["result"] == ["slow", 2]
    assert got[2]["result"] == ["fast", 3]
    assert got[3]["error"]["code"] == "test"
    assert got[4]["error"]["code"] == "unknown-verb"
    # the event was handled (awaited) in its turn, before the call after it
    assert got[5]["result"] == [{"event": "seen", "n": 1}]


def test_a_bad_body_is_refused_and_the_connection_carries_on(peer: Peer) -> None:
    with connect(peer) as s:
        body = b'{"call":"fast","call":"x"}'
        s.sendall(struct.pack(">I", len(body)) + body + frames.pack(call("fast", [], id="ok")))
        bad, good = replies(s, 2)
    assert bad["ok"] is False
    assert bad["error"]["code"] == "bad-json"
    assert good["id"] == "ok"


@pytest.mark.parametrize("header", [struct.pack(">I", 0), struct.pack(">I", 4097)])
def test_lost_framing_is_refused_then_the_connection_closes(peer: Peer, header: bytes) -> None:
    with connect(peer) as s:
        s.sendall(frames.pack(call("fast", [], id="before")) + header + b"{}")
        before, refusal = replies(s, 2)
        assert before["id"] == "before"
        assert refusal["error"]["code"] in ("bad-frame", "too-large")
        assert frames.recv(s) is None  # closed


def test_a_half_close_after_pipelined_calls_still_gets_every_reply(peer: Peer) -> None:
    with connect(peer) as s:
        s.sendall(frames.pack(call("slow", [], id="a")) + frames.pack(call("fast", [], id="b")))
        s.shutdown(socket.SHUT_WR)
        threading.Timer(0.1, peer.release.set).start()
        assert [r["id"] for r in replies(s, 2)] == ["a", "b"]
        assert frames.recv(s) is None


def test_a_frame_cut_by_the_peer_closing_is_refused(peer: Peer) -> None:
    with connect(peer) as s:
        s.sendall(struct.pack(">I", 100) + b'{"call":')
        s.shutdown(socket.SHUT_WR)
        (refusal,) = replies(s, 1)
        assert refusal["error"]["code"] == "truncated"
        assert frames.recv(s) is None


def test_a_peer_that_does_not_read_its_replies_stops_the_server_reading(peer: Peer) -> None:
    """Back-pressure: replies pile up only to the transport's high-water mark plus what
    one read held; then the server reads no more until the peer reads."""
    s = connect(peer)
    s.setblocking(False)
    one = frames.pack(call("big", [3000]))
    total = 40_000  # far more replies (120 MB) than any buffer should hold
    sent, stalled = 0, 0
    while sent < total and stalled < 20:  # stop once the server has read nothing for ~1 s
        try:
            s.send(one)  # frames this small go whole or not at all
            sent += 1
            stalled = 0
        except BlockingIOError:
            stalled += 1
            threading.Event().wait(0.05)  # let the server's thread run
    assert sent < total, "the server kept reading while nobody read its replies"

    async def buffered() -> int:
        return sum(a._transport.get_write_buffer_size() for a in peer.answerers if a._transport)

    held = asyncio.run_coroutine_threadsafe(buffered(), peer.loop).result(10)
    assert held < 64 * 1024 * 1024 // 8  # bounded: far less than what was asked for
    s.setblocking(True)
    s.settimeout(10)
    got = replies(s, sent)
    assert all(r["result"] == ["x" * 3000] for r in got)
    s.close()


def test_many_clients_at_once(peer: Peer) -> None:
    errors: list[BaseException] = []

    def client(i: int) -> None:
        try:
            with connect(peer) as s:
                for j in range(50):
                    frames.send(s, call("fast", [i, j], id=f"{i}.{j}"))
                    got = frames.recv(s)
                    assert got is not None
                    assert got["result"] == ["fast", i, j]
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == []
