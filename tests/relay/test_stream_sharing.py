"""A task's streams share one build and one encoding of each update (issue 23): the frame a
JSON-RPC stream sends is the request's id in bytes around the update's shared bytes, and
a publish wakes the streams a batch per event-loop pass, never all in one.

The relay tests run a real relay over loopback HTTP on both backends, with raw SSE
clients (httpx, the exact bytes) and the a2a-sdk's own client on each binding: every
stream of a task gets the same events, byte for byte but for its own id; a stream opened
mid-task gets what it missed (in its snapshot) and then the same frames as the others;
the store reads stay one per change, however many streams follow.
"""

from __future__ import annotations

import asyncio
import json
import math
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
from a2a.client import ClientConfig, create_client
from a2a.types import StreamResponse, SubscribeToTaskRequest
from a2a.utils.constants import TransportProtocol
from google.protobuf import json_format
from hypothesis import given
from hypothesis import strategies as st

from a2a_kit import Server, World, running
from melchior.mellan.client.receiver import ReceiverClient
from melchior.mellan.relay import watch
from melchior.mellan.relay.metrics import Metrics
from melchior.mellan.relay.notify import LocalNotifier
from melchior.mellan.relay.store.base import Task, TaskEvent, TaskState
from melchior.mellan.relay.surfaces.a2a import jsonrpc, sse, tasks
from melchior.mellan.relay.watch import Watches
from storekit import db_url_fixture  # noqa: F401
from streams_kit import POLL, eventually, metric, queued_task

# -- the envelope: bytes around shared bytes are the whole response ---------------------------

_text = st.text(  # no lone surrogates: not UTF-8, so never in a stored event
    st.characters(exclude_categories=("Cs",)) | st.sampled_from('\u2028\u2029"\\\n')
)
_json = st.recursive(
    st.none() | st.booleans() | st.integers() | _text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_text, inner, max_size=4),
    max_leaves=12,
)


@given(rid=st.none() | st.integers() | _text, value=_json)
def test_the_jsonrpc_frame_is_the_id_around_the_shared_bytes(rid: Any, value: Any) -> None:
    event = sse.Encoded({"statusUpdate": value})
    whole = sse.frame({"jsonrpc": "2.0", "id": rid, "result": {"statusUpdate": value}})
    assert jsonrpc.stream_envelope(rid).frame(event) == whole
    assert sse.BARE.frame(event) == sse.frame({"statusUpdate": value})
    assert event.data() is event.data()  # encoded once, then shared
    assert b"\n" not in whole[:-2]  # one data line, whatever the strings held


# -- the reader wakes its followers a batch per loop pass ------------------------------------


def test_a_publish_wakes_followers_a_batch_per_loop_pass() -> None:
    """With every follower waiting on one future, all of them would resume in the same
    loop pass (and write their frames in one burst); here no pass resumes more than
    :data:`~watch.WAKE_BATCH`, and every follower gets the new value."""
    n = 3 * watch.WAKE_BATCH + 7

    async def main() -> None:
        loop = asyncio.get_running_loop()
        notifier = LocalNotifier()
        await notifier.start()
        watches = Watches(notifier, 3600.0, Metrics())

        async def look(prev: int | None) -> AsyncIterator[int]:
            yield 1 if prev is None else prev + 1

        passes = 0

        def count() -> None:  # one increment per loop pass
            nonlocal passes
            passes += 1
            loop.call_soon(count)

        woke: list[tuple[int, int]] = []
        waiting = 0
        all_waiting = asyncio.Event()

        async def follower() -> None:
            nonlocal waiting
            f = watches.follow(("k", 1), "t", look, lambda v: v >= 2)
            try:
                await f.arm()
                assert f.latest() == 1
                waiting += 1
                if waiting == n:  # the others are in wait() already, this one is next
                    all_waiting.set()
                assert await f.wait(3600.0)
                woke.append((passes, f.latest()))
            finally:
                f.close()

        async with asyncio.TaskGroup() as group:
            for _ in range(n):
                group.create_task(follower())
            await all_waiting.wait()
            loop.call_soon(count)
            notifier.publish("t")
        await notifier.stop()
        assert [v for _, v in woke] == [2] * n
        per_pass: dict[int, int] = {}
        for at, _ in woke:
            per_pass[at] = per_pass.get(at, 0) + 1
        assert max(per_pass.values()) <= watch.WAKE_BATCH, per_pass
        assert len(per_pass) >= math.ceil(n / watch.WAKE_BATCH), per_pass

    asyncio.run(asyncio.wait_for(main(), 60))


# -- a real relay: many streams of one task -------------------------------------------------


class Raw:
    """One stream on a bare HTTP client in a thread: every SSE frame's exact bytes."""

    def __init__(self, server: Server, world: World, task_id: str, rid: Any = None) -> None:
        auth = {"A2A-Version": "1.0", "Authorization": f"Bearer {world.tokens['caller']}"}
        if rid is None:  # the HTTP+JSON binding
            self.args: dict[str, Any] = {
                "method": "GET", "url": f"{server.base()}/tasks/{task_id}:subscribe",
                "headers": auth,
            }  # fmt: skip
        else:
            body = {"jsonrpc": "2.0", "id": rid, "method": "SubscribeToTask",
                    "params": {"id": task_id}}  # fmt: skip
            self.args = {"method": "POST", "url": server.base(), "json": body,
                         "headers": {**auth, "Content-Type": "application/json"}}  # fmt: skip
        self.rid = rid
        self.frames: list[bytes] = []
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        buf = b""
        with httpx.stream(**self.args, timeout=90) as s:
            assert s.status_code == 200, s.read()
            for chunk in s.iter_bytes():
                buf += chunk
                *whole, buf = buf.split(b"\n\n")
                self.frames += [f + b"\n\n" for f in whole if f.startswith(b"data: ")]

    def results(self) -> list[bytes]:
        """Each frame's ``StreamResponse`` bytes: the envelope checked and taken off."""
        head = jsonrpc.stream_envelope(self.rid).head if self.rid is not None else b""
        tail = b"}" if self.rid is not None else b""
        out = []
        for f in self.frames:
            data = f.removeprefix(b"data: ").removesuffix(b"\n\n")
            assert data.startswith(head), (self.rid, data[:80])
            assert data.endswith(tail), (self.rid, data[-80:])
            out.append(data[len(head) : len(data) - len(tail)])
        return out

    def done(self) -> bool:
        return not self.thread.is_alive()


class Sdk:
    """One SubscribeToTask through the a2a-sdk's client on ``binding``, in a thread."""

    def __init__(self, server: Server, world: World, task_id: str, binding: str) -> None:
        self.events: list[StreamResponse] = []
        self.error: BaseException | None = None
        self._args = (server, world, task_id, binding)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            asyncio.run(asyncio.wait_for(self._follow(*self._args), 90))
        except BaseException as exc:  # reported by the test
            self.error = exc

    async def _follow(self, server: Server, world: World, task_id: str, binding: str) -> None:
        http = httpx.AsyncClient(
            headers={"Authorization": f"Bearer {world.tokens['caller']}"}, timeout=90
        )
        config = ClientConfig(
            httpx_client=http, supported_protocol_bindings=[binding], streaming=True
        )
        client = await create_client(server.base(), client_config=config)
        try:
            async for ev in client.subscribe(SubscribeToTaskRequest(id=task_id)):
                self.events.append(ev)
        finally:
            await client.close()

    def done(self) -> bool:
        return not self.thread.is_alive()


def parsed(data: bytes) -> StreamResponse:
    return json_format.Parse(data.decode(), StreamResponse())


def drive(server: Server, world: World, task_id: str, steps: int, then: Callable[[], None]) -> None:
    """Claim the task, write ``steps`` artifact chunks (calling ``then`` halfway), finish it."""
    rc = ReceiverClient(server.url, world.tokens["receiver"])
    try:
        (lease,) = rc.claim(limit=1, lease_seconds=60)
        epoch = lease.epoch
        assert epoch is not None
        for i in range(steps):
            if i == steps // 2:
                then()
            rc.progress(task_id, epoch, "artifact", {
                "artifact": {"artifactId": "out", "parts": [{"text": f"c{i}\u2028"}]},
                "append": i > 0,
            })  # fmt: skip
        rc.complete(task_id, epoch, {"message": {"parts": [{"text": "done"}]}})
    finally:
        rc.close()


def test_every_stream_of_a_task_gets_the_same_bytes_under_its_own_id(db_url: str) -> None:
    ids: list[Any] = [1, 2, "three", "id \u2028 with a line separator", 0, -7]
    with running(db_url, receiver=False, poll=POLL) as (server, world, _):
        task_id = queued_task(server, world)
        raws = [Raw(server, world, task_id, rid) for rid in ids]
        raws += [Raw(server, world, task_id) for _ in range(2)]
        bindings = (TransportProtocol.JSONRPC, TransportProtocol.HTTP_JSON)
        sdks = [Sdk(server, world, task_id, b) for b in bindings]
        early = len(raws) + len(sdks)
        eventually(
            lambda: metric(server, world, "mellan_stream_followers", kind="a2a") == early,
            "not every stream subscribed",
        )
        eventually(lambda: all(r.frames for r in raws), "no snapshots")
        before = metric(server, world, "mellan_stream_reads_total", kind="a2a")
        late: list[Raw] = []

        def join() -> None:  # mid-task: once the first chunks are out to everyone
            eventually(lambda: all(len(r.frames) >= 3 for r in raws), "no chunks")
            late.extend([Raw(server, world, task_id, "late"), Raw(server, world, task_id)])
            eventually(lambda: all(r.frames for r in late), "no late snapshot")

        steps = 8
        drive(server, world, task_id, steps, join)
        eventually(lambda: all(x.done() for x in [*raws, *late, *sdks]), "streams did not end")
        reads = metric(server, world, "mellan_stream_reads_total", kind="a2a") - before

    # Byte for byte the same results (the snapshot, every chunk in order, the end), each
    # stream under its own id; the SDK's clients read the same events.
    first = raws[0].results()
    for r in raws[1:]:
        assert r.results() == first, r.rid
    updates = [json.loads(d) for d in first[1:]]
    assert updates[0]["statusUpdate"]["status"]["state"] == "TASK_STATE_WORKING"  # the claim
    texts = [u["artifactUpdate"]["artifact"]["parts"][0]["text"] for u in updates[1 : 1 + steps]]
    assert texts == [f"c{i}\u2028" for i in range(steps)]
    assert updates[-1]["statusUpdate"]["status"]["state"] == "TASK_STATE_COMPLETED"
    assert b"\\u2028" in first[2]  # written escaped: one data line, whatever the text
    assert "\u2028".encode() not in b"".join(raws[3].frames)  # its id's too
    for sdk in sdks:
        assert sdk.error is None, repr(sdk.error)
        assert sdk.events == [parsed(d) for d in first]

    # Late streams: the snapshot holds what they missed, in order; then the same frames.
    for r in late:
        snap, *rest = r.results()
        assert late[0].results()[0] == snap
        (artifact,) = json.loads(snap)["task"]["artifacts"]
        had = "".join(p["text"] for p in artifact["parts"])
        missed = len(first) - 1 - len(rest)  # the working state and the first chunks
        assert missed >= 2
        assert had == "".join(f"c{i}\u2028" for i in range(missed - 1))
        assert rest == first[1 + missed :]

    # One reader: a read per change (a wake-up may be doubled), never one per stream.
    changes = 2 + steps  # the claim, the chunks, the end
    assert reads <= 2 * changes < (early + len(late)) * changes, reads


# -- the order a stream tells a turn in, whenever its reader looks --------------------------


def _task(state: TaskState, turn: int = 1) -> Task:
    return Task(
        id="t1", workspace="w", caller="c", receiver="r", capability="cap", context_id="ctx",
        state=state, payload="{}", metadata="{}", message_id=None, session_key=None,
        chain="", hop=1, path=(), attempt=1, max_attempts=3, lease_epoch=1, lease_owner=None,
        lease_expires_at=None, result=None, error=None, created_at="2026-01-01T00:00:00Z",
        updated_at="2026-01-01T00:00:01Z", turn=turn,
    )  # fmt: skip


def _chunk(seq: int) -> TaskEvent:
    body = {"artifact": {"artifactId": "out", "parts": [{"text": f"c{seq}"}]}, "append": seq > 1}
    return TaskEvent(seq, "t1", "2026-01-01T00:00:02Z", "artifact", json.dumps(body))


@given(
    chunks=st.integers(0, 6),
    looks=st.lists(st.tuples(st.integers(0, 7), st.booleans()), max_size=8),
)
def test_a_stream_says_working_before_the_turns_events_wherever_its_reader_looked(
    chunks: int, looks: list[tuple[int, bool]]
) -> None:
    """The life of a turn: claimed, ``chunks`` artifact events, completed. The shared
    reader looks at it at arbitrary points, and at each may hold events handed to it
    after its last read of the row (the state it knows lags behind the events): the
    stream still says working first, every chunk once in order, and the end last — as
    the turn happened (a reader that took a chunk before it read the claim said the chunk
    first, and CI saw it)."""
    events = [_chunk(i + 1) for i in range(chunks)]
    values, row, read_at = [], TaskState.QUEUED, 0
    for point, handed in sorted(looks):  # 0: not claimed yet; p: claimed, p - 1 events
        seen = min(max(point - 1, 0), chunks)
        if handed:  # events handed before the reader read the row again: it lags
            values.append(tasks.Watched(_task(row), events[:seen], [], read_at))
        else:
            row, read_at = (TaskState.LEASED if point else TaskState.QUEUED), seen
            values.append(tasks.Watched(_task(row), events[:seen], []))
    values.append(tasks.Watched(_task(TaskState.SUCCEEDED), events, []))
    place = tasks.Place(0, TaskState.QUEUED, 1, frozenset())
    said: list[dict[str, Any]] = []
    for value in values:
        updates, place = tasks.advance(value, place)
        said += [json.loads(u.data()) for u in updates]
    kinds = [
        u["statusUpdate"]["status"]["state"] if "statusUpdate" in u
        else u["artifactUpdate"]["artifact"]["parts"][0]["text"]
        for u in said
    ]  # fmt: skip
    middle = [f"c{i + 1}" for i in range(chunks)]
    if chunks or row is TaskState.LEASED:
        assert kinds == ["TASK_STATE_WORKING", *middle, "TASK_STATE_COMPLETED"]
    else:
        assert kinds == ["TASK_STATE_COMPLETED"]
