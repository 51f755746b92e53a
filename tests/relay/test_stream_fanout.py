"""Streams of one task share one store reader per replica (issue 23): a real relay over
loopback HTTP on both backends, the task driven step by step through the receiver API.

Reads are counted by the relay itself (``mellan_stream_reads_total`` at ``/metrics``),
never by timing: N streams on one task make one read per change, not N. All streams see
the same events in order, ending with the terminal state; a client that stops reading
holds nobody else up and, once it reads again, gets every event it missed in order; and
when the last stream of a task leaves, its reader is gone.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable
from typing import Any

import httpx

from a2a_kit import Server, World, running
from melchior.mellan.client.receiver import ReceiverClient
from storekit import db_url_fixture  # noqa: F401
from streams_kit import POLL, eventually, metric, queued_task


class Listener:
    """One SubscribeToTask client in a thread, keeping every event it is sent."""

    def __init__(self, server: Server, world: World, task_id: str) -> None:
        self.url = f"{server.base()}/tasks/{task_id}:subscribe"
        self.headers = {"A2A-Version": "1.0", "Authorization": f"Bearer {world.tokens['caller']}"}
        self.events: list[Any] = []
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        with httpx.stream("GET", self.url, headers=self.headers, timeout=90) as s:
            for line in s.iter_lines():
                if line.startswith("data: "):
                    self.events.append(json.loads(line[6:]))

    def done(self) -> bool:
        return not self.thread.is_alive()


def states(events: list[Any]) -> list[str]:
    return [e["statusUpdate"]["status"]["state"] for e in events if "statusUpdate" in e]


def chunks(events: list[Any]) -> list[str]:
    return [
        e["artifactUpdate"]["artifact"]["parts"][0]["text"] for e in events if "artifactUpdate" in e
    ]


def test_n_streams_make_one_store_read_per_change(db_url: str) -> None:
    n = 10
    with running(db_url, receiver=False, poll=POLL) as (server, world, _):
        task_id = queued_task(server, world)
        listeners = [Listener(server, world, task_id) for _ in range(n)]
        eventually(lambda: all(len(x.events) >= 1 for x in listeners), "no snapshots")
        assert metric(server, world, "mellan_stream_readers", kind="a2a") == 1
        assert metric(server, world, "mellan_stream_followers", kind="a2a") == n
        before = metric(server, world, "mellan_stream_reads_total", kind="a2a")
        rc = ReceiverClient(server.url, world.tokens["receiver"])
        try:
            (lease,) = rc.claim(limit=1, lease_seconds=60)
            epoch = lease.epoch
            assert epoch is not None

            def chunk(i: int) -> Callable[[], Any]:
                artifact = {"artifactId": "out", "parts": [{"text": f"c{i}"}]}
                body = {"artifact": artifact, "append": i > 0}
                return lambda: rc.progress(task_id, epoch, "artifact", body)

            steps: list[Callable[[], Any]] = [
                lambda: rc.progress(task_id, epoch, "status", {"message": {"parts": []}}),
                *(chunk(i) for i in range(3)),
                lambda: rc.complete(task_id, epoch, {"message": {"parts": [{"text": "ok"}]}}),
            ]
            changes = 1  # the claim
            eventually(lambda: all(len(x.events) >= 2 for x in listeners), "no working state")
            for step in steps:
                seen = [len(x.events) for x in listeners]
                step()
                changes += 1
                eventually(
                    lambda seen=seen: all(  # type: ignore[misc]
                        len(x.events) > k or x.done() for x, k in zip(listeners, seen, strict=True)
                    ),
                    "a stream missed a change",
                )
        finally:
            rc.close()
        eventually(lambda: all(x.done() for x in listeners), "streams did not end")
        reads = metric(server, world, "mellan_stream_reads_total", kind="a2a") - before
        # One read per change (a wake-up may be doubled), never one per stream.
        assert reads <= 2 * changes < n * changes, reads
        first = listeners[0].events
        assert states(first)[-1] == "TASK_STATE_COMPLETED"
        assert chunks(first) == ["c0", "c1", "c2"]
        for x in listeners[1:]:
            assert x.events == first
        eventually(
            lambda: metric(server, world, "mellan_stream_readers", kind="a2a") == 0,
            "the reader outlived its task",
        )
        assert metric(server, world, "mellan_stream_followers", kind="a2a") == 0


def test_a_stalled_client_holds_nobody_up_and_misses_nothing(db_url: str) -> None:
    """One client subscribes and stops reading (a tiny receive buffer, so the relay's
    writes to it block); megabytes of events later the others have all of them and their
    terminal state. Then it reads: every event in order, the terminal state last."""
    with running(db_url, receiver=False, poll=POLL) as (server, world, _):
        task_id = queued_task(server, world)
        stalled = raw_subscribe(server, world, task_id, rcvbuf=4096)
        listeners = [Listener(server, world, task_id) for _ in range(3)]
        eventually(lambda: all(x.events for x in listeners), "no snapshots")
        eventually(
            lambda: metric(server, world, "mellan_stream_followers", kind="a2a") == 4,
            "the stalled client did not subscribe",
        )
        rc = ReceiverClient(server.url, world.tokens["receiver"])
        big = "x" * 200_000
        count = 48  # ~10 MB: past any socket buffer and the server's write buffer
        try:
            (lease,) = rc.claim(limit=1, lease_seconds=60)
            epoch = lease.epoch
            assert epoch is not None
            for i in range(count):
                rc.progress(task_id, epoch, "artifact", {
                    "artifact": {"artifactId": "out", "parts": [{"text": f"{i}:{big}"}]},
                    "append": i > 0,
                })  # fmt: skip
            rc.complete(task_id, epoch, {"message": {"parts": [{"text": "done"}]}})
        finally:
            rc.close()
        eventually(lambda: all(x.done() for x in listeners), "a stalled client held others up")
        want = [f"{i}:{big}" for i in range(count)]
        for x in listeners:
            assert chunks(x.events) == want
            assert states(x.events)[-1] == "TASK_STATE_COMPLETED"
        # The stalled one has not had it all yet (else it was not stalled): it is still
        # followed; now it reads, and gets everything in order.
        assert metric(server, world, "mellan_stream_followers", kind="a2a") == 1
        stalled.settimeout(60)
        raw = bytearray()
        while chunk := stalled.recv(1 << 20):
            raw += chunk
        stalled.close()
        body = raw.split(b"\r\n\r\n", 1)[1].decode()
        events = [
            json.loads(line[6:])
            for line in body.replace("\r\n", "\n").split("\n")
            if line.startswith("data: ")
        ]
        assert events[0]["task"]["id"] == task_id
        assert chunks(events) == want
        assert states(events)[-1] == "TASK_STATE_COMPLETED"


def raw_subscribe(server: Server, world: World, task_id: str, rcvbuf: int = 0) -> socket.socket:
    """A SubscribeToTask request on a bare socket, whose reading the test controls."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    host, port = server.url.removeprefix("http://").split(":")
    sock.connect((host, int(port)))
    path = server.base().removeprefix(server.url) + f"/tasks/{task_id}:subscribe"
    head = (
        f"GET {path} HTTP/1.1\r\nHost: {host}\r\nA2A-Version: 1.0\r\n"
        f"Authorization: Bearer {world.tokens['caller']}\r\nConnection: close\r\n\r\n"
    )
    sock.sendall(head.encode())
    return sock


def test_the_reader_goes_with_its_last_follower(db_url: str) -> None:
    with running(db_url, receiver=False, poll=POLL) as (server, world, _):
        task_id = queued_task(server, world)
        for round_ in range(2):  # the second round starts a fresh reader
            socks = [raw_subscribe(server, world, task_id) for _ in range(3)]
            for sock in socks:  # the snapshot
                sock.settimeout(60)
                got = b""
                while b"data: " not in got:
                    got += sock.recv(65536)
            assert metric(server, world, "mellan_stream_readers", kind="a2a") == 1, round_
            assert metric(server, world, "mellan_stream_followers", kind="a2a") == 3
            socks[0].close()
            eventually(
                lambda: metric(server, world, "mellan_stream_followers", kind="a2a") == 2,
                "a client gone is still followed",
            )
            assert metric(server, world, "mellan_stream_readers", kind="a2a") == 1
            for sock in socks[1:]:
                sock.close()
            eventually(
                lambda: metric(server, world, "mellan_stream_readers", kind="a2a") == 0,
                "the reader outlived its followers",
            )
            assert metric(server, world, "mellan_stream_followers", kind="a2a") == 0
